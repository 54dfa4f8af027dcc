//! The cache's objects in key order as one shared array, so that a list
//! takes one share of the array instead of one share of every object it
//! sends. A share of an object is an atomic count in the object's own
//! memory: taken and given back per object and per list, those counts
//! moved each object's line from core to core while lists ran side by
//! side (12 % of the server's CPU in a list of 5,000 ConfigMaps at 16
//! clients, on the instruction after the count's decrement).
//!
//! The array follows the objects change by change while no list holds it;
//! a change that finds it held lets it go to the lists that hold it, and
//! the next list makes a new one. Following costs each change a search
//! and a move of the array's tail, so a snapshot no list has asked for in
//! `UNLISTED_CHANGES` changes is let go too: writes to a resource nobody
//! lists (ConfigMaps created by the thousand) do not pay for it. While
//! there is none, a list of fewer than half of the objects (a small
//! namespace of a large resource) takes a share of each of its own, as
//! making a snapshot of all of them would cost more than it saves.

use std::collections::BTreeMap;
use std::ops::{Bound, Range};
use std::sync::{Arc, Mutex, Weak};

use super::list_writes::ListWrites;
use super::object::{CachedObject, EventType, Omit};
use crate::sync::LockExt;

/// Changes a snapshot follows without a list asking for it before it is
/// let go: about what making it again costs (a share of every object).
const UNLISTED_CHANGES: usize = 128;

/// The objects at one revision, in key order.
pub struct Snapshot {
    objects: Vec<Arc<CachedObject>>,
    /// The runs of objects lists in flight send, joined into writes.
    writes: Mutex<Vec<Weak<ListWrites>>>,
}

impl Snapshot {
    pub fn of(objects: Vec<Arc<CachedObject>>) -> Snapshot {
        debug_assert!(objects.windows(2).all(|w| w[0].key < w[1].key), "in key order");
        Snapshot { objects, writes: Mutex::default() }
    }

    pub fn get(&self, i: usize) -> Option<&Arc<CachedObject>> {
        self.objects.get(i)
    }

    /// The writes of the objects `run` with `omit`: the ones a list in
    /// flight shares, or new ones that the lists after it share.
    pub fn list_writes(self: &Arc<Self>, run: Range<usize>, omit: Omit) -> Arc<ListWrites> {
        let mut shared = self.writes.locked();
        if let Some(w) = shared.iter().filter_map(Weak::upgrade).find(|w| w.is(&run, omit)) {
            return w;
        }
        shared.retain(|w| w.strong_count() > 0);
        let w = Arc::new(ListWrites::new(self.clone(), run, omit));
        shared.push(Arc::downgrade(&w));
        w
    }

    /// The positions of the keys from `from` on that start with `prefix`
    /// (`from` is at or after `prefix`): one run of the array.
    pub fn scope(&self, prefix: &str, from: &str) -> Range<usize> {
        let start = self.objects.partition_point(|o| o.key.as_str() < from);
        let len = self.objects[start..].partition_point(|o| o.key.starts_with(prefix));
        start..start + len
    }

    /// One change, as the cache's objects took it (no list holds the
    /// snapshot, so none holds writes of it either).
    fn apply(&mut self, kind: EventType, object: &Arc<CachedObject>) {
        self.writes.locked_mut().clear();
        let objects = &mut self.objects;
        match (objects.binary_search_by(|o| o.key.as_str().cmp(&object.key)), kind) {
            (Ok(i), EventType::Deleted) => {
                objects.remove(i);
            }
            (Ok(i), _) => objects[i] = object.clone(),
            (Err(_), EventType::Deleted) => {}
            (Err(i), _) => objects.insert(i, object.clone()),
        }
    }
}

/// Where the cache keeps its snapshot between lists.
#[derive(Default)]
pub struct SnapshotSlot(Mutex<Slot>);

#[derive(Default)]
struct Slot {
    snapshot: Option<Arc<Snapshot>>,
    /// Changes since a list last asked for the snapshot.
    unlisted: usize,
}

