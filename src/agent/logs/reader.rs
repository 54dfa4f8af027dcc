//! Reading a container's CRI log files (upstream's `kuberuntime/logs`):
//! each line is `<RFC3339Nano> stdout|stderr F|P <text>`; `P` lines are
//! pieces of a longer line and are written without their newline, so the
//! reader joins them. The rotated files (`<log>.<YYYYMMDD-hhmmss>`, older
//! ones gzipped) come before the live one, oldest first. `tail` counts
//! file lines from the end across them, `since` skips older lines, and
//! `bytes` cuts the output (timestamps included) at its limit.
//!
//! Following polls the open file while a follower is connected (nothing
//! polls otherwise): new bytes are sent as they come, a rotation (the
//! path now names another file) is noticed by its inode, the rest of the
//! old file drained and the new one read from its start, and the stream
//! ends once the container is no longer running and the file is drained.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures_util::future::BoxFuture;
use k8s_openapi::jiff::Timestamp;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc;

use super::options::LogOptions;

/// How often a follower looks at its file.
const FOLLOW_POLL: Duration = Duration::from_millis(250);
/// How often a follower asks whether the container still runs.
const STATE_CHECK: Duration = Duration::from_secs(1);

/// One parsed CRI log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine<'a> {
    pub timestamp: &'a [u8],
    pub stream: &'a [u8],
    pub partial: bool,
    /// The text, with its newline unless partial.
    pub log: &'a [u8],
}

/// `parseCRILog`: `None` for a line that is not in the CRI format.
pub fn parse_cri_line(line: &[u8]) -> Option<LogLine<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let timestamp = parts.next()?;
    let stream = parts.next()?;
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let tag = parts.next()?;
    let mut log = parts.next()?;
    // Tags may carry more fields after ':'; the first says partial or full.
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    if partial && log.last() == Some(&b'\n') {
        log = &log[..log.len() - 1];
    }
    Some(LogLine { timestamp, stream, partial, log })
}

/// Turns CRI lines into the bytes a client gets.
#[derive(Debug, Clone)]
pub struct LogWriter {
    opts: LogOptions,
    remain: Option<u64>,
    /// Whether the next text begins a line (gets a timestamp).
    new_line: bool,
}

/// What writing a line gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Written {
    /// Bytes to send (maybe none); more may follow.
    More(Vec<u8>),
    /// The last bytes to send: the byte limit is reached.
    Last(Vec<u8>),
}

impl LogWriter {
    pub fn new(opts: LogOptions) -> LogWriter {
        LogWriter { opts, remain: opts.bytes, new_line: true }
    }

    /// One raw file line (with its `\n` if it has one).
    pub fn write(&mut self, raw: &[u8]) -> Written {
        let Some(line) = parse_cri_line(raw) else {
            tracing::debug!(line = %String::from_utf8_lossy(raw), "skipping a log line not in the CRI format");
            return Written::More(Vec::new());
        };
        if let Some(since) = self.opts.since {
            let ts = std::str::from_utf8(line.timestamp).ok().and_then(|t| t.parse::<Timestamp>().ok());
            match ts {
                Some(ts) if ts < since => return Written::More(Vec::new()),
                Some(_) => {}
                None => return Written::More(Vec::new()),
            }
        }
        let mut out = Vec::with_capacity(line.log.len() + 32);
        if self.opts.timestamps && self.new_line {
            out.extend_from_slice(line.timestamp);
            out.push(b' ');
        }
        out.extend_from_slice(line.log);
        self.new_line = !line.partial;
        match self.remain {
            None => Written::More(out),
            Some(remain) => {
                if out.len() as u64 >= remain {
                    out.truncate(remain as usize);
                    self.remain = Some(0);
                    Written::Last(out)
                } else {
                    self.remain = Some(remain - out.len() as u64);
                    Written::More(out)
                }
            }
        }
    }
}

/// The rotated files of a live log, oldest first (finished ones only).
pub fn rotated_logs(live: &Path) -> Vec<PathBuf> {
    let all = super::rotation::rotated_files(live).unwrap_or_default();
    let (_, kept) = super::rotation::unused_logs(&all);
    kept
}

fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "gz")
}

/// Where the last `n` complete lines of `data` start, or how many
/// complete lines it has when fewer than `n` (`FindTailLineStartIndex`:
/// an unfinished last line is not counted).
fn tail_start(data: &[u8], n: u64) -> Result<usize, u64> {
    let mut seen = 0u64;
    for (i, b) in data.iter().enumerate().rev() {
        if *b == b'\n' {
            if seen == n {
                return Ok(i + 1);
            }
            seen += 1;
        }
    }
    Err(seen)
}

