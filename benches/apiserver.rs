//! API server benchmark: creates, gets, lists and updates of ConfigMaps
//! over HTTPS with 1 and 16 concurrent clients (the `kube` crate, one
//! connection per client), and the server's resident memory holding 10k
//! ConfigMaps. Prints figures; it is not a pass/fail test.
//!
//! `cargo bench --bench apiserver [-- --quick]`; `FERROK_BIN` runs another
//! binary, `FERROK_BENCH_OPS` sets the operations of a 1-client phase
//! (1,000; each of the 16 clients runs a quarter of it), for phases long
//! enough to profile.

use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{client, rss_kib, start_with};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, PostParams};

fn cm(name: &str) -> ConfigMap {
    let mut c = ConfigMap::default();
    c.metadata.name = Some(name.to_string());
    c.data = Some([("key".to_string(), "v".repeat(100))].into_iter().collect());
    c
}

/// Runs `per_client` operations on each of `clients` connections.
async fn phase<F, Fut>(server: u32, label: &str, kubeconfig: &std::path::Path, clients: usize, per_client: usize, op: F)
where
    F: Fn(Api<ConfigMap>, usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<(), kube::Error>> + Send,
{
    let op = Arc::new(op);
    let mut tasks = Vec::new();
    let meter = common::Meter::start(server);
    for c in 0..clients {
        let api: Api<ConfigMap> = Api::namespaced(client(kubeconfig).await.expect("client"), "default");
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let t = Instant::now();
                if let Err(e) = op(api.clone(), c, i).await {
                    eprintln!("error: {e}");
                }
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    common::report_phase(label, clients, meter, tasks).await;
}

#[tokio::main]
async fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = match std::env::var("FERROK_BENCH_OPS").ok().and_then(|v| v.parse().ok()) {
        Some(n) => n,
        None if quick => 200,
        None => 1000,
    };
    let (server, _client, ready) = start_with(&[]).await;
    println!("ready after {ready:?} (kubeconfig written and /version answered)");
    let pid = server.child.id();
    let kubeconfig = server.dir.path().join("kubeconfig.yaml");
    let (rss, _) = rss_kib(pid);
    println!("server RSS at rest: {:.1} MiB", rss as f64 / 1024.0);
    for clients in [1usize, 16] {
        let per = if clients == 1 { n } else { n / 4 };
        let tag = format!("c{clients}");
        let t = tag.clone();
        phase(pid, "create", &kubeconfig, clients, per, move |api, c, i| {
            let t = t.clone();
            async move { api.create(&PostParams::default(), &cm(&format!("{t}-{c}-{i}"))).await.map(|_| ()) }
        })
        .await;
        let t = tag.clone();
        phase(pid, "get", &kubeconfig, clients, per, move |api, c, i| {
            let t = t.clone();
            async move { api.get(&format!("{t}-{c}-{i}")).await.map(|_| ()) }
        })
        .await;
        let t = tag.clone();
        phase(pid, "update", &kubeconfig, clients, per, move |api, c, i| {
            let t = t.clone();
            async move {
                let mut obj = api.get(&format!("{t}-{c}-{i}")).await?;
                obj.data.get_or_insert_with(Default::default).insert("n".into(), i.to_string());
                api.replace(&format!("{t}-{c}-{i}"), &PostParams::default(), &obj).await.map(|_| ())
            }
        })
        .await;
        phase(pid, "list500", &kubeconfig, clients, if quick { 5 } else { 20 }, |api, _, _| async move {
            api.list(&ListParams::default().limit(500)).await.map(|_| ())
        })
        .await;
    }
    // Fill to 10k ConfigMaps and measure memory.
    let existing = Api::<ConfigMap>::namespaced(client(&kubeconfig).await.expect("client"), "default")
        .list(&ListParams::default())
        .await
        .map(|l| l.items.len())
        .unwrap_or(0);
    let missing = 10_000usize.saturating_sub(existing);
    if !quick && missing > 0 {
        phase(pid, "fill", &kubeconfig, 16, missing / 16 + 1, |api, c, i| async move {
            api.create(&PostParams::default(), &cm(&format!("fill-{c}-{i}"))).await.map(|_| ())
        })
        .await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (rss, hwm) = rss_kib(pid);
    let db = std::fs::metadata(server.dir.path().join("server/db/state.db")).map(|m| m.len()).unwrap_or(0);
    println!(
        "server RSS holding {} ConfigMaps: {:.1} MiB (peak {:.1} MiB), database {:.1} MiB",
        if quick { existing } else { existing + missing },
        rss as f64 / 1024.0,
        hwm as f64 / 1024.0,
        db as f64 / 1048576.0
    );
    // Idle CPU over 10 s.
    let before = common::cpu_ticks(pid);
    let secs = if quick { 3 } else { 10 };
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let used = common::cpu_ticks(pid) - before;
    println!("idle CPU over {secs} s: {:.2} % of one core", used as f64 / (secs as f64 * 100.0) * 100.0);
}
