//! httpGet probes against small servers on 127.0.0.1.

use std::convert::Infallible;
use std::sync::Mutex;

use http_body_util::Full;
use hyper::service::service_fn;
use k8s_openapi::api::core::v1::{ContainerPort, HTTPHeader};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use tokio::net::TcpListener;

use super::*;

/// What the server saw: request target and headers, in order.
type Seen = Arc<Mutex<Vec<(String, Vec<(String, String)>)>>>;

/// An answer: status, extra headers, body.
type Answer = (u16, Vec<(&'static str, String)>, String);

/// Answers every request with `answer(path, own port)`.
async fn serve(answer: fn(&str, u16) -> Answer) -> (u16, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen: Seen = Arc::default();
    let log = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let log = log.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let target = req.uri().path_and_query().map(|p| p.to_string()).unwrap_or_default();
                    let headers = req
                        .headers()
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or_default().to_string()))
                        .collect();
                    log.lock().unwrap().push((target.clone(), headers));
                    let (status, extra, body) = answer(&target, port);
                    let mut resp = hyper::Response::builder().status(status);
                    for (n, v) in extra {
                        resp = resp.header(n, v);
                    }
                    async move { Ok::<_, Infallible>(resp.body(Full::new(Bytes::from(body))).unwrap()) }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    (port, seen)
}

fn routes(path: &str, port: u16) -> Answer {
    match path {
        "/ok" | "/healthz?full=1" => (200, vec![], "fine".into()),
        "/fail" => (500, vec![], "secret details".into()),
        "/same-host" => (302, vec![("location", "/ok".into())], String::new()),
        "/same-host-fail" => (307, vec![("location", format!("http://127.0.0.1:{port}/fail"))], String::new()),
        "/other-host" => (302, vec![("location", format!("http://localhost:{port}/ok"))], "<a>Found</a>.".into()),
        "/loop" => (301, vec![("location", "/loop".into())], String::new()),
        "/big" => (301, vec![], "x".repeat(20_000)),
        _ => (404, vec![], String::new()),
    }
}

fn action(port: IntOrString, path: &str) -> HTTPGetAction {
    HTTPGetAction { port, path: Some(path.into()), ..Default::default() }
}

fn request(port: u16, path: &str) -> HttpGetRequest {
    HttpGetRequest::new(&action(IntOrString::Int(port.into()), path), &Container::default(), Some("127.0.0.1"), "probe")
        .unwrap()
}

const SECOND: Duration = Duration::from_secs(1);

#[tokio::test]
async fn status_codes_decide_and_messages_read_as_upstream() {
    let (port, seen) = serve(routes).await;
    assert_eq!(probe(&request(port, "/ok"), SECOND).await, ProbeResult::Success);
    assert_eq!(
        probe(&request(port, "/fail"), SECOND).await,
        ProbeResult::Failure("HTTP probe failed with statuscode: 500".into())
    );
    assert_eq!(
        probe(&request(port, "/missing"), SECOND).await,
        ProbeResult::Failure("HTTP probe failed with statuscode: 404".into())
    );
    let (target, headers) = seen.lock().unwrap()[0].clone();
    assert_eq!(target, "/ok");
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(header("user-agent").as_deref(), Some("kube-probe/1.33"));
    assert_eq!(header("accept").as_deref(), Some("*/*"));
    assert_eq!(header("host"), Some(format!("127.0.0.1:{port}")));
    assert_eq!(header("connection").as_deref(), Some("close"));
}

