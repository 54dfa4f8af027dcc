//! Container lifecycle hooks (postStart, preStop), as upstream's
//! `pkg/kubelet/lifecycle/handlers.go`: exec through CRI ExecSync with no
//! timeout of its own (the caller bounds it: the grace period for preStop),
//! httpGet with the probes' HTTP client (any answer counts; only a failed
//! exchange is an error; an HTTPS hook answered in plain HTTP is retried
//! over HTTP), sleep, and tcpSocket rejected as upstream does. The error is
//! the message upstream puts in its `FailedPostStartHook` /
//! `FailedPreStopHook` event.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};

use crate::agent::cri::{api, Cri};
use crate::agent::kuberuntime::manager::{HookError, HookRunner, HttpHookError};
use crate::agent::prober::exec::exec_sync;
use crate::agent::prober::http::{self, HttpGetRequest};
use crate::agent::prober::target::pod_ip_from_status;
use crate::agent::prober::text::{go_quote, go_string_slice, pod_full_name, quote};

/// Upstream's event reason when a postStart hook fails (the container is
/// then killed).
pub const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
/// Upstream's event reason when a preStop hook fails.
pub const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";

/// Runs one hook of a container to its end. The error is the event message.
pub async fn run_handler(
    cri: &Cri,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    handler: &LifecycleHandler,
) -> Result<(), HookError> {
    let pod_name = quote(&pod_full_name(pod));
    let container_name = quote(&container.name);
    if let Some(action) = &handler.exec {
        let command = action.command.clone().unwrap_or_default();
        let outcome = exec_sync(cri, container_id, &command, None).await;
        return outcome.result.map_err(|source| {
            let e = HookError::Exec {
                command: go_string_slice(&command),
                container: container_name,
                pod: pod_name,
                source,
                output: go_quote(&outcome.output),
            };
            tracing::debug!(message = %e, "lifecycle hook failed");
            e
        });
    }
    if let Some(action) = &handler.http_get {
        return run_http(cri, pod, container, container_id, action).await.map_err(|source| {
            let e = HookError::Http {
                path: action.path.clone().unwrap_or_default(),
                container: container_name,
                pod: pod_name,
                source,
            };
            tracing::debug!(message = %e, "lifecycle hook failed");
            e
        });
    }
    if let Some(action) = &handler.sleep {
        tokio::time::sleep(Duration::from_secs(action.seconds.max(0) as u64)).await;
        return Ok(());
    }
    Err(HookError::InvalidHandler(go_handler_text(handler)))
}

