//! Patching: how lists and maps merge, read from the schema (`patch_meta`,
//! upstream's PatchMeta); strategic merge patch (`strategic`); and
//! server-side apply with the managed fields it records (`managed_fields`,
//! upstream's fieldmanager). The PATCH handler that uses them is
//! `handlers::patch`.

pub mod managed_fields;
pub mod patch_meta;
pub mod strategic;
