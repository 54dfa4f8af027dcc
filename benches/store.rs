//! Store benchmark: real etcd against `ferrok datastore`, both driven over
//! the etcd v3 gRPC API by the same client code. It prints figures; it is not
//! a pass/fail test.
//!
//! ```text
//! ./bench                  # full run (about 3 minutes)
//! ./bench --quick          # short run
//! ./bench --help           # all flags
//! ```
//!
//! Workloads, run against each target in turn (the others sit idle); the
//! size test runs first, on the fresh database:
//! 1. writes: the kube-apiserver's create and update txns, 1 KiB values, at
//!    several client counts; ops/s, latency, bytes sent to storage and CPU
//!    per write (server and clients), and the share of the CPUs left idle.
//! 2. watch: delivery latency (receive time minus the send time carried in
//!    the value) for a paced writer and for a burst.
//! 3. size: the database after N updates to K keys, before and after a
//!    physical compaction to head, and after Defragment.
//! 4. memory: VmRSS/VmHWM at rest after start and after the runs.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use ferrok::store::proto::compare::{CompareResult, CompareTarget, TargetUnion};
use ferrok::store::proto::kv_client::KvClient;
use ferrok::store::proto::maintenance_client::MaintenanceClient;
use ferrok::store::proto::request_op::Request as Op;
use ferrok::store::proto::watch_client::WatchClient;
use ferrok::store::proto::watch_request::RequestUnion;
use ferrok::store::proto::{
    CompactionRequest, Compare, DefragmentRequest, PutRequest, RangeRequest, RequestOp, StatusRequest, TxnRequest,
    TxnResponse, WatchCreateRequest, WatchRequest,
};
use tonic::transport::{Channel, Endpoint};

mod common;

const VALUE_BYTES: usize = 1024;
/// Longest any single RPC may take before it counts as an error (a hang).
const RPC_TIMEOUT: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------- options

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Etcd,
    FerrokFull,
    FerrokNormal,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Etcd => "etcd",
            Kind::FerrokFull => "ferrok-full",
            Kind::FerrokNormal => "ferrok-normal",
        }
    }
    fn parse(s: &str) -> Option<Kind> {
        match s {
            "etcd" => Some(Kind::Etcd),
            "ferrok" | "ferrok-full" | "full" => Some(Kind::FerrokFull),
            "ferrok-normal" | "normal" => Some(Kind::FerrokNormal),
            _ => None,
        }
    }
}

#[derive(Debug, Clone)]
struct Opts {
    targets: Vec<Kind>,
    secs: f64,
    levels: Vec<usize>,
    shared_channel: bool,
    watch_rate: u64,
    watch_secs: f64,
    burst: usize,
    burst_writers: usize,
    size_keys: usize,
    size_updates: usize,
    size_writers: usize,
    etcd_bin: PathBuf,
    ferrok_bin: PathBuf,
    phases: Vec<String>,
}

const HELP: &str = "\
usage: ./bench [--quick] [flags]   (or: cargo bench --bench store -- [flags])

  --quick               short run (1 s per level, 200 watch events, 10k updates to 100 keys)
  --targets LIST        comma list of etcd,ferrok-full,ferrok-normal (default: all three)
  --duration SECS       seconds per write concurrency level (default 5)
  --clients LIST        concurrency levels (default 1,16,64)
  --shared-channel      all clients of a level share one gRPC connection
                        (default: one connection per client)
  --phases LIST         comma list of writes,watch,size (default: all; memory is always reported)
  --watch-rate N        paced watch writer, puts per second (default 200)
  --watch-secs SECS     paced watch duration (default 3)
  --burst N             burst watch variant, puts (default 2000)
  --burst-writers N     concurrent writers in the burst (default 16)
  --size-keys N         keys in the size test (default 1000)
  --size-updates N      updates in the size test (default 100000)
  --size-writers N      concurrent writers in the size test (default 16)
  --etcd PATH           etcd binary (default /usr/bin/etcd, or $ETCD_BIN)
  --ferrok PATH         ferrok binary (default: the one cargo built, or $FERROK_BIN)
";

