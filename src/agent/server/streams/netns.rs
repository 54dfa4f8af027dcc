//! Dialling a pod's port from inside its network namespace, as containerd's
//! CRI port-forward does: a short-lived OS thread enters the namespace
//! (setns only changes the calling thread), connects to localhost over IPv4
//! and then IPv6, and hands the socket to tokio. No tokio worker ever
//! changes namespace.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::net::TcpStream;

const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("cannot enter network namespace {path:?}: {source}")]
    Namespace { path: PathBuf, source: std::io::Error },
    #[error("failed to connect to localhost:{port} inside namespace {netns:?}, IPv4: {v4} IPv6 {v6} ")]
    Connect { port: u16, netns: PathBuf, v4: std::io::Error, v6: std::io::Error },
    #[error("port-forward dial thread: {0}")]
    Thread(std::io::Error),
}

/// Connects to `port` on the loopback of the namespace at `netns`.
pub async fn dial(netns: &Path, port: u16) -> Result<TcpStream, DialError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let path = netns.to_path_buf();
    std::thread::Builder::new()
        .name("portforward-dial".into())
        .spawn(move || {
            let _ = tx.send(dial_blocking(&path, port));
        })
        .map_err(DialError::Thread)?;
    let std_stream = rx.await.map_err(|_| DialError::Thread(std::io::Error::other("dial thread died")))??;
    std_stream.set_nonblocking(true).map_err(DialError::Thread)?;
    let stream = TcpStream::from_std(std_stream).map_err(DialError::Thread)?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

/// Runs on its own thread, which it moves into the namespace for good.
fn dial_blocking(netns: &Path, port: u16) -> Result<std::net::TcpStream, DialError> {
    let ns_err = |source| DialError::Namespace { path: netns.to_path_buf(), source };
    let file = std::fs::File::open(netns).map_err(ns_err)?;
    // SAFETY: setns on a valid fd for the current thread only; the thread ends after dialling.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(ns_err(std::io::Error::last_os_error()));
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v4_err = match std::net::TcpStream::connect_timeout(&v4, DIAL_TIMEOUT) {
        Ok(s) => return Ok(s),
        Err(e) => e,
    };
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    std::net::TcpStream::connect_timeout(&v6, DIAL_TIMEOUT).map_err(|v6_err| DialError::Connect {
        port,
        netns: netns.to_path_buf(),
        v4: v4_err,
        v6: v6_err,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Our own namespace stands in for a pod's: a listener on 127.0.0.1 is
    /// reached, a closed port reports both attempts.
    #[tokio::test]
    async fn dials_loopback_inside_a_namespace() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let ns = Path::new("/proc/self/ns/net");
        let (dialed, accepted) = tokio::join!(dial(ns, port), listener.accept());
        assert!(dialed.is_ok() && accepted.is_ok());
        drop(listener);
        match dial(ns, port).await {
            Err(DialError::Connect { port: p, .. }) => assert_eq!(p, port),
            other => panic!("expected a connect error, got {other:?}"),
        }
        assert!(matches!(dial(Path::new("/nonexistent/netns"), port).await, Err(DialError::Namespace { .. })));
    }
}
