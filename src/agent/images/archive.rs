//! Reading an image tarball: plain, gzip or zstd (told apart by their
//! magic bytes, never by the file name), walked entry by entry on a
//! blocking thread that hands each file's bytes and SHA-256 to the async
//! importer through a bounded channel, so a large archive is never held in
//! memory and never read twice.

use std::io::{BufReader, Cursor, Read};

use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

/// Bytes per chunk sent to containerd's content store.
const CHUNK: usize = 1 << 20;
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn detect(head: &[u8]) -> Compression {
        if head.starts_with(&GZIP_MAGIC) {
            Compression::Gzip
        } else if head.starts_with(&ZSTD_MAGIC) {
            Compression::Zstd
        } else {
            Compression::None
        }
    }
}

/// Why an archive cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("cannot read: {0}")]
    Read(#[source] std::io::Error),
    #[error("corrupt archive: {0}")]
    Corrupt(#[source] std::io::Error),
    #[error("not an image archive: empty or truncated before the first tar header")]
    Empty,
    #[error("not an image archive: not a tar file (plain, gzip or zstd compressed)")]
    NotTar,
    #[error("corrupt tar archive: {0}")]
    CorruptTar(#[source] std::io::Error),
    #[error("corrupt or truncated tar archive: {0}")]
    CorruptEntry(#[source] std::io::Error),
    #[error("{path}: corrupt tar header: {source}")]
    CorruptHeader { path: String, source: std::io::Error },
    #[error("{path}: truncated or corrupt archive: {source}")]
    CorruptFile { path: String, source: std::io::Error },
    #[error("{path}: truncated archive: {read} of {size} bytes")]
    Truncated { path: String, read: u64, size: u64 },
    /// The importer went away (it failed and said why).
    #[error("import stopped")]
    Stopped,
}

/// What the reader thread reports, in archive order.
#[derive(Debug)]
pub enum Event {
    /// A regular file starts; `Data` chunks and one `End` follow.
    File {
        path: String,
        size: u64,
    },
    Data(Vec<u8>),
    /// The file's bytes are all sent; their SHA-256 digest.
    End {
        digest: String,
    },
    /// A symlink or hard link, with its target as an archive path.
    Link {
        path: String,
        target: String,
    },
}

/// Reads `reader` on a blocking thread. The channel yields the events, an
/// error (then nothing more), and closes at the end of the archive.
pub fn spawn_reader<R: Read + Send + 'static>(reader: R) -> mpsc::Receiver<Result<Event, ArchiveError>> {
    let (tx, rx) = mpsc::channel(4);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = read_archive(reader, &tx) {
            let _ = tx.blocking_send(Err(e));
        }
    });
    rx
}

/// The archive's tar stream, decompressed as its first bytes say.
pub fn decompressed<R: Read + Send + 'static>(mut reader: R) -> Result<Box<dyn Read + Send>, ArchiveError> {
    let mut magic = Vec::with_capacity(4);
    (&mut reader).take(4).read_to_end(&mut magic).map_err(ArchiveError::Read)?;
    let compression = Compression::detect(&magic);
    let source = BufReader::with_capacity(CHUNK, Cursor::new(magic).chain(reader));
    Ok(match compression {
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(source)),
        Compression::Zstd => Box::new(ZstdFrames::new(source)),
        Compression::None => Box::new(source),
    })
}