fn parse_opts() -> Opts {
    let mut o = Opts {
        targets: vec![Kind::Etcd, Kind::FerrokFull, Kind::FerrokNormal],
        secs: 5.0,
        levels: vec![1, 16, 64],
        shared_channel: false,
        watch_rate: 200,
        watch_secs: 3.0,
        burst: 2000,
        burst_writers: 16,
        size_keys: 1000,
        size_updates: 100_000,
        size_writers: 16,
        phases: vec!["writes".into(), "watch".into(), "size".into()],
        ferrok_bin: std::env::var_os("FERROK_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_ferrok").into()),
        etcd_bin: std::env::var_os("ETCD_BIN").map(PathBuf::from).unwrap_or_else(|| "/usr/bin/etcd".into()),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    // --quick first, so that explicit flags override it wherever they stand.
    if args.iter().any(|a| a == "--quick") {
        o.secs = 1.0;
        o.watch_secs = 1.0;
        o.burst = 500;
        o.size_keys = 100;
        o.size_updates = 10_000;
    }
    let mut it = args.into_iter();
    fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> T {
        match v.as_deref().map(str::parse) {
            Some(Ok(n)) => n,
            _ => die(&format!("{flag} needs a number\n\n{HELP}")),
        }
    }
    fn list(flag: &str, v: Option<String>) -> Vec<String> {
        match v {
            Some(v) => v.split(',').filter(|s| !s.is_empty()).map(String::from).collect(),
            None => die(&format!("{flag} needs a comma list\n\n{HELP}")),
        }
    }
    while let Some(a) = it.next() {
        match a.as_str() {
            "--bench" | "--quick" => {} // cargo bench passes --bench to harness=false benches
            "-h" | "--help" => {
                print!("{HELP}");
                std::process::exit(0);
            }
            "--targets" => {
                o.targets = list(&a, it.next())
                    .iter()
                    .map(|s| Kind::parse(s).unwrap_or_else(|| die(&format!("unknown target {s:?}\n\n{HELP}"))))
                    .collect()
            }
            "--duration" => o.secs = num(&a, it.next()),
            "--clients" => {
                o.levels = list(&a, it.next())
                    .iter()
                    .map(|s| s.parse().unwrap_or_else(|_| die(&format!("--clients: bad number {s:?}"))))
                    .collect()
            }
            "--shared-channel" => o.shared_channel = true,
            "--phases" => {
                o.phases = list(&a, it.next());
                if let Some(p) = o.phases.iter().find(|p| !["writes", "watch", "size"].contains(&p.as_str())) {
                    die(&format!("unknown phase {p:?}\n\n{HELP}"));
                }
            }
            "--watch-rate" => o.watch_rate = num(&a, it.next()),
            "--watch-secs" => o.watch_secs = num(&a, it.next()),
            "--burst" => o.burst = num(&a, it.next()),
            "--burst-writers" => o.burst_writers = num(&a, it.next()),
            "--size-keys" => o.size_keys = num(&a, it.next()),
            "--size-updates" => o.size_updates = num(&a, it.next()),
            "--size-writers" => o.size_writers = num(&a, it.next()),
            "--ferrok" => o.ferrok_bin = it.next().map(PathBuf::from).unwrap_or_else(|| die("--ferrok needs a path")),
            "--etcd" => o.etcd_bin = it.next().map(PathBuf::from).unwrap_or_else(|| die("--etcd needs a path")),
            other => die(&format!("unknown argument {other:?}\n\n{HELP}")),
        }
    }
    o.size_keys = o.size_keys.max(1);
    o.size_writers = o.size_writers.clamp(1, o.size_keys);
    o.burst_writers = o.burst_writers.max(1);
    o.watch_rate = o.watch_rate.max(1);
    o
}

/// Progress on stderr, with seconds since the start.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("bench [{:6.1}s] {}", now_ns() as f64 / 1e9, format!($($arg)*))
    };
}

fn die(msg: &str) -> ! {
    eprintln!("bench: {msg}");
    std::process::exit(2);
}

// ---------------------------------------------------------------- processes

/// A server process; killed (and reaped) when dropped, also on panic. Its
/// data directory is removed after the process is gone.
struct Proc {
    child: Child,
    log: PathBuf,
    data: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let text =
            std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()));
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

struct Target {
    kind: Kind,
    url: String,
    proc: Proc,
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn spawn(kind: Kind, opts: &Opts) -> Result<Target, String> {
    let tmp = tempfile::Builder::new()
        .prefix(&format!("ferrok-bench-{}-", kind.name()))
        .tempdir()
        .map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let data = tmp.path().join("data");
    let log = tmp.path().join("server.log");
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let url = format!("http://127.0.0.1:{port}");
    let mut cmd;
    match kind {
        Kind::Etcd => {
            if !opts.etcd_bin.is_file() {
                return Err(format!(
                    "{} not found (apt-get install -y etcd-server etcd-client, or pass --etcd PATH)",
                    opts.etcd_bin.display()
                ));
            }
            let peer = format!("http://127.0.0.1:{}", free_port().map_err(|e| format!("no free port: {e}"))?);
            cmd = Command::new(&opts.etcd_bin);
            cmd.arg("--name").arg("default");
            cmd.arg("--data-dir").arg(&data);
            cmd.args(["--listen-client-urls", &url, "--advertise-client-urls", &url]);
            cmd.args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer]);
            cmd.arg("--initial-cluster").arg(format!("default={peer}"));
            cmd.args(["--quota-backend-bytes", "8589934592"]);
        }
        Kind::FerrokFull | Kind::FerrokNormal => {
            cmd = Command::new(&opts.ferrok_bin);
            cmd.arg("datastore");
            cmd.arg("--data-dir").arg(&data);
            cmd.args(["--listen-client-urls", &url]);
            cmd.args(["--sync", if kind == Kind::FerrokFull { "full" } else { "normal" }]);
        }
    }
    let out = std::fs::File::create(&log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let err = out.try_clone().map_err(|e| format!("cannot dup log file: {e}"))?;
    cmd.stdin(Stdio::null()).stdout(out).stderr(err);
    // Die with the bench even if it is killed by a signal (Drop does not run
    // then). Spawned from the main thread, which lives as long as the bench.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| format!("cannot start {:?}: {e}", cmd.get_program()))?;
    Ok(Target { kind, url, proc: Proc { child, log, data, _tmp: tmp } })
}

