//! The JSON of a run of a snapshot's objects, joined into writes once and
//! shared by the lists that send the same run at the same time. Sixteen
//! clients listing 5,000 ConfigMaps each copied every object's bytes
//! into writes of their own: a fifth of the server's CPU, in 10,000 small
//! copies per list from objects spread over the heap. Joined once, the
//! writes are read whole by each list's TLS layer.
//!
//! A write is made by the first list that reaches it and kept while
//! another list holds the run; a list alone lets each write go once it
//! has taken it, so one list's memory stays about one write, as before.
//! Kept writes live in mappings of their own, given back to the kernel
//! when the last list lets them go.

use std::ops::Range;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;

use super::object::Omit;
use super::snapshot::Snapshot;
use crate::sync::LockExt;

/// How many bytes a write carries (the TLS layer's own buffer is 64 KiB).
pub const WRITE_BYTES: usize = 64 << 10;

/// The objects `run` of `snapshot`, as JSON values joined by commas.
pub struct ListWrites {
    snapshot: Arc<Snapshot>,
    run: Range<usize>,
    omit: Omit,
    /// The object each write starts at, then the run's end.
    starts: Vec<usize>,
    /// Each write's length in bytes.
    sizes: Vec<usize>,
    writes: Box<[Mutex<Option<Bytes>>]>,
}

impl ListWrites {
    /// Measures the run and cuts it into writes; nothing is copied yet.
    pub fn new(snapshot: Arc<Snapshot>, run: Range<usize>, omit: Omit) -> ListWrites {
        let (mut starts, mut sizes, mut in_write) = (vec![run.start], Vec::new(), 0usize);
        for i in run.clone() {
            let n = snapshot.get(i).map_or(0, |o| o.json_slices(omit).iter().map(|s| s.len()).sum());
            if in_write >= WRITE_BYTES {
                starts.push(i);
                sizes.push(in_write);
                in_write = 0;
            }
            // Each object but the run's first follows a comma.
            in_write += n + usize::from(i > run.start);
        }
        if run.end > run.start {
            starts.push(run.end);
            sizes.push(in_write);
        }
        let writes = sizes.iter().map(|_| Mutex::new(None)).collect();
        ListWrites { snapshot, run, omit, starts, sizes, writes }
    }

    /// Whether this is the run `run` of the objects with `omit`.
    pub fn is(&self, run: &Range<usize>, omit: Omit) -> bool {
        self.run == *run && self.omit == omit
    }

    /// The bytes of all writes.
    pub fn byte_len(&self) -> u64 {
        self.sizes.iter().map(|n| *n as u64).sum()
    }

    /// How many writes there are (none for an empty run).
    pub fn count(&self) -> usize {
        self.writes.len()
    }

    /// The `k`-th write: the one another list made, or made now. A list
    /// that holds the run alone keeps nothing it has taken; a write kept
    /// for other lists is made in pages of its own (`Pages`).
    pub fn write(self: &Arc<Self>, k: usize) -> Bytes {
        let Some(slot) = self.writes.get(k) else { return Bytes::new() };
        let mut slot = slot.locked();
        let alone = Arc::strong_count(self) == 1;
        if let Some(made) = if alone { slot.take() } else { slot.clone() } {
            return made;
        }
        if alone {
            return self.on_heap(k);
        }
        let made = match Pages::new(self.sizes[k]) {
            Some(mut pages) => {
                let mut at = 0;
                self.fill(k, |part| {
                    // The snapshot's objects do not change, so the parts
                    // fit the measured length; a part that would not is
                    // left out rather than panic.
                    if let Some(to) = pages.as_mut().get_mut(at..at + part.len()) {
                        to.copy_from_slice(part);
                    }
                    at += part.len();
                });
                debug_assert_eq!(at, self.sizes[k], "a write is as long as measured");
                Bytes::from_owner(pages)
            }
            None => self.on_heap(k),
        };
        *slot = Some(made.clone());
        made
    }

    /// The `k`-th write made on the heap.
    fn on_heap(&self, k: usize) -> Bytes {
        let mut out = Vec::with_capacity(self.sizes[k]);
        self.fill(k, |part| out.extend_from_slice(part));
        Bytes::from(out)
    }

    /// Hands the parts of the `k`-th write to `put`, in order: exactly
    /// `sizes[k]` bytes.
    fn fill(&self, k: usize, mut put: impl FnMut(&[u8])) {
        for i in self.starts[k]..self.starts[k + 1] {
            if i > self.run.start {
                put(b",");
            }
            if let Some(o) = self.snapshot.get(i) {
                for s in o.json_slices(self.omit) {
                    put(s);
                }
            }
        }
    }
}

