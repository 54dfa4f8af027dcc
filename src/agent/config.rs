//! What a node is told at start: its name and addresses, labels and taints,
//! where its runtime is, and the kubelet settings `--kubelet-arg` may change
//! (upstream's KubeletConfiguration names and defaults).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

/// Everything the node role needs to run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// `<data-dir>/agent`.
    pub dir: PathBuf,
    pub node_name: String,
    /// Internal addresses (`--node-ip`); the first is the node's host IP.
    pub node_ips: Vec<IpAddr>,
    pub external_ips: Vec<IpAddr>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    /// A server's own node: control-plane labels.
    pub control_plane: bool,
    /// `--pause-image`; ferrok's built-in one when absent.
    pub pause_image: Option<String>,
    /// The resolv.conf pods with `dnsPolicy: Default` get (host's when absent).
    pub resolv_conf: Option<PathBuf>,
    /// An existing CRI socket (`--container-runtime-endpoint`) instead of a
    /// containerd of our own.
    pub runtime_endpoint: Option<String>,
    pub cluster_dns: Vec<IpAddr>,
    /// Whether this node serves the cluster DNS itself (off with `--disable coredns`).
    pub dns_server: bool,
    pub cluster_domain: String,
    /// `--cluster-cidr`: pod traffic inside it is not masqueraded.
    pub cluster_cidr: crate::net::Ipv4Net,
    /// `--service-cidr`: routed onto the pod bridge so that traffic to a
    /// service address never leaves through the default route.
    pub service_cidr: crate::net::Ipv4Net,
    /// `--flannel-backend`: how pods reach other nodes' pods.
    pub flannel_backend: crate::network::overlay::FlannelBackend,
    /// `--flannel-iface`: the interface that carries the overlay (default:
    /// the one holding the node's first IPv4 InternalIP).
    pub flannel_iface: Option<String>,
    /// Where container logs go (`/var/log/pods` for a root install).
    pub pod_logs_dir: PathBuf,
    pub kubelet: KubeletConfig,
    /// The kubelet API's certificate and the CA its clients' certificates
    /// are checked against; no kubelet API without it.
    pub kubelet_tls: Option<KubeletTls>,
}

/// The files the kubelet API serves with.
#[derive(Debug, Clone)]
pub struct KubeletTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

/// A signal and the threshold below which the node is under pressure:
/// `memory.available<100Mi`, `nodefs.available<10%`.
#[derive(Debug, Clone, PartialEq)]
pub struct Threshold {
    pub signal: Signal,
    pub value: ThresholdValue,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    MemoryAvailable,
    NodeFsAvailable,
    NodeFsInodesFree,
    ImageFsAvailable,
    ImageFsInodesFree,
    PidAvailable,
}

