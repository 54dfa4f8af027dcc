//! exec and attach: the client's streams (SPDY or WebSocket, any
//! remotecommand version) bridged to the runtime's streaming server.

use tokio::task::JoinHandle;

use super::remotecommand::ClientStreams;
use super::runtime_stream::RuntimeStreams;

/// Copies the client's stdin and resizes to the runtime, the runtime's
/// output to the client, and ends with the runtime's status. Returns when
/// the command ended or the client went away.
pub async fn bridge(client: ClientStreams, runtime: RuntimeStreams) {
    let ClientStreams { stdin, resize, output } = client;
    let RuntimeStreams { session, stdin: rt_stdin, stdout, stderr, resize: rt_resize, mut error } = runtime;
    let mut pumps: Vec<JoinHandle<()>> = Vec::new();
    if let (Some(mut from), Some(to)) = (stdin, rt_stdin) {
        pumps.push(tokio::spawn(async move {
            while let Some(data) = from.recv().await {
                if to.write(&data).await.is_err() {
                    return;
                }
            }
            // The client closed stdin: close the process' stdin.
            let _ = to.close().await;
        }));
    }
    if let (Some(mut from), Some(to)) = (resize, rt_resize) {
        pumps.push(tokio::spawn(async move {
            while let Some(data) = from.recv().await {
                if to.write(&data).await.is_err() {
                    return;
                }
            }
        }));
    }
    let work = async {
        let copy_out = async {
            if let Some(mut r) = stdout {
                while let Some(d) = r.read().await {
                    if output.stdout(&d).await.is_err() {
                        break;
                    }
                }
            }
        };
        let copy_err = async {
            if let Some(mut r) = stderr {
                while let Some(d) = r.read().await {
                    if output.stderr(&d).await.is_err() {
                        break;
                    }
                }
            }
        };
        let status = async {
            let mut status = Vec::new();
            while let Some(d) = error.read().await {
                status.extend(d);
            }
            status
        };
        let ((), (), status) = tokio::join!(copy_out, copy_err, status);
        status
    };
    let finished = tokio::select! {
        status = work => Some(status),
        _ = output.gone() => None,
    };
    for p in pumps {
        p.abort();
    }
    session.close().await;
    match finished {
        Some(status) => output.finish(&status).await,
        None => tracing::debug!("exec client went away; closed the runtime's stream"),
    }
}
