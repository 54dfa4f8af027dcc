//! The single writer of ferrok's nftables table. Each part of the node
//! (the node's masquerade, the service proxy, network policies) owns its
//! own chains, sets and maps in the table and hands the writer two kinds of
//! text: a *full* rendering that declares all of its objects from scratch,
//! and *updates* (nft commands that change only what changed). The writer
//! - at start, waits until every registered part has rendered itself (or a
//!   short deadline passes) and loads the whole table in one transaction;
//! - afterwards, applies updates, coalescing whatever is queued into one
//!   transaction, and falling back to one transaction per update when a
//!   batch is refused, so one part's mistake does not hold up another's;
//! - when a part renders itself in full again (after a refused update, say),
//!   asks every *other* part for a fresh rendering and replaces the whole
//!   table atomically, since nothing else is known to be in step. The part
//!   that asked is not asked back: its rendering is the fresh one, and a
//!   part asked by its own rendering would answer with another one, which
//!   would ask again, reloading the table every [`RESYNC_WAIT`] forever.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::NftError;

/// How long the first load waits for the parts that have not rendered yet.
const START_WAIT: Duration = Duration::from_millis(if cfg!(test) { 300 } else { 3000 });
/// How long a reload waits for the other parts' fresh renderings.
const RESYNC_WAIT: Duration = Duration::from_secs(2);

type Done = oneshot::Sender<Result<(), NftError>>;

enum Request {
    Register(&'static str, watch::Sender<u64>),
    Full { part: &'static str, gen: u64, text: String, done: Done },
    Update { part: &'static str, text: String, done: Done },
}

/// Where transactions go: `nft -f` for real, a recorder in tests.
#[async_trait::async_trait]
pub trait Apply: Send + 'static {
    async fn apply(&mut self, transaction: &str) -> Result<(), NftError>;
}

struct Nft;

#[async_trait::async_trait]
impl Apply for Nft {
    async fn apply(&mut self, transaction: &str) -> Result<(), NftError> {
        super::load(transaction).await
    }
}

/// The handle parts are registered through.
#[derive(Clone)]
pub struct TableWriter {
    tx: mpsc::UnboundedSender<Request>,
}

/// One part's way to the table.
pub struct Part {
    name: &'static str,
    tx: mpsc::UnboundedSender<Request>,
    resync: watch::Receiver<u64>,
}

impl TableWriter {
    /// Starts the writer over `nft`. Register every part that belongs in the
    /// first load right away, before yielding to the runtime.
    pub fn start() -> TableWriter {
        Self::start_with(Nft)
    }

    pub fn start_with(apply: impl Apply) -> TableWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        let writer = Writer { apply, parts: BTreeMap::new(), gen: 0, loaded: false, wait: None };
        tokio::spawn(writer.run(rx));
        TableWriter { tx }
    }

    pub fn part(&self, name: &'static str) -> Part {
        let (resync_tx, resync) = watch::channel(0);
        let _ = self.tx.send(Request::Register(name, resync_tx));
        Part { name, tx: self.tx.clone(), resync }
    }
}

impl Part {
    /// Declares all of this part's objects from scratch.
    pub async fn full(&self, text: String) -> Result<(), NftError> {
        let gen = *self.resync.borrow();
        self.send(|done| Request::Full { part: self.name, gen, text, done }).await
    }

    /// Changes some of this part's objects.
    pub async fn update(&self, text: String) -> Result<(), NftError> {
        self.send(|done| Request::Update { part: self.name, text, done }).await
    }

    /// Changes when the writer wants a full rendering from this part.
    pub fn resync_requests(&self) -> watch::Receiver<u64> {
        let mut rx = self.resync.clone();
        rx.mark_unchanged();
        rx
    }

    async fn send(&self, make: impl FnOnce(Done) -> Request) -> Result<(), NftError> {
        let (done, rx) = oneshot::channel();
        self.tx.send(make(done)).map_err(|_| NftError::Stopped)?;
        rx.await.map_err(|_| NftError::Stopped)?
    }
}

struct PartState {
    /// The latest full rendering, and the resync generation it answers.
    full: Option<(String, u64)>,
    /// Whether the table holds this part's objects.
    loaded: bool,
    /// Where this part is asked for a rendering of a newer generation.
    resync: watch::Sender<u64>,
}

/// A whole-table load being prepared: the parts' renderings are awaited.
struct Wait {
    deadline: Instant,
    /// Full renderings to acknowledge once the table is loaded.
    fulls: Vec<Done>,
    /// Updates that came after their part's full rendering, applied after it.
    updates: Vec<(&'static str, String, Done)>,
}

struct Writer<A> {
    apply: A,
    parts: BTreeMap<&'static str, PartState>,
    /// The resync generation every part's rendering must answer.
    gen: u64,
    /// Whether the first whole-table load has happened.
    loaded: bool,
    wait: Option<Wait>,
}

impl<A: Apply> Writer<A> {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Request>) {
        loop {
            let msg = match self.wait.as_ref().map(|w| w.deadline) {
                Some(deadline) => tokio::select! {
                    m = rx.recv() => m,
                    _ = tokio::time::sleep_until(deadline) => {
                        self.reload().await;
                        continue;
                    }
                },
                None => rx.recv().await,
            };
            let Some(first) = msg else { return };
            let mut updates = Vec::new();
            self.handle(first, &mut updates).await;
            while let Ok(m) = rx.try_recv() {
                self.handle(m, &mut updates).await;
            }
            if self.wait.as_ref().is_some_and(|_| self.all_rendered()) {
                self.reload().await;
            }
            self.apply_updates(updates).await;
        }
    }

