//! TCP probes: a connection opened within the timeout is success, as
//! upstream's tcp prober; and the dialer the HTTP and gRPC probes share,
//! whose errors read as Go's (`dial tcp 10.42.0.5:8080: connect:
//! connection refused`).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::time::Instant;

use super::text::{errno_text, join_host_port};
use super::ProbeResult;

/// Why a connection was not opened, in Go's words.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("dial tcp: lookup {host}: {}", errno_text(.source))]
    Lookup { host: String, source: std::io::Error },
    #[error("dial tcp: lookup {0}: no such host")]
    NoSuchHost(String),
    #[error("dial tcp {addr}: connect: {}", errno_text(.source))]
    Connect { addr: String, source: std::io::Error },
    #[error("dial tcp {0}: i/o timeout")]
    Timeout(String),
}

/// Opens a TCP connection to `host:port` before `deadline`.
pub async fn dial(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, DialError> {
    let addr = join_host_port(host, port);
    let attempt = async {
        let targets: Vec<SocketAddr> = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|source| DialError::Lookup { host: host.to_string(), source })?
                .collect(),
        };
        let mut last = DialError::NoSuchHost(host.to_string());
        for target in targets {
            match TcpStream::connect(target).await {
                Ok(stream) => return Ok(stream),
                Err(source) => {
                    last = DialError::Connect { addr: join_host_port(&target.ip().to_string(), port), source }
                }
            }
        }
        Err(last)
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result,
        Err(_) => Err(DialError::Timeout(addr)),
    }
}

/// One attempt of a TCP probe.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> ProbeResult {
    match dial(host, port, Instant::now() + timeout).await {
        Ok(stream) => {
            drop(stream);
            ProbeResult::Success
        }
        Err(e) => ProbeResult::Failure(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn open_port_succeeds_and_closed_port_fails() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        assert_eq!(probe("127.0.0.1", port, Duration::from_secs(1)).await, ProbeResult::Success);
        drop(listener);
        assert_eq!(
            probe("127.0.0.1", port, Duration::from_secs(1)).await,
            ProbeResult::Failure(format!("dial tcp 127.0.0.1:{port}: connect: connection refused"))
        );
    }
}
