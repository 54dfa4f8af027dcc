//! `ferrok etcd-snapshot save|ls|delete|prune|restore`, as k3s' command of
//! that name: snapshots of the datastore in `<data-dir>/server/db/snapshots`.
//! The embedded store is copied online with SQLite (consistent while the
//! server writes, and with no server running); an external etcd
//! (`--datastore-endpoint`) streams etcd's own snapshot, which `etcdctl
//! snapshot status` and `etcdutl snapshot restore` read. The server's
//! scheduled snapshots and `--cluster-reset` are in `schedule`.

pub mod dir;
pub mod schedule;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::store::etcd::{EtcdOptions, EtcdStore};
use crate::store::sqlite::backup;
use crate::store::Store;

/// The embedded store's file in a data dir.
pub fn embedded_db(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("db").join("state.db")
}

/// Where snapshots go unless told otherwise.
pub fn default_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("server").join("db").join("snapshots")
}

#[derive(Debug, Args)]
pub struct EtcdSnapshotArgs {
    #[command(subcommand)]
    command: SnapshotCommand,
    /// The server's data dir.
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Folder of the snapshots (default: <data-dir>/server/db/snapshots).
    #[arg(long, global = true, value_name = "DIR", alias = "etcd-snapshot-dir")]
    dir: Option<PathBuf>,
    /// This node's name, part of the snapshots' names (default: the hostname).
    #[arg(long, global = true)]
    node_name: Option<String>,
    #[command(flatten)]
    external: ExternalDatastore,
    /// The server's config file: its data-dir, etcd-snapshot-dir, node-name,
    /// datastore-* and (prune) etcd-snapshot-retention keys apply, others are ignored.
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "FERROK_CONFIG_FILE",
        default_value = "/etc/ferrok/config.yaml"
    )]
    pub config: PathBuf,
}

