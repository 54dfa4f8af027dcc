//! `ferrok check-config`: whether this host can run ferrok, a line per
//! check (ok, warn or fail, with what to do), as k3s' `check-config`. It
//! exits with 1 when anything fails.

use std::path::PathBuf;

use clap::Args;

use crate::host::check::{self, Check, Status};

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// The data dir ferrok will use.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The API server's port.
    #[arg(long, default_value_t = 6443)]
    https_listen_port: u16,
    /// The kubelet API's port.
    #[arg(long, default_value_t = 10250)]
    kubelet_port: u16,
}

fn checks(args: &CheckConfigArgs) -> Vec<Check> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let proc_cgroups = std::fs::read_to_string("/proc/cgroups").unwrap_or_default();
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    vec![
        check::kernel_version(&release),
        check::kernel_options(&release),
        check::cgroups(std::path::Path::new("/sys/fs/cgroup"), &proc_cgroups),
        check::program("containerd", "containerd", false),
        check::program("runc", "runc", false),
        check::program("crun", "crun", true),
        check::cni_plugins(crate::agent::containerd::cni_bin_dir().as_deref()),
        check::program("nft", "nftables", false),
        check::program("ip", "iproute2", false),
        check::nftables(super::is_root()),
        check::port("the API server", args.https_listen_port, false),
        check::port("the kubelet API", args.kubelet_port, false),
        check::port("VXLAN between nodes", 8472, true),
        check::data_dir(&data_dir),
    ]
}

pub fn run(args: CheckConfigArgs) -> anyhow::Result<()> {
    let results = checks(&args);
    let width = results.iter().map(|c| c.name.len()).max().unwrap_or(0);
    for c in &results {
        let status = match c.status {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        println!("{status:<4}  {:width$}  {}", c.name, c.detail);
    }
    let failed = results.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed; see above");
    }
    Ok(())
}
