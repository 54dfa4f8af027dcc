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

/// Opens a TCP connection to `host:port` before `deadline`.
pub async fn dial(host: &str, port: u16, deadline: Instant) -> Result<TcpStream, String> {
    let addr = join_host_port(host, port);
    let attempt = async {
        let targets: Vec<SocketAddr> = match host.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => tokio::net::lookup_host((host, port))
                .await
                .map_err(|e| format!("dial tcp: lookup {host}: {}", errno_text(&e)))?
                .collect(),
        };
        let mut last = format!("dial tcp: lookup {host}: no such host");
        for target in targets {
            match TcpStream::connect(target).await {
                Ok(stream) => return Ok(stream),
                Err(e) => {
                    last = format!(
                        "dial tcp {}: connect: {}",
                        join_host_port(&target.ip().to_string(), port),
                        errno_text(&e)
                    )
                }
            }
        }
        Err(last)
    };
    match tokio::time::timeout_at(deadline, attempt).await {
        Ok(result) => result,
        Err(_) => Err(format!("dial tcp {addr}: i/o timeout")),
    }
}

/// One attempt of a TCP probe.
pub async fn probe(host: &str, port: u16, timeout: Duration) -> ProbeResult {
    match dial(host, port, Instant::now() + timeout).await {
        Ok(stream) => {
            drop(stream);
            ProbeResult::Success
        }
        Err(message) => ProbeResult::Failure(message),
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
