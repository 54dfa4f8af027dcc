//! The compare clauses the API server's txns guard their writes with, as
//! upstream's etcd3 storage writes them: `mod_revision` for an object's
//! optimistic concurrency (0: the key does not exist), `version` for the
//! compaction handshake key.

use super::proto::compare::{CompareResult, CompareTarget, TargetUnion};
use super::proto::Compare;

impl Compare {
    /// `key`'s mod_revision equals `rev`.
    pub fn mod_revision_is(key: &[u8], rev: i64) -> Compare {
        Compare::equal(key, CompareTarget::Mod, TargetUnion::ModRevision(rev))
    }

    /// `key`'s version (writes since its creation) equals `version`.
    pub fn version_is(key: &[u8], version: i64) -> Compare {
        Compare::equal(key, CompareTarget::Version, TargetUnion::Version(version))
    }

    /// No key exists in `[key, range_end)`: compared over a range, etcd
    /// checks every key in it, and a range without keys compares as a key
    /// never created.
    pub fn none_in_range(key: &[u8], range_end: &[u8]) -> Compare {
        let mut c = Compare::equal(key, CompareTarget::Create, TargetUnion::CreateRevision(0));
        c.range_end = range_end.to_vec();
        c
    }

    fn equal(key: &[u8], target: CompareTarget, value: TargetUnion) -> Compare {
        Compare {
            result: CompareResult::Equal as i32,
            target: target as i32,
            key: key.to_vec(),
            range_end: Vec::new(),
            target_union: Some(value),
        }
    }
}