async fn connect(url: &str) -> Result<Channel, String> {
    Endpoint::from_shared(url.to_string())
        .map_err(|e| format!("bad url {url}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| format!("connect {url}: {e}"))
}

/// Waits until the target answers a Range.
async fn wait_ready(t: &mut Target) -> Result<Duration, String> {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < Duration::from_secs(60) {
        if let Ok(Some(status)) = t.proc.child.try_wait() {
            return Err(format!("exited with {status}; log tail:\n{}", t.proc.log_tail()));
        }
        match connect(&t.url).await {
            Ok(ch) => {
                let req = RangeRequest { key: b"/ready".to_vec(), ..Default::default() };
                match tokio::time::timeout(Duration::from_secs(2), KvClient::new(ch).range(req)).await {
                    Ok(Ok(_)) => return Ok(start.elapsed()),
                    Ok(Err(e)) => last = format!("range: {e}"),
                    Err(_) => last = "range timed out".into(),
                }
            }
            Err(e) => last = e,
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("not ready after 60 s ({last}); log tail:\n{}", t.proc.log_tail()))
}

// ---------------------------------------------------------------- measurements

#[derive(Clone, Copy, Default)]
struct Mem {
    rss_kib: u64,
    hwm_kib: u64,
}

fn mem(pid: u32) -> Mem {
    let mut m = Mem::default();
    match std::fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => {
            for line in s.lines() {
                let val = || line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
                if line.starts_with("VmRSS:") {
                    m.rss_kib = val();
                } else if line.starts_with("VmHWM:") {
                    m.hwm_kib = val();
                }
            }
        }
        Err(e) => eprintln!("bench: cannot read /proc/{pid}/status: {e}"),
    }
    m
}

/// The bytes `pid` has sent to storage so far (`write_bytes` of
/// /proc/PID/io, counted when it dirties a page), or None where the kernel
/// does not keep the count.
fn write_bytes(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines().find_map(|l| l.strip_prefix("write_bytes:")).and_then(|v| v.trim().parse().ok())
}

/// Time all CPUs have spent idle (idle and iowait) so far, in clock ticks.
fn idle_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu: Vec<u64> = stat.lines().next()?.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    Some(cpu.get(3)? + cpu.get(4)?)
}

/// What a write level cost the machine: CPU per op of the server and of
/// the clients (this process), and the share of all CPUs left idle; it
/// tells a level bound by work from one bound by waiting (the disk's
/// flush, hand-offs between threads).
struct CpuCost {
    server: u64,
    clients: u64,
    idle: Option<u64>,
    at: Instant,
}

impl CpuCost {
    fn start(server: u32) -> CpuCost {
        CpuCost {
            server: common::cpu_ticks(server),
            clients: common::cpu_ticks(std::process::id()),
            idle: idle_ticks(),
            at: Instant::now(),
        }
    }

    /// "server µs/op, clients µs/op, idle %" as three columns.
    fn columns(&self, server: u32, ops: u64) -> String {
        let per_op = |before: u64, after: u64| {
            format!("{:.0}", after.saturating_sub(before) as f64 * 10_000.0 / ops.max(1) as f64)
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let idle = match (self.idle, idle_ticks()) {
            (Some(a), Some(b)) => {
                format!("{:.0}", b.saturating_sub(a) as f64 / (self.at.elapsed().as_secs_f64() * 100.0 * cpus) * 100.0)
            }
            _ => "?".into(),
        };
        format!(
            "{:>10} {:>10} {:>7}",
            per_op(self.server, common::cpu_ticks(server)),
            per_op(self.clients, common::cpu_ticks(std::process::id())),
            idle
        )
    }
}

/// Apparent size and allocated bytes of a file, or of all files under a folder.
fn disk(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let Ok(md) = std::fs::symlink_metadata(path) else { return (0, 0) };
    if md.is_dir() {
        let mut sum = (0, 0);
        if let Ok(rd) = std::fs::read_dir(path) {
            for e in rd.flatten() {
                let (a, b) = disk(&e.path());
                sum.0 += a;
                sum.1 += b;
            }
        }
        sum
    } else {
        (md.len(), md.blocks() * 512)
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / (1024.0 * 1024.0))
}

/// Latencies in microseconds.
struct Lat(Vec<u64>);

impl Lat {
    fn sorted(mut v: Vec<u64>) -> Lat {
        v.sort_unstable();
        Lat(v)
    }
    fn pct_ms(&self, q: f64) -> String {
        if self.0.is_empty() {
            return "-".into();
        }
        let i = ((q * self.0.len() as f64).ceil() as usize).clamp(1, self.0.len()) - 1;
        format!("{:.2}", self.0[i] as f64 / 1000.0)
    }
    fn max_ms(&self) -> String {
        self.0.last().map(|v| format!("{:.2}", *v as f64 / 1000.0)).unwrap_or_else(|| "-".into())
    }
}

/// Nanoseconds since the bench started; carried in watch values.
fn now_ns() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

// ---------------------------------------------------------------- requests

/// The apiserver's create: put if the key does not exist.
fn create_txn(key: &[u8], value: Vec<u8>) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.to_vec(),
            range_end: vec![],
            target_union: Some(TargetUnion::ModRevision(0)),
        }],
        success: vec![RequestOp {
            request: Some(Op::RequestPut(PutRequest { key: key.to_vec(), value, ..Default::default() })),
        }],
        failure: vec![],
    }
}

