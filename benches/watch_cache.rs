//! Watch cache benchmark: creates of 5,000 1 KiB ConfigMaps at 16
//! clients, lists of them at 1 and 16 clients beside the same bytes
//! served with no API work (the list's floor on this machine, `floor`),
//! the server's memory with them and with 10,000 pods, and W watchers of
//! pods (1, 10, 50, 100) while pods change at about 1,000/s: delivery
//! latency and the server's CPU per change. Prints figures; it is not a
//! pass/fail test.
//!
//! `cargo bench --bench watch_cache [-- --quick]`; `FERROK_BENCH_ARGS`
//! adds server flags (`--default-watch-cache-size 0` turns the cache off,
//! so the store answers every read), `FERROK_BIN` runs another binary,
//! `FERROK_BENCH_LISTS` sets the lists per list phase (40),
//! `FERROK_BENCH_CREATE_CLIENTS` the clients that create (16).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
#[path = "watch_cache/floor.rs"]
mod floor;

use common::{client, percentile, rss_kib, start_with};
use http_body_util::BodyExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// The `bench/sent-ns` annotation of the object in a watch event's line,
/// found by a substring search (the line is not parsed).
fn sent_stamp(line: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\"bench/sent-ns\":\"";
    let at = memchr::memmem::find(line, KEY)? + KEY.len();
    let digits = &line[at..];
    let end = memchr::memchr(b'"', digits)?;
    std::str::from_utf8(&digits[..end]).ok()?.parse().ok()
}

/// utime + stime of `pid`, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    common::cpu_ticks(pid) as f64 / 100.0
}

/// GETs `path` and reads its body to the end, frame by frame, counting the
/// bytes: the bench reads what the server sends (and decrypts it) but
/// does not copy it into one buffer, which it would never use.
async fn raw_get(client: &kube::Client, path: &str) -> usize {
    let req = axum::http::Request::get(path).body(kube::client::Body::empty()).expect("request");
    let resp = client.send(req).await.expect("send");
    assert!(resp.status().is_success(), "{path}: {}", resp.status());
    let mut body = resp.into_body();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        len += frame.expect("body").data_ref().map_or(0, |d| d.len());
    }
    len
}

/// Runs `op(client index, i)` `per_client` times on each of `clients` connections.
async fn phase<F, Fut>(server: u32, label: &str, kubeconfig: &std::path::Path, clients: usize, per_client: usize, op: F)
where
    F: Fn(kube::Client, usize, usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let op = Arc::new(op);
    let mut tasks = Vec::new();
    let meter = common::Meter::start(server);
    for c in 0..clients {
        let cl = client(kubeconfig).await.expect("client");
        let op = op.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(per_client);
            for i in 0..per_client {
                let t = Instant::now();
                op(cl.clone(), c, i).await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    common::report_phase(label, clients, meter, tasks).await;
}

fn cm(name: &str) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v".repeat(1000)}})).expect("cm")
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "c", "image": "busybox"}]}
    }))
    .expect("pod")
}