/// Bytes in an anonymous mapping of their own, unmapped when the last
/// share is dropped. The shared writes of 16 lists of 5,000 ConfigMaps
/// (6.6 MB) made from the heap stayed in the allocator's free pages
/// afterwards: the server's RSS 10 MiB higher for good.
struct Pages {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// The mapping is owned by the one `Pages`; it is written only through
// `&mut` before it is shared, and read through `&` after.
unsafe impl Send for Pages {}
unsafe impl Sync for Pages {}

impl Pages {
    /// `len` (> 0) bytes of zeroed private pages; None if the kernel refuses.
    fn new(len: usize) -> Option<Pages> {
        if len == 0 {
            return None;
        }
        // SAFETY: a new private anonymous mapping; no existing memory is touched.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Pages { ptr: std::ptr::NonNull::new(ptr.cast())?, len })
    }
}

impl AsRef<[u8]> for Pages {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len` mapped, initialized (zeroed or written) bytes, alive as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for Pages {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once; no slice of it outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::watch_cache::object::{CachedObject, Form};
    use serde_json::{json, Value};

    fn snapshot(n: usize, data: usize) -> Arc<Snapshot> {
        let form = Form::new("v1", "ConfigMap", None);
        let objs = (0..n)
            .map(|i| {
                let v = json!({"metadata": {"name": format!("cm-{i:05}"), "namespace": "a", "resourceVersion": "1",
                    "managedFields": [{"manager": "m"}]}, "data": {"k": "x".repeat(data)}});
                let stored = serde_json::to_vec(&v).expect("JSON");
                let key = |_: &Value| format!("/registry/configmaps/a/cm-{i:05}");
                Arc::new(CachedObject::from_stored(&stored, 1, &form, key).expect("cached"))
            })
            .collect();
        Arc::new(Snapshot::of(objs))
    }

    fn joined(w: &Arc<ListWrites>) -> Vec<u8> {
        let mut all = Vec::new();
        for k in 0..w.count() {
            all.extend_from_slice(&w.write(k));
        }
        all
    }

    fn names(items: &[u8]) -> Vec<String> {
        let list: Vec<Value> = serde_json::from_slice(&[b"[", items, b"]"].concat()).expect("JSON values");
        list.iter().filter_map(|o| o["metadata"]["name"].as_str().map(str::to_string)).collect()
    }

    #[test]
    fn the_writes_join_the_runs_objects_with_commas_and_their_length_is_told_first() {
        let s = snapshot(300, 1000);
        for run in [0..300, 0..1, 17..250, 5..5] {
            let w = Arc::new(ListWrites::new(s.clone(), run.clone(), Omit::Nothing));
            let all = joined(&w);
            assert_eq!(all.len() as u64, w.byte_len(), "{run:?}");
            for k in 0..w.count() {
                assert_eq!(w.write(k).len(), w.sizes[k], "write {k} is as long as measured");
            }
            let want: Vec<String> = run.clone().map(|i| format!("cm-{i:05}")).collect();
            assert_eq!(names(&all), want, "{run:?}");
            if run.len() == 300 {
                assert!(w.count() > 3, "300 KiB of objects make several writes");
            }
            if run.is_empty() {
                assert_eq!((w.count(), w.byte_len()), (0, 0));
            }
        }
    }

    #[test]
    fn omitted_managed_fields_are_left_out_of_the_writes() {
        let s = snapshot(3, 10);
        let w = Arc::new(ListWrites::new(s, 0..3, Omit::ManagedFields));
        let all = joined(&w);
        assert_eq!(all.len() as u64, w.byte_len());
        let list: Vec<Value> = serde_json::from_slice(&[b"[", &all[..], b"]"].concat()).expect("JSON");
        assert!(list.iter().all(|o| o["metadata"].get("managedFields").is_none()), "{list:?}");
        assert_eq!(list.len(), 3);
        let whole = joined(&Arc::new(ListWrites::new(w.snapshot.clone(), 0..3, Omit::Nothing)));
        assert!(String::from_utf8_lossy(&whole).contains("managedFields"), "kept for readers that want them");
    }

    #[test]
    fn a_write_is_kept_while_another_list_holds_the_run_and_not_when_one_list_does() {
        let s = snapshot(200, 1000);
        let w = Arc::new(ListWrites::new(s, 0..200, Omit::Nothing));
        let alone = w.write(0);
        assert!(w.writes[0].lock().expect("slot").is_none(), "a list alone keeps nothing");
        let other = w.clone();
        let first = w.write(1);
        assert!(w.writes[1].lock().expect("slot").is_some(), "kept for the other list");
        let second = other.write(1);
        assert_eq!(first.as_ptr(), second.as_ptr(), "the other list sends the same bytes, not a copy");
        assert_eq!(other.write(0), alone, "made again, the same bytes");
        drop(other);
        assert_eq!(w.write(1), first, "the kept write is handed to the list left alone");
        assert!(w.writes[1].lock().expect("slot").is_none(), "and no longer kept");
    }
}