impl SnapshotSlot {
    /// What a list of the keys under `prefix` from `from` on reads, and
    /// where in it: the snapshot when there is one, or when the list
    /// covers most of `objects` (it is made then, for the lists after);
    /// else the list's own few objects, as making a snapshot of every
    /// object for them would cost more than it saves. The caller holds
    /// the cache's lock, so `objects` is the state the slot follows.
    pub fn for_list(
        &self,
        objects: &BTreeMap<String, Arc<CachedObject>>,
        prefix: &str,
        from: &str,
    ) -> (Arc<Snapshot>, Range<usize>) {
        let mut slot = self.0.locked();
        if slot.snapshot.is_none() {
            // Counted first, so a list of most objects takes no share of
            // the half it would then drop.
            let in_scope = || {
                objects
                    .range::<str, _>((Bound::Included(from), Bound::Unbounded))
                    .take_while(|(key, _)| key.starts_with(prefix))
            };
            if in_scope().nth(objects.len() / 2).is_none() {
                let few: Vec<_> = in_scope().map(|(_, obj)| obj.clone()).collect();
                let n = few.len();
                return (Arc::new(Snapshot::of(few)), 0..n);
            }
        }
        slot.unlisted = 0;
        let snapshot =
            slot.snapshot.get_or_insert_with(|| Arc::new(Snapshot::of(objects.values().cloned().collect()))).clone();
        let scope = snapshot.scope(prefix, from);
        (snapshot, scope)
    }

    /// Follows one change: applied in place while no list holds the
    /// snapshot and lists still ask for it, else let go.
    pub fn follow(&mut self, kind: EventType, object: &Arc<CachedObject>) {
        let slot = self.0.locked_mut();
        slot.unlisted += 1;
        let wanted = slot.unlisted <= UNLISTED_CHANGES;
        match slot.snapshot.as_mut().map(Arc::get_mut) {
            Some(Some(snapshot)) if wanted => snapshot.apply(kind, object),
            Some(_) => slot.snapshot = None,
            None => {}
        }
    }

    /// Forgets the snapshot (the cache lists anew).
    pub fn clear(&mut self) {
        self.0.locked_mut().snapshot = None;
    }

