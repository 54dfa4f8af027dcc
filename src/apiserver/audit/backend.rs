//! Where Events go: a bounded channel read by one writer thread, as
//! upstream's buffered backend, so a request never waits on the disk. A
//! full buffer drops the Event (and says so) rather than stall requests;
//! `shutdown` drains what is queued before the process exits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use super::event::Event;
use super::rotate::{RotateOptions, RotatingFile};
use crate::sync::LockExt;

/// Events queued before new ones are dropped (upstream's buffer size).
const BUFFER: usize = 10_000;

/// Where the log goes: `--audit-log-path`, `-` for standard output.
#[derive(Debug, Clone)]
pub enum Sink {
    Stdout,
    File { path: PathBuf, rotate: RotateOptions },
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("cannot open the audit log {path}: {source}")]
    Open { path: String, source: std::io::Error },
    #[error("cannot start the audit log writer: {0}")]
    Thread(std::io::Error),
}

enum Output {
    Stdout(std::io::Stdout),
    File(RotatingFile),
}

impl Output {
    fn write(&mut self, line: &[u8]) -> std::io::Result<()> {
        use std::io::Write;
        match self {
            Output::Stdout(s) => s.write_all(line),
            Output::File(f) => f.write_record(line),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        use std::io::Write;
        match self {
            Output::Stdout(s) => s.flush(),
            Output::File(f) => f.flush(),
        }
    }
}

pub struct Backend {
    sender: Mutex<Option<mpsc::Sender<Event>>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    dropped: AtomicU64,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("dropped", &self.dropped.load(Ordering::Relaxed)).finish()
    }
}

impl Backend {
    pub fn start(sink: Sink) -> Result<Arc<Backend>, BackendError> {
        let mut output = match sink {
            Sink::Stdout => Output::Stdout(std::io::stdout()),
            Sink::File { path, rotate } => {
                let shown = path.display().to_string();
                Output::File(
                    RotatingFile::open(path, rotate).map_err(|source| BackendError::Open { path: shown, source })?,
                )
            }
        };
        let (tx, mut rx) = mpsc::channel::<Event>(BUFFER);
        let writer = std::thread::Builder::new()
            .name("audit-log".into())
            .spawn(move || {
                while let Some(event) = rx.blocking_recv() {
                    if let Err(e) = output.write(&event.to_line()) {
                        tracing::error!(error = %e, "cannot write the audit log");
                    }
                    // Flush once the queue is empty: batches under load, prompt when idle.
                    if rx.is_empty() {
                        if let Err(e) = output.flush() {
                            tracing::error!(error = %e, "cannot flush the audit log");
                        }
                    }
                }
                let _ = output.flush();
            })
            .map_err(BackendError::Thread)?;
        Ok(Arc::new(Backend {
            sender: Mutex::new(Some(tx)),
            writer: Mutex::new(Some(writer)),
            dropped: AtomicU64::new(0),
        }))
    }

    /// Queues `event` without waiting.
    pub fn process(&self, event: Event) {
        let guard = self.sender.locked();
        let Some(tx) = guard.as_ref() else {
            return;
        };
        if tx.try_send(event).is_err() {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                tracing::warn!(dropped = n, "the audit buffer is full; audit events were dropped");
            }
        }
    }

    /// Stops taking Events and waits until the queued ones are written.
    pub async fn shutdown(&self) {
        drop(self.sender.locked().take());
        let writer = self.writer.locked().take();
        if let Some(w) = writer {
            let _ = tokio::task::spawn_blocking(move || w.join()).await;
        }
    }
}
