//! `ferrok datastore`: the embedded store (or an external etcd) served as an
//! etcd v3 gRPC endpoint, for etcdctl and any other etcd client.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};

use crate::store::etcd::{EtcdOptions, EtcdStore};
use crate::store::grpc::{self, TlsFiles};
use crate::store::sqlite::{SqliteOptions, SqliteStore, SyncMode};
use crate::store::{Store, DEFAULT_MAX_REQUEST_BYTES};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Sync {
    /// fsync every commit: acknowledged writes survive power loss.
    Full,
    /// fsync at checkpoints: acknowledged writes survive a crash of ferrok;
    /// a power loss may roll back the newest ones.
    Normal,
}

#[derive(Debug, Args)]
pub struct DatastoreArgs {
    /// Folder for ferrok's state (the database is server/db/state.db inside it).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Comma-separated URLs to serve etcd clients on (http:// or https://).
    #[arg(long, value_name = "URLS", value_delimiter = ',', default_value = "http://127.0.0.1:2379")]
    listen_client_urls: Vec<String>,
    /// Comma-separated URLs MemberList reports (default: the listen URLs).
    #[arg(long, value_name = "URLS", value_delimiter = ',')]
    advertise_client_urls: Vec<String>,
    /// This member's name in MemberList.
    #[arg(long, default_value = "default")]
    name: String,
    /// Serving certificate for https:// listeners (PEM).
    #[arg(long, value_name = "FILE")]
    cert_file: Option<PathBuf>,
    /// Key of the serving certificate (PEM).
    #[arg(long, value_name = "FILE")]
    key_file: Option<PathBuf>,
    /// CA that client certificates must chain to; turns client-certificate checks on.
    #[arg(long, value_name = "FILE")]
    trusted_ca_file: Option<PathBuf>,
    /// When to fsync the embedded database.
    #[arg(long, value_enum, default_value = "full")]
    sync: Sync,
    /// The largest request accepted, in bytes.
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Space quota in bytes, as etcd's flag: past it, writes fail with the
    /// NOSPACE alarm until it is disarmed. 0 is etcd's default (2 GiB); a
    /// negative value turns the quota off.
    #[arg(long, value_name = "BYTES", default_value_t = 0, allow_negative_numbers = true)]
    quota_backend_bytes: i64,
    /// How often watchers that asked for progress notifications get one.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = super::duration::parse)]
    watch_progress_notify_interval: Duration,
    /// Serve this external etcd (comma-separated URLs) instead of the embedded store.
    #[arg(long, value_name = "URLS")]
    datastore_endpoint: Option<String>,
    /// CA of the external etcd's serving certificate.
    #[arg(long, value_name = "FILE")]
    datastore_cafile: Option<PathBuf>,
    /// Client certificate for the external etcd.
    #[arg(long, value_name = "FILE")]
    datastore_certfile: Option<PathBuf>,
    /// Key of the client certificate for the external etcd.
    #[arg(long, value_name = "FILE")]
    datastore_keyfile: Option<PathBuf>,
}

fn check_file(flag: &str, path: &Option<PathBuf>) -> anyhow::Result<()> {
    if let Some(path) = path {
        if !path.is_file() {
            anyhow::bail!("{flag}: {} is not a readable file", path.display());
        }
    }
    Ok(())
}

pub async fn run(args: DatastoreArgs) -> anyhow::Result<()> {
    for (flag, path) in [
        ("--cert-file", &args.cert_file),
        ("--key-file", &args.key_file),
        ("--trusted-ca-file", &args.trusted_ca_file),
        ("--datastore-cafile", &args.datastore_cafile),
        ("--datastore-certfile", &args.datastore_certfile),
        ("--datastore-keyfile", &args.datastore_keyfile),
    ] {
        check_file(flag, path)?;
    }
    if args.cert_file.is_some() != args.key_file.is_some() {
        anyhow::bail!("--cert-file and --key-file go together");
    }
    let listeners = grpc::bind(&args.listen_client_urls).await.context("--listen-client-urls")?;
    let advertised = if args.advertise_client_urls.is_empty() {
        listeners.iter().map(|l| l.url.clone()).collect()
    } else {
        args.advertise_client_urls.clone()
    };

    let mut sqlite = None;
    let store: Arc<dyn Store> = match &args.datastore_endpoint {
        Some(endpoints) => {
            let opts = EtcdOptions::from_flags(
                endpoints,
                args.datastore_cafile.clone(),
                args.datastore_certfile.clone(),
                args.datastore_keyfile.clone(),
            );
            EtcdStore::connect(&opts).context("--datastore-endpoint")?
        }
        None => {
            let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
            let mut opts = SqliteOptions::new(data_dir.join("server").join("db").join("state.db"));
            opts.sync = match args.sync {
                Sync::Full => SyncMode::Full,
                Sync::Normal => SyncMode::Normal,
            };
            opts.max_request_bytes = args.max_request_bytes;
            opts.quota_backend_bytes = args.quota_backend_bytes;
            opts.progress_notify_interval = args.watch_progress_notify_interval;
            opts.member_name = args.name.clone();
            opts.client_urls = advertised;
            let store = SqliteStore::open(opts)
                .with_context(|| format!("cannot open the datastore in {}", data_dir.display()))?;
            sqlite = Some(store.clone());
            store
        }
    };

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let tls = TlsFiles {
        cert_file: args.cert_file.clone(),
        key_file: args.key_file.clone(),
        trusted_ca_file: args.trusted_ca_file.clone(),
    };
    let mut server = tokio::spawn(grpc::serve(store, listeners, tls, args.max_request_bytes, stop_rx));
    let outcome = tokio::select! {
        res = &mut server => Some(res),
        _ = super::shutdown_signal() => None,
    };
    let _ = stop_tx.send(true);
    let served = match outcome {
        Some(res) => res,
        None => server.await,
    };
    if let Some(store) = sqlite {
        store.close().await;
    }
    served.context("the gRPC server task failed")??;
    Ok(())
}