    #[cfg(test)]
    fn held(&mut self) -> bool {
        self.0.locked_mut().snapshot.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::watch_cache::object::Form;
    use serde_json::json;

    fn obj(ns: &str, name: &str, rev: i64) -> Arc<CachedObject> {
        let v = json!({"metadata": {"name": name, "namespace": ns, "resourceVersion": rev.to_string()}});
        let form = Form::new("v1", "ConfigMap", None);
        Arc::new(CachedObject::new(format!("/registry/configmaps/{ns}/{name}"), rev, v, &form))
    }

    fn keys(s: &Snapshot) -> Vec<(String, i64)> {
        s.objects.iter().map(|o| (o.key.clone(), o.rev)).collect()
    }

    /// A list of every object.
    fn all(slot: &SnapshotSlot, objects: &BTreeMap<String, Arc<CachedObject>>) -> Arc<Snapshot> {
        let (snapshot, scope) = slot.for_list(objects, "/registry/configmaps/", "/registry/configmaps/");
        assert_eq!(scope, 0..objects.len());
        snapshot
    }

    fn map(objs: &[Arc<CachedObject>]) -> BTreeMap<String, Arc<CachedObject>> {
        objs.iter().map(|o| (o.key.clone(), o.clone())).collect()
    }

    #[test]
    fn scope_is_the_run_of_keys_under_the_prefix_from_the_start_key() {
        let objs = [obj("a", "x", 1), obj("b", "x", 2), obj("b", "y", 3), obj("bb", "x", 4), obj("c", "x", 5)];
        let s = Snapshot::of(objs.to_vec());
        let p = "/registry/configmaps/";
        assert_eq!(s.scope(p, p), 0..5);
        assert_eq!(s.scope(&format!("{p}b/"), &format!("{p}b/")), 1..3, "b/ is not bb/");
        assert_eq!(s.scope(&format!("{p}b/"), &format!("{p}b/x\0")), 2..3, "a continue key is after its object");
        assert_eq!(s.scope(&format!("{p}z/"), &format!("{p}z/")), 5..5);
        assert_eq!(s.scope(&format!("{p}0/"), &format!("{p}0/")), 0..0);
    }

    #[test]
    fn an_unshared_snapshot_follows_the_objects_and_a_shared_one_is_let_go() {
        let mut objects = map(&[obj("a", "x", 1), obj("a", "z", 2)]);
        let mut slot = SnapshotSlot::default();
        slot.follow(EventType::Added, &obj("a", "q", 3));
        let first = all(&slot, &objects);
        assert_eq!(keys(&first).len(), 2, "made from the objects");
        drop(first);
        for (kind, o) in [
            (EventType::Added, obj("a", "y", 3)),
            (EventType::Modified, obj("a", "x", 4)),
            (EventType::Deleted, obj("a", "z", 5)),
            (EventType::Deleted, obj("a", "nothing", 6)),
            (EventType::Added, obj("a", "a", 7)),
        ] {
            match kind {
                EventType::Deleted => objects.remove(&o.key),
                _ => objects.insert(o.key.clone(), o.clone()),
            };
            slot.follow(kind, &o);
        }
        let followed = all(&slot, &objects);
        assert!(slot.held(), "the slot's own snapshot, followed since the first list");
        let made = Snapshot::of(objects.values().cloned().collect());
        assert_eq!(keys(&followed), keys(&made), "changed in place as the objects were");

        // Held by a list: the list keeps what it had, the slot lets it go.
        let changed = obj("a", "y", 8);
        objects.insert(changed.key.clone(), changed.clone());
        slot.follow(EventType::Modified, &changed);
        assert!(keys(&followed).contains(&("/registry/configmaps/a/y".into(), 3)), "the list's view is unchanged");
        let next = all(&slot, &objects);
        assert!(!Arc::ptr_eq(&followed, &next), "a new snapshot");
        assert!(keys(&next).contains(&("/registry/configmaps/a/y".into(), 8)));
    }

    #[test]
    fn lists_in_flight_of_the_same_run_share_its_writes() {
        let s = Arc::new(Snapshot::of(vec![obj("a", "x", 1), obj("a", "y", 2), obj("b", "x", 3)]));
        let first = s.list_writes(0..3, Omit::Nothing);
        let same = s.list_writes(0..3, Omit::Nothing);
        assert!(Arc::ptr_eq(&first, &same), "the same run, shared");
        let (run, form) = (s.list_writes(0..2, Omit::Nothing), s.list_writes(0..3, Omit::ManagedFields));
        assert!(!Arc::ptr_eq(&first, &run), "another run");
        assert!(!Arc::ptr_eq(&first, &form), "another form");
        let kept = Arc::downgrade(&first);
        drop((first, same, run, form));
        assert!(kept.upgrade().is_none(), "the snapshot does not keep writes no list holds");
        assert_eq!(s.writes.lock().expect("writes").len(), 3, "until the next list looks");
        drop(s.list_writes(1..3, Omit::Nothing));
        assert_eq!(s.writes.lock().expect("writes").len(), 1, "the dead ones are let go");
    }

    #[test]
    fn a_snapshot_no_list_asks_for_is_let_go() {
        let objects = map(&[obj("a", "x", 1)]);
        let mut slot = SnapshotSlot::default();
        drop(all(&slot, &objects));
        for i in 0..UNLISTED_CHANGES {
            slot.follow(EventType::Modified, &obj("a", "x", 2 + i as i64));
        }
        assert!(slot.held(), "followed while lists may still come");
        drop(all(&slot, &objects));
        for i in 0..=UNLISTED_CHANGES {
            assert!(slot.held(), "change {i}");
            slot.follow(EventType::Modified, &obj("a", "x", 1000 + i as i64));
        }
        assert!(!slot.held(), "let go after {UNLISTED_CHANGES} changes without a list");
    }

    #[test]
    fn a_list_of_a_few_objects_copies_them_unless_a_snapshot_is_there() {
        let objects = map(&[obj("a", "x", 1), obj("b", "x", 2), obj("b", "y", 3), obj("c", "x", 4), obj("c", "y", 5)]);
        let mut slot = SnapshotSlot::default();
        let few = |slot: &SnapshotSlot, ns: &str| {
            let prefix = format!("/registry/configmaps/{ns}/");
            let (s, scope) = slot.for_list(&objects, &prefix, &prefix);
            s.objects[scope].iter().map(|o| o.key.clone()).collect::<Vec<_>>()
        };
        assert_eq!(few(&slot, "b"), ["/registry/configmaps/b/x", "/registry/configmaps/b/y"]);
        assert_eq!(few(&slot, "z"), Vec::<String>::new());
        assert!(!slot.held(), "two of five objects, or none, make no snapshot");
        let prefix = "/registry/configmaps/";
        let (s, scope) = slot.for_list(&objects, prefix, &format!("{prefix}b/"));
        assert_eq!(scope.len(), 4, "from b/ on: most of the objects");
        assert_eq!(s.objects.len(), 5, "the snapshot holds them all");
        assert!(slot.held());
        drop(s);
        let (s, scope) = slot.for_list(&objects, "/registry/configmaps/c/", "/registry/configmaps/c/");
        assert_eq!((s.objects.len(), scope), (5, 3..5), "once made, a small list shares it");
    }
}
