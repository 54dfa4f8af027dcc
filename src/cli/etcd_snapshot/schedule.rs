//! The server's side of snapshots, with k3s' flags: snapshots on a cron
//! schedule (`--etcd-snapshot-schedule-cron`, default every 12 hours, in
//! the host's local time as cron's), the newest `--etcd-snapshot-retention`
//! scheduled ones kept; and `--cluster-reset --cluster-reset-restore-path`,
//! which restores a snapshot before anything starts and exits.
//!
//! The schedule is CronJob's five-field syntax, parsed by the same code
//! (`controllers::cron_schedule`; `cli` stands above `controllers`).

use std::path::{Path, PathBuf};

use clap::Args;
use k8s_openapi::jiff::tz::TimeZone;
use k8s_openapi::jiff::Timestamp;

use super::Datastore;
use crate::controllers::cron_schedule::{Schedule, ScheduleError};

#[derive(Debug, Args)]
pub struct SnapshotServerArgs {
    /// Take no scheduled snapshots.
    #[arg(long)]
    pub etcd_disable_snapshots: bool,
    /// When to take snapshots, in cron's five fields (the host's local time).
    #[arg(long, value_name = "CRON", default_value = "0 */12 * * *", value_parser = parse_cron)]
    pub etcd_snapshot_schedule_cron: Schedule,
    /// Scheduled snapshots kept (the oldest beyond this are deleted; 0 keeps all).
    #[arg(long, value_name = "N", default_value_t = 5)]
    pub etcd_snapshot_retention: usize,
    /// Folder of the snapshots (default: <data-dir>/server/db/snapshots).
    #[arg(long, value_name = "DIR")]
    pub etcd_snapshot_dir: Option<PathBuf>,
    /// Name of scheduled snapshots, before the node name and the time.
    #[arg(long, value_name = "NAME", default_value = "etcd-snapshot")]
    pub etcd_snapshot_name: String,
    /// Restore the embedded store from --cluster-reset-restore-path, then
    /// exit: start again without --cluster-reset.
    #[arg(long)]
    pub cluster_reset: bool,
    /// The snapshot to restore (a file, or a name in the snapshot folder).
    #[arg(long, value_name = "FILE")]
    pub cluster_reset_restore_path: Option<PathBuf>,
}

fn parse_cron(s: &str) -> Result<Schedule, ScheduleError> {
    Schedule::parse(s)
}

impl SnapshotServerArgs {
    pub fn dir(&self, data_dir: &Path) -> PathBuf {
        self.etcd_snapshot_dir.clone().unwrap_or_else(|| super::default_dir(data_dir))
    }

    /// Whether the server is to restore a snapshot and exit.
    pub fn resetting(&self) -> bool {
        self.cluster_reset || self.cluster_reset_restore_path.is_some()
    }

    /// `--cluster-reset`: restores the snapshot into the data dir. The
    /// server then exits, as k3s' does: the flag is usually in a unit file
    /// or the config file, and a server that went on serving would take
    /// writes that the next start with the same flags throws away.
    pub fn cluster_reset(&self, data_dir: &Path, external: Option<&str>) -> anyhow::Result<()> {
        if !self.cluster_reset {
            anyhow::bail!("--cluster-reset-restore-path: give --cluster-reset too");
        }
        if let Some(endpoints) = external {
            anyhow::bail!(
                "--cluster-reset: the datastore is the external etcd at {endpoints}; restore it with etcdutl snapshot \
                 restore (etcd's own tool) and start ferrok server without --cluster-reset"
            );
        }
        let Some(snapshot) = &self.cluster_reset_restore_path else {
            anyhow::bail!(
                "--cluster-reset: the embedded store has no peers to forget; give --cluster-reset-restore-path=FILE \
                 to restore a snapshot"
            );
        };
        let done = super::restore(data_dir, &self.dir(data_dir), snapshot, None)?;
        eprintln!("{done}\nrestart ferrok server without --cluster-reset");
        Ok(())
    }

    /// Starts the scheduled snapshots, unless disabled.
    pub fn start(&self, datastore: Datastore, data_dir: &Path, node: &str) -> Option<tokio::task::JoinHandle<()>> {
        if self.etcd_disable_snapshots {
            return None;
        }
        let job = Scheduled {
            schedule: self.etcd_snapshot_schedule_cron.clone(),
            tz: local_time_zone(),
            datastore,
            dir: self.dir(data_dir),
            name: self.etcd_snapshot_name.clone(),
            node: node.to_string(),
            retention: self.etcd_snapshot_retention,
        };
        Some(tokio::spawn(job.run()))
    }
}

/// The host's time zone (`/etc/localtime`), UTC if it has none.
fn local_time_zone() -> TimeZone {
    std::fs::read("/etc/localtime").ok().and_then(|data| TimeZone::tzif("Local", &data).ok()).unwrap_or(TimeZone::UTC)
}

struct Scheduled {
    schedule: Schedule,
    tz: TimeZone,
    datastore: Datastore,
    dir: PathBuf,
    name: String,
    node: String,
    retention: usize,
}

impl Scheduled {
    async fn run(self) {
        // The last firing: a timer that wakes a little before the wall
        // clock's minute must not fire that minute twice.
        let mut last = Timestamp::now();
        loop {
            let now = Timestamp::now().max(last);
            let Some(next) = self.schedule.next(now, &self.tz) else {
                tracing::warn!("the snapshot schedule never fires again");
                return;
            };
            let wait_ms = (next.as_millisecond() - Timestamp::now().as_millisecond()).max(0) as u64;
            tracing::debug!(next = %next, "next scheduled snapshot");
            tokio::time::sleep(std::time::Duration::from_millis(wait_ms)).await;
            last = next;
            self.once().await;
        }
    }

    async fn once(&self) {
        match super::save(&self.datastore, &self.dir, &self.name, &self.node).await {
            Ok(saved) => tracing::info!(
                name = %saved.name, revision = saved.revision, bytes = saved.size, "scheduled snapshot saved"
            ),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), dir = %self.dir.display(), "scheduled snapshot failed");
                return;
            }
        }
        match super::dir::prune(&self.dir, &self.name, &self.node, self.retention) {
            Ok(gone) => {
                for f in gone {
                    tracing::info!(name = %f.name, "old scheduled snapshot deleted");
                }
            }
            Err(e) => tracing::warn!(error = %format!("{e:#}"), "cannot prune the scheduled snapshots"),
        }
    }
}
