use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

use super::*;

fn opts() -> LogOptions {
    LogOptions::default()
}

/// Runs the whole reader over a log folder and returns what a client got.
async fn read_all(live: &Path, o: LogOptions, running: Running) -> String {
    let (tx, mut rx) = mpsc::channel(16);
    let file = File::open(live).unwrap();
    let task = tokio::spawn(stream_logs(live.to_path_buf(), file, o, tx, running));
    let mut out = Vec::new();
    while let Some(chunk) = rx.recv().await {
        out.extend_from_slice(&chunk.unwrap());
    }
    task.await.unwrap();
    String::from_utf8(out).unwrap()
}

fn stopped() -> Running {
    Arc::new(|| Box::pin(async { false }))
}

fn line(ts: &str, stream: &str, tag: &str, text: &str) -> String {
    format!("2026-11-24T04:00:{ts}Z {stream} {tag} {text}\n")
}

#[test]
fn cri_lines_parse() {
    let l = parse_cri_line(b"2026-11-24T04:00:00.123456789Z stdout F hello world\n").unwrap();
    assert_eq!(l.timestamp, b"2026-11-24T04:00:00.123456789Z");
    assert_eq!(l.stream, b"stdout");
    assert!(!l.partial);
    assert_eq!(l.log, b"hello world\n");
    let p = parse_cri_line(b"2026-11-24T04:00:00Z stderr P:more part\n").unwrap();
    assert!(p.partial);
    assert_eq!(p.log, b"part");
    assert_eq!(parse_cri_line(b"2026-11-24T04:00:00Z stdin F x\n"), None);
    assert_eq!(parse_cri_line(b"garbage\n"), None);
}

#[test]
fn partial_lines_join_and_take_one_timestamp() {
    let mut w = LogWriter::new(LogOptions { timestamps: true, ..opts() });
    let a = w.write(line("01", "stdout", "P", "hel").as_bytes());
    let b = w.write(line("02", "stdout", "F", "lo").as_bytes());
    assert_eq!(a, Written::More(b"2026-11-24T04:00:01Z hel".to_vec()));
    assert_eq!(b, Written::More(b"lo\n".to_vec()));
}

#[test]
fn limit_bytes_cuts_a_line() {
    let mut w = LogWriter::new(LogOptions { bytes: Some(8), ..opts() });
    assert_eq!(w.write(line("01", "stdout", "F", "abc").as_bytes()), Written::More(b"abc\n".to_vec()));
    assert_eq!(w.write(line("02", "stdout", "F", "defghij").as_bytes()), Written::Last(b"defg".to_vec()));
}

#[test]
fn since_skips_older_lines() {
    let since = "2026-11-24T04:00:02Z".parse().ok();
    let mut w = LogWriter::new(LogOptions { since, ..opts() });
    assert_eq!(w.write(line("01", "stdout", "F", "old").as_bytes()), Written::More(vec![]));
    assert_eq!(w.write(line("02", "stderr", "F", "new").as_bytes()), Written::More(b"new\n".to_vec()));
}

#[test]
fn tail_start_counts_complete_lines() {
    let data = b"a\nb\nc\n";
    assert_eq!(tail_start(data, 0), Ok(6));
    assert_eq!(tail_start(data, 2), Ok(2));
    assert_eq!(tail_start(data, 3), Err(3));
    // An unfinished last line does not count.
    assert_eq!(tail_start(b"a\nb\nc", 1), Ok(2));
}

#[test]
fn tail_in_a_file_crosses_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("0.log");
    let text: String = (0..20000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&p, &text).unwrap();
    let mut f = File::open(&p).unwrap();
    let at = tail_start_in_file(&mut f, 15000).unwrap().unwrap();
    assert!(text[at as usize..].starts_with("line 5000\n"));
    assert_eq!(tail_start_in_file(&mut f, 30000).unwrap(), Err(20000));
}

/// A live log with two rotated files before it, the older gzipped.
fn rotated_folder() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("0.log");
    let gz = dir.path().join("0.log.20261124-040000.gz");
    let mut enc = flate2::write::GzEncoder::new(File::create(&gz).unwrap(), flate2::Compression::default());
    enc.write_all((line("00", "stdout", "F", "one") + &line("01", "stdout", "P", "tw")).as_bytes()).unwrap();
    enc.finish().unwrap();
    std::fs::write(
        dir.path().join("0.log.20261124-040010"),
        line("02", "stdout", "F", "o") + &line("03", "stderr", "F", "three"),
    )
    .unwrap();
    std::fs::write(&live, line("04", "stdout", "F", "four") + &line("05", "stdout", "F", "five")).unwrap();
    // A half-written compression is not read.
    std::fs::write(dir.path().join("0.log.20261124-040010.gz.tmp"), "junk").unwrap();
    (dir, live)
}

