//! Soak: does a single-node control plane stay bounded when left running?
//! Two runs, one after the other, each on a fresh server: one idle, one
//! under churn (ConfigMap updates at a steady rate, plus an Event every
//! tenth update). Every sample period it prints the database file, the
//! WAL, the live part of the database (etcd's `dbSizeInUse`), the store's
//! revision and compact revision, and the server's resident memory; for the
//! churn run also the updates done and the slowest update of the period
//! (a long stall from compaction or vacuum would show there). It prints
//! figures; it is not a pass/fail test.
//!
//! ```text
//! cargo bench --profile dev --bench soak -- --minutes 30          # the issue's measurement
//! cargo bench --profile dev --bench soak -- --minutes 5 --compaction-interval 1m --event-ttl 2m
//! ```
//! Flags: `--minutes N` (per run, default 30), `--sample SECS` (default 60),
//! `--rate N` updates a minute (default 1000), `--keys N` ConfigMaps updated
//! in turn (default 100), `--compaction-interval D` and `--event-ttl D`
//! (passed to the server; its defaults when not given), `--only idle|churn`,
//! `--node` (the whole single-node cluster: the server with its node role in
//! a network namespace of its own, as the node tests run it, with `--pods N`
//! sleeping pods, default 10; needs root, containerd, runc and the CNI
//! plugins; the node's Lease and status add their own revisions).
//! `FERROK_BIN` runs another build of the binary (e.g. a release copy).

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;
#[path = "../tests/common/mod.rs"]
mod tcommon;

use common::{free_port, rss_kib, start_with};
use ferrok::store::proto::maintenance_client::MaintenanceClient;
use ferrok::store::proto::StatusRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Event, ObjectReference, Pod};
use kube::api::{Api, PostParams};

struct Options {
    minutes: u64,
    sample: Duration,
    rate: u64,
    keys: usize,
    server_flags: Vec<String>,
    only: Option<String>,
    node: bool,
    pods: usize,
}

fn options() -> Options {
    let args: Vec<String> = std::env::args().collect();
    let value = |flag: &str| args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).cloned();
    let number = |flag: &str, default: u64| value(flag).and_then(|v| v.parse().ok()).unwrap_or(default);
    let mut server_flags = Vec::new();
    for flag in ["--compaction-interval", "--event-ttl"] {
        if let Some(v) = value(flag) {
            let name = if flag == "--compaction-interval" { "--etcd-compaction-interval" } else { flag };
            server_flags.extend([name.to_string(), v]);
        }
    }
    Options {
        minutes: number("--minutes", 30),
        sample: Duration::from_secs(number("--sample", 60)),
        rate: number("--rate", 1000),
        keys: number("--keys", 100) as usize,
        server_flags,
        only: value("--only"),
        node: args.iter().any(|a| a == "--node"),
        pods: number("--pods", 10) as usize,
    }
}

fn file_mib(path: &Path) -> f64 {
    std::fs::metadata(path).map(|m| m.len() as f64 / 1048576.0).unwrap_or(0.0)
}

fn config_map(name: &str, n: u64) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.to_string());
    cm.data = Some([("n".to_string(), n.to_string()), ("pad".to_string(), "x".repeat(1024))].into_iter().collect());
    cm
}

fn event(n: u64) -> Event {
    let mut ev = Event::default();
    ev.metadata.generate_name = Some("soak-".into());
    ev.involved_object = ObjectReference {
        kind: Some("ConfigMap".into()),
        name: Some("soak".into()),
        namespace: Some("default".into()),
        ..Default::default()
    };
    ev.reason = Some("Updated".into());
    ev.message = Some(format!("update {n}"));
    ev.type_ = Some("Normal".into());
    ev
}

