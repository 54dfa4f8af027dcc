//! Locks that go on after a panic.
//!
//! A `std::sync::Mutex` or `RwLock` is poisoned when a thread panics while
//! holding it, and every later `lock()` returns an error. ferrok's locks
//! guard data that is consistent between statements (maps, queues,
//! counters, caches whose entries are replaced whole): a panic while one is
//! held leaves data that is still consistent for our uses. So we take the
//! guard anyway and go on, rather than turn one panic into a cascade of
//! panics through every task that touches the lock. These traits are that
//! one decision, written once: `m.locked()` instead of `m.lock()` and an
//! `unwrap_or_else` at every call.

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// A `Mutex` locked whether or not it is poisoned.
pub trait LockExt<T: ?Sized> {
    /// The guard, also after a holder panicked.
    fn locked(&self) -> MutexGuard<'_, T>;
    /// The data through a unique borrow (no locking), also after a holder
    /// panicked.
    fn locked_mut(&mut self) -> &mut T;
}

impl<T: ?Sized> LockExt<T> for Mutex<T> {
    fn locked(&self) -> MutexGuard<'_, T> {
        self.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn locked_mut(&mut self) -> &mut T {
        self.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// An `RwLock` locked whether or not it is poisoned.
pub trait RwLockExt<T: ?Sized> {
    /// A shared guard, also after a writer panicked.
    fn read_locked(&self) -> RwLockReadGuard<'_, T>;
    /// The exclusive guard, also after a writer panicked.
    fn write_locked(&self) -> RwLockWriteGuard<'_, T>;
}

impl<T: ?Sized> RwLockExt<T> for RwLock<T> {
    fn read_locked(&self) -> RwLockReadGuard<'_, T> {
        self.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write_locked(&self) -> RwLockWriteGuard<'_, T> {
        self.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn poison<L: Send + Sync + 'static>(lock: Arc<L>, hold: fn(&L)) {
        let held = lock.clone();
        let _ = std::thread::spawn(move || {
            hold(&held);
        })
        .join();
    }

    #[test]
    fn a_poisoned_mutex_still_locks() {
        let m = Arc::new(Mutex::new(1));
        poison(m.clone(), |m| {
            let mut g = m.locked();
            *g = 2;
            panic!("while holding the lock");
        });
        assert!(m.is_poisoned());
        assert_eq!(*m.locked(), 2);
        let mut m = Arc::try_unwrap(m).expect("the only owner");
        *m.locked_mut() += 1;
        assert_eq!(*m.locked(), 3);
    }

    #[test]
    fn a_poisoned_rwlock_still_reads_and_writes() {
        let l = Arc::new(RwLock::new(vec![1]));
        poison(l.clone(), |l| {
            let _g = l.write_locked();
            panic!("while writing");
        });
        assert!(l.is_poisoned());
        l.write_locked().push(2);
        assert_eq!(*l.read_locked(), vec![1, 2]);
    }
}