fn read_archive<R: Read + Send + 'static>(
    reader: R,
    tx: &mpsc::Sender<Result<Event, ArchiveError>>,
) -> Result<(), ArchiveError> {
    let mut stream = decompressed(reader)?;
    // The first header block, to say "not a tar archive" rather than a checksum error.
    let mut first = Vec::with_capacity(512);
    (&mut stream).take(512).read_to_end(&mut first).map_err(ArchiveError::Corrupt)?;
    if first.len() < 512 {
        return Err(ArchiveError::Empty);
    }
    if &first[257..262] != b"ustar" {
        return Err(ArchiveError::NotTar);
    }
    let mut archive = tar::Archive::new(Cursor::new(first).chain(stream));
    let entries = archive.entries().map_err(ArchiveError::CorruptTar)?;
    for entry in entries {
        let mut entry = entry.map_err(ArchiveError::CorruptEntry)?;
        let path = clean_path(&String::from_utf8_lossy(&entry.path_bytes()));
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            let Some(link) = entry.link_name_bytes() else { continue };
            let link = String::from_utf8_lossy(&link).into_owned();
            let target = if kind.is_symlink() { resolve_symlink(&path, &link) } else { clean_path(&link) };
            send(tx, Event::Link { path, target })?;
            continue;
        }
        if !(kind.is_file() || kind == tar::EntryType::Continuous) {
            continue;
        }
        let size =
            entry.header().size().map_err(|source| ArchiveError::CorruptHeader { path: path.clone(), source })?;
        send(tx, Event::File { path: path.clone(), size })?;
        let mut hasher = Sha256::new();
        let mut read: u64 = 0;
        loop {
            let mut buf = vec![0u8; CHUNK];
            let mut filled = 0;
            while filled < CHUNK {
                match entry.read(&mut buf[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(source) => return Err(ArchiveError::CorruptFile { path, source }),
                }
            }
            if filled == 0 {
                break;
            }
            buf.truncate(filled);
            hasher.update(&buf);
            read += filled as u64;
            send(tx, Event::Data(buf))?;
        }
        if read != size {
            return Err(ArchiveError::Truncated { path, read, size });
        }
        send(tx, Event::End { digest: format!("sha256:{}", super::oci::hex(&hasher.finalize())) })?;
    }
    Ok(())
}

fn send(tx: &mpsc::Sender<Result<Event, ArchiveError>>, event: Event) -> Result<(), ArchiveError> {
    // The importer went away (it failed and said why): stop quietly.
    tx.blocking_send(Ok(event)).map_err(|_| ArchiveError::Stopped)
}

/// `./a//b/` → `a/b`; `..` and `.` components resolved, never above the root.
pub fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join("/")
}

fn resolve_symlink(path: &str, target: &str) -> String {
    if target.starts_with('/') {
        return clean_path(target);
    }
    let dir = path.rsplit_once('/').map(|(d, _)| d).unwrap_or("");
    clean_path(&format!("{dir}/{target}"))
}

/// A zstd stream of one or more frames; skippable frames (pzstd writes
/// them) are stepped over.
struct ZstdFrames<R: Read> {
    state: Option<ZstdState<R>>,
}

enum ZstdState<R: Read> {
    Between(Peek<R>),
    InFrame(Box<ruzstd::decoding::StreamingDecoder<Peek<R>, ruzstd::decoding::FrameDecoder>>),
}

/// A reader that can look at its next bytes without consuming them.
struct Peek<R> {
    inner: R,
    ahead: Vec<u8>,
}

impl<R: Read> Peek<R> {
    fn peek(&mut self, n: usize) -> std::io::Result<&[u8]> {
        if self.ahead.len() < n {
            let want = n - self.ahead.len();
            (&mut self.inner).take(want as u64).read_to_end(&mut self.ahead)?;
        }
        Ok(&self.ahead[..self.ahead.len().min(n)])
    }
}

impl<R: Read> Read for Peek<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.ahead.is_empty() {
            return self.inner.read(buf);
        }
        let n = buf.len().min(self.ahead.len());
        buf[..n].copy_from_slice(&self.ahead[..n]);
        self.ahead.drain(..n);
        Ok(n)
    }
}

impl<R: Read> ZstdFrames<R> {
    fn new(inner: R) -> Self {
        ZstdFrames { state: Some(ZstdState::Between(Peek { inner, ahead: Vec::new() })) }
    }
}