/// The apiserver's update: put if unchanged since `rev`, else read it back.
fn update_txn(key: &[u8], rev: i64, value: Vec<u8>) -> TxnRequest {
    TxnRequest {
        compare: vec![Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Mod as i32,
            key: key.to_vec(),
            range_end: vec![],
            target_union: Some(TargetUnion::ModRevision(rev)),
        }],
        success: vec![RequestOp {
            request: Some(Op::RequestPut(PutRequest { key: key.to_vec(), value, ..Default::default() })),
        }],
        failure: vec![RequestOp {
            request: Some(Op::RequestRange(RangeRequest { key: key.to_vec(), ..Default::default() })),
        }],
    }
}

fn value() -> Vec<u8> {
    vec![b'v'; VALUE_BYTES]
}

enum TxnOutcome {
    Ok(i64),
    Failed(String),
    Error(String),
}

async fn txn(kv: &mut KvClient<Channel>, req: TxnRequest) -> TxnOutcome {
    match tokio::time::timeout(RPC_TIMEOUT, kv.txn(req)).await {
        Err(_) => TxnOutcome::Error(format!("no answer within {RPC_TIMEOUT:?}")),
        Ok(Err(e)) => TxnOutcome::Error(format!("{:?}: {}", e.code(), e.message())),
        Ok(Ok(resp)) => {
            let resp: TxnResponse = resp.into_inner();
            let rev = resp.header.as_ref().map(|h| h.revision).unwrap_or(0);
            if resp.succeeded {
                TxnOutcome::Ok(rev)
            } else {
                TxnOutcome::Failed(format!("succeeded=false at revision {rev}, responses {:?}", short(&resp)))
            }
        }
    }
}

fn short(resp: &TxnResponse) -> String {
    let mut s = format!("{:?}", resp.responses);
    if s.len() > 300 {
        s.truncate(300);
        s.push('…');
    }
    s
}

/// Counts of unexpected answers; the first few messages are kept.
#[derive(Default)]
struct Problems {
    failed: u64,
    errors: u64,
    samples: Vec<String>,
}

impl Problems {
    fn add(&mut self, what: &str, outcome: &TxnOutcome) {
        match outcome {
            TxnOutcome::Ok(_) => {}
            TxnOutcome::Failed(m) => {
                self.failed += 1;
                if self.samples.len() < 3 {
                    self.samples.push(format!("{what}: {m}"));
                }
            }
            TxnOutcome::Error(m) => {
                self.errors += 1;
                if self.samples.len() < 3 {
                    self.samples.push(format!("{what}: {m}"));
                }
            }
        }
    }
    fn merge(&mut self, o: Problems) {
        self.failed += o.failed;
        self.errors += o.errors;
        for s in o.samples {
            if self.samples.len() < 3 {
                self.samples.push(s);
            }
        }
    }
}

async fn channels(url: &str, n: usize, shared: bool) -> Result<Vec<Channel>, String> {
    let mut v = Vec::with_capacity(n);
    if shared {
        let ch = connect(url).await?;
        v.resize(n, ch);
    } else {
        for _ in 0..n {
            v.push(connect(url).await?);
        }
    }
    Ok(v)
}

// ---------------------------------------------------------------- 1. writes

struct WriteResult {
    clients: usize,
    ops: u64,
    secs: f64,
    lat: Lat,
    problems: Problems,
}

