//! The floor of a list on this machine: the very bytes the API server sent
//! for the list, served from memory through ferrok's own TLS and HTTP
//! serving (`apiserver::serve`, the same cipher suites, 64 KiB writes as
//! the list's), to the same clients, by a process of its own. No API
//! work is done, so what a list costs beyond this is the API server's;
//! what this costs is the cipher, the copies and the kernel's TCP, on
//! both sides.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use ferrok::apiserver::serve;
use ferrok::apiserver::watch_cache::list_writes::WRITE_BYTES;

/// Set in the child: `<tls dir>|<port>|<body file>`.
const ENV: &str = "FERROK_BENCH_FLOOR_SERVE";

/// In the child this bench starts (`Floor::start`): serves the body file
/// at every path until killed, and returns true. False elsewhere.
pub async fn serve_if_asked() -> bool {
    let Ok(spec) = std::env::var(ENV) else { return false };
    let parts: Vec<&str> = spec.splitn(3, '|').collect();
    let [tls, port, body] = parts[..] else { panic!("{ENV}: {spec}") };
    let (tls, port) = (PathBuf::from(tls), port.parse::<u16>().expect("port"));
    let body = Bytes::from(std::fs::read(body).expect("the body file"));
    let suites = serve::tls_config(
        &tls.join("serving-kube-apiserver.crt"),
        &tls.join("serving-kube-apiserver.key"),
        &tls.join("client-ca.crt"),
    )
    .expect("TLS files");
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move { response(body) }
    });
    let listener = serve::bind(([127, 0, 0, 1], port).into()).await.expect("bind");
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    serve::serve(listener, suites, app, stopped).await;
    true
}

/// `body` in writes of the list's size, shared (not copied), with its length told first.
fn response(body: Bytes) -> axum::response::Response {
    let len = body.len();
    let writes: Vec<Result<Bytes, std::io::Error>> =
        (0..len).step_by(WRITE_BYTES).map(|at| Ok(body.slice(at..(at + WRITE_BYTES).min(len)))).collect();
    axum::response::Response::builder()
        .header("content-type", "application/json")
        .header("content-length", len)
        .body(Body::from_stream(futures_util::stream::iter(writes)))
        .expect("response")
}

/// The child serving a list's bytes, and a kubeconfig that reaches it.
pub struct Floor {
    child: Child,
    pub kubeconfig: PathBuf,
}

impl Floor {
    /// Serves `body` with the TLS files of the server whose data dir is
    /// `data_dir`; `kubeconfig` is that server's, pointed at the child.
    pub fn start(data_dir: &Path, kubeconfig: &Path, body: &[u8]) -> Floor {
        let port = crate::common::free_port();
        let file = data_dir.join("floor-body.json");
        std::fs::write(&file, body).expect("write the body");
        let tls = data_dir.join("server").join("tls");
        let child = Command::new(std::env::current_exe().expect("this bench"))
            .env(ENV, format!("{}|{port}|{}", tls.display(), file.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the floor server");
        let text = std::fs::read_to_string(kubeconfig).expect("kubeconfig");
        const SERVER: &str = "server: https://127.0.0.1:";
        let at = text.find(SERVER).expect("the server's address") + SERVER.len();
        let end = at + text[at..].find(|c: char| !c.is_ascii_digit()).expect("the port's end");
        let floor_kubeconfig = data_dir.join("floor-kubeconfig.yaml");
        std::fs::write(&floor_kubeconfig, format!("{}{port}{}", &text[..at], &text[end..])).expect("write kubeconfig");
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(started.elapsed() < Duration::from_secs(10), "the floor server did not start");
            std::thread::sleep(Duration::from_millis(10));
        }
        Floor { child, kubeconfig: floor_kubeconfig }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Floor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