/// Updates the ConfigMaps in turn at `per_minute`, an Event every tenth
/// update, until `until`; counts updates and keeps the slowest of each period.
async fn churn(
    client: kube::Client,
    keys: usize,
    per_minute: u64,
    until: Instant,
    done: Arc<AtomicU64>,
    slowest_us: Arc<AtomicU64>,
) {
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let events: Api<Event> = Api::namespaced(client, "default");
    for k in 0..keys {
        if let Err(e) = cms.create(&PostParams::default(), &config_map(&format!("soak-{k}"), 0)).await {
            eprintln!("create soak-{k}: {e}");
        }
    }
    let period = Duration::from_secs_f64(60.0 / per_minute.max(1) as f64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut n = 0u64;
    while Instant::now() < until {
        tick.tick().await;
        n += 1;
        let name = format!("soak-{}", n as usize % keys.max(1));
        let started = Instant::now();
        let updated = async {
            let mut cm = cms.get(&name).await?;
            cm.data = config_map(&name, n).data;
            cms.replace(&name, &PostParams::default(), &cm).await
        }
        .await;
        slowest_us.fetch_max(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        match updated {
            Ok(_) => {
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => eprintln!("update {name}: {e}"),
        }
        if n.is_multiple_of(10) {
            if let Err(e) = events.create(&PostParams::default(), &event(n)).await {
                eprintln!("event: {e}");
            }
        }
    }
}

/// What runs under the soak: the control plane alone, or the whole
/// single-node cluster with its node role in a namespace of its own.
enum Cluster {
    ControlPlane(common::Server),
    Node(Box<tcommon::node::Node>),
}

impl Cluster {
    fn pid(&self) -> u32 {
        match self {
            Cluster::ControlPlane(s) => s.child.id(),
            Cluster::Node(n) => n.pid().unwrap_or(0),
        }
    }

    fn data_dir(&self) -> &Path {
        match self {
            Cluster::ControlPlane(s) => s.dir.path(),
            Cluster::Node(n) => n.dir.path(),
        }
    }
}

/// `count` pods that sleep, all Running before the soak's clock starts.
async fn sleeping_pods(client: &kube::Client, count: usize) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..count {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("idle-{i}")},
            "spec": {"terminationGracePeriodSeconds": 1,
                     "containers": [{"name": "c", "image": tcommon::node::BUSYBOX, "command": ["sleep", "1000000"]}]}
        }))
        .expect("pod");
        if let Err(e) = pods.create(&PostParams::default(), &pod).await {
            eprintln!("create idle-{i}: {e}");
        }
    }
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(120) {
        let list = pods.list(&Default::default()).await.map(|l| l.items).unwrap_or_default();
        let running = list.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"));
        if running.count() >= count {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("not all {count} pods Running after 120 s; soaking anyway");
}

async fn start(opts: &Options) -> (Cluster, kube::Client, String) {
    if !opts.node {
        let etcd_url = format!("http://127.0.0.1:{}", free_port());
        let mut flags: Vec<&str> = vec!["--datastore-listen", &etcd_url];
        flags.extend(opts.server_flags.iter().map(String::as_str));
        let (server, client, _) = start_with(&flags).await;
        return (Cluster::ControlPlane(server), client, etcd_url);
    }
    let mut node = tcommon::node::Node::new(&[]);
    let etcd_url = format!("http://{}:2379", node.ip);
    node.extra.extend(["--datastore-listen".to_string(), etcd_url.clone()]);
    node.extra.extend(opts.server_flags.iter().cloned());
    let node = tokio::task::spawn_blocking(move || {
        node.launch();
        node
    })
    .await
    .expect("start the node");
    let client = tcommon::kube_client(&node.kubeconfig()).await;
    sleeping_pods(&client, opts.pods).await;
    (Cluster::Node(Box::new(node)), client, etcd_url)
}

async fn run(label: &str, opts: &Options, with_churn: bool) {
    let (server, client, etcd_url) = start(opts).await;
    let pid = server.pid();
    let db = server.data_dir().join("server/db/state.db");
    let wal = server.data_dir().join("server/db/state.db-wal");
    let mut maintenance = match tonic::transport::Endpoint::from_shared(etcd_url.clone()) {
        Ok(ep) => match ep.connect().await {
            Ok(ch) => Some(MaintenanceClient::new(ch)),
            Err(e) => {
                eprintln!("cannot reach the store's etcd face: {e}");
                None
            }
        },
        Err(e) => {
            eprintln!("bad URL {etcd_url}: {e}");
            None
        }
    };
    println!(
        "\n== {label}: {} min, sample every {:?}, server flags {:?}, {}",
        opts.minutes,
        opts.sample,
        opts.server_flags,
        if opts.node { format!("node role with {} pods", opts.pods) } else { "control plane alone".into() }
    );
    println!(
        "{:>6} {:>9} {:>9} {:>10} {:>9} {:>9} {:>8} {:>9} {:>10}",
        "min", "db MiB", "wal MiB", "inuse MiB", "rev", "compact", "rss MiB", "updates", "slowest ms"
    );
    let started = Instant::now();
    let until = started + Duration::from_secs(opts.minutes * 60);
    let done = Arc::new(AtomicU64::new(0));
    let slowest = Arc::new(AtomicU64::new(0));
    let writer = with_churn
        .then(|| tokio::spawn(churn(client.clone(), opts.keys, opts.rate, until, done.clone(), slowest.clone())));
    let mut compact_rev = 0;
    loop {
        let at = started.elapsed();
        let (in_use, rev) = match maintenance.as_mut() {
            Some(m) => match m.status(StatusRequest {}).await {
                Ok(s) => {
                    let s = s.into_inner();
                    (s.db_size_in_use as f64 / 1048576.0, s.header.map_or(0, |h| h.revision))
                }
                Err(e) => {
                    eprintln!("status: {e}");
                    (0.0, 0)
                }
            },
            None => (0.0, 0),
        };
        if let Some(kv) = compact_rev_key(&etcd_url).await {
            compact_rev = kv;
        }
        let (rss, _) = rss_kib(pid);
        println!(
            "{:>6.1} {:>9.2} {:>9.2} {:>10.2} {:>9} {:>9} {:>8.1} {:>9} {:>10.1}",
            at.as_secs_f64() / 60.0,
            file_mib(&db),
            file_mib(&wal),
            in_use,
            rev,
            compact_rev,
            rss as f64 / 1024.0,
            done.load(Ordering::Relaxed),
            slowest.swap(0, Ordering::Relaxed) as f64 / 1000.0,
        );
        if Instant::now() >= until {
            break;
        }
        tokio::time::sleep(opts.sample.min(until.saturating_duration_since(Instant::now()))).await;
    }
    if let Some(w) = writer {
        let _ = w.await;
    }
    drop(server);
}

/// The revision the API servers last compacted to: the value of
/// `compact_rev_key`, written by the round that compacted to it.
async fn compact_rev_key(url: &str) -> Option<i64> {
    let ch = tonic::transport::Endpoint::from_shared(url.to_string()).ok()?.connect().await.ok()?;
    let req = ferrok::store::proto::RangeRequest { key: b"compact_rev_key".to_vec(), ..Default::default() };
    let resp = ferrok::store::proto::kv_client::KvClient::new(ch).range(req).await.ok()?.into_inner();
    std::str::from_utf8(&resp.kvs.first()?.value).ok()?.parse().ok()
}

#[tokio::main]
async fn main() {
    let opts = options();
    if opts.only.as_deref() != Some("churn") {
        run("idle", &opts, false).await;
    }
    if opts.only.as_deref() != Some("idle") {
        run(&format!("churn ({} updates/min over {} ConfigMaps)", opts.rate, opts.keys), &opts, true).await;
    }
}