/// `clients` clients, each alternately creating a new key and updating it
/// once with the revision the create returned, for `secs` seconds.
async fn writes(url: &str, clients: usize, first_id: usize, secs: f64, shared: bool) -> Result<WriteResult, String> {
    let chans = channels(url, clients, shared).await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(clients + 1));
    let dur = Duration::from_secs_f64(secs);
    let mut tasks = Vec::new();
    for (i, ch) in chans.into_iter().enumerate() {
        let barrier = barrier.clone();
        let id = first_id + i;
        tasks.push(tokio::spawn(async move {
            let mut kv = KvClient::new(ch);
            let mut lat = Vec::with_capacity(4096);
            let mut problems = Problems::default();
            barrier.wait().await;
            let deadline = Instant::now() + dur;
            let mut n = 0u64;
            while Instant::now() < deadline {
                let key = format!("/registry/configmaps/bench/c{id}-{n}").into_bytes();
                n += 1;
                let t = Instant::now();
                let out = txn(&mut kv, create_txn(&key, value())).await;
                lat.push(t.elapsed().as_micros() as u64);
                problems.add("create", &out);
                let TxnOutcome::Ok(rev) = out else { continue };
                if Instant::now() >= deadline {
                    break;
                }
                let t = Instant::now();
                let out = txn(&mut kv, update_txn(&key, rev, value())).await;
                lat.push(t.elapsed().as_micros() as u64);
                problems.add("update", &out);
            }
            (lat, problems, Instant::now())
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut all = Vec::new();
    let mut problems = Problems::default();
    let mut end = start;
    for t in tasks {
        let (lat, p, e) = t.await.map_err(|e| format!("client task: {e}"))?;
        all.extend(lat);
        problems.merge(p);
        end = end.max(e);
    }
    let ops = all.len() as u64;
    Ok(WriteResult { clients, ops, secs: (end - start).as_secs_f64(), lat: Lat::sorted(all), problems })
}

// ---------------------------------------------------------------- 2. watch

struct WatchResult {
    label: String,
    sent: u64,
    received: u64,
    lat: Lat,
    /// Txn round trips of the writers.
    put_lat: Lat,
    write_secs: f64,
    problems: Problems,
}

/// Value of a watch put: the send time in ns, then padding to 1 KiB.
fn stamped() -> Vec<u8> {
    let mut v = now_ns().to_le_bytes().to_vec();
    v.resize(VALUE_BYTES, b'w');
    v
}

enum Pace {
    /// `rate` puts per second for `count` puts, one task per put.
    Paced { rate: u64, count: usize },
    /// `count` puts from `writers` writers, each as fast as it can.
    Burst { writers: usize, count: usize },
}

async fn watch(url: &str, label: &str, pace: Pace) -> Result<WatchResult, String> {
    let prefix = format!("/registry/configmaps/watch-{label}/");
    let mut end = prefix.clone().into_bytes();
    *end.last_mut().expect("non-empty prefix") += 1;

    // The watcher: its own connection, like a separate client.
    let wch = connect(url).await?;
    let (req_tx, req_rx) = tokio::sync::mpsc::channel::<WatchRequest>(4);
    req_tx
        .send(WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: prefix.clone().into_bytes(),
                range_end: end,
                ..Default::default()
            })),
        })
        .await
        .map_err(|_| "watch request channel closed".to_string())?;
    let mut stream = WatchClient::new(wch)
        .watch(tokio_stream::wrappers::ReceiverStream::new(req_rx))
        .await
        .map_err(|e| format!("watch: {e}"))?
        .into_inner();
    match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
        Ok(Ok(Some(r))) if r.created => {}
        Ok(Ok(Some(r))) => return Err(format!("first watch response is not `created`: {r:?}")),
        Ok(Ok(None)) => return Err("watch stream ended before `created`".into()),
        Ok(Err(e)) => return Err(format!("watch stream: {e}")),
        Err(_) => return Err("no `created` within 10 s".into()),
    }

    let expected = match pace {
        Pace::Paced { count, .. } | Pace::Burst { count, .. } => count as u64,
    };
    let receiver = tokio::spawn(async move {
        let _keep_open = req_tx; // closing the request side may end the watch
        let mut lat = Vec::with_capacity(expected as usize);
        let mut note = None;
        while (lat.len() as u64) < expected {
            match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
                Ok(Ok(Some(r))) => {
                    let now = now_ns();
                    if r.canceled {
                        note = Some(format!(
                            "watch canceled: {:?} (compact_revision {})",
                            r.cancel_reason, r.compact_revision
                        ));
                        break;
                    }
                    for ev in r.events {
                        if let Some(kv) = ev.kv {
                            if kv.value.len() >= 8 {
                                let sent = u64::from_le_bytes(kv.value[..8].try_into().expect("8 bytes"));
                                lat.push(now.saturating_sub(sent) / 1000);
                            }
                        }
                    }
                }
                Ok(Ok(None)) => {
                    note = Some("watch stream ended".into());
                    break;
                }
                Ok(Err(e)) => {
                    note = Some(format!("watch stream error: {e}"));
                    break;
                }
                Err(_) => {
                    note = Some("no event for 10 s".into());
                    break;
                }
            }
        }
        (lat, note)
    });

    // The writers: one shared connection.
    let ch = connect(url).await?;
    let start = Instant::now();
    let problems = Arc::new(std::sync::Mutex::new(Problems::default()));
    let put_lat = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    match pace {
        Pace::Paced { rate, count } => {
            let mut tick = tokio::time::interval(Duration::from_nanos(1_000_000_000 / rate));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            for n in 0..count {
                tick.tick().await;
                let mut kv = KvClient::new(ch.clone());
                let key = format!("{prefix}k{n}").into_bytes();
                let problems = problems.clone();
                let put_lat = put_lat.clone();
                tasks.push(tokio::spawn(async move {
                    let t = Instant::now();
                    let out = txn(&mut kv, create_txn(&key, stamped())).await;
                    put_lat.lock().expect("lock").push(t.elapsed().as_micros() as u64);
                    problems.lock().expect("lock").add("watch put", &out);
                }));
            }
        }
        Pace::Burst { writers, count } => {
            let next = Arc::new(AtomicU64::new(0));
            for _ in 0..writers {
                let mut kv = KvClient::new(ch.clone());
                let prefix = prefix.clone();
                let next = next.clone();
                let problems = problems.clone();
                let put_lat = put_lat.clone();
                tasks.push(tokio::spawn(async move {
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        if n >= count as u64 {
                            break;
                        }
                        let key = format!("{prefix}k{n}").into_bytes();
                        let t = Instant::now();
                        let out = txn(&mut kv, create_txn(&key, stamped())).await;
                        put_lat.lock().expect("lock").push(t.elapsed().as_micros() as u64);
                        problems.lock().expect("lock").add("watch put", &out);
                    }
                }));
            }
        }
    }
    for t in tasks {
        t.await.map_err(|e| format!("writer task: {e}"))?;
    }
    let write_secs = start.elapsed().as_secs_f64();
    let (lat, note) = receiver.await.map_err(|e| format!("watch task: {e}"))?;
    let mut problems = std::mem::take(&mut *problems.lock().expect("lock"));
    if let Some(n) = note {
        problems.samples.push(n);
    }
    let put_lat = Lat::sorted(std::mem::take(&mut *put_lat.lock().expect("lock")));
    Ok(WatchResult {
        label: label.into(),
        sent: expected,
        received: lat.len() as u64,
        lat: Lat::sorted(lat),
        put_lat,
        write_secs,
        problems,
    })
}