#[tokio::main]
async fn main() {
    if floor::serve_if_asked().await {
        return;
    }
    let quick = std::env::args().any(|a| a == "--quick");
    let extra: Vec<String> =
        std::env::var("FERROK_BENCH_ARGS").unwrap_or_default().split_whitespace().map(str::to_string).collect();
    let extra_refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut flags = vec!["--etcd-compaction-interval", "0"];
    flags.extend(extra_refs);
    let (server, admin, _) = start_with(&flags).await;
    let pid = server.child.id();
    let kubeconfig = server.kubeconfig();
    println!("server flags: {flags:?}");
    println!("server RSS at rest: {:.1} MiB", rss_kib(pid).0 as f64 / 1024.0);

    // Creates of 5,000 1 KiB ConfigMaps at 16 clients
    // (FERROK_BENCH_CREATE_CLIENTS: another count, to see how much of the
    // time at 16 is waiting rather than work).
    let n_cms = if quick { 1000 } else { 5000 };
    let creators =
        std::env::var("FERROK_BENCH_CREATE_CLIENTS").ok().and_then(|n| n.parse().ok()).filter(|n| *n > 0).unwrap_or(16);
    phase(pid, "create configmap 1KiB", &kubeconfig, creators, n_cms / creators + 1, |c, k, i| async move {
        let api: Api<ConfigMap> = Api::namespaced(c, "default");
        if let Err(e) = api.create(&PostParams::default(), &cm(&format!("cm-{k:02}-{i:05}"))).await {
            eprintln!("create: {e}");
        }
    })
    .await;
    let path = "/api/v1/namespaces/default/configmaps";
    let bytes = raw_get(&admin, path).await;
    println!("list size: {:.1} MiB", bytes as f64 / (1 << 20) as f64);
    println!("server RSS with {n_cms} ConfigMaps: {:.1} MiB", rss_kib(pid).0 as f64 / 1024.0);
    // FERROK_BENCH_LISTS: lists per phase at 1 client (16 clients make a
    // quarter as many each), for a longer phase to profile or compare.
    let lists =
        std::env::var("FERROK_BENCH_LISTS").ok().and_then(|n| n.parse().ok()).unwrap_or(if quick { 10 } else { 40 });
    phase(pid, &format!("list {n_cms} configmaps"), &kubeconfig, 1, lists, move |c, _, _| async move {
        raw_get(&c, path).await;
    })
    .await;
    phase(pid, &format!("list {n_cms} configmaps"), &kubeconfig, 16, lists / 4, move |c, _, _| async move {
        raw_get(&c, path).await;
    })
    .await;
    // The same bytes served from memory by ferrok's TLS and HTTP serving
    // alone: what any list of them costs on this machine (`floor`).
    let req = axum::http::Request::get(path).body(kube::client::Body::empty()).expect("request");
    let body = admin.send(req).await.expect("list").into_body().collect().await.expect("body").to_bytes();
    let floor = floor::Floor::start(server.dir.path(), &kubeconfig, &body);
    for clients in [1, 16] {
        let per_client = if clients == 1 { lists } else { lists / 4 };
        let label = "list floor: bytes, no API";
        phase(floor.pid(), label, &floor.kubeconfig, clients, per_client, move |c, _, _| async move {
            raw_get(&c, path).await;
        })
        .await;
    }
    drop(floor);
    phase(pid, &format!("list {n_cms} cms rv=0"), &kubeconfig, 1, lists, move |c, _, _| async move {
        raw_get(&c, &format!("{path}?resourceVersion=0")).await;
    })
    .await;
    println!("server RSS after the lists: {:.1} MiB", rss_kib(pid).0 as f64 / 1024.0);

    // 10,000 pods.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(admin.clone());
    let node = serde_json::from_value(json!({"metadata": {"name": "bench-node"}})).expect("node");
    nodes.create(&PostParams::default(), &node).await.expect("node");
    let n_pods = if quick { 2000 } else { 10000 };
    phase(pid, "create pod", &kubeconfig, 16, n_pods / 16, |c, k, i| async move {
        let api: Api<Pod> = Api::namespaced(c, "default");
        if let Err(e) = api.create(&PostParams::default(), &pod(&format!("p-{k:02}-{i:05}"))).await {
            eprintln!("create pod: {e}");
        }
    })
    .await;
    raw_get(&admin, "/api/v1/pods").await;
    println!("server RSS with {n_cms} ConfigMaps and {n_pods} pods: {:.1} MiB", rss_kib(pid).0 as f64 / 1024.0);

    // Watchers of pods while pods change at ~1,000/s.
    let changing: Vec<String> = (0..200).map(|i| format!("p-{:02}-{:05}", i % 16, i / 16)).collect();
    let changing = Arc::new(changing);
    let origin = Instant::now();
    let seconds = if quick { 3 } else { 5 };
    for watchers in [1usize, 10, 50, 100] {
        let delivered = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        let (_, _, list_rv) = {
            let req = axum::http::Request::get("/api/v1/namespaces/default/pods?limit=1")
                .body(kube::client::Body::empty())
                .expect("request");
            let body = admin.send(req).await.expect("list").into_body().collect().await.expect("body").to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            ((), (), v["metadata"]["resourceVersion"].as_str().unwrap_or("0").to_string())
        };
        let (stop, stopped) = tokio::sync::watch::channel(false);
        for _ in 0..watchers {
            let c = client(&kubeconfig).await.expect("client");
            let (got, mut stopped) = (delivered.clone(), stopped.clone());
            let path = format!("/api/v1/namespaces/default/pods?watch=1&resourceVersion={list_rv}&timeoutSeconds=120");
            tasks.push(tokio::spawn(async move {
                let req = axum::http::Request::get(path).body(kube::client::Body::empty()).expect("request");
                let mut body = c.send(req).await.expect("watch").into_body();
                let (mut buf, mut lat) = (Vec::new(), Vec::new());
                loop {
                    let frame = tokio::select! {
                        f = body.frame() => f,
                        _ = stopped.changed() => break,
                    };
                    let Some(Ok(frame)) = frame else { break };
                    let Ok(data) = frame.into_data() else { continue };
                    buf.extend_from_slice(&data);
                    // Each complete line is one event; the watcher finds the
                    // writer's stamp by a string search rather than parsing
                    // the whole pod, so the 100 watchers (which share the
                    // server's two cores) measure the server's delivery and
                    // not their own JSON decoding.
                    let mut start = 0;
                    while let Some(i) = memchr::memchr(b'\n', &buf[start..]) {
                        let line = &buf[start..start + i];
                        start += i + 1;
                        if let Some(sent) = sent_stamp(line) {
                            let now = origin.elapsed().as_nanos() as u64;
                            lat.push(Duration::from_nanos(now.saturating_sub(sent)));
                            got.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    buf.drain(..start);
                }
                lat
            }));
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (cpu0, bench0) = (cpu_seconds(pid), cpu_seconds(std::process::id()));
        let started = Instant::now();
        let writes = Arc::new(AtomicUsize::new(0));
        let patch_times = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut writers = Vec::new();
        // 16 writers, each paced to ~1,000/16 changes a second, their
        // phases spread over the period: a change about every millisecond,
        // not 16 at once every 16 ms.
        let period = Duration::from_micros(16_000);
        for w in 0..16usize {
            let c = client(&kubeconfig).await.expect("client");
            let (changing, writes, patch_times) = (changing.clone(), writes.clone(), patch_times.clone());
            writers.push(tokio::spawn(async move {
                let api: Api<Pod> = Api::namespaced(c, "default");
                let mut next = started + period * w as u32 / 16;
                tokio::time::sleep_until(next.into()).await;
                let mut i = w;
                while started.elapsed() < Duration::from_secs(seconds) {
                    let name = &changing[i % changing.len()];
                    let sent = origin.elapsed().as_nanos().to_string();
                    let patch = json!({"metadata": {"annotations": {"bench/sent-ns": sent}}});
                    let t = Instant::now();
                    if api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                        patch_times.lock().expect("lock").push(t.elapsed());
                        writes.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 16;
                    next += period;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        tokio::time::sleep(wait).await;
                    }
                }
            }));
        }
        for w in writers {
            w.await.expect("writer");
        }
        let elapsed = started.elapsed();
        let changes = writes.load(Ordering::Relaxed);
        // Let the last deliveries arrive.
        let deadline = Instant::now() + Duration::from_secs(10);
        while delivered.load(Ordering::Relaxed) < changes * watchers && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let cpu = cpu_seconds(pid) - cpu0;
        let bench_cpu = cpu_seconds(std::process::id()) - bench0;
        let _ = stop.send(true);
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.expect("watcher"));
        }
        lat.sort();
        let mut patches = std::mem::take(&mut *patch_times.lock().expect("lock"));
        patches.sort();
        println!(
            "watchers={watchers:<3} changes={changes:<5} ({:>5.0}/s) delivered={:<6} latency p50 {:>7.2} ms p99 {:>8.2} ms (patch p50 {:.2} ms p99 {:.2} ms)  server CPU {:.2} s = {:>6.1} µs/change, {:>5.1} µs/delivery; clients {:>5.1} µs/delivery",
            changes as f64 / elapsed.as_secs_f64(),
            lat.len(),
            percentile(&lat, 0.5),
            percentile(&lat, 0.99),
            percentile(&patches, 0.5),
            percentile(&patches, 0.99),
            cpu,
            cpu * 1e6 / changes.max(1) as f64,
            cpu * 1e6 / lat.len().max(1) as f64,
            bench_cpu * 1e6 / lat.len().max(1) as f64,
        );
    }
    println!("server RSS at the end: {:.1} MiB", rss_kib(pid).0 as f64 / 1024.0);
}
