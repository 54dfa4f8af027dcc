//! Images without a registry for the tests: a busybox image built offline
//! from the host's static busybox (as an OCI image-layout tarball or a
//! `docker save` archive), a containerd of the test's own, and a real
//! registry (Debian's docker-registry) on 127.0.0.1 to pull from.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferrok::agent::containerd::{check_host, Containerd, ContainerdConfig, ContainerdPaths};
use ferrok::agent::cri::Cri;
use sha2::{Digest, Sha256};

/// The busybox applets linked into the test image's `/bin`.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh",
    "sleep",
    "echo",
    "cat",
    "httpd",
    "wget",
    "nc",
    "env",
    "id",
    "ls",
    "mkdir",
    "touch",
    "test",
    "true",
    "false",
    "ps",
    "kill",
    "date",
    "grep",
    "hostname",
    "nslookup",
    "whoami",
    "tar",
    "wc",
    "sha256sum",
];

/// Panics naming the Debian package when `bin` is missing: tests never skip.
pub fn require_binary(bin: &str, package: &str) -> PathBuf {
    ferrok::agent::containerd::find_binary(bin)
        .unwrap_or_else(|| panic!("{bin} is not installed: apt-get install -y {package} (or run scripts/deps)"))
}

fn digest(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn goarch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn append(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_size(data.len() as u64);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, path, data).expect("append to tar");
}

fn append_dir(b: &mut tar::Builder<Vec<u8>>, path: &str, mode: u32) {
    let mut h = tar::Header::new_ustar();
    h.set_size(0);
    h.set_mode(mode);
    h.set_mtime(0);
    h.set_entry_type(tar::EntryType::Directory);
    b.append_data(&mut h, path, std::io::empty()).expect("append dir to tar");
}

/// The busybox image's parts: the uncompressed layer and its config.
pub struct BusyboxImage {
    pub layer: Vec<u8>,
    pub config: Vec<u8>,
}

/// Builds the busybox root filesystem layer and the image config.
pub fn busybox_image() -> BusyboxImage {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .unwrap_or_else(|| panic!("busybox is not installed: apt-get install -y busybox-static"));
    let mut b = tar::Builder::new(Vec::new());
    append_dir(&mut b, "bin/", 0o755);
    append(&mut b, "bin/busybox", 0o755, &busybox);
    for applet in BUSYBOX_APPLETS {
        let mut h = tar::Header::new_ustar();
        h.set_size(0);
        h.set_mode(0o777);
        h.set_mtime(0);
        h.set_entry_type(tar::EntryType::Symlink);
        b.append_link(&mut h, format!("bin/{applet}"), "busybox").expect("append symlink");
    }
    append_dir(&mut b, "tmp/", 0o1777);
    append_dir(&mut b, "etc/", 0o755);
    append(
        &mut b,
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    );
    append(&mut b, "etc/group", 0o644, b"root:x:0:\nnobody:x:65534:\n");
    let layer = b.into_inner().expect("finish layer");
    let config = serde_json::json!({
        "architecture": goarch(),
        "os": "linux",
        "config": { "Env": ["PATH=/bin"], "Cmd": ["sh"] },
        "rootfs": { "type": "layers", "diff_ids": [digest(&layer)] },
        "history": [{ "created_by": "ferrok tests: busybox from the host" }],
    });
    BusyboxImage { layer, config: serde_json::to_vec(&config).expect("config json") }
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(data).expect("gzip");
    gz.finish().expect("gzip")
}

/// Writes an OCI image-layout tarball of busybox named `reference` (its
/// index entry has `io.containerd.image.name` and the tag as
/// `org.opencontainers.image.ref.name`), with a gzip-compressed layer.
pub fn busybox_oci_tar(path: &Path, reference: &str) {
    write_oci_tar(path, reference, false);
}

/// Like [`busybox_oci_tar`], but index.json names a multi-platform image
/// index whose first manifest is for linux/s390x (and, as in an export for
/// one platform, its blobs are not in the tarball).
pub fn busybox_oci_multiplatform_tar(path: &Path, reference: &str) {
    write_oci_tar(path, reference, true);
}

