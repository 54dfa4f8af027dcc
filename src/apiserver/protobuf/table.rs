//! The shapes of the generated schema table (`schema.rs`).

/// A field's value type (for maps: the value's type; the key's is `Field::key`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Str,
    Bytes,
    Bool,
    I32,
    I64,
    #[allow(dead_code)] // no built-in type has one today
    U32,
    #[allow(dead_code)]
    U64,
    F64,
    #[allow(dead_code)]
    F32,
    /// A message: `Field::msg` indexes `MESSAGES`.
    Msg,
}

/// Messages whose JSON form is not simply an object of their fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    Plain,
    /// metav1.Time {1 seconds} -> "2006-01-02T15:04:05Z"; empty -> null.
    Time,
    /// metav1.MicroTime {1 seconds, 2 nanos} -> "2006-01-02T15:04:05.000000Z".
    MicroTime,
    /// metav1.Duration {1 nanoseconds} -> Go duration string ("1h0m0s").
    #[allow(dead_code)] // no built-in kind reaches one today
    Duration,
    /// metav1.FieldsV1 {1 raw JSON}.
    FieldsV1,
    /// resource.Quantity {1 string}.
    Quantity,
    /// intstr.IntOrString {1 type, 2 intVal, 3 strVal}.
    IntOrString,
    /// runtime.RawExtension {1 raw JSON (or nested protobuf)}.
    RawExtension,
    /// A named []string (metav1.Verbs, ExtraValue) {1 repeated items}: a JSON array.
    StringList,
    /// apiextensions JSON {1 raw JSON}.
    Json,
    /// apiextensions JSONSchemaPropsOrArray {1 schema, 2 repeated schemas}.
    SchemaOrArray,
    /// apiextensions JSONSchemaPropsOrBool {1 allows, 2 schema}.
    SchemaOrBool,
    /// apiextensions JSONSchemaPropsOrStringArray {1 schema, 2 repeated property}.
    SchemaOrStringArray,
}

/// Field flags.
pub const REP: u8 = 1;
pub const MAP: u8 = 2;
/// A non-pointer Go field with `omitempty` (or `omitzero`): gogo-protobuf
/// writes its zero value, Go's JSON drops it, so drop it too.
pub const OMIT: u8 = 4;
/// An embedded struct (`json:",inline"`): its fields join the parent's object.
pub const INLINE: u8 = 8;

#[derive(Debug)]
pub struct Field {
    pub name: &'static str,
    /// The field number (every built-in type's are small).
    pub tag: u16,
    pub ty: Ty,
    /// The key type of a map field.
    pub key: Ty,
    /// For `Ty::Msg`: the index of the message in `MESSAGES`.
    pub msg: u16,
    pub flags: u8,
}

#[derive(Debug)]
pub struct Message {
    /// e.g. "api.core.v1.Pod", for errors.
    pub name: &'static str,
    pub special: Special,
    /// `FIELDS[first..first + len]`, sorted by tag.
    pub first: u16,
    pub len: u16,
}

pub const fn f(tag: u16, name: &'static str, ty: Ty, key: Ty, msg: u16, flags: u8) -> Field {
    Field { tag, name, ty, key, msg, flags }
}

pub const fn m(name: &'static str, special: Special, first: u16, len: u16) -> Message {
    Message { name, special, first, len }
}