/// The server's external etcd, if it uses one.
#[derive(Debug, Args)]
pub struct ExternalDatastore {
    /// The external etcd the server uses (comma-separated URLs) instead of the embedded store.
    #[arg(long, global = true, value_name = "URLS")]
    datastore_endpoint: Option<String>,
    /// CA of the external etcd's serving certificate.
    #[arg(long, global = true, value_name = "FILE")]
    datastore_cafile: Option<PathBuf>,
    /// Client certificate for the external etcd.
    #[arg(long, global = true, value_name = "FILE")]
    datastore_certfile: Option<PathBuf>,
    /// Key of the client certificate for the external etcd.
    #[arg(long, global = true, value_name = "FILE")]
    datastore_keyfile: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum SnapshotCommand {
    /// Save a snapshot now, named <name>-<node name>-<unix time>.
    Save {
        #[arg(long, default_value = "on-demand")]
        name: String,
    },
    /// List the snapshots: name, location, size in bytes, creation time.
    #[command(alias = "ls")]
    List,
    /// Delete snapshots by name.
    #[command(alias = "rm")]
    Delete {
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Delete all but the newest --snapshot-retention snapshots named <name>-<node name>-*.
    Prune {
        #[arg(long, default_value = "on-demand")]
        name: String,
        #[arg(long, alias = "etcd-snapshot-retention", default_value_t = 5)]
        snapshot_retention: usize,
    },
    /// Replace the stopped server's store with a snapshot (a name in the
    /// snapshot folder, or a file), as `ferrok server --cluster-reset
    /// --cluster-reset-restore-path` does.
    Restore { snapshot: PathBuf },
}

/// The datastore a snapshot is taken of.
#[derive(Clone)]
pub enum Datastore {
    /// The embedded store's database file.
    Embedded(PathBuf),
    /// An external etcd.
    External(Arc<dyn Store>),
}

/// A snapshot written.
#[derive(Debug)]
pub struct Saved {
    pub name: String,
    pub path: PathBuf,
    pub revision: i64,
    pub size: u64,
}

impl ExternalDatastore {
    fn connect(&self) -> anyhow::Result<Option<Arc<dyn Store>>> {
        let Some(endpoints) = &self.datastore_endpoint else { return Ok(None) };
        let store = EtcdStore::connect(&EtcdOptions::from_flags(
            endpoints,
            self.datastore_cafile.clone(),
            self.datastore_certfile.clone(),
            self.datastore_keyfile.clone(),
        ))
        .context("--datastore-endpoint")?;
        Ok(Some(store))
    }
}

impl Datastore {
    /// Writes a snapshot to `to`, which must not exist.
    async fn save_to(&self, to: &Path) -> anyhow::Result<(i64, u64)> {
        match self {
            Datastore::Embedded(db) => {
                let (db, to) = (db.clone(), to.to_path_buf());
                let info = tokio::task::spawn_blocking(move || backup::save(&db, &to)).await??;
                Ok((info.revision, info.size))
            }
            Datastore::External(store) => etcd_snapshot(store.as_ref(), to).await,
        }
    }
}

/// etcd's snapshot stream into `to`, as `etcdctl snapshot save` writes it:
/// the database followed by the SHA-256 etcd sends last, checked here.
async fn etcd_snapshot(store: &dyn Store, to: &Path) -> anyhow::Result<(i64, u64)> {
    // etcd 3.4 sends no header with the snapshot: the revision is the one
    // just before, which the snapshot holds at least.
    let before = store.status().await.ok().and_then(|s| s.header).map(|h| h.revision).unwrap_or(0);
    let mut chunks = store.snapshot().await.context("etcd snapshot")?;
    let mut file = tokio::fs::File::create_new(to).await.with_context(|| format!("cannot create {}", to.display()))?;
    let mut hasher = Sha256::new();
    let mut held: Vec<u8> = Vec::new();
    let mut revision = before;
    let mut size = 0u64;
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.context("etcd snapshot")?;
        if let Some(h) = chunk.header {
            revision = h.revision;
        }
        hasher.update(&held);
        held = chunk.blob;
        file.write_all(&held).await.with_context(|| format!("cannot write {}", to.display()))?;
        size += held.len() as u64;
    }
    if held.as_slice() != hasher.finalize().as_slice() {
        bail!("etcd snapshot: the stream ended without its checksum (or with a wrong one)");
    }
    file.sync_all().await.with_context(|| format!("cannot write {}", to.display()))?;
    Ok((revision, size))
}

/// Saves a snapshot of `datastore` into `dir` as `<name>-<node>-<unix time>`.
pub async fn save(datastore: &Datastore, dir: &Path, name: &str, node: &str) -> anyhow::Result<Saved> {
    dir::check_name("--name", name)?;
    std::fs::create_dir_all(dir).with_context(|| format!("--etcd-snapshot-dir: cannot create {}", dir.display()))?;
    let (folder, base, n) = (dir.to_path_buf(), name.to_string(), node.to_string());
    let name = tokio::task::spawn_blocking(move || dir::new_name(&folder, &base, &n)).await?;
    let partial = dir::partial(dir, &name);
    let path = dir.join(&name);
    let written = match datastore.save_to(&partial).await {
        Ok(w) => {
            std::fs::rename(&partial, &path).map(|()| w).with_context(|| format!("cannot write {}", path.display()))
        }
        Err(e) => Err(e),
    };
    let (revision, size) = match written {
        Ok(w) => w,
        Err(e) => {
            let _ = std::fs::remove_file(&partial);
            return Err(e);
        }
    };
    Ok(Saved { name, path, revision, size })
}

/// A snapshot given by name (in `dir`) or as a file.
fn resolve(dir: &Path, snapshot: &Path) -> anyhow::Result<PathBuf> {
    if snapshot.components().count() == 1 && !snapshot.exists() {
        let name = snapshot.to_string_lossy();
        return Ok(dir::find(dir, &name)?.path);
    }
    if !snapshot.is_file() {
        bail!("{}: no such snapshot file", snapshot.display());
    }
    Ok(snapshot.to_path_buf())
}

/// Replaces the embedded store in `data_dir` with a snapshot (the server
/// stopped) and says what it did; an external etcd is restored with etcd's
/// own tools.
pub fn restore(data_dir: &Path, snapshots: &Path, snapshot: &Path, external: Option<&str>) -> anyhow::Result<String> {
    if let Some(endpoints) = external {
        bail!(
            "the datastore is the external etcd at {endpoints}: restore it with etcdutl snapshot restore (etcd's own \
             tool), then start ferrok server on it without --cluster-reset"
        );
    }
    let file = resolve(snapshots, snapshot)?;
    let db = embedded_db(data_dir);
    let restored = backup::restore(&file, &db)?;
    let kept = match &restored.replaced {
        Some(old) => format!("; the replaced store is kept as {}", old.display()),
        None => String::new(),
    };
    Ok(format!(
        "restored {} (revision {}) into {}, now at revision {}{kept}",
        file.display(),
        restored.snapshot_revision,
        db.display(),
        restored.revision
    ))
}

fn rfc3339(t: std::time::SystemTime) -> String {
    let secs = t.duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    k8s_openapi::jiff::Timestamp::from_second(secs).map(|t| t.to_string()).unwrap_or_default()
}

pub async fn run(args: EtcdSnapshotArgs) -> anyhow::Result<()> {
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    let external = args.external.datastore_endpoint.as_deref();
    let snapshots = match &args.dir {
        Some(d) => {
            if !matches!(args.command, SnapshotCommand::Save { .. }) && !d.is_dir() {
                bail!("--dir: {} is not a folder", d.display());
            }
            d.clone()
        }
        None => {
            if external.is_none() && !data_dir.join("server").is_dir() {
                bail!("--data-dir: {} is not a server's data dir (no server/ in it)", data_dir.display());
            }
            default_dir(&data_dir)
        }
    };
    let node = args.node_name.clone().unwrap_or_else(crate::host::hostname).to_lowercase();
    match &args.command {
        SnapshotCommand::Save { name } => {
            let datastore = match args.external.connect()? {
                Some(store) => Datastore::External(store),
                None => {
                    let db = embedded_db(&data_dir);
                    if !db.is_file() {
                        bail!("--data-dir: no datastore at {}", db.display());
                    }
                    Datastore::Embedded(db)
                }
            };
            let saved = save(&datastore, &snapshots, name, &node).await?;
            println!(
                "Snapshot {} saved (revision {}, {} bytes) to {}",
                saved.name,
                saved.revision,
                saved.size,
                saved.path.display()
            );
        }
        SnapshotCommand::List => {
            let rows: Vec<[String; 4]> = dir::list(&snapshots)?
                .into_iter()
                .map(|f| {
                    let location = std::path::absolute(&f.path).unwrap_or(f.path);
                    [f.name, format!("file://{}", location.display()), f.size.to_string(), rfc3339(f.created)]
                })
                .collect();
            super::table::print_table(["Name", "Location", "Size", "Created"], &rows);
        }
        SnapshotCommand::Delete { names } => {
            for f in dir::delete(&snapshots, names)? {
                println!("Snapshot {} deleted", f.name);
            }
        }
        SnapshotCommand::Prune { name, snapshot_retention } => {
            for f in dir::prune(&snapshots, name, &node, *snapshot_retention)? {
                println!("Snapshot {} deleted", f.name);
            }
        }
        SnapshotCommand::Restore { snapshot } => println!("{}", restore(&data_dir, &snapshots, snapshot, external)?),
    }
    Ok(())
}