    async fn handle(&mut self, msg: Request, updates: &mut Vec<(&'static str, String, Done)>) {
        match msg {
            Request::Register(name, resync) => {
                // One registered after a resync (none do today) starts in step.
                resync.send_if_modified(|g| std::mem::replace(g, self.gen) != self.gen);
                self.parts.insert(name, PartState { full: None, loaded: false, resync });
                if !self.loaded && self.wait.is_none() {
                    self.wait =
                        Some(Wait { deadline: Instant::now() + START_WAIT, fulls: Vec::new(), updates: Vec::new() });
                }
            }
            Request::Full { part, gen, text, done } => {
                let Some(state) = self.parts.get_mut(part) else {
                    let _ = done.send(Err(NftError::Stopped));
                    return;
                };
                if let Some(wait) = &mut self.wait {
                    // A later rendering answers at least what the part's
                    // earlier one did (the part is not told of the
                    // generation its own rendering started).
                    let answered = state.full.as_ref().map_or(0, |(_, g)| *g);
                    state.full = Some((text, gen.max(answered)));
                    // Its earlier updates are part of this rendering.
                    for (_, _, d) in wait.updates.extract_if(.., |(p, _, _)| *p == part) {
                        let _ = d.send(Ok(()));
                    }
                    for (_, _, d) in updates.extract_if(.., |(p, _, _)| *p == part) {
                        let _ = d.send(Ok(()));
                    }
                    wait.fulls.push(done);
                } else if !state.loaded {
                    // A part that missed the first load only adds its objects.
                    let result = self.apply.apply(&text).await;
                    state.loaded = result.is_ok();
                    state.full = Some((text, gen));
                    let _ = done.send(result);
                } else {
                    // This rendering answers a new generation; the other
                    // parts are asked for theirs.
                    self.gen += 1;
                    state.full = Some((text, self.gen));
                    for (name, other) in &self.parts {
                        if *name != part {
                            other.resync.send_replace(self.gen);
                        }
                    }
                    for (_, _, d) in updates.extract_if(.., |(p, _, _)| *p == part) {
                        let _ = d.send(Ok(()));
                    }
                    // The other parts' queued updates wait for their fresh
                    // renderings, which acknowledge them.
                    self.wait = Some(Wait {
                        deadline: Instant::now() + RESYNC_WAIT,
                        fulls: vec![done],
                        updates: std::mem::take(updates),
                    });
                }
            }
            Request::Update { part, text, done } => match &mut self.wait {
                Some(wait) => wait.updates.push((part, text, done)),
                None => updates.push((part, text, done)),
            },
        }
    }

    /// Every registered part has answered the current resync generation.
    fn all_rendered(&self) -> bool {
        self.parts.values().all(|p| p.full.as_ref().is_some_and(|(_, g)| *g >= self.gen))
    }

    /// Replaces the whole table with the parts' latest renderings.
    async fn reload(&mut self) {
        let Some(wait) = self.wait.take() else { return };
        let mut text = super::reset_table();
        for (name, state) in &self.parts {
            match &state.full {
                Some((full, _)) => text.push_str(full),
                None => {
                    tracing::warn!(part = name, "the nftables table is loaded without this part (not rendered yet)")
                }
            }
        }
        let result = self.apply.apply(&text).await;
        match &result {
            Ok(()) => {
                self.loaded = true;
                for state in self.parts.values_mut() {
                    state.loaded = state.full.is_some();
                }
                tracing::debug!(bytes = text.len(), "nftables table loaded");
            }
            Err(e) => tracing::error!(error = %e, "cannot load ferrok's nftables table"),
        }
        for done in wait.fulls {
            let _ = done.send(result.clone());
        }
        self.apply_updates(wait.updates).await;
    }

    async fn apply_updates(&mut self, updates: Vec<(&'static str, String, Done)>) {
        if updates.is_empty() {
            return;
        }
        if updates.len() > 1 {
            let batch: String = updates.iter().map(|(_, t, _)| t.as_str()).collect::<Vec<_>>().join("\n");
            if self.apply.apply(&batch).await.is_ok() {
                for (_, _, done) in updates {
                    let _ = done.send(Ok(()));
                }
                return;
            }
        }
        for (part, text, done) in updates {
            let result = self.apply.apply(&text).await;
            if let Err(e) = &result {
                tracing::warn!(part, error = %e, "an nftables update was refused");
            }
            let _ = done.send(result);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Recorder {
        log: Arc<Mutex<Vec<String>>>,
    }

    #[async_trait::async_trait]
    impl Apply for Recorder {
        async fn apply(&mut self, transaction: &str) -> Result<(), NftError> {
            self.log.lock().unwrap().push(transaction.to_string());
            if transaction.contains("bad") {
                return Err(NftError::Refused("bad".into()));
            }
            Ok(())
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<String> {
            std::mem::take(&mut self.log.lock().unwrap())
        }
    }

    #[tokio::test]
    async fn first_load_is_one_transaction_of_every_part() {
        let rec = Recorder::default();
        let writer = TableWriter::start_with(rec.clone());
        let a = writer.part("a");
        let b = writer.part("b");
        let (ra, rb) = tokio::join!(a.full("A\n".into()), b.full("B\n".into()));
        ra.unwrap();
        rb.unwrap();
        let log = rec.take();
        assert_eq!(log.len(), 1);
        assert!(log[0].starts_with(&super::super::reset_table()));
        assert!(log[0].ends_with("A\nB\n"));
    }

    #[tokio::test]
    async fn updates_are_batched_and_a_refused_batch_is_split() {
        let rec = Recorder::default();
        let writer = TableWriter::start_with(rec.clone());
        let a = writer.part("a");
        a.full("A\n".into()).await.unwrap();
        rec.take();
        let (r1, r2) = tokio::join!(a.update("u1".into()), a.update("u2".into()));
        r1.unwrap();
        r2.unwrap();
        assert_eq!(rec.take(), ["u1\nu2"]);
        let (r1, r2) = tokio::join!(a.update("u3".into()), a.update("bad".into()));
        assert!(r1.is_ok());
        assert!(r2.is_err());
        assert_eq!(rec.take(), ["u3\nbad", "u3", "bad"]);
    }

    /// Parts a and b, loaded with their first renderings; the log emptied.
    async fn loaded_pair() -> (Recorder, Part, Part) {
        let rec = Recorder::default();
        let writer = TableWriter::start_with(rec.clone());
        let a = writer.part("a");
        let b = writer.part("b");
        let (ra, rb) = tokio::join!(a.full("A1\n".into()), b.full("B1\n".into()));
        ra.unwrap();
        rb.unwrap();
        rec.take();
        (rec, a, b)
    }

    #[tokio::test]
    async fn a_new_full_rendering_asks_every_part_and_reloads_the_table() {
        let (rec, a, b) = loaded_pair().await;
        let a_asked = a.resync_requests();
        let mut asked = b.resync_requests();
        let answer_b = async {
            asked.changed().await.unwrap();
            b.full("B2\n".into()).await
        };
        // A's rendering answers the resync it starts: the table is reloaded
        // as soon as B has answered, not when the wait for laggards ends.
        let (ra, rb) = tokio::time::timeout(RESYNC_WAIT / 2, async { tokio::join!(a.full("A2\n".into()), answer_b) })
            .await
            .expect("the reload waited for a part that had already rendered");
        ra.unwrap();
        rb.unwrap();
        let log = rec.take();
        assert_eq!(log.len(), 1);
        assert!(log[0].ends_with("A2\nB2\n"));
        // And A is not asked back (its answer would start another resync,
        // and so on forever).
        assert!(!a_asked.has_changed().unwrap(), "a part was asked to resync by its own rendering");
    }

    #[tokio::test]
    async fn a_part_rendering_again_during_its_own_resync_still_counts() {
        let (rec, a, b) = loaded_pair().await;
        let mut asked = b.resync_requests();
        let answer_b = async {
            asked.changed().await.unwrap();
            // A renders once more before B answers.
            tokio::task::yield_now().await;
            b.full("B2\n".into()).await
        };
        let again = async {
            tokio::task::yield_now().await;
            a.full("A3\n".into()).await
        };
        let (r2, r3, rb) =
            tokio::time::timeout(RESYNC_WAIT / 2, async { tokio::join!(a.full("A2\n".into()), again, answer_b) })
                .await
                .expect("the reload waited for a part that had rendered twice");
        r2.unwrap();
        r3.unwrap();
        rb.unwrap();
        let log = rec.take();
        assert_eq!(log.len(), 1, "{log:?}");
        assert!(log[0].ends_with("A3\nB2\n"));
    }

    #[tokio::test]
    async fn a_silent_part_does_not_hold_the_first_load_forever() {
        let rec = Recorder::default();
        let writer = TableWriter::start_with(rec.clone());
        let a = writer.part("a");
        let _silent = writer.part("b");
        a.full("A\n".into()).await.unwrap();
        let log = rec.take();
        assert_eq!(log.len(), 1);
        assert!(log[0].ends_with("A\n"));
        // The late part then only adds its objects.
        _silent.full("B\n".into()).await.unwrap();
        assert_eq!(rec.take(), ["B\n"]);
    }
}