impl Signal {
    pub fn name(self) -> &'static str {
        match self {
            Signal::MemoryAvailable => "memory.available",
            Signal::NodeFsAvailable => "nodefs.available",
            Signal::NodeFsInodesFree => "nodefs.inodesFree",
            Signal::ImageFsAvailable => "imagefs.available",
            Signal::ImageFsInodesFree => "imagefs.inodesFree",
            Signal::PidAvailable => "pid.available",
        }
    }

    fn parse(s: &str) -> Option<Signal> {
        [
            Signal::MemoryAvailable,
            Signal::NodeFsAvailable,
            Signal::NodeFsInodesFree,
            Signal::ImageFsAvailable,
            Signal::ImageFsInodesFree,
            Signal::PidAvailable,
        ]
        .into_iter()
        .find(|sig| sig.name() == s)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ThresholdValue {
    /// An absolute amount (bytes, inodes or PIDs).
    Quantity(i64),
    /// A fraction of capacity, 0.0–1.0.
    Percentage(f64),
}

impl ThresholdValue {
    /// The amount under which the signal is past the threshold.
    pub fn amount(self, capacity: i64) -> i64 {
        match self {
            ThresholdValue::Quantity(q) => q,
            ThresholdValue::Percentage(p) => (capacity as f64 * p) as i64,
        }
    }
}

/// The kubelet settings a node runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct KubeletConfig {
    pub max_pods: u32,
    pub eviction_hard: Vec<Threshold>,
    pub eviction_soft: Vec<Threshold>,
    pub eviction_soft_grace_period: BTreeMap<Signal, Duration>,
    pub eviction_max_pod_grace_period: i64,
    pub eviction_pressure_transition_period: Duration,
    pub image_gc_high_threshold_percent: u8,
    pub image_gc_low_threshold_percent: u8,
    pub image_minimum_gc_age: Duration,
    pub container_log_max_size: i64,
    pub container_log_max_files: u32,
    /// The cgroup under which pods' QoS cgroups are made (`/kubepods`).
    pub cgroup_root: String,
    pub node_status_update_frequency: Duration,
    pub node_status_report_frequency: Duration,
    pub node_lease_duration_seconds: i32,
    pub pod_pids_limit: i64,
    /// The port of the kubelet API.
    pub port: u16,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        let t = |signal, value| Threshold { signal, value };
        KubeletConfig {
            max_pods: 110,
            // Upstream's defaults (pkg/kubelet/eviction/defaults_linux.go).
            // k3s' disk thresholds (5 %, where upstream's are 10 % and
            // 15 %: a developer's 250 GB disk with 37 GB free is not short
            // of space), upstream's memory and inode ones.
            eviction_hard: vec![
                t(Signal::MemoryAvailable, ThresholdValue::Quantity(100 << 20)),
                t(Signal::NodeFsAvailable, ThresholdValue::Percentage(0.05)),
                t(Signal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
                t(Signal::ImageFsAvailable, ThresholdValue::Percentage(0.05)),
            ],
            eviction_soft: Vec::new(),
            eviction_soft_grace_period: BTreeMap::new(),
            eviction_max_pod_grace_period: 0,
            eviction_pressure_transition_period: Duration::from_secs(300),
            image_gc_high_threshold_percent: 85,
            image_gc_low_threshold_percent: 80,
            image_minimum_gc_age: Duration::from_secs(120),
            container_log_max_size: 10 << 20,
            container_log_max_files: 5,
            cgroup_root: "/kubepods".into(),
            node_status_update_frequency: Duration::from_secs(10),
            node_status_report_frequency: Duration::from_secs(300),
            node_lease_duration_seconds: 40,
            pod_pids_limit: -1,
            port: 10250,
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("--kubelet-arg {arg:?}: {reason}")]
pub struct KubeletArgError {
    pub arg: String,
    pub reason: InvalidSetting,
}

/// Why a `--kubelet-arg` is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidSetting {
    #[error("expected key=value")]
    NotKeyValue,
    #[error("unknown kubelet setting {0:?}")]
    Unknown(String),
    #[error("expected a positive number")]
    NotPositive,
    #[error("expected a positive number of seconds")]
    NotPositiveSeconds,
    #[error("expected a number of seconds")]
    NotSeconds,
    #[error("expected a number")]
    NotANumber,
    #[error("expected a port number")]
    NotAPort,
    #[error("expected a number ≥ 2")]
    TooFewFiles,
    #[error("expected an absolute cgroup path like /kubepods")]
    RelativeCgroup,
    #[error("{0:?} is not a percentage")]
    NotAPercentage(String),
    #[error("{0:?}: a percentage must be between 0% and 100%")]
    PercentageRange(String),
    #[error("{0:?} is not a quantity or percentage")]
    NotAThresholdValue(String),
    #[error("{0:?}: expected SIGNAL<VALUE")]
    NotAThreshold(String),
    #[error("{0:?}: expected SIGNAL=DURATION")]
    NotAGracePeriod(String),
    #[error("unknown eviction signal {0:?}")]
    UnknownSignal(String),
    #[error(transparent)]
    Duration(#[from] crate::duration::ParseError),
    #[error("{0:?} is not a percentage 0–100")]
    NotAPercent(String),
    #[error("{0:?} is not a size like 10Mi")]
    NotASize(String),
    #[error("must not be above image-gc-high-threshold")]
    LowAboveHigh,
}

/// `100Mi`, `10%`, `1000` for a threshold.
fn threshold_value(s: &str) -> Result<ThresholdValue, InvalidSetting> {
    if let Some(p) = s.strip_suffix('%') {
        let v: f64 = p.trim().parse().map_err(|_| InvalidSetting::NotAPercentage(s.to_string()))?;
        if !(0.0..=100.0).contains(&v) {
            return Err(InvalidSetting::PercentageRange(s.to_string()));
        }
        return Ok(ThresholdValue::Percentage(v / 100.0));
    }
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.trim().to_string());
    crate::quantity::value(&q)
        .filter(|v| *v >= 0)
        .map(ThresholdValue::Quantity)
        .ok_or_else(|| InvalidSetting::NotAThresholdValue(s.to_string()))
}

/// `memory.available<100Mi,nodefs.available<10%`.
fn thresholds(s: &str) -> Result<Vec<Threshold>, InvalidSetting> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, value) = part.split_once('<').ok_or_else(|| InvalidSetting::NotAThreshold(part.to_string()))?;
        let signal =
            Signal::parse(name.trim()).ok_or_else(|| InvalidSetting::UnknownSignal(name.trim().to_string()))?;
        out.push(Threshold { signal, value: threshold_value(value)? });
    }
    Ok(out)
}

