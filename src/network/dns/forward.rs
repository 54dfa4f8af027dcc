//! Forwarding to the host's resolvers (its resolv.conf's nameservers, the
//! real ones behind a local systemd stub): over UDP from a fresh random
//! port and with a random id each time, again over TCP when the answer was
//! truncated; the next nameserver when one fails or does not answer.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Edns, Message, Query};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

/// How long one nameserver has to answer.
pub const TIMEOUT: Duration = Duration::from_secs(2);
/// The UDP payload size offered to upstreams (the DNS flag day's value).
pub const UDP_PAYLOAD: u16 = 1232;

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("no upstream nameserver is configured")]
    NoUpstream,
    #[error("{0}: no answer in time")]
    Timeout(SocketAddr),
    #[error("{0}: {1}")]
    Io(SocketAddr, std::io::Error),
    #[error("{0}: {1}")]
    Proto(SocketAddr, String),
}

/// The host's nameservers as socket addresses, without `exclude` (the
/// cluster DNS' own addresses: forwarding to itself would loop).
pub fn upstreams(nameservers: &[String], exclude: &[IpAddr]) -> Vec<SocketAddr> {
    nameservers
        .iter()
        .filter_map(|n| n.split('%').next()?.parse::<IpAddr>().ok())
        .filter(|ip| !exclude.contains(ip))
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

#[derive(Debug, Clone)]
pub struct Forwarder {
    upstreams: Vec<SocketAddr>,
    timeout: Duration,
}

impl Forwarder {
    pub fn new(upstreams: Vec<SocketAddr>) -> Forwarder {
        Forwarder { upstreams, timeout: TIMEOUT }
    }

    pub fn upstreams(&self) -> &[SocketAddr] {
        &self.upstreams
    }

    /// Asks the nameservers in turn until one answers.
    pub async fn resolve(&self, query: &Query, recursion_desired: bool) -> Result<Message, ForwardError> {
        let mut last = ForwardError::NoUpstream;
        for upstream in &self.upstreams {
            match self.ask(*upstream, query, recursion_desired).await {
                Ok(m) => return Ok(m),
                Err(e) => {
                    tracing::debug!(error = %e, "upstream nameserver failed");
                    last = e;
                }
            }
        }
        Err(last)
    }

    async fn ask(&self, upstream: SocketAddr, query: &Query, rd: bool) -> Result<Message, ForwardError> {
        let mut request = Message::query();
        request.metadata.recursion_desired = rd;
        request.add_query(query.clone());
        let mut edns = Edns::new();
        edns.set_max_payload(UDP_PAYLOAD);
        request.set_edns(edns);
        let bytes = request.to_vec().map_err(|e| ForwardError::Proto(upstream, e.to_string()))?;
        let answer = tokio::time::timeout(self.timeout, udp_exchange(upstream, &bytes, &request))
            .await
            .map_err(|_| ForwardError::Timeout(upstream))??;
        if !answer.metadata.truncation {
            return Ok(answer);
        }
        tokio::time::timeout(self.timeout, tcp_exchange(upstream, &bytes, &request))
            .await
            .map_err(|_| ForwardError::Timeout(upstream))?
    }
}

/// Whether `answer` answers `request` (same id and question).
fn matches(request: &Message, answer: &Message) -> bool {
    answer.metadata.id == request.metadata.id
        && answer.queries.len() == request.queries.len()
        && answer.queries.iter().zip(&request.queries).all(|(a, q)| {
            a.query_type == q.query_type && a.query_class == q.query_class && a.name.eq_ignore_root_case(&q.name)
        })
}

async fn udp_exchange(upstream: SocketAddr, bytes: &[u8], request: &Message) -> Result<Message, ForwardError> {
    let io = |e| ForwardError::Io(upstream, e);
    let local: SocketAddr = if upstream.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = UdpSocket::bind(local).await.map_err(io)?;
    socket.connect(upstream).await.map_err(io)?;
    socket.send(bytes).await.map_err(io)?;
    let mut buf = vec![0u8; 65535];
    loop {
        let n = socket.recv(&mut buf).await.map_err(io)?;
        // Anything else arriving on this port is not the answer: wait on.
        if let Ok(answer) = Message::from_vec(&buf[..n]) {
            if matches(request, &answer) {
                return Ok(answer);
            }
        }
    }
}

async fn tcp_exchange(upstream: SocketAddr, bytes: &[u8], request: &Message) -> Result<Message, ForwardError> {
    let io = |e| ForwardError::Io(upstream, e);
    let mut stream = TcpStream::connect(upstream).await.map_err(io)?;
    let len = u16::try_from(bytes.len()).map_err(|_| ForwardError::Proto(upstream, "query too long".into()))?;
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).await.map_err(io)?;
    let n = stream.read_u16().await.map_err(io)? as usize;
    let mut buf = vec![0u8; n];
    stream.read_exact(&mut buf).await.map_err(io)?;
    let answer = Message::from_vec(&buf).map_err(|e| ForwardError::Proto(upstream, e.to_string()))?;
    if !matches(request, &answer) {
        return Err(ForwardError::Proto(upstream, "the answer does not match the question".into()));
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_skip_our_own_addresses_and_zones() {
        let ns = vec!["10.43.0.10".to_string(), "192.0.2.53".into(), "fe80::1%eth0".into(), "junk".into()];
        let got = upstreams(&ns, &["10.43.0.10".parse().unwrap()]);
        assert_eq!(got, vec!["192.0.2.53:53".parse().unwrap(), "[fe80::1]:53".parse().unwrap()]);
    }
}