/// The same on a plain file, read backwards in blocks.
fn tail_start_in_file(file: &mut File, n: u64) -> io::Result<Result<u64, u64>> {
    const BLOCK: u64 = 64 * 1024;
    let len = file.metadata()?.len();
    let mut seen = 0u64;
    let mut end = len;
    let mut buf = vec![0u8; BLOCK as usize];
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let chunk = &mut buf[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(chunk)?;
        match tail_start(chunk, n - seen) {
            Ok(i) => return Ok(Ok(start + i as u64)),
            Err(c) => seen += c,
        }
        end = start;
    }
    Ok(Err(seen))
}

/// A rotated file's bytes (gzipped ones inflated).
fn read_rotated(path: &Path) -> io::Result<Vec<u8>> {
    let mut data = Vec::new();
    let f = File::open(path)?;
    if is_gzip(path) {
        flate2::read::GzDecoder::new(f).read_to_end(&mut data)?;
    } else {
        io::BufReader::new(f).read_to_end(&mut data)?;
    }
    Ok(data)
}

/// Sends bytes to the client; false once it has gone.
pub type Sink = mpsc::Sender<io::Result<Bytes>>;

/// Feeds complete lines of `data` to the writer; returns the unfinished
/// rest, or `None` once the output is over (limit or client gone).
fn feed_blocking<'a>(data: &'a [u8], writer: &mut LogWriter, sink: &Sink) -> Option<&'a [u8]> {
    let mut rest = data;
    while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
        let (line, after) = rest.split_at(nl + 1);
        rest = after;
        let (bytes, last) = match writer.write(line) {
            Written::More(b) => (b, false),
            Written::Last(b) => (b, true),
        };
        if !bytes.is_empty() && sink.blocking_send(Ok(Bytes::from(bytes))).is_err() {
            return None;
        }
        if last {
            return None;
        }
    }
    Some(rest)
}

/// Where the reading stands after the history: the live file at its end
/// and a line begun there.
pub struct Position {
    pub file: File,
    pub pending: Vec<u8>,
}

/// Reads the rotated files and the live one up to its end (blocking).
/// Returns the position to follow from, or `None` when the output is over.
pub fn read_history(
    live_path: &Path,
    mut live: File,
    writer: &mut LogWriter,
    sink: &Sink,
) -> io::Result<Option<Position>> {
    let rotated = rotated_logs(live_path);
    // Which rotated file to start in, and where; or where in the live one.
    let mut first_rotated = rotated.len();
    let mut rotated_start = 0usize;
    let mut live_start = 0u64;
    let mut loaded: Vec<Option<Vec<u8>>> = vec![None; rotated.len()];
    if let Some(n) = writer.opts.tail {
        match tail_start_in_file(&mut live, n)? {
            Ok(at) => live_start = at,
            Err(seen) => {
                let mut need = n - seen;
                first_rotated = 0;
                for i in (0..rotated.len()).rev() {
                    let data = read_rotated(&rotated[i])?;
                    let found = tail_start(&data, need);
                    loaded[i] = Some(data);
                    match found {
                        Ok(at) => {
                            first_rotated = i;
                            rotated_start = at;
                            break;
                        }
                        Err(c) => need -= c,
                    }
                }
            }
        }
    } else {
        first_rotated = 0;
    }
    for i in first_rotated..rotated.len() {
        let data = match loaded[i].take() {
            Some(d) => d,
            None => read_rotated(&rotated[i])?,
        };
        let from = if i == first_rotated { rotated_start } else { 0 };
        let Some(rest) = feed_blocking(&data[from.min(data.len())..], writer, sink) else { return Ok(None) };
        // A rotated file ends with a whole line; an unfinished one is its own.
        if !rest.is_empty() && feed_blocking(&[rest, b"\n"].concat(), writer, sink).is_none() {
            return Ok(None);
        }
    }
    live.seek(SeekFrom::Start(live_start))?;
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = live.read(&mut buf)?;
        if n == 0 {
            break;
        }
        pending.extend_from_slice(&buf[..n]);
        let Some(rest) = feed_blocking(&pending, writer, sink) else { return Ok(None) };
        pending = rest.to_vec();
    }
    if !writer.opts.follow {
        // Not following: an unfinished last line is shown as it is.
        if !pending.is_empty() {
            let _ = feed_blocking(&[&pending[..], b"\n"].concat(), writer, sink);
        }
        return Ok(None);
    }
    Ok(Some(Position { file: live, pending }))
}

