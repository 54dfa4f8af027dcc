//! Time as probe workers see it: tokio's timers on a node; a clock moved
//! by hand in tests, so that periods, initial delays and thresholds are
//! checked second by second without waiting for them.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use tokio::time::Instant;

pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send>>;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> Instant;
    fn sleep_until(&self, deadline: Instant) -> Sleep;
    fn sleep(&self, d: Duration) -> Sleep {
        self.sleep_until(self.now() + d)
    }
}

/// tokio's clock.
pub struct TokioClock;

impl Clock for TokioClock {
    fn now(&self) -> Instant {
        Instant::now()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        Box::pin(tokio::time::sleep_until(deadline))
    }
}

/// A clock that moves only when told to.
#[cfg(test)]
pub struct FakeClock {
    base: Instant,
    offset: tokio::sync::watch::Sender<Duration>,
}

#[cfg(test)]
impl FakeClock {
    pub fn new() -> Self {
        FakeClock { base: Instant::now(), offset: tokio::sync::watch::Sender::new(Duration::ZERO) }
    }

    /// Moves the clock forward, one second at a time, letting every task
    /// that wakes run to its next wait (on a current-thread runtime).
    pub async fn advance(&self, d: Duration) {
        let mut left = d;
        while !left.is_zero() {
            let step = left.min(Duration::from_secs(1));
            self.offset.send_modify(|o| *o += step);
            left -= step;
            settle().await;
        }
    }
}

/// Lets every ready task run until it waits again.
#[cfg(test)]
pub async fn settle() {
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
}

#[cfg(test)]
impl Clock for FakeClock {
    fn now(&self) -> Instant {
        self.base + *self.offset.borrow()
    }

    fn sleep_until(&self, deadline: Instant) -> Sleep {
        let mut offset = self.offset.subscribe();
        let base = self.base;
        Box::pin(async move {
            loop {
                if base + *offset.borrow_and_update() >= deadline {
                    return;
                }
                if offset.changed().await.is_err() {
                    // The clock is gone: nothing will ever wake this sleeper.
                    std::future::pending::<()>().await;
                }
            }
        })
    }
}