// ---------------------------------------------------------------- 3. size

struct SizeRow {
    phase: String,
    status_db: i64,
    status_in_use: i64,
    db_file: (u64, u64),
    wal: (u64, u64),
    took: Option<Duration>,
}

struct SizeResult {
    updates: u64,
    secs: f64,
    lat: Lat,
    problems: Problems,
    rows: Vec<SizeRow>,
}

/// Database file and WAL (file or folder) of a target.
fn db_paths(t: &Target) -> (PathBuf, PathBuf) {
    match t.kind {
        Kind::Etcd => (t.proc.data.join("member/snap/db"), t.proc.data.join("member/wal")),
        _ => {
            let db = t.proc.data.join("server/db");
            (db.join("state.db"), db.join("state.db-wal"))
        }
    }
}

async fn size_row(t: &Target, phase: &str, took: Option<Duration>) -> Result<SizeRow, String> {
    let mut m = MaintenanceClient::new(connect(&t.url).await?);
    let st = tokio::time::timeout(RPC_TIMEOUT, m.status(StatusRequest {}))
        .await
        .map_err(|_| "Status: no answer".to_string())?
        .map_err(|e| format!("Status: {e}"))?
        .into_inner();
    let (db, wal) = db_paths(t);
    Ok(SizeRow {
        phase: phase.into(),
        status_db: st.db_size,
        status_in_use: st.db_size_in_use,
        db_file: disk(&db),
        wal: disk(&wal),
        took,
    })
}

/// Waits until the database files stop changing (ferrok hands pages back
/// to the file system in the background after a compaction).
async fn settle(t: &Target, max: Duration) -> Duration {
    let (db, wal) = db_paths(t);
    let start = Instant::now();
    let mut last = (disk(&db), disk(&wal));
    let mut stable_since = Instant::now();
    while start.elapsed() < max {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = (disk(&db), disk(&wal));
        if now != last {
            last = now;
            stable_since = Instant::now();
        } else if stable_since.elapsed() >= Duration::from_secs(2) {
            break;
        }
    }
    start.elapsed()
}