/// A Go duration as upstream's flags take it: `300ms`, `1m30s`, `5m0s`, `2h`.
pub fn go_duration(s: &str) -> Result<Duration, crate::duration::ParseError> {
    crate::duration::parse(s)
}

fn duration(s: &str) -> Result<Duration, InvalidSetting> {
    Ok(go_duration(s)?)
}

fn percent(s: &str) -> Result<u8, InvalidSetting> {
    s.trim().parse::<u8>().ok().filter(|v| *v <= 100).ok_or_else(|| InvalidSetting::NotAPercent(s.to_string()))
}

fn bytes(s: &str) -> Result<i64, InvalidSetting> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.trim().to_string());
    crate::quantity::value(&q).filter(|v| *v > 0).ok_or_else(|| InvalidSetting::NotASize(s.to_string()))
}

impl KubeletConfig {
    /// Applies `--kubelet-arg` values (`key=value`, upstream's flag names).
    pub fn apply_args(&mut self, args: &[String]) -> Result<(), KubeletArgError> {
        for arg in args {
            let err = |reason: InvalidSetting| KubeletArgError { arg: arg.clone(), reason };
            let (key, value) =
                arg.trim_start_matches("--").split_once('=').ok_or_else(|| err(InvalidSetting::NotKeyValue))?;
            match key {
                "max-pods" => {
                    self.max_pods =
                        value.parse().ok().filter(|v| *v > 0).ok_or_else(|| err(InvalidSetting::NotPositive))?
                }
                "eviction-hard" => self.eviction_hard = thresholds(value).map_err(err)?,
                "eviction-soft" => self.eviction_soft = thresholds(value).map_err(err)?,
                "eviction-soft-grace-period" => {
                    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                        let (name, d) = part
                            .split_once('=')
                            .ok_or_else(|| err(InvalidSetting::NotAGracePeriod(part.to_string())))?;
                        let signal =
                            Signal::parse(name).ok_or_else(|| err(InvalidSetting::UnknownSignal(name.to_string())))?;
                        self.eviction_soft_grace_period.insert(signal, duration(d).map_err(err)?);
                    }
                }
                "eviction-max-pod-grace-period" => {
                    self.eviction_max_pod_grace_period = value.parse().map_err(|_| err(InvalidSetting::NotSeconds))?
                }
                "eviction-pressure-transition-period" => {
                    self.eviction_pressure_transition_period = duration(value).map_err(err)?
                }
                "image-gc-high-threshold" => self.image_gc_high_threshold_percent = percent(value).map_err(err)?,
                "image-gc-low-threshold" => self.image_gc_low_threshold_percent = percent(value).map_err(err)?,
                "minimum-image-ttl-duration" | "image-minimum-gc-age" => {
                    self.image_minimum_gc_age = duration(value).map_err(err)?
                }
                "container-log-max-size" => self.container_log_max_size = bytes(value).map_err(err)?,
                "container-log-max-files" => {
                    self.container_log_max_files =
                        value.parse().ok().filter(|v| *v >= 2).ok_or_else(|| err(InvalidSetting::TooFewFiles))?
                }
                "cgroup-root" => {
                    if !value.starts_with('/') {
                        return Err(err(InvalidSetting::RelativeCgroup));
                    }
                    self.cgroup_root = value.trim_end_matches('/').to_string();
                    if self.cgroup_root.is_empty() {
                        self.cgroup_root = "/kubepods".into();
                    }
                }
                "node-status-update-frequency" => self.node_status_update_frequency = duration(value).map_err(err)?,
                "node-status-report-frequency" => self.node_status_report_frequency = duration(value).map_err(err)?,
                "node-lease-duration-seconds" => {
                    self.node_lease_duration_seconds = value
                        .parse()
                        .ok()
                        .filter(|s: &i32| *s > 0)
                        .ok_or_else(|| err(InvalidSetting::NotPositiveSeconds))?
                }
                "pod-max-pids" => self.pod_pids_limit = value.parse().map_err(|_| err(InvalidSetting::NotANumber))?,
                "port" => self.port = value.parse().map_err(|_| err(InvalidSetting::NotAPort))?,
                other => return Err(err(InvalidSetting::Unknown(other.to_string()))),
            }
        }
        if self.image_gc_low_threshold_percent > self.image_gc_high_threshold_percent {
            return Err(KubeletArgError { arg: "image-gc-low-threshold".into(), reason: InvalidSetting::LowAboveHigh });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(args: &[&str]) -> Result<KubeletConfig, KubeletArgError> {
        let mut c = KubeletConfig::default();
        c.apply_args(&args.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        Ok(c)
    }

    #[test]
    fn defaults_are_upstreams_with_k3s_disk_thresholds() {
        let c = KubeletConfig::default();
        assert_eq!(c.max_pods, 110);
        assert_eq!(c.container_log_max_size, 10 << 20);
        assert_eq!(c.container_log_max_files, 5);
        assert_eq!(
            c.eviction_hard[0],
            Threshold { signal: Signal::MemoryAvailable, value: ThresholdValue::Quantity(100 << 20) }
        );
        for signal in [Signal::NodeFsAvailable, Signal::ImageFsAvailable] {
            let t = c.eviction_hard.iter().find(|t| t.signal == signal).expect("a disk threshold");
            assert_eq!(t.value, ThresholdValue::Percentage(0.05));
        }
    }

    #[test]
    fn args_change_settings() {
        let c = apply(&[
            "max-pods=20",
            "eviction-hard=memory.available<200Mi,nodefs.available<5%",
            "image-gc-high-threshold=90",
            "container-log-max-size=1Mi",
            "container-log-max-files=3",
            "--cgroup-root=/ferrok/kubepods",
        ])
        .unwrap();
        assert_eq!(c.max_pods, 20);
        assert_eq!(c.eviction_hard.len(), 2);
        assert_eq!(c.eviction_hard[1].value, ThresholdValue::Percentage(0.05));
        assert_eq!(c.image_gc_high_threshold_percent, 90);
        assert_eq!(c.container_log_max_size, 1 << 20);
        assert_eq!(c.cgroup_root, "/ferrok/kubepods");
    }

    #[test]
    fn bad_args_name_themselves() {
        let e = apply(&["max-pods=none"]).unwrap_err();
        assert_eq!(e.to_string(), "--kubelet-arg \"max-pods=none\": expected a positive number");
        assert!(apply(&["frobnicate=1"]).unwrap_err().to_string().contains("unknown kubelet setting"));
        assert!(apply(&["eviction-hard=memory.free<1"]).unwrap_err().to_string().contains("unknown eviction signal"));
        assert!(apply(&["image-gc-low-threshold=95"]).is_err());
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(go_duration("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(go_duration("5m0s"), Ok(Duration::from_secs(300)));
        assert!(go_duration("5 minutes").is_err());
        assert!(go_duration("").is_err());
    }
}
