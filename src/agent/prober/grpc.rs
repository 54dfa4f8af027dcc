//! gRPC probes: the standard `grpc.health.v1.Health/Check` unary call over
//! plain HTTP/2, through tonic's generic client with the two health
//! messages defined here. SERVING is success; the failure messages are
//! upstream's grpc prober's. As upstream (grpc-go with `WithBlock`), a
//! server that cannot be reached is retried until the timeout.

use std::time::Duration;

use tokio::time::Instant;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Endpoint;

use super::text::{go_duration, join_host_port, quote};
use super::{tcp, ProbeResult, KUBE_VERSION};

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(enumeration = "ServingStatus", tag = "1")]
    pub status: i32,
}

/// `grpc.health.v1.HealthCheckResponse.ServingStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ServingStatus {
    Unknown = 0,
    Serving = 1,
    NotServing = 2,
    ServiceUnknown = 3,
}

/// The method's path on the wire.
pub const CHECK_PATH: &str = "/grpc.health.v1.Health/Check";

/// How protobuf spells a status (an unknown number prints as itself).
pub fn status_name(status: i32) -> String {
    match ServingStatus::try_from(status) {
        Ok(ServingStatus::Unknown) => "UNKNOWN".into(),
        Ok(ServingStatus::Serving) => "SERVING".into(),
        Ok(ServingStatus::NotServing) => "NOT_SERVING".into(),
        Ok(ServingStatus::ServiceUnknown) => "SERVICE_UNKNOWN".into(),
        Err(_) => status.to_string(),
    }
}

/// How long to wait between connection attempts (grpc-go's base back-off).
const RECONNECT: Duration = Duration::from_secs(1);

/// One attempt of a gRPC probe of `service` ("" for the whole server).
pub async fn probe(host: &str, port: u16, service: &str, timeout: Duration) -> ProbeResult {
    let addr = join_host_port(host, port);
    let deadline = Instant::now() + timeout;
    let Some(channel) = connect(host, port, deadline).await else {
        return ProbeResult::Failure(format!(
            "timeout: failed to connect service {} within {}: context deadline exceeded",
            quote(&addr),
            go_duration(timeout)
        ));
    };
    let timed_out =
        || ProbeResult::Failure(format!("timeout: health rpc did not complete within {}", go_duration(timeout)));
    let call = async {
        let mut grpc = tonic::client::Grpc::new(channel);
        grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(HealthCheckRequest { service: service.to_string() });
        request.set_timeout(deadline.saturating_duration_since(Instant::now()));
        let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
        grpc.unary(request, PathAndQuery::from_static(CHECK_PATH), codec).await
    };
    let answer = match tokio::time::timeout_at(deadline, call).await {
        Ok(answer) => answer,
        Err(_) => return timed_out(),
    };
    match answer {
        Ok(resp) => {
            let status = resp.into_inner().status;
            if status == ServingStatus::Serving as i32 {
                ProbeResult::Success
            } else {
                ProbeResult::Failure(format!("service unhealthy (responded with {})", quote(&status_name(status))))
            }
        }
        Err(s) if s.code() == tonic::Code::Unimplemented => ProbeResult::Failure(format!(
            "error: this server does not implement the grpc health protocol (grpc.health.v1.Health): {}",
            s.message()
        )),
        Err(s) if s.code() == tonic::Code::DeadlineExceeded => timed_out(),
        Err(s) => ProbeResult::Failure(format!(
            "error: health rpc probe failed: rpc error: code = {:?} desc = {}",
            s.code(),
            s.message()
        )),
    }
}