async fn size(t: &Target, keys: usize, updates: usize, writers: usize) -> Result<SizeResult, String> {
    let chans = channels(&t.url, writers, false).await?;
    let barrier = Arc::new(tokio::sync::Barrier::new(writers + 1));
    let mut tasks = Vec::new();
    for (w, ch) in chans.into_iter().enumerate() {
        let barrier = barrier.clone();
        // writer w owns keys w, w+writers, ...; its share of the updates:
        let share = updates / writers + usize::from(w < updates % writers);
        tasks.push(tokio::spawn(async move {
            let mut kv = KvClient::new(ch);
            let mut problems = Problems::default();
            let mut own: Vec<(Vec<u8>, i64)> = Vec::new();
            for k in (w..keys).step_by(writers) {
                let key = format!("/registry/configmaps/size/k{k}").into_bytes();
                let out = txn(&mut kv, create_txn(&key, value())).await;
                problems.add("create", &out);
                if let TxnOutcome::Ok(rev) = out {
                    own.push((key, rev));
                }
            }
            let mut lat = Vec::with_capacity(share);
            barrier.wait().await;
            if own.is_empty() {
                return (lat, problems);
            }
            for i in 0..share {
                let j = i % own.len();
                let t = Instant::now();
                let out = txn(&mut kv, update_txn(&own[j].0, own[j].1, value())).await;
                lat.push(t.elapsed().as_micros() as u64);
                problems.add("update", &out);
                if let TxnOutcome::Ok(rev) = out {
                    own[j].1 = rev;
                }
            }
            (lat, problems)
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut all = Vec::new();
    let mut problems = Problems::default();
    for task in tasks {
        let (lat, p) = task.await.map_err(|e| format!("writer task: {e}"))?;
        all.extend(lat);
        problems.merge(p);
    }
    let secs = start.elapsed().as_secs_f64();
    let done = all.len() as u64;

    let mut rows = vec![size_row(t, &format!("after {done} updates"), None).await?];

    let ch = connect(&t.url).await?;
    let head = KvClient::new(ch.clone())
        .range(RangeRequest { key: b"/ready".to_vec(), ..Default::default() })
        .await
        .map_err(|e| format!("Range: {e}"))?
        .into_inner()
        .header
        .map(|h| h.revision)
        .unwrap_or(0);
    let c0 = Instant::now();
    tokio::time::timeout(
        Duration::from_secs(300),
        KvClient::new(ch.clone()).compact(CompactionRequest { revision: head, physical: true }),
    )
    .await
    .map_err(|_| format!("Compact(revision {head}, physical): no answer within 300 s"))?
    .map_err(|e| format!("Compact(revision {head}, physical): {e}"))?;
    rows.push(size_row(t, &format!("compacted to {head}"), Some(c0.elapsed())).await?);
    let waited = settle(t, Duration::from_secs(30)).await;
    rows.push(size_row(t, "  + settled", Some(waited)).await?);
    let d0 = Instant::now();
    tokio::time::timeout(Duration::from_secs(300), MaintenanceClient::new(ch).defragment(DefragmentRequest {}))
        .await
        .map_err(|_| "Defragment: no answer within 300 s".to_string())?
        .map_err(|e| format!("Defragment: {e}"))?;
    rows.push(size_row(t, "  + defragmented", Some(d0.elapsed())).await?);
    Ok(SizeResult { updates: done, secs, lat: Lat::sorted(all), problems, rows })
}

// ---------------------------------------------------------------- driver

#[derive(Default)]
struct Report {
    writes: String,
    watch: String,
    size: String,
    memory: String,
    problems: String,
}

fn problems_line(out: &mut String, target: &str, what: &str, p: &Problems) {
    if p.failed + p.errors > 0 || !p.samples.is_empty() {
        let _ = writeln!(out, "{target} {what}: {} txns not succeeded, {} errors", p.failed, p.errors);
        for s in &p.samples {
            let _ = writeln!(out, "    {s}");
        }
    }
}

async fn run_target(t: &mut Target, opts: &Opts, rep: &mut Report, rest: Mem) {
    let name = t.kind.name();
    let url = t.url.clone();

    let on = |p: &str| opts.phases.iter().any(|x| x == p);
    // First, on a fresh database, so that the size figures hold only this workload.
    let size_result = if on("size") {
        progress!(
            "{name}: size, {} updates to {} keys, {} writers",
            opts.size_updates,
            opts.size_keys,
            opts.size_writers
        );
        Some(size(t, opts.size_keys, opts.size_updates, opts.size_writers).await)
    } else {
        None
    };
    match size_result {
        None => {}
        Some(Ok(r)) => {
            let _ = writeln!(
                rep.size,
                "{name:<14} {} updates in {:.1} s: {:.0} updates/s, p50 {} ms, p99 {} ms",
                r.updates,
                r.secs,
                r.updates as f64 / r.secs,
                r.lat.pct_ms(0.5),
                r.lat.pct_ms(0.99)
            );
            for row in &r.rows {
                let _ = writeln!(
                    rep.size,
                    "{:<14} {:<22} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
                    "",
                    row.phase,
                    mib(row.status_db as u64),
                    mib(row.status_in_use as u64),
                    mib(row.db_file.0),
                    mib(row.db_file.1),
                    mib(row.wal.0),
                    mib(row.wal.1),
                    row.took.map(|d| format!("{:.2}", d.as_secs_f64())).unwrap_or_else(|| "".into())
                );
            }
            problems_line(&mut rep.problems, name, "size", &r.problems);
        }
        Some(Err(e)) => {
            let _ = writeln!(rep.size, "{name:<14} ERROR {e}");
        }
    }

    let mut first_id = 0;
    let levels: &[usize] = if on("writes") { &opts.levels } else { &[] };
    for &clients in levels {
        progress!("{name}: writes, {clients} clients, {} s", opts.secs);
        let written_before = write_bytes(t.proc.pid());
        let cost = CpuCost::start(t.proc.pid());
        match writes(&url, clients, first_id, opts.secs, opts.shared_channel).await {
            Ok(r) => {
                let per_op = match (written_before, write_bytes(t.proc.pid())) {
                    (Some(a), Some(b)) if r.ops > 0 => {
                        format!("{:.2}", b.saturating_sub(a) as f64 / 1024.0 / r.ops as f64)
                    }
                    _ => "?".into(),
                };
                let _ = writeln!(
                    rep.writes,
                    "{:<14} {:>7} {:>8} {:>9.0} {:>8} {:>8} {:>8} {:>7} {:>11} {}",
                    name,
                    r.clients,
                    r.ops,
                    r.ops as f64 / r.secs,
                    r.lat.pct_ms(0.5),
                    r.lat.pct_ms(0.99),
                    r.lat.max_ms(),
                    r.problems.failed + r.problems.errors,
                    per_op,
                    cost.columns(t.proc.pid(), r.ops)
                );
                problems_line(&mut rep.problems, name, &format!("writes/{clients}"), &r.problems);
            }
            Err(e) => {
                let _ = writeln!(rep.writes, "{name:<14} {clients:>7}  ERROR {e}");
            }
        }
        first_id += clients;
    }

    let paced = Pace::Paced {
        rate: opts.watch_rate,
        count: (opts.watch_rate as f64 * opts.watch_secs).round().max(1.0) as usize,
    };
    let burst = Pace::Burst { writers: opts.burst_writers, count: opts.burst.max(1) };
    let modes = if on("watch") {
        vec![(format!("{}/s", opts.watch_rate), paced), (format!("burst/{}w", opts.burst_writers), burst)]
    } else {
        vec![]
    };
    for (label, pace) in modes {
        progress!("{name}: watch, {label}");
        let tag = label.replace('/', "-");
        match watch(&url, &tag, pace).await {
            Ok(r) => {
                let _ = writeln!(
                    rep.watch,
                    "{:<14} {:<12} {:>6} {:>6} {:>7.2} {:>8} {:>8} {:>8} {:>8} {:>8}",
                    name,
                    r.label.replace('-', "/"),
                    r.sent,
                    r.received,
                    r.write_secs,
                    r.lat.pct_ms(0.5),
                    r.lat.pct_ms(0.99),
                    r.lat.max_ms(),
                    r.put_lat.pct_ms(0.5),
                    r.put_lat.pct_ms(0.99)
                );
                problems_line(&mut rep.problems, name, &format!("watch {label}"), &r.problems);
            }
            Err(e) => {
                let _ = writeln!(rep.watch, "{name:<14} {label:<12} ERROR {e}");
            }
        }
    }

    let end = mem(t.proc.pid());
    let _ = writeln!(
        rep.memory,
        "{:<14} {:>8} {:>8} {:>8} {:>8}",
        name,
        mib(rest.rss_kib * 1024),
        mib(rest.hwm_kib * 1024),
        mib(end.rss_kib * 1024),
        mib(end.hwm_kib * 1024)
    );
    if let Ok(Some(status)) = t.proc.child.try_wait() {
        let _ = writeln!(
            rep.problems,
            "{name}: process exited during the run ({status}); log tail:\n{}",
            t.proc.log_tail()
        );
    }
}

fn main() {
    let opts = parse_opts();
    now_ns();

    // Spawned from the main thread (see PR_SET_PDEATHSIG in spawn).
    let mut targets = Vec::new();
    for &k in &opts.targets {
        match spawn(k, &opts) {
            Ok(t) => targets.push(t),
            Err(e) => eprintln!("bench: skipping {}: {e}", k.name()),
        }
    }
    if targets.is_empty() {
        die("no target could be started");
    }

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| die(&format!("tokio runtime: {e}")));
    let report = rt.block_on(async {
        let mut ready = Vec::new();
        for mut t in targets {
            match wait_ready(&mut t).await {
                Ok(d) => {
                    progress!(
                        "{} ready at {} (pid {}) after {:.2} s",
                        t.kind.name(),
                        t.url,
                        t.proc.pid(),
                        d.as_secs_f64()
                    );
                    ready.push(t);
                }
                Err(e) => eprintln!("bench: skipping {}: {e}", t.kind.name()),
            }
        }
        // Rest: a moment after start, before any workload.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rest: Vec<Mem> = ready.iter().map(|t| mem(t.proc.pid())).collect();
        let mut rep = Report::default();
        for (t, rest) in ready.iter_mut().zip(rest) {
            run_target(t, &opts, &mut rep, rest).await;
        }
        (rep, ready)
    });
    let (rep, ready) = report;

    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    println!();
    println!("ferrok store bench: {cpus} CPUs; client and servers on this host; targets run one after another.");
    println!(
        "ferrok-full = --sync full (fsync per commit), ferrok-normal = --sync normal; etcd = {}; ferrok = {}",
        opts.etcd_bin.display(),
        opts.ferrok_bin.display()
    );
    println!();
    println!(
        "== 1. writes: apiserver create (mod_rev=0 ? put) then update (mod_rev=prev ? put : range) per key, 1 KiB values, {} s per level, {}",
        opts.secs,
        if opts.shared_channel { "all clients share one connection" } else { "one connection per client" }
    );
    println!(
        "{:<14} {:>7} {:>8} {:>9} {:>8} {:>8} {:>8} {:>7} {:>11} {:>10} {:>10} {:>7}",
        "target",
        "clients",
        "ops",
        "ops/s",
        "p50_ms",
        "p99_ms",
        "max_ms",
        "failed",
        "disk_KiB/op",
        "srv_us/op",
        "cli_us/op",
        "idle_%"
    );
    println!("   disk_KiB/op = the server's write_bytes (/proc/PID/io: what it sent to storage, WAL and checkpoints or snapshots alike) per write");
    println!("   srv_us/op, cli_us/op = CPU time (user and system) of the server and of this bench's clients per write; idle_% = the share of all CPUs idle meanwhile");
    print!("{}", rep.writes);
    println!();
    println!(
        "== 2. watch delivery latency (receive - send, send stamped before the txn): paced {}/s for {} s; burst {} puts from {} writers",
        opts.watch_rate, opts.watch_secs, opts.burst, opts.burst_writers
    );
    println!("   put_* = the writers' txn round trips, for comparison");
    println!(
        "{:<14} {:<12} {:>6} {:>6} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "target", "mode", "sent", "recv", "write_s", "p50_ms", "p99_ms", "max_ms", "put_p50", "put_p99"
    );
    print!("{}", rep.watch);
    println!();
    println!(
        "== 3. database size (MiB), run first on the fresh database: {} updates to {} keys from {} writers; Compact(head, physical) then Defragment; took_s = time of that step",
        opts.size_updates, opts.size_keys, opts.size_writers
    );
    println!("   etcd files: member/snap/db and member/wal/ (preallocated segments); ferrok: server/db/state.db and state.db-wal");
    println!("   *_alloc = allocated blocks on disk");
    println!(
        "{:<14} {:<22} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8}",
        "target", "phase", "st_db", "st_inuse", "db_file", "db_alloc", "wal", "wal_alloc", "took_s"
    );
    print!("{}", rep.size);
    println!();
    println!("== 4. memory (MiB): at rest 1 s after start, and after all runs");
    println!("{:<14} {:>8} {:>8} {:>8} {:>8}", "target", "rss_rest", "hwm_rest", "rss_end", "hwm_end");
    print!("{}", rep.memory);
    if !rep.problems.is_empty() {
        println!();
        println!("== unexpected answers");
        print!("{}", rep.problems);
    }
    drop(ready); // kills the servers
    drop(rt);
}