fn write_oci_tar(path: &Path, reference: &str, multiplatform: bool) {
    let image = busybox_image();
    let layer = gzip(&image.layer);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&image.config), "size": image.config.len() },
        "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest(&layer), "size": layer.len() }],
    }))
    .expect("manifest json");
    let tag = reference.rsplit_once(':').map(|(_, t)| t).filter(|t| !t.contains('/')).unwrap_or("latest");
    let annotations =
        serde_json::json!({ "io.containerd.image.name": reference, "org.opencontainers.image.ref.name": tag });
    let host_entry = serde_json::json!({
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "digest": digest(&manifest),
        "size": manifest.len(),
        "platform": { "architecture": goarch(), "os": "linux" },
    });
    let mut blobs = vec![layer, image.config, manifest];
    let top = if multiplatform {
        let absent = format!("sha256:{}", "5".repeat(64));
        let nested = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                { "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": absent, "size": 500,
                  "platform": { "architecture": "s390x", "os": "linux" } },
                host_entry,
            ],
        }))
        .expect("nested index json");
        let entry = serde_json::json!({
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "digest": digest(&nested),
            "size": nested.len(),
            "annotations": annotations,
        });
        blobs.push(nested);
        entry
    } else {
        let mut entry = host_entry;
        entry["annotations"] = annotations;
        entry
    };
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [top],
    }))
    .expect("index json");
    let mut b = tar::Builder::new(Vec::new());
    append(&mut b, "oci-layout", 0o644, br#"{"imageLayoutVersion":"1.0.0"}"#);
    append_dir(&mut b, "blobs/", 0o755);
    append_dir(&mut b, "blobs/sha256/", 0o755);
    for blob in &blobs {
        append(&mut b, &format!("blobs/sha256/{}", &digest(blob)[7..]), 0o644, blob);
    }
    // index.json last, as some tools write it: the importer must not care.
    append(&mut b, "index.json", 0o644, &index);
    std::fs::write(path, b.into_inner().expect("finish tar")).expect("write OCI tarball");
}

