//! The node's client side towards the runtime's streaming server: CRI
//! `Exec`/`Attach` return a URL on containerd's streaming server (plain
//! HTTP on 127.0.0.1), which speaks upstream's remotecommand protocol.
//!
//! We dial it with SPDY/3.1 and `v4.channel.k8s.io`: SPDY can half-close
//! stdin (a FIN on the stdin stream closes the process' stdin, which
//! `echo hi | kubectl exec -i … cat` needs), while WebSocket v4 cannot and
//! containerd 1.6's server predates v5's close channel. v4's error stream
//! carries a metav1.Status with the exit code, which we pass on.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::remotecommand::{Options, V4};
use super::spdy::{self, Headers, Session, StreamReader, StreamWriter};

#[derive(Debug, thiserror::Error)]
pub enum RuntimeStreamError {
    #[error("unsupported streaming URL {0:?}")]
    Url(String),
    #[error("connecting to the runtime's streaming server: {0}")]
    Io(#[from] std::io::Error),
    #[error("the runtime's streaming server refused the upgrade: {0}")]
    Refused(String),
    #[error(transparent)]
    Spdy(#[from] spdy::SessionError),
}

/// The streams of one exec or attach at the runtime.
pub struct RuntimeStreams {
    pub session: Session,
    pub stdin: Option<StreamWriter>,
    pub stdout: Option<StreamReader>,
    pub stderr: Option<StreamReader>,
    pub resize: Option<StreamWriter>,
    pub error: StreamReader,
}

/// `http://host:port/path` → (`host:port`, `/path`).
fn split_url(url: &str) -> Result<(&str, &str), RuntimeStreamError> {
    let rest = url.strip_prefix("http://").ok_or_else(|| RuntimeStreamError::Url(url.into()))?;
    Ok(match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    })
}

/// Reads the response head (up to the blank line) without reading past it.
async fn read_head(tcp: &mut TcpStream) -> Result<String, RuntimeStreamError> {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 16 * 1024 {
            return Err(RuntimeStreamError::Refused("response head too large".into()));
        }
        head.push(tcp.read_u8().await?);
    }
    Ok(String::from_utf8_lossy(&head).into_owned())
}

/// Dials `url` and opens the streams `opts` asks for, in upstream client's
/// order (error, stdin, stdout, stderr, resize).
pub async fn connect(url: &str, opts: &Options) -> Result<RuntimeStreams, RuntimeStreamError> {
    let (host, path) = split_url(url)?;
    let mut tcp = TcpStream::connect(host).await?;
    tcp.set_nodelay(true)?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {V4}\r\nContent-Length: 0\r\n\r\n"
    );
    tcp.write_all(request.as_bytes()).await?;
    let head = read_head(&mut tcp).await?;
    let status_line = head.lines().next().unwrap_or_default();
    if status_line.split_whitespace().nth(1) != Some("101") {
        // Read whatever body came with the refusal for the message.
        let mut body = vec![0u8; 4096];
        let n = tokio::time::timeout(std::time::Duration::from_secs(2), tcp.read(&mut body))
            .await
            .ok()
            .and_then(|r| r.ok())
            .unwrap_or(0);
        let text = String::from_utf8_lossy(&body[..n]).trim().to_string();
        return Err(RuntimeStreamError::Refused(format!("{status_line} {text}").trim().to_string()));
    }
    let (session, _incoming) = Session::client(tcp);
    let open = |kind: &'static str| {
        let session = session.clone();
        async move { session.open(Headers::new().with("streamType", kind)).await }
    };
    let error = open("error").await?;
    let stdin = if opts.stdin { Some(open("stdin").await?.writer) } else { None };
    let stdout = if opts.stdout { Some(open("stdout").await?.reader) } else { None };
    let stderr = if opts.stderr && !opts.tty { Some(open("stderr").await?.reader) } else { None };
    let resize = if opts.tty { Some(open("resize").await?.writer) } else { None };
    Ok(RuntimeStreams { session, stdin, stdout, stderr, resize, error: error.reader })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_host_and_path() {
        assert_eq!(split_url("http://127.0.0.1:4321/exec/AbC").unwrap(), ("127.0.0.1:4321", "/exec/AbC"));
        assert!(split_url("https://127.0.0.1:1/x").is_err());
    }
}