async fn run_http(
    cri: &Cri,
    pod: &Pod,
    container: &Container,
    container_id: &str,
    action: &k8s_openapi::api::core::v1::HTTPGetAction,
) -> Result<(), HttpHookError> {
    let pod_ip = match action.host.as_deref().filter(|h| !h.is_empty()) {
        Some(_) => None,
        None => {
            let ip = sandbox_ip(cri, container_id).await.or_else(|| pod_ip_from_status(pod));
            Some(ip.ok_or(HttpHookError::NoSandboxIp)?.to_string())
        }
    };
    let req = HttpGetRequest::new(action, container, pod_ip.as_deref(), "lifecycle")?;
    match http::get(&req, None).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_http_response_to_https() => {
            let plain = req.as_plain_http();
            if http::get(&plain, None).await.is_err() {
                return Err(e.into());
            }
            tracing::warn!(
                host = %plain.url.authority(),
                "request to HTTPS lifecycle hook got HTTP response, retry with HTTP succeeded"
            );
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The IP of the sandbox the container runs in, as the runtime reports it.
async fn sandbox_ip(cri: &Cri, container_id: &str) -> Option<IpAddr> {
    let filter = api::ContainerFilter { id: container_id.to_string(), ..Default::default() };
    let containers = cri
        .list_containers(Some(filter))
        .await
        .map_err(|e| tracing::debug!(error = %e, container_id, "cannot find the container's sandbox"))
        .ok()?;
    let sandbox = containers.into_iter().next()?.pod_sandbox_id;
    let status = cri
        .runtime()
        .pod_sandbox_status(api::PodSandboxStatusRequest { pod_sandbox_id: sandbox, verbose: false })
        .await
        .map_err(|e| tracing::debug!(error = %e, container_id, "cannot read the pod sandbox's status"))
        .ok()?
        .into_inner();
    status.status?.network?.ip.parse().ok()
}

/// Hooks through CRI (exec), HTTP or sleep.
pub struct CriHooks {
    pub cri: Cri,
}

#[async_trait::async_trait]
impl HookRunner for CriHooks {
    async fn run(
        &self,
        pod: &Pod,
        container: &Container,
        container_id: &str,
        handler: &LifecycleHandler,
    ) -> Result<(), HookError> {
        run_handler(&self.cri, pod, container, container_id, handler).await
    }
}

/// Go's `%v` of a handler, as upstream's "invalid handler" message shows it.
fn go_handler_text(h: &LifecycleHandler) -> String {
    let present = |b: bool, text: &str| if b { text.to_string() } else { "nil".to_string() };
    let tcp = match &h.tcp_socket {
        Some(t) => {
            let port = match &t.port {
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n) => n.to_string(),
                k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s) => s.clone(),
            };
            format!("&TCPSocketAction{{Port:{port},Host:{},}}", t.host.as_deref().unwrap_or_default())
        }
        None => "nil".into(),
    };
    format!(
        "&LifecycleHandler{{Exec:{},HTTPGet:{},TCPSocket:{tcp},Sleep:{},}}",
        present(h.exec.is_some(), "&ExecAction{}"),
        present(h.http_get.is_some(), "&HTTPGetAction{}"),
        present(h.sleep.is_some(), "&SleepAction{}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HTTPGetAction, SleepAction, TCPSocketAction};
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn pod() -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        pod.metadata.namespace = Some("ns".into());
        pod.metadata.uid = Some("u-1".into());
        pod
    }

    /// A runtime that is never reached (the hooks below need none).
    fn no_runtime() -> Cri {
        Cri::connect(std::path::Path::new("/nonexistent/ferrok-test.sock")).unwrap()
    }

    #[tokio::test]
    async fn tcp_socket_hooks_are_rejected_as_upstream() {
        let handler = LifecycleHandler {
            tcp_socket: Some(TCPSocketAction { port: IntOrString::Int(8080), host: None }),
            ..Default::default()
        };
        let c = Container { name: "c".into(), ..Default::default() };
        let err = run_handler(&no_runtime(), &pod(), &c, "id", &handler).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "Cannot run handler: invalid handler: &LifecycleHandler{Exec:nil,HTTPGet:nil,TCPSocket:&TCPSocketAction{Port:8080,Host:,},Sleep:nil,}"
        );
    }

    #[tokio::test]
    async fn sleep_hooks_sleep() {
        let handler = LifecycleHandler { sleep: Some(SleepAction { seconds: 1 }), ..Default::default() };
        let started = std::time::Instant::now();
        run_handler(&no_runtime(), &pod(), &Container::default(), "id", &handler).await.unwrap();
        assert!(started.elapsed() >= Duration::from_secs(1));
    }

    #[tokio::test]
    async fn http_hooks_fail_only_without_an_answer() {
        use hyper::service::service_fn;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let svc = service_fn(|_req| async {
                        let body = http_body_util::Full::new(hyper::body::Bytes::from_static(b"no"));
                        Ok::<_, std::convert::Infallible>(hyper::Response::builder().status(500).body(body).unwrap())
                    });
                    let io = hyper_util::rt::TokioIo::new(s);
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
                });
            }
        });
        let c = Container { name: "c".into(), ..Default::default() };
        let hook = |port: u16| LifecycleHandler {
            http_get: Some(HTTPGetAction {
                host: Some("127.0.0.1".into()),
                port: IntOrString::Int(port.into()),
                path: Some("/stop".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        // A 500 is an answer: upstream's hooks do not judge status codes.
        run_handler(&no_runtime(), &pod(), &c, "id", &hook(port)).await.unwrap();
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let err = run_handler(&no_runtime(), &pod(), &c, "id", &hook(port)).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "HTTP lifecycle hook (/stop) for Container \"c\" in Pod \"p_ns(u-1)\" failed - error: Get \"http://127.0.0.1:{port}/stop\": dial tcp 127.0.0.1:{port}: connect: connection refused"
            )
        );
    }
}
