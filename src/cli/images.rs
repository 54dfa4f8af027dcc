//! `ferrok images`: import tarballs into the node's containerd, list its
//! images, remove some — without a running ferrok, only its containerd.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use clap::{Args, Subcommand};

use crate::agent::cri::{socket_path, Cri};
use crate::agent::images::{self, ImportOptions, ListedImage};

#[derive(Debug, Args)]
pub struct ImagesArgs {
    #[command(subcommand)]
    command: ImagesCommand,
    /// The node's data dir, to find its containerd (`<data-dir>/agent/containerd/containerd.sock`).
    #[arg(long, global = true, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// The CRI socket to use instead (`unix:///run/containerd/containerd.sock`).
    #[arg(long, global = true, value_name = "ENDPOINT")]
    container_runtime_endpoint: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ImagesCommand {
    /// Import image tarballs (OCI layout or docker save; plain, gzip or zstd).
    Import {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Name for index entries that carry only a tag (`<base-name>:<tag>`).
        #[arg(long)]
        base_name: Option<String>,
    },
    /// List the node's images (PINNED: kept by image garbage collection).
    #[command(alias = "ls")]
    List,
    /// Remove images by name, or by ID (all of the image's names).
    #[command(alias = "rmi")]
    Rm {
        #[arg(required = true)]
        images: Vec<String>,
    },
}

fn socket(args: &ImagesArgs) -> anyhow::Result<PathBuf> {
    if let Some(endpoint) = &args.container_runtime_endpoint {
        return Ok(socket_path(endpoint)?);
    }
    let data_dir = args.data_dir.clone().unwrap_or_else(super::default_data_dir);
    Ok(data_dir.join("agent").join("containerd").join("containerd.sock"))
}

async fn connect(args: &ImagesArgs) -> anyhow::Result<Cri> {
    let socket = socket(args)?;
    if !socket.exists() {
        bail!(
            "no containerd socket at {} (is the node running? see --data-dir and --container-runtime-endpoint)",
            socket.display()
        );
    }
    let cri = Cri::connect(&socket)?;
    tokio::time::timeout(Duration::from_secs(10), cri.version())
        .await
        .map_err(|_| anyhow!("containerd at {} does not answer", socket.display()))?
        .with_context(|| format!("containerd at {}", socket.display()))?;
    Ok(cri)
}

pub async fn run(args: ImagesArgs) -> anyhow::Result<()> {
    let cri = connect(&args).await?;
    match &args.command {
        ImagesCommand::Import { files, base_name } => {
            let options = ImportOptions { base_name: base_name.clone(), ..Default::default() };
            for file in files {
                let source = file.display().to_string();
                let reader = std::fs::File::open(file).with_context(|| format!("cannot open {source}"))?;
                let names =
                    images::import_with(&cri, &source, reader, &options).await.map_err(|e| name_it(e, &source))?;
                for name in names {
                    println!("imported {name}");
                }
            }
        }
        ImagesCommand::List => print!("{}", table(&images::list_images(&cri).await?)),
        ImagesCommand::Rm { images: refs } => {
            for r in refs {
                let removed = images::remove_image(&cri, r).await.map_err(|e| name_it(e, r))?;
                for name in removed {
                    println!("Deleted: {name}");
                }
            }
        }
    }
    Ok(())
}

/// The error, with `what` in front unless it already names it.
fn name_it(e: images::ImageError, what: &str) -> anyhow::Error {
    let text = e.to_string();
    if text.contains(what) {
        anyhow!(text)
    } else {
        anyhow!("{what}: {text}")
    }
}

/// Sizes as crictl prints them (decimal units, three significant digits).
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    let mut size = bytes as f64;
    let mut unit = 0;
    while size >= 1000.0 && unit + 1 < UNITS.len() {
        size /= 1000.0;
        unit += 1;
    }
    let digits = if size >= 100.0 {
        0
    } else if size >= 10.0 {
        1
    } else {
        2
    };
    let mut text = format!("{size:.digits$}");
    if text.contains('.') {
        text = text.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    format!("{text}{}", UNITS[unit])
}

/// `repo:tag` → (`repo`, `tag`).
fn split_tag(name: &str) -> (String, String) {
    let slash = name.rfind('/').map(|i| i + 1).unwrap_or(0);
    match name[slash..].rfind(':') {
        Some(i) => (name[..slash + i].to_string(), name[slash + i + 1..].to_string()),
        None => (name.to_string(), "<none>".to_string()),
    }
}

fn table(list: &[ListedImage]) -> String {
    let mut rows = vec![["IMAGE".to_string(), "TAG".into(), "IMAGE ID".into(), "SIZE".into(), "PINNED".into()]];
    for image in list {
        let id: String = image.id.trim_start_matches("sha256:").chars().take(12).collect();
        let mut names: Vec<(String, String)> = image.repo_tags.iter().map(|t| split_tag(t)).collect();
        if names.is_empty() {
            let repo = image.repo_digests.first().and_then(|d| d.split_once('@')).map(|(r, _)| r.to_string());
            names.push((repo.unwrap_or_else(|| "<none>".into()), "<none>".into()));
        }
        for (repo, tag) in names {
            rows.push([repo, tag, id.clone(), human_size(image.size), image.protected.to_string()]);
        }
    }
    let mut widths = [0usize; 5];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_crictl_prints_them() {
        assert_eq!(human_size(512), "512B");
        assert_eq!(human_size(1_982_256), "1.98MB");
        assert_eq!(human_size(315_000), "315kB");
        assert_eq!(human_size(12_000_000), "12MB");
        assert_eq!(human_size(1_000), "1kB");
    }

    #[test]
    fn table_has_a_row_per_name() {
        let list = vec![ListedImage {
            id: "sha256:0123456789abcdef".into(),
            repo_tags: vec!["docker.io/library/busybox:1".into(), "127.0.0.1:5000/x:2".into()],
            repo_digests: vec![],
            size: 2_000_000,
            protected: true,
        }];
        let t = table(&list);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "{t}");
        assert!(lines[0].starts_with("IMAGE "), "{t}");
        assert!(
            lines[1].contains("docker.io/library/busybox")
                && lines[1].contains("0123456789ab ")
                && lines[1].ends_with("true"),
            "{t}"
        );
        assert!(lines[2].starts_with("127.0.0.1:5000/x ") && lines[2].contains(" 2 "), "{t}");
    }
}
