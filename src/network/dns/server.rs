//! The cluster DNS' listeners: UDP and TCP on one address. Answers the
//! index or the cache can give are sent from the receiving loop itself; a
//! forward gets a task of its own, at most `MAX_FORWARDS` at once (more are
//! dropped: the client asks again). TCP connections (at most
//! `MAX_CONNECTIONS`) may carry several queries and close when idle.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::Semaphore;

use super::resolver::{encode, malformed, needs_chase, udp_limit, Resolver};

/// Forwards in flight at once.
pub const MAX_FORWARDS: usize = 1024;
/// TCP connections at once.
pub const MAX_CONNECTIONS: usize = 256;
/// A TCP connection with no query for this long is closed.
pub const TCP_IDLE: Duration = Duration::from_secs(10);
/// How long binding waits between tries while the address is not there yet.
const BIND_RETRY_MAX: Duration = Duration::from_secs(2);

/// Binds UDP and TCP on `addr`, trying again with back-off while the
/// address does not exist yet (the pod bridge comes with the podCIDR).
pub async fn bind(addr: SocketAddr) -> (UdpSocket, TcpListener) {
    let mut delay = Duration::from_millis(50);
    let mut tries = 0u32;
    loop {
        let bound = async { Ok::<_, std::io::Error>((UdpSocket::bind(addr).await?, TcpListener::bind(addr).await?)) };
        match bound.await {
            Ok(pair) => return pair,
            Err(e) => {
                tries += 1;
                if tries == 1 || tries.is_multiple_of(30) {
                    tracing::info!(%addr, error = %e, "cluster DNS cannot listen yet; retrying");
                }
                tokio::time::sleep(delay).await;
                delay = crate::backoff::doubled(delay, BIND_RETRY_MAX);
            }
        }
    }
}

/// Serves queries arriving on `socket` (run several on one socket to use several cores).
pub async fn serve_udp(socket: Arc<UdpSocket>, resolver: Arc<Resolver>, forwards: Arc<Semaphore>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, peer) = match socket.recv_from(&mut buf).await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "cluster DNS: UDP receive failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let request = match Message::from_vec(&buf[..n]) {
            Ok(m) => m,
            Err(_) => {
                if let Some(reply) = malformed(&buf[..n]) {
                    let _ = socket.send_to(&reply, peer).await;
                }
                continue;
            }
        };
        let limit = udp_limit(&request);
        match resolver.answer_local(&request) {
            Ok(m) if !needs_chase(&m) => {
                if let Some(bytes) = encode(&m, Some(limit)) {
                    let _ = socket.send_to(&bytes, peer).await;
                }
            }
            outcome => {
                let Ok(permit) = forwards.clone().try_acquire_owned() else { continue };
                let (socket, resolver) = (socket.clone(), resolver.clone());
                tokio::spawn(async move {
                    let m = match outcome {
                        Ok(m) => resolver.chase_upstream(&request, m).await,
                        Err(pending) => resolver.forward(*pending).await,
                    };
                    if let Some(bytes) = encode(&m, Some(limit)) {
                        let _ = socket.send_to(&bytes, peer).await;
                    }
                    drop(permit);
                });
            }
        }
    }
}

/// Accepts TCP connections and serves each in a task of its own.
pub async fn serve_tcp(listener: TcpListener, resolver: Arc<Resolver>) {
    let connections = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = connections.clone().acquire_owned().await else { return };
        let (stream, _) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "cluster DNS: TCP accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let resolver = resolver.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream, &resolver).await {
                tracing::debug!(error = %e, "cluster DNS: TCP connection ended");
            }
            drop(permit);
        });
    }
}

async fn serve_connection(mut stream: TcpStream, resolver: &Resolver) -> std::io::Result<()> {
    loop {
        let len = match tokio::time::timeout(TCP_IDLE, stream.read_u16()).await {
            Ok(Ok(len)) => usize::from(len),
            // Idle, or closed by the client.
            Err(_) | Ok(Err(_)) => return Ok(()),
        };
        let mut buf = vec![0u8; len];
        tokio::time::timeout(TCP_IDLE, stream.read_exact(&mut buf))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        let reply = match Message::from_vec(&buf) {
            Ok(request) => encode(&resolver.answer(&request).await, None),
            Err(_) => malformed(&buf),
        };
        let Some(reply) = reply else { return Ok(()) };
        let Ok(n) = u16::try_from(reply.len()) else { return Ok(()) };
        let mut framed = Vec::with_capacity(reply.len() + 2);
        framed.extend_from_slice(&n.to_be_bytes());
        framed.extend_from_slice(&reply);
        stream.write_all(&framed).await?;
    }
}

/// Runs the listeners on `addr` (bound first, waiting for the address).
pub async fn run(addr: SocketAddr, resolver: Arc<Resolver>) {
    let (udp, tcp) = bind(addr).await;
    tracing::info!(%addr, "cluster DNS listening");
    let udp = Arc::new(udp);
    let forwards = Arc::new(Semaphore::new(MAX_FORWARDS));
    let loops = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, 4);
    let udp_loops = (0..loops).map(|_| serve_udp(udp.clone(), resolver.clone(), forwards.clone()));
    tokio::join!(futures_util::future::join_all(udp_loops), serve_tcp(tcp, resolver));
}