/// An HTTP/2 channel to the server, retried until the deadline.
async fn connect(host: &str, port: u16, deadline: Instant) -> Option<tonic::transport::Channel> {
    let endpoint = Endpoint::from_shared(format!("http://{}", join_host_port(host, port)))
        .ok()?
        .user_agent(format!("kube-probe/{KUBE_VERSION}"))
        .ok()?;
    let attempts = async {
        loop {
            let name = host.to_string();
            let connector = tower::service_fn(move |_: tonic::codegen::http::Uri| {
                let host = name.clone();
                async move {
                    let stream = tcp::dial(&host, port, deadline).await.map_err(std::io::Error::other)?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            });
            match endpoint.connect_with_connector(connector).await {
                Ok(channel) => return channel,
                Err(e) => {
                    tracing::trace!(error = %e, host, port, "gRPC probe cannot connect yet");
                    tokio::time::sleep(RECONNECT).await;
                }
            }
        }
    };
    tokio::time::timeout_at(deadline, attempts).await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::task::{Context, Poll};

    use tonic::body::Body;
    use tonic::codegen::http;
    use tonic::server::NamedService;

    /// A health server: `statuses` maps service names to their status; an
    /// unknown name is NotFound, as in grpc-go's health server.
    #[derive(Clone)]
    struct Health {
        statuses: Arc<HashMap<String, ServingStatus>>,
    }

    impl NamedService for Health {
        const NAME: &'static str = "grpc.health.v1.Health";
    }

    struct Check(Arc<HashMap<String, ServingStatus>>);

    impl tonic::server::UnaryService<HealthCheckRequest> for Check {
        type Response = HealthCheckResponse;
        type Future = std::future::Ready<Result<tonic::Response<HealthCheckResponse>, tonic::Status>>;
        fn call(&mut self, req: tonic::Request<HealthCheckRequest>) -> Self::Future {
            let answer = match self.0.get(&req.get_ref().service) {
                Some(s) => Ok(tonic::Response::new(HealthCheckResponse { status: *s as i32 })),
                None => Err(tonic::Status::not_found("unknown service")),
            };
            std::future::ready(answer)
        }
    }

    impl tower::Service<http::Request<Body>> for Health {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Infallible>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }

        fn call(&mut self, req: http::Request<Body>) -> Self::Future {
            let statuses = self.statuses.clone();
            Box::pin(async move {
                if req.uri().path() == CHECK_PATH {
                    let codec = tonic_prost::ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default();
                    let mut grpc = tonic::server::Grpc::new(codec);
                    Ok(grpc.unary(Check(statuses), req).await)
                } else {
                    Ok(tonic::Status::unimplemented("").into_http())
                }
            })
        }
    }

    /// A server of some other service only.
    #[derive(Clone)]
    struct Other(Health);

    impl NamedService for Other {
        const NAME: &'static str = "example.Other";
    }

    impl tower::Service<http::Request<Body>> for Other {
        type Response = http::Response<Body>;
        type Error = Infallible;
        type Future = <Health as tower::Service<http::Request<Body>>>::Future;

        fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            self.0.poll_ready(cx)
        }

        fn call(&mut self, req: http::Request<Body>) -> Self::Future {
            self.0.call(req)
        }
    }

    async fn health_server(statuses: &[(&str, ServingStatus)]) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let statuses = Arc::new(statuses.iter().map(|(n, s)| (n.to_string(), *s)).collect());
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder().add_service(Health { statuses }).serve_with_incoming(incoming),
        );
        port
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn serving_is_success_and_anything_else_fails() {
        let port = health_server(&[("", ServingStatus::Serving), ("db", ServingStatus::NotServing)]).await;
        assert_eq!(probe("127.0.0.1", port, "", SECOND).await, ProbeResult::Success);
        assert_eq!(
            probe("127.0.0.1", port, "db", SECOND).await,
            ProbeResult::Failure("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        assert_eq!(
            probe("127.0.0.1", port, "other", SECOND).await,
            ProbeResult::Failure(
                "error: health rpc probe failed: rpc error: code = NotFound desc = unknown service".into()
            )
        );
    }

    #[tokio::test]
    async fn servers_without_the_health_service_fail() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let other = Other(Health { statuses: Arc::default() });
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(tonic::transport::Server::builder().add_service(other).serve_with_incoming(incoming));
        match probe("127.0.0.1", port, "", SECOND).await {
            ProbeResult::Failure(m) => assert!(
                m.starts_with("error: this server does not implement the grpc health protocol (grpc.health.v1.Health)"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_closed_port_times_out_connecting() {
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = closed.local_addr().unwrap().port();
        drop(closed);
        let started = Instant::now();
        assert_eq!(
            probe("127.0.0.1", port, "", SECOND).await,
            ProbeResult::Failure(format!(
                "timeout: failed to connect service \"127.0.0.1:{port}\" within 1s: context deadline exceeded"
            ))
        );
        let took = started.elapsed();
        assert!(took >= SECOND && took < SECOND * 2, "{took:?}");
    }

    #[test]
    fn statuses_are_spelled_as_protobuf() {
        assert_eq!(status_name(2), "NOT_SERVING");
        assert_eq!(status_name(3), "SERVICE_UNKNOWN");
        assert_eq!(status_name(9), "9");
    }
}