/// Writes a `docker save` archive of busybox tagged `reference`
/// (manifest.json, `<id>.json` config, `<id>/layer.tar` uncompressed).
pub fn busybox_docker_archive(path: &Path, reference: &str) {
    let image = busybox_image();
    let config_hex = digest(&image.config)[7..].to_string();
    let layer_id = digest(&image.layer)[7..].to_string();
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{config_hex}.json"),
        "RepoTags": [reference],
        "Layers": [format!("{layer_id}/layer.tar")],
    }]))
    .expect("manifest.json");
    let mut b = tar::Builder::new(Vec::new());
    append(&mut b, &format!("{config_hex}.json"), 0o644, &image.config);
    append_dir(&mut b, &format!("{layer_id}/"), 0o755);
    append(&mut b, &format!("{layer_id}/VERSION"), 0o644, b"1.0");
    append(&mut b, &format!("{layer_id}/json"), 0o644, format!(r#"{{"id":"{layer_id}"}}"#).as_bytes());
    append(&mut b, &format!("{layer_id}/layer.tar"), 0o644, &image.layer);
    append(&mut b, "manifest.json", 0o644, &manifest);
    std::fs::write(path, b.into_inner().expect("finish tar")).expect("write docker archive");
}

/// gzip-compresses `from` into `to`.
pub fn gzip_file(from: &Path, to: &Path) {
    std::fs::write(to, gzip(&std::fs::read(from).expect("read tarball"))).expect("write .tar.gz");
}

/// zstd-compresses `from` into `to` with the zstd tool.
pub fn zstd_file(from: &Path, to: &Path) {
    let zstd = require_binary("zstd", "zstd");
    let status = Command::new(zstd).args(["-q", "-f", "-o"]).arg(to).arg(from).status().expect("run zstd");
    assert!(status.success(), "zstd failed");
}

/// A containerd of the test's own under `dir` (its own root, socket and
/// runc root; certs.d at `<dir>/agent/etc/containerd/certs.d`).
pub struct TestContainerd {
    pub containerd: Option<Containerd>,
    pub cri: Cri,
    pub paths: ContainerdPaths,
    pub agent_dir: PathBuf,
}

impl TestContainerd {
    pub async fn start(dir: &Path) -> TestContainerd {
        let (handlers, cni_bin_dir) = check_host(false).unwrap_or_else(|e| panic!("{e} (run scripts/deps)"));
        let agent_dir = dir.join("agent");
        let paths = ContainerdPaths::new(&agent_dir);
        let config = ContainerdConfig {
            paths: paths.clone(),
            sandbox_image: ferrok::agent::images::PAUSE_IMAGE.into(),
            handlers,
            cni_bin_dir,
            max_container_log_line_size: 16384,
        };
        let containerd = Containerd::start(&config).await.unwrap_or_else(|e| panic!("containerd: {e}"));
        let cri = Cri::connect(&paths.socket).expect("CRI client");
        cri.wait_ready(Duration::from_secs(20)).await.expect("containerd answers CRI");
        TestContainerd { containerd: Some(containerd), cri, paths, agent_dir }
    }

    pub async fn stop(mut self) {
        if let Some(c) = self.containerd.take() {
            c.stop().await;
        }
    }
}

impl Drop for TestContainerd {
    /// A test that panicked before `stop`: containerd is not left running.
    fn drop(&mut self) {
        if self.containerd.is_none() {
            return;
        }
        let pid_file = self.paths.root.join("containerd.pid");
        if let Some(pid) = std::fs::read_to_string(pid_file).ok().and_then(|s| s.trim().parse::<i32>().ok()) {
            // SAFETY: kill(2) of the containerd this test started.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
}

/// A docker-registry on 127.0.0.1, killed when dropped.
pub struct Registry {
    child: Child,
    pub addr: String,
    pub port: u16,
    pub dir: PathBuf,
    pub credentials: Option<(String, String)>,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Registry {
    /// Starts `docker-registry serve` with its storage in `dir`; with
    /// `htpasswd`, pulls and pushes need that user and password.
    pub fn start(dir: &Path, htpasswd: Option<(&str, &str)>) -> Registry {
        Registry::start_at(dir, htpasswd, "127.0.0.1", None)
    }

    /// A registry on `addr`, inside the network namespace `netns` when given
    /// (a test node's own, so that its containerd reaches it).
    pub fn start_at(dir: &Path, htpasswd: Option<(&str, &str)>, addr: &str, netns: Option<&str>) -> Registry {
        let registry = require_binary("docker-registry", "docker-registry");
        std::fs::create_dir_all(dir).expect("registry dir");
        let port = super::free_port();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}:{port}\n",
            dir.join("data").display()
        );
        if let Some((user, pass)) = htpasswd {
            let tool = require_binary("htpasswd", "apache2-utils");
            let out = Command::new(tool).args(["-Bbn", user, pass]).output().expect("run htpasswd");
            assert!(out.status.success(), "htpasswd failed: {}", String::from_utf8_lossy(&out.stderr));
            let file = dir.join("htpasswd");
            std::fs::write(&file, &out.stdout).expect("write htpasswd");
            config.push_str(&format!("auth:\n  htpasswd:\n    realm: ferrok-test\n    path: {}\n", file.display()));
        }
        let config_path = dir.join("config.yml");
        std::fs::write(&config_path, config).expect("write registry config");
        let log = std::fs::File::create(dir.join("registry.log")).expect("registry log");
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net=/run/netns/{ns}")).arg(registry);
                c
            }
            None => Command::new(registry),
        };
        let child = cmd
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start docker-registry");
        let mut r = Registry {
            child,
            addr: addr.to_string(),
            port,
            dir: dir.to_path_buf(),
            credentials: htpasswd.map(|(u, p)| (u.to_string(), p.to_string())),
        };
        r.wait_ready();
        r
    }

    /// `<addr>:<port>`
    pub fn host(&self) -> String {
        format!("{}:{}", self.addr, self.port)
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                let log = std::fs::read_to_string(self.dir.join("registry.log")).unwrap_or_default();
                panic!("docker-registry exited with {status}:\n{log}");
            }
            if let Ok(mut s) = TcpStream::connect((self.addr.as_str(), self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
                let req = format!("GET /v2/ HTTP/1.0\r\nHost: {}\r\n\r\n", self.host());
                let mut answer = [0u8; 12];
                if s.write_all(req.as_bytes()).is_ok()
                    && s.read_exact(&mut answer).is_ok()
                    && answer.starts_with(b"HTTP/")
                {
                    return;
                }
            }
            assert!(Instant::now() < deadline, "docker-registry did not answer on {}", self.host());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Pushes an OCI image-layout tarball as `repo_tag` (`library/busybox:1`).
    pub fn push(&self, tar: &Path, repo_tag: &str) {
        let skopeo = require_binary("skopeo", "skopeo");
        let mut cmd = Command::new(skopeo);
        cmd.args(["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"]);
        if let Some((u, p)) = &self.credentials {
            cmd.arg("--dest-creds").arg(format!("{u}:{p}"));
        }
        cmd.arg(format!("oci-archive:{}", tar.display())).arg(format!("docker://{}/{repo_tag}", self.host()));
        let out = cmd.output().expect("run skopeo");
        assert!(out.status.success(), "skopeo copy failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}