#[tokio::test]
async fn rotated_and_gzipped_files_are_read_in_order() {
    let (_dir, live) = rotated_folder();
    assert_eq!(read_all(&live, opts(), stopped()).await, "one\ntwo\nthree\nfour\nfive\n");
    let tail = |n| LogOptions { tail: Some(n), ..opts() };
    assert_eq!(read_all(&live, tail(1), stopped()).await, "five\n");
    assert_eq!(read_all(&live, tail(3), stopped()).await, "three\nfour\nfive\n");
    // The tail counts file lines: a joined line may come out in part.
    assert_eq!(read_all(&live, tail(4), stopped()).await, "o\nthree\nfour\nfive\n");
    assert_eq!(read_all(&live, tail(0), stopped()).await, "");
    assert_eq!(read_all(&live, tail(100), stopped()).await, "one\ntwo\nthree\nfour\nfive\n");
    let limited = LogOptions { bytes: Some(10), ..opts() };
    assert_eq!(read_all(&live, limited, stopped()).await, "one\ntwo\nth");
    let since = LogOptions { since: "2026-11-24T04:00:03Z".parse().ok(), timestamps: true, ..opts() };
    assert_eq!(
        read_all(&live, since, stopped()).await,
        "2026-11-24T04:00:03Z three\n2026-11-24T04:00:04Z four\n2026-11-24T04:00:05Z five\n"
    );
}

/// The next chunk a follower sends, failing rather than waiting for ever.
async fn next(rx: &mut mpsc::Receiver<io::Result<Bytes>>) -> Bytes {
    tokio::time::timeout(Duration::from_secs(10), rx.recv())
        .await
        .expect("the follower sent nothing for 10 s")
        .expect("the follower ended")
        .expect("the follower failed")
}

#[tokio::test]
async fn following_survives_a_rotation_and_ends_with_the_container() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("0.log");
    std::fs::write(&live, line("00", "stdout", "F", "before")).unwrap();
    let alive = Arc::new(AtomicBool::new(true));
    let flag = alive.clone();
    let running: Running = Arc::new(move || {
        let flag = flag.clone();
        Box::pin(async move { flag.load(Ordering::SeqCst) })
    });
    let (tx, mut rx) = mpsc::channel(16);
    let o = LogOptions { follow: true, tail: Some(10), ..opts() };
    let task = tokio::spawn(stream_logs(live.clone(), File::open(&live).unwrap(), o, tx, running));
    assert_eq!(&next(&mut rx).await[..], b"before\n");
    // Written in two pieces: nothing is sent until the line is whole.
    let mut f = std::fs::OpenOptions::new().append(true).open(&live).unwrap();
    f.write_all(b"2026-11-24T04:00:01Z stdout F gro").unwrap();
    f.flush().unwrap();
    tokio::time::sleep(FOLLOW_POLL * 2).await;
    f.write_all(b"wing\n").unwrap();
    assert_eq!(&next(&mut rx).await[..], b"growing\n");
    // Rotation: the old file gets one more line, then a new one starts.
    let rotated = dir.path().join("0.log.20261124-040001");
    std::fs::rename(&live, &rotated).unwrap();
    f.write_all(line("02", "stdout", "F", "last of old").as_bytes()).unwrap();
    std::fs::write(&live, line("03", "stdout", "F", "first of new")).unwrap();
    assert_eq!(&next(&mut rx).await[..], b"last of old\n");
    assert_eq!(&next(&mut rx).await[..], b"first of new\n");
    alive.store(false, Ordering::SeqCst);
    let rest = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("the follower ends");
    assert!(rest.is_none(), "{rest:?}");
    task.await.unwrap();
}

#[tokio::test]
async fn following_a_stopped_container_ends_at_the_end_of_its_log() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("0.log");
    std::fs::write(&live, line("00", "stdout", "F", "done")).unwrap();
    let o = LogOptions { follow: true, ..opts() };
    let got = tokio::time::timeout(Duration::from_secs(2), read_all(&live, o, stopped())).await.unwrap();
    assert_eq!(got, "done\n");
}
