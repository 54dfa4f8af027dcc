//! A JSON map read as its entries in order, each value left unparsed (a
//! slice of the input), and written back the same way: how the watch
//! cache and the binding edit an object's JSON at the few places they
//! change without decoding the rest of it.

use std::borrow::Cow;
use std::fmt;
use std::ops::Range;

use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// A map's entries in order, each value unparsed.
pub struct Entries<'a>(pub Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Entries<'a> {
    /// The entries of the JSON map `json`; None when it is not one.
    pub fn of(json: &'a str) -> Option<Entries<'a>> {
        serde_json::from_str(json).ok()
    }

    /// Keys strictly increasing: sorted, none repeated (serde_json's
    /// encoding of a map).
    pub fn sorted(&self) -> bool {
        self.0.windows(2).all(|w| w[0].0 < w[1].0)
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// Writes the map with `changes` made, each at its sorted place:
    /// `Some(json)` sets the key (replacing its value), `None` removes it.
    /// The entries and the changes must both be sorted by key.
    pub fn write_changed(&self, out: &mut Vec<u8>, changes: &[(&str, Option<&[u8]>)]) {
        write_changed(out, self.0.iter().map(|(k, v)| (&**k, v.get().as_bytes())), changes);
    }
}

/// `Entries::write_changed` of a map given as its sorted entries, each
/// value already JSON.
pub fn write_changed<'e>(
    out: &mut Vec<u8>,
    entries: impl IntoIterator<Item = (&'e str, &'e [u8])>,
    changes: &[(&str, Option<&[u8]>)],
) {
    write_changed_finding(out, entries, changes, None);
}

/// `write_changed`, answering where the unchanged entry `find` went: its
/// bytes with one comma beside it (the one before it, or for the first
/// entry the one after it), so that cutting that range out leaves the
/// map without it.
pub fn write_changed_finding<'e>(
    out: &mut Vec<u8>,
    entries: impl IntoIterator<Item = (&'e str, &'e [u8])>,
    changes: &[(&str, Option<&[u8]>)],
    find: Option<&str>,
) -> Option<Range<usize>> {
    let start = out.len();
    let mut found = None;
    let mut map = MapWriter::new(out);
    let mut pending = changes.iter().peekable();
    for (key, value) in entries {
        while let Some((k, change)) = pending.next_if(|(k, _)| *k <= key) {
            if let Some(v) = change {
                map.entry(k, v);
            }
        }
        if !changes.iter().any(|(k, _)| *k == key) {
            let before = map.out.len();
            map.entry(key, value);
            if find == Some(key) {
                found = Some((before, map.out.len()));
            }
        }
    }
    for (k, change) in pending {
        if let Some(v) = change {
            map.entry(k, v);
        }
    }
    let end = map.out.len();
    map.end();
    let (before, after) = found?;
    let first = before == start + 1;
    Some(before..after + usize::from(first && end > after))
}

impl<'de> serde::Deserialize<'de> for Entries<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entries<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries<'de>, A::Error> {
                let mut out = Vec::new();
                while let Some(Key(k)) = map.next_key()? {
                    out.push((k, map.next_value::<&RawValue>()?));
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A map key, borrowed from the input unless it holds escapes.
pub struct Key<'a>(pub Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(s.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// Writes `s` as a JSON string, escaped as serde_json escapes it.
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    // Writing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Writes a JSON map of `entries`, each value already JSON.
pub struct MapWriter<'o> {
    out: &'o mut Vec<u8>,
    first: bool,
}

impl<'o> MapWriter<'o> {
    pub fn new(out: &'o mut Vec<u8>) -> Self {
        out.push(b'{');
        MapWriter { out, first: true }
    }

    pub fn entry(&mut self, key: &str, value: &[u8]) {
        if !std::mem::take(&mut self.first) {
            self.out.push(b',');
        }
        write_str(self.out, key);
        self.out.push(b':');
        self.out.extend_from_slice(value);
    }

    pub fn end(self) {
        self.out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entry_found_is_cut_out_with_one_comma() {
        let cut = |json: &str, changes: &[(&str, Option<&[u8]>)]| {
            let entries = Entries::of(json).unwrap();
            let mut out = Vec::new();
            let entries = entries.0.iter().map(|(k, v)| (&**k, v.get().as_bytes()));
            let range = write_changed_finding(&mut out, entries, changes, Some("m")).expect("found");
            out.drain(range);
            String::from_utf8(out).unwrap()
        };
        assert_eq!(cut(r#"{"a":1,"m":[2],"z":3}"#, &[]), r#"{"a":1,"z":3}"#, "in the middle");
        assert_eq!(cut(r#"{"m":[2],"z":3}"#, &[]), r#"{"z":3}"#, "first");
        assert_eq!(cut(r#"{"a":1,"m":[2]}"#, &[]), r#"{"a":1}"#, "last");
        assert_eq!(cut(r#"{"m":[2]}"#, &[]), "{}", "alone");
        assert_eq!(cut(r#"{"m":[2]}"#, &[("r", Some(b"4"))]), r#"{"r":4}"#, "first, a change after it");
        assert_eq!(cut(r#"{"m":[2],"r":0}"#, &[("a", Some(b"4"))]), r#"{"a":4,"r":0}"#, "after a change");
    }

    #[test]
    fn changes_land_at_their_sorted_places() {
        let changed = |json: &str, changes: &[(&str, Option<&[u8]>)]| {
            let mut out = Vec::new();
            Entries::of(json).unwrap().write_changed(&mut out, changes);
            String::from_utf8(out).unwrap()
        };
        let map = r#"{"b":1,"d":{"x": 2},"f":"é"}"#;
        assert_eq!(changed(map, &[]), r#"{"b":1,"d":{"x": 2},"f":"é"}"#);
        assert_eq!(
            changed(map, &[("a", Some(b"0")), ("c", Some(b"3")), ("g", Some(b"7"))]),
            r#"{"a":0,"b":1,"c":3,"d":{"x": 2},"f":"é","g":7}"#
        );
        assert_eq!(changed(map, &[("d", Some(b"null")), ("f", None)]), r#"{"b":1,"d":null}"#);
        assert_eq!(changed(map, &[("b", None), ("e", None)]), r#"{"d":{"x": 2},"f":"é"}"#);
        assert_eq!(changed("{}", &[("k", Some(br#""v""#))]), r#"{"k":"v"}"#);
    }
}