/// Whether the container still runs (asked of the runtime).
pub type Running = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

async fn feed(pending: &mut Vec<u8>, writer: &mut LogWriter, sink: &Sink) -> bool {
    let mut start = 0;
    while let Some(nl) = pending[start..].iter().position(|b| *b == b'\n') {
        let line = &pending[start..start + nl + 1];
        start += nl + 1;
        let (bytes, last) = match writer.write(line) {
            Written::More(b) => (b, false),
            Written::Last(b) => (b, true),
        };
        if !bytes.is_empty() && sink.send(Ok(Bytes::from(bytes))).await.is_err() {
            return false;
        }
        if last {
            return false;
        }
    }
    pending.drain(..start);
    true
}

/// Reads what the file has now; false once the output is over.
async fn drain(
    file: &mut tokio::fs::File,
    pending: &mut Vec<u8>,
    writer: &mut LogWriter,
    sink: &Sink,
) -> io::Result<bool> {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf).await?;
        if n == 0 {
            return Ok(true);
        }
        pending.extend_from_slice(&buf[..n]);
        if !feed(pending, writer, sink).await {
            return Ok(false);
        }
    }
}

/// `drain`, an error sent to the client; whether following goes on.
async fn drain_or_report(
    file: &mut tokio::fs::File,
    pending: &mut Vec<u8>,
    writer: &mut LogWriter,
    sink: &Sink,
) -> bool {
    match drain(file, pending, writer, sink).await {
        Ok(go_on) => go_on,
        Err(e) => {
            let _ = sink.send(Err(e)).await;
            false
        }
    }
}

/// Follows the live log from `pos` until the container stops running,
/// the client goes, or the byte limit is reached.
pub async fn follow(path: PathBuf, pos: Position, mut writer: LogWriter, sink: Sink, running: Running) {
    let Position { file, mut pending } = pos;
    let mut inode = file.metadata().map(|m| m.ino()).ok();
    let mut file = tokio::fs::File::from_std(file);
    // The first look at the container is at the first end of file.
    let mut last_check: Option<Instant> = None;
    loop {
        if !drain_or_report(&mut file, &mut pending, &mut writer, &sink).await {
            return;
        }
        // Rotated: the rest of the old file is read; the new one from its start.
        let now_inode = tokio::fs::metadata(&path).await.map(|m| m.ino()).ok();
        if now_inode.is_some() && now_inode != inode {
            match tokio::fs::File::open(&path).await {
                Ok(f) => {
                    // Lines the runtime wrote to the old file after the drain
                    // above and before it reopened the log: the new file's
                    // existence means the old one is finished.
                    if !drain_or_report(&mut file, &mut pending, &mut writer, &sink).await {
                        return;
                    }
                    tracing::debug!(log = %path.display(), "log rotated; following the new file");
                    file = f;
                    inode = now_inode;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let _ = sink.send(Err(e)).await;
                    return;
                }
            }
        }
        if last_check.is_none_or(|t| t.elapsed() >= STATE_CHECK) {
            last_check = Some(Instant::now());
            if !running().await {
                // What was written before the exit is still read.
                let _ = drain(&mut file, &mut pending, &mut writer, &sink).await;
                return;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = sink.closed() => return,
        }
    }
}

/// Streams a container's log into `sink`: the history on a blocking
/// thread, then, when following, the live file.
pub async fn stream_logs(path: PathBuf, live: File, opts: LogOptions, sink: Sink, running: Running) {
    let mut writer = LogWriter::new(opts);
    let (p, s) = (path.clone(), sink.clone());
    let history = tokio::task::spawn_blocking(move || {
        let pos = read_history(&p, live, &mut writer, &s);
        (pos, writer)
    })
    .await;
    match history {
        Ok((Ok(Some(pos)), writer)) => follow(path, pos, writer, sink, running).await,
        Ok((Ok(None), _)) => {}
        Ok((Err(e), _)) => {
            let _ = sink.send(Err(e)).await;
        }
        Err(e) => {
            let _ = sink.send(Err(io::Error::other(e))).await;
        }
    }
}

#[cfg(test)]
#[path = "reader_tests.rs"]
mod tests;
