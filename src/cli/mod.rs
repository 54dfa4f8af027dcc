//! The command line: parsing, logging, the runtime, and the data-dir layout.

mod agent;
mod certificate;
mod check_config;
mod cluster_info;
mod components;
mod config;
#[cfg(test)]
mod config_reference;
mod datastore;
mod datastore_pki;
mod duration;
mod etcd_snapshot;
mod images;
mod kubectl;
mod node_args;
mod secrets_encrypt;
mod server;
mod table;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "ferrok",
    version,
    about = "Kubernetes in one executable",
    propagate_version = true,
    args_override_self = true
)]
pub struct Cli {
    /// More log output (-v: debug for ferrok, -vv: trace).
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start; the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the control plane (API server on the embedded store) and, unless disabled, the node role.
    Server(server::ServerArgs),
    /// Run the node role alone and join a server.
    Agent(agent::AgentArgs),
    /// Serve the embedded datastore (or an external etcd) as an etcd v3 endpoint.
    Datastore(datastore::DatastoreArgs),
    /// Import, list and remove the node's container images (no registry needed).
    Images(images::ImagesArgs),
    /// Create, list and delete bootstrap tokens that agents join with.
    Token(token::TokenArgs),
    /// Check the expiry of this host's certificates, or rotate them.
    Certificate(certificate::CertificateArgs),
    /// Save, list, delete, prune and restore snapshots of the datastore.
    EtcdSnapshot(etcd_snapshot::EtcdSnapshotArgs),
    /// Secrets encrypted at rest: status, enable, disable, rotate-keys.
    SecretsEncrypt(secrets_encrypt::SecretsEncryptArgs),
    /// Check whether this host can run ferrok: kernel, cgroups, programs, ports, data dir.
    CheckConfig(check_config::CheckConfigArgs),
    /// Run the host's kubectl with the cluster's admin kubeconfig (also: ferrok linked as `kubectl`).
    #[command(disable_help_flag = true)]
    Kubectl {
        /// kubectl's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
}

/// Whether ferrok runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// Where ferrok keeps its state when `--data-dir` is not given.
pub fn default_data_dir() -> PathBuf {
    match std::env::var_os("HOME") {
        Some(home) if !is_root() => PathBuf::from(home).join(".ferrok"),
        _ => PathBuf::from("/var/lib/ferrok"),
    }
}

/// SIGINT or SIGTERM, caught from the moment it is installed: a signal
/// that arrives while the server is still starting is kept until
/// [`ShutdownSignal::wait`] (the default action would kill the process and
/// leave containerd and the store unclosed).
pub struct ShutdownSignal {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignal {
    pub fn install() -> ShutdownSignal {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).map_err(|e| tracing::warn!(error = %e, "cannot catch SIGTERM")).ok();
        let int = signal(SignalKind::interrupt()).map_err(|e| tracing::warn!(error = %e, "cannot catch SIGINT")).ok();
        ShutdownSignal { term, int }
    }

    pub async fn wait(&mut self) {
        async fn recv(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            _ = recv(&mut self.term) => {}
            _ = recv(&mut self.int) => {}
        }
        tracing::info!("shutting down");
    }
}

/// SIGINT or SIGTERM from now on.
pub async fn shutdown_signal() {
    ShutdownSignal::install().wait().await
}

/// `quiet`: a one-shot command, whose output is what it prints; its log
/// says only what went wrong unless asked for more.
fn init_logging(verbose: u8, quiet: bool) {
    let default = match verbose {
        0 if quiet => "warn",
        0 => "warn,ferrok=info",
        1 => "info,ferrok=debug",
        _ => "debug,ferrok=trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr).init();
}

/// glibc gives every thread that allocates its own malloc arena; with the
/// store's reader threads that multiplies resident memory for no gain.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only adjusts allocator tuning; called before any threads start.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

pub fn main() -> ExitCode {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // kubectl's arguments are kubectl's: they go through untouched.
    let kubectl_args = match argv.get(1) {
        _ if argv.first().is_some_and(|a| kubectl::invoked_as_kubectl(a)) => Some(&argv[1..]),
        Some(a) if a == "kubectl" => Some(&argv[2..]),
        _ => None,
    };
    if let Some(args) = kubectl_args {
        eprintln!("error: {:#}", kubectl::exec(args.to_vec()));
        return ExitCode::FAILURE;
    }
    let argv = match config::with_config_file(argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // One line, naming the flag or value at fault.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("error: invalid arguments");
            eprintln!("{first}");
            return ExitCode::from(2);
        }
    };
    init_logging(
        cli.verbose,
        matches!(
            cli.command,
            Command::Token(_)
                | Command::CheckConfig(_)
                | Command::Certificate(_)
                | Command::EtcdSnapshot(_)
                | Command::SecretsEncrypt(_)
        ),
    );
    limit_malloc_arenas();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().max_blocking_threads(32).build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Datastore(args) => datastore::run(args).await,
            Command::Server(args) => server::run(args).await,
            Command::Images(args) => images::run(args).await,
            Command::Token(args) => token::run(args).await,
            Command::SecretsEncrypt(args) => secrets_encrypt::run(args).await,
            Command::CheckConfig(args) => check_config::run(args),
            Command::Certificate(args) => certificate::run(args).await,
            Command::EtcdSnapshot(args) => etcd_snapshot::run(args).await,
            Command::Agent(args) => agent::run(args).await,
            Command::Kubectl { args } => Err(kubectl::exec(args)),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