impl<R: Read> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            match self.state.take() {
                None => return Ok(0),
                Some(ZstdState::InFrame(mut dec)) => {
                    let n = dec.read(buf)?;
                    if n > 0 || buf.is_empty() {
                        self.state = Some(ZstdState::InFrame(dec));
                        return Ok(n);
                    }
                    self.state = Some(ZstdState::Between(dec.into_inner()));
                }
                Some(ZstdState::Between(mut inner)) => {
                    let head = inner.peek(8)?;
                    if head.is_empty() {
                        return Ok(0);
                    }
                    if head.len() == 8 {
                        let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
                        if (0x184D_2A50..=0x184D_2A5F).contains(&magic) {
                            let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as u64;
                            let skipped = std::io::copy(&mut (&mut inner).take(8 + len), &mut std::io::sink())?;
                            if skipped != 8 + len {
                                return Err(std::io::Error::new(
                                    std::io::ErrorKind::UnexpectedEof,
                                    "zstd: truncated skippable frame",
                                ));
                            }
                            self.state = Some(ZstdState::Between(inner));
                            continue;
                        }
                    }
                    match ruzstd::decoding::StreamingDecoder::new(inner) {
                        Ok(dec) => self.state = Some(ZstdState::InFrame(Box::new(dec))),
                        Err(e) => return Err(std::io::Error::other(format!("zstd: {e}"))),
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compression_is_told_by_magic() {
        assert_eq!(Compression::detect(&[0x1f, 0x8b, 8, 0]), Compression::Gzip);
        assert_eq!(Compression::detect(&[0x28, 0xb5, 0x2f, 0xfd]), Compression::Zstd);
        assert_eq!(Compression::detect(b"ustar"), Compression::None);
        assert_eq!(Compression::detect(&[]), Compression::None);
    }

    #[test]
    fn paths_are_cleaned_and_links_resolved() {
        assert_eq!(clean_path("./blobs//sha256/ab/"), "blobs/sha256/ab");
        assert_eq!(resolve_symlink("abc/layer.tar", "../def/layer.tar"), "def/layer.tar");
        assert_eq!(resolve_symlink("abc/layer.tar", "/x/y"), "x/y");
        assert_eq!(clean_path("../../etc"), "etc");
    }

    fn tarball(files: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in files {
            let mut h = tar::Header::new_ustar();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    fn read_all(data: Vec<u8>) -> Result<Vec<(String, Vec<u8>, String)>, ArchiveError> {
        let mut out = Vec::new();
        let (tx, mut rx) = mpsc::channel(1024);
        std::thread::spawn(move || {
            if let Err(e) = read_archive(Cursor::new(data), &tx) {
                let _ = tx.blocking_send(Err(e));
            }
        });
        let mut cur: Option<(String, Vec<u8>)> = None;
        while let Some(ev) = rx.blocking_recv() {
            match ev? {
                Event::File { path, .. } => cur = Some((path, Vec::new())),
                Event::Data(d) => cur.as_mut().unwrap().1.extend(d),
                Event::End { digest } => {
                    let (p, d) = cur.take().unwrap();
                    out.push((p, d, digest));
                }
                Event::Link { .. } => {}
            }
        }
        Ok(out)
    }

    #[test]
    fn plain_and_gzip_archives_read_alike() {
        let tar = tarball(&[("index.json", b"{}"), ("blobs/sha256/x", b"hello")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        let gz = gz.finish().unwrap();
        for data in [tar.clone(), gz] {
            let files = read_all(data).unwrap();
            assert_eq!(files.len(), 2);
            assert_eq!(files[1].0, "blobs/sha256/x");
            assert_eq!(files[1].1, b"hello");
            assert_eq!(files[1].2, super::super::oci::sha256_digest(b"hello"));
        }
    }

    #[test]
    fn garbage_and_truncation_are_reported() {
        let err = read_all(vec![7u8; 2000]).unwrap_err().to_string();
        assert!(err.contains("not a tar file"), "{err}");
        let tar = tarball(&[("big", &[1u8; 5000])]);
        let err = read_all(tar[..2048].to_vec()).unwrap_err().to_string();
        assert!(err.contains("truncated"), "{err}");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        let gz = gz.finish().unwrap();
        let err = read_all(gz[..gz.len() - 20].to_vec()).unwrap_err().to_string();
        assert!(err.contains("truncated") || err.contains("corrupt"), "{err}");
    }
}