#[tokio::test]
async fn redirects_are_followed_only_within_the_host() {
    let (port, seen) = serve(routes).await;
    assert_eq!(probe(&request(port, "/same-host"), SECOND).await, ProbeResult::Success);
    assert_eq!(
        probe(&request(port, "/same-host-fail"), SECOND).await,
        ProbeResult::Failure("HTTP probe failed with statuscode: 500".into())
    );
    assert_eq!(
        probe(&request(port, "/other-host"), SECOND).await,
        ProbeResult::Warning("Probe terminated redirects, Response body: <a>Found</a>.".into())
    );
    let targets: Vec<String> = seen.lock().unwrap().iter().map(|(t, _)| t.clone()).collect();
    assert_eq!(targets, ["/same-host", "/ok", "/same-host-fail", "/fail", "/other-host"]);
    assert_eq!(
        probe(&request(port, "/loop"), SECOND).await,
        ProbeResult::Failure(format!("Get \"http://127.0.0.1:{port}/loop\": stopped after 10 redirects"))
    );
    assert_eq!(seen.lock().unwrap().len(), 5 + 10);
    // A 3xx without Location is an answer; its body is cut at 10 KiB.
    match probe(&request(port, "/big"), SECOND).await {
        ProbeResult::Warning(m) => {
            assert_eq!(m.len(), "Probe terminated redirects, Response body: ".len() + MAX_BODY)
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn spec_headers_named_ports_and_query_are_sent() {
    let (port, seen) = serve(routes).await;
    let container = Container {
        ports: Some(vec![ContainerPort {
            name: Some("web".into()),
            container_port: port.into(),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let mut a = action(IntOrString::String("web".into()), "healthz?full=1");
    a.http_headers = Some(vec![
        HTTPHeader { name: "X-Custom".into(), value: "1".into() },
        HTTPHeader { name: "Host".into(), value: "example.test".into() },
        HTTPHeader { name: "user-agent".into(), value: "mine".into() },
        HTTPHeader { name: "Accept".into(), value: String::new() },
    ]);
    let req = HttpGetRequest::new(&a, &container, Some("127.0.0.1"), "probe").unwrap();
    assert_eq!(req.url.to_string(), format!("http://127.0.0.1:{port}/healthz?full=1"));
    assert_eq!(probe(&req, SECOND).await, ProbeResult::Success);
    let (target, headers) = seen.lock().unwrap()[0].clone();
    assert_eq!(target, "/healthz?full=1");
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(header("host").as_deref(), Some("example.test"));
    assert_eq!(header("x-custom").as_deref(), Some("1"));
    assert_eq!(header("user-agent").as_deref(), Some("mine"));
    assert_eq!(header("accept"), None);
}

#[tokio::test]
async fn unreachable_and_silent_servers_fail_with_gos_texts() {
    let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    assert_eq!(
        probe(&request(port, "/healthz"), SECOND).await,
        ProbeResult::Failure(format!(
            "Get \"http://127.0.0.1:{port}/healthz\": dial tcp 127.0.0.1:{port}: connect: connection refused"
        ))
    );
    // Accepts, never answers.
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let started = Instant::now();
    assert_eq!(
        probe(&request(port, "/"), Duration::from_millis(300)).await,
        ProbeResult::Failure(format!(
            "Get \"http://127.0.0.1:{port}/\": context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
        ))
    );
    assert!(started.elapsed() < SECOND);
    drop(silent);
}

#[tokio::test]
async fn https_is_not_verified_and_plain_servers_are_recognised() {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.cert.der().clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { return };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else { return };
                let svc = service_fn(|_req| async {
                    Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"secure"))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(tls), svc).await;
            });
        }
    });
    let mut a = action(IntOrString::Int(port.into()), "/");
    a.scheme = Some("HTTPS".into());
    let req = HttpGetRequest::new(&a, &Container::default(), Some("127.0.0.1"), "probe").unwrap();
    assert_eq!(probe(&req, SECOND).await, ProbeResult::Success);

    let (plain, _) = serve(routes).await;
    let mut a = action(IntOrString::Int(plain.into()), "/ok");
    a.scheme = Some("HTTPS".into());
    let req = HttpGetRequest::new(&a, &Container::default(), Some("127.0.0.1"), "lifecycle").unwrap();
    let err = get(&req, Some(SECOND)).await.unwrap_err();
    assert!(err.is_http_response_to_https(), "{err}");
    assert_eq!(get(&req.as_plain_http(), Some(SECOND)).await.unwrap().status, 200);
}

#[test]
fn requests_need_a_host() {
    let a = action(IntOrString::Int(80), "/");
    let err = HttpGetRequest::new(&a, &Container::default(), None, "probe").unwrap_err();
    assert_eq!(err.to_string(), "the pod has no IP address yet");
    let bad = action(IntOrString::String("nope".into()), "/");
    assert!(HttpGetRequest::new(&bad, &Container::default(), Some("10.0.0.1"), "probe").is_err());
}
