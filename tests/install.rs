//! The curl-pipe installer (`install.sh`) and the packaging: run as a user
//! would, relocated into a temporary root (`INSTALL_FERROK_ROOT`), on this
//! machine without systemd or OpenRC. The service it writes is started the
//! way its OpenRC script would, in a network namespace of its own, up to a
//! Ready node running a pod; then `ferrok-killall.sh` and the uninstaller
//! must leave nothing ferrok made: processes, mounts, nftables table,
//! links, routes, cgroups, files. The sysv script (`/etc/init.d`, for
//! hosts with neither) is started and stopped with itself. Needs root and what `scripts/deps`
//! installs (shellcheck, containerd, runc, CNI plugins, nftables, dpkg).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::ferrok_bin;
use common::install::{
    cgroup_root, copy_binary, kubectl, listing, node_exec, node_name, processes_under, repo, run_install, server_exec,
    text, wait_node_ready, Netns, Release, Service,
};

/// The shell scripts of the repository and their shell.
const SCRIPTS: &[&str] = &[
    "install.sh",
    "packaging/ferrok-killall.sh",
    "packaging/openrc/ferrok",
    "packaging/sysv/ferrok",
    "packaging/debian/postinst",
    "packaging/debian/prerm",
    "packaging/debian/postrm",
    "scripts/build-deb",
];

fn check_script(path: &Path) {
    for shell in [&["sh", "-n"][..], &["busybox", "sh", "-n"][..]] {
        let out = Command::new(shell[0]).args(&shell[1..]).arg(path).output().expect("sh");
        assert!(out.status.success(), "{shell:?} {}: {}", path.display(), text(&out));
    }
    let out = Command::new("shellcheck").args(["-s", "sh"]).arg(path).output().expect("shellcheck (scripts/deps)");
    assert!(out.status.success(), "shellcheck {}:\n{}", path.display(), text(&out));
}

#[test]
fn scripts_are_posix_sh_and_shellcheck_clean() {
    for script in SCRIPTS {
        check_script(&repo().join(script));
    }
}

/// A relocated install of `ferrok` already in place (INSTALL_FERROK_SKIP_DOWNLOAD).
fn root_with_binary() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    let bin = root.path().join("usr/local/bin");
    std::fs::create_dir_all(&bin).expect("bin dir");
    copy_binary(Path::new(ferrok_bin()), &bin.join("ferrok"));
    root
}

/// A packaging/ template with the values install.sh fills in.
fn render(template: &str, values: &[(&str, String)]) -> String {
    let mut text = std::fs::read_to_string(repo().join("packaging").join(template)).expect("template");
    for (key, value) in values {
        text = text.replace(&format!("@{key}@"), value);
    }
    text
}

/// Panics with the first line where `actual` (a written file) and the
/// template differ.
fn assert_same(actual: &str, expected: &str, what: &str) {
    if actual == expected {
        return;
    }
    let (a, e): (Vec<&str>, Vec<&str>) = (actual.lines().collect(), expected.lines().collect());
    let line = a.iter().zip(&e).position(|(x, y)| x != y).unwrap_or(a.len().min(e.len()));
    panic!(
        "{what}: line {} is\n  {:?}\nbut packaging/ says\n  {:?}",
        line + 1,
        a.get(line).copied().unwrap_or("<end>"),
        e.get(line).copied().unwrap_or("<end>")
    );
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).expect("metadata").permissions().mode() & 0o777
}

/// install.sh writes the units, OpenRC scripts and killall of packaging/,
/// word for word once its values are filled in; its env file holds the
/// FERROK_ variables, for root's eyes only; the uninstaller takes all of
/// it away again.
#[test]
fn installer_writes_packaging_files_and_uninstalls_them() {
    let systemd_analyze = Path::new("/usr/bin/systemd-analyze").exists();
    for init in ["systemd", "openrc", "sysv"] {
        for agent in [false, true] {
            let root = root_with_binary();
            let r = root.path().to_string_lossy().into_owned();
            let before = listing(root.path());
            let mut env = vec![("INSTALL_FERROK_SKIP_DOWNLOAD", "true"), ("INSTALL_FERROK_INIT", init)];
            if agent {
                env.extend([("FERROK_URL", "https://10.0.0.1:6443"), ("FERROK_TOKEN", "K10abc::server:secret")]);
            }
            let out = run_install(root.path(), &env, &["--node-name", "n1"]);
            assert!(out.status.success(), "{init} agent={agent}: {}", text(&out));
            let name = if agent { "ferrok-agent" } else { "ferrok" };
            let exec =
                format!("{} --node-name n1 --data-dir {r}/var/lib/ferrok", if agent { "agent" } else { "server" });
            let (service, env_file) = if init == "systemd" {
                (format!("{r}/etc/systemd/system/{name}.service"), format!("{r}/etc/systemd/system/{name}.service.env"))
            } else {
                (format!("{r}/etc/init.d/{name}"), format!("{r}/etc/ferrok/{name}.env"))
            };
            let values = [
                ("SYSTEM_NAME", name.to_string()),
                ("BIN_DIR", format!("{r}/usr/local/bin")),
                ("EXEC", exec),
                ("ENV_FILE", env_file.clone()),
                ("LOG_FILE", format!("{r}/var/log/{name}.log")),
                ("PID_FILE", format!("{r}/var/run/{name}.pid")),
                ("DATA_DIR", format!("{r}/var/lib/ferrok")),
                ("CLUSTER_CIDR", "10.42.0.0/16".into()),
                ("CGROUP_ROOT", "/kubepods".into()),
                ("SYSTEMD_DIR", format!("{r}/etc/systemd/system")),
                ("INIT_DIR", format!("{r}/etc/init.d")),
                ("ROOT", r.clone()),
            ];
            let template = match init {
                "systemd" => "systemd/ferrok.service",
                "openrc" => "openrc/ferrok",
                _ => "sysv/ferrok",
            };
            assert_same(&read(Path::new(&service)), &render(template, &values), &service);
            if init == "sysv" {
                check_script(Path::new(&service));
                assert_eq!(mode(Path::new(&service)), 0o755);
            }
            let killall = root.path().join("usr/local/bin/ferrok-killall.sh");
            assert_same(&read(&killall), &render("ferrok-killall.sh", &values), "ferrok-killall.sh");
            assert_eq!(mode(&killall), 0o755);
            assert_eq!(mode(Path::new(&env_file)), 0o600, "the env file holds the token");
            let env_text = read(Path::new(&env_file));
            assert!(env_text.contains(&format!("FERROK_CONFIG_FILE='{r}/etc/ferrok/config.yaml'")), "{env_text}");
            if agent {
                assert!(env_text.contains("FERROK_URL='https://10.0.0.1:6443'"), "{env_text}");
                assert!(env_text.contains("FERROK_TOKEN='K10abc::server:secret'"), "{env_text}");
            }
            let uninstall = root.path().join(format!("usr/local/bin/{name}-uninstall.sh"));
            check_script(&uninstall);
            check_script(&killall);
            if init == "systemd" && systemd_analyze {
                let out =
                    Command::new("systemd-analyze").arg("verify").arg(&service).output().expect("systemd-analyze");
                assert!(out.status.success(), "systemd-analyze verify {service}: {}", text(&out));
            }
            let out = Command::new(&uninstall).output().expect("uninstall");
            assert!(out.status.success(), "{}", text(&out));
            let mut expected: BTreeSet<String> = before.clone();
            expected.remove("usr/local/bin/ferrok");
            assert_eq!(listing(root.path()), expected, "{init} agent={agent}: the uninstaller left files");
        }
    }
}

/// One line naming the variable at fault, a non-zero exit, nothing written.
#[test]
fn bad_input_is_one_line_and_installs_nothing() {
    let cases: &[(&[(&str, &str)], &str)] = &[
        (&[("INSTALL_FERROK_INIT", "upstart")], "error: INSTALL_FERROK_INIT=upstart: expected systemd, openrc or sysv"),
        (
            &[("INSTALL_FERROK_INIT", "openrc"), ("FERROK_URL", "https://10.0.0.1:6443")],
            "error: an agent needs FERROK_TOKEN or FERROK_TOKEN_FILE",
        ),
        (
            &[("INSTALL_FERROK_INIT", "openrc"), ("FERROK_URL", "http://10.0.0.1:6443"), ("FERROK_TOKEN", "t")],
            "error: FERROK_URL=http://10.0.0.1:6443: only https:// URLs are supported",
        ),
        (
            &[("INSTALL_FERROK_INIT", "openrc"), ("INSTALL_FERROK_EXEC", "serve")],
            "error: INSTALL_FERROK_EXEC: serve is not a ferrok command",
        ),
        (
            &[("INSTALL_FERROK_INIT", "openrc"), ("INSTALL_FERROK_SKIP_DOWNLOAD", "true")],
            "error: INSTALL_FERROK_SKIP_DOWNLOAD=true but there is no ferrok at",
        ),
    ];
    for (env, error) in cases {
        let root = tempfile::tempdir().expect("tempdir");
        let out = run_install(root.path(), env, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{env:?} succeeded");
        assert_eq!(stderr.lines().count(), 1, "{env:?}: not one line: {stderr}");
        assert!(stderr.starts_with(error), "{env:?}: {stderr}");
        assert!(listing(root.path()).is_empty(), "{env:?}: wrote {:?}", listing(root.path()));
    }
}

/// A host without containerd, runc, nftables and iproute2: the installer
/// installs them with the package manager it finds, and says so. Here the
/// host is a PATH with the installer's own tools only, and a package
/// manager (`apt-get`, `dnf` or `apk`) that writes down what it was asked.
fn installs_missing_packages_with(manager: &str, names: &str, asked_for: &str) {
    let root = root_with_binary();
    let path = tempfile::tempdir().expect("tempdir");
    for tool in [
        "sh",
        "env",
        "sed",
        "awk",
        "id",
        "rm",
        "cp",
        "mv",
        "chmod",
        "mkdir",
        "dirname",
        "grep",
        "tr",
        "mktemp",
        "ln",
        "cat",
        "sha256sum",
    ] {
        let real = ["/usr/bin", "/bin"].iter().map(|d| Path::new(d).join(tool)).find(|p| p.exists());
        std::os::unix::fs::symlink(real.unwrap_or_else(|| panic!("no {tool}")), path.path().join(tool)).expect("link");
    }
    let asked = path.path().join("asked");
    let stub = path.path().join(manager);
    std::fs::write(&stub, format!("#!/bin/sh\necho \"$*\" >>{}\n", asked.display())).expect("package manager");
    std::fs::set_permissions(&stub, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    let out = Command::new("/bin/sh")
        .arg(repo().join("install.sh"))
        .env_clear()
        .env("PATH", path.path())
        .env("INSTALL_FERROK_ROOT", root.path())
        .env("INSTALL_FERROK_SKIP_DOWNLOAD", "true")
        .env("INSTALL_FERROK_INIT", "openrc")
        .env("INSTALL_FERROK_SYMLINK", "skip")
        .output()
        .expect("install.sh");
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("[INFO]  installed: {names}")), "{}", text(&out));
    assert_eq!(read(&asked), asked_for);
}

#[test]
fn missing_host_packages_are_installed_with_apt() {
    installs_missing_packages_with(
        "apt-get",
        "containerd runc nftables iproute2",
        "update -qq\ninstall -y -qq containerd runc nftables iproute2\n",
    );
}

/// Fedora and RHEL name iproute2 `iproute`.
#[test]
fn missing_host_packages_are_installed_with_dnf() {
    installs_missing_packages_with(
        "dnf",
        "containerd runc nftables iproute",
        "install -y -q containerd runc nftables iproute\n",
    );
}

#[test]
fn missing_host_packages_are_installed_with_apk() {
    installs_missing_packages_with(
        "apk",
        "containerd runc nftables iproute2",
        "add -q containerd runc nftables iproute2\n",
    );
}

/// A download whose checksum does not match, or that is not there, stops
/// the installer with one line before anything is installed.
#[test]
fn download_is_verified_against_its_checksum() {
    let release = Release::serve(Path::new(ferrok_bin()), Some(&"0".repeat(64)));
    let root = tempfile::tempdir().expect("tempdir");
    let env = [("INSTALL_FERROK_INIT", "openrc"), ("INSTALL_FERROK_DOWNLOAD_URL", release.url.as_str())];
    let out = run_install(root.path(), &env, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: checksum mismatch for {}/ferrok-", release.url)), "{stderr}");
    assert!(stderr.contains("nothing was installed"), "{stderr}");
    assert!(listing(root.path()).is_empty(), "{:?}", listing(root.path()));

    let missing = format!("{}/v9.9.9", release.url);
    let env = [("INSTALL_FERROK_INIT", "openrc"), ("INSTALL_FERROK_DOWNLOAD_URL", missing.as_str())];
    let out = run_install(root.path(), &env, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.starts_with(&format!("error: cannot download {missing}/sha256sum-")), "{stderr}");
    assert!(listing(root.path()).is_empty());
}

/// Mount points under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = format!("{}/", dir.display());
    read(Path::new("/proc/self/mountinfo"))
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

/// Cgroup folders named `cgroup_root` in any hierarchy.
fn cgroups_named(cgroup_root: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().filter_map(Result::ok) {
        let p = e.path().join(cgroup_root.trim_start_matches('/'));
        if p.is_dir() {
            out.push(p);
        }
    }
    out
}

/// Whatever is left when a test fails midway: killall, then the namespace.
struct Cleanup<'a> {
    netns: &'a Netns,
    killall: PathBuf,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() && self.killall.exists() {
            let _ = self.netns.command(&self.killall).output();
        }
    }
}

#[test]
fn install_start_killall_uninstall_leaves_nothing() {
    let release = Release::serve(Path::new(ferrok_bin()), None);
    let netns = Netns::new();
    let root = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("tempdir");
    let config = outside.path().join("config.yaml");
    std::fs::write(&config, "node-label:\n  - installed-by=install-sh\n").expect("config");
    let node = node_name(&netns);
    let cgroup_root = cgroup_root(&netns);
    let exec = server_exec(&netns);
    assert!(listing(root.path()).is_empty());

    let started = Instant::now();
    let env = [
        ("INSTALL_FERROK_INIT", "openrc"),
        ("INSTALL_FERROK_DOWNLOAD_URL", release.url.as_str()),
        ("INSTALL_FERROK_SYMLINK", "force"),
        ("INSTALL_FERROK_EXEC", exec.as_str()),
        ("FERROK_CONFIG_FILE", config.to_str().expect("utf-8")),
    ];
    let out = run_install(root.path(), &env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let installed = started.elapsed();
    let said = text(&out);
    assert!(said.contains("host packages present"), "{said}");
    let bin = root.path().join("usr/local/bin");
    let _cleanup = Cleanup { netns: &netns, killall: bin.join("ferrok-killall.sh") };
    let data = root.path().join("var/lib/ferrok");
    let images = data.join("agent/images");
    std::fs::create_dir_all(&images).expect("images dir");
    common::images::busybox_oci_tar(&images.join("busybox.tar"), common::node::BUSYBOX);

    let mut service = Service::start_openrc(&netns, &root.path().join("etc/init.d/ferrok"));
    let kubeconfig = data.join("kubeconfig.yaml");
    let log = root.path().join("var/log/ferrok.log");
    assert!(
        wait_node_ready(&netns, &mut service, &kubeconfig, &node, Duration::from_secs(120)),
        "node {node} did not become Ready\n{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let ready = started.elapsed();
    eprintln!("install.sh: {:.2} s to install, {:.2} s to a Ready node", installed.as_secs_f64(), ready.as_secs_f64());

    // The config file the installer named in the env file was read, and
    // kubectl linked to ferrok runs the host's kubectl.
    let labels = netns
        .command(bin.join("kubectl"))
        .args(["--kubeconfig"])
        .arg(&kubeconfig)
        .args(["get", "node", &node, "-o", "jsonpath={.metadata.labels.installed-by}"])
        .output()
        .expect("kubectl link");
    assert_eq!(String::from_utf8_lossy(&labels.stdout), "install-sh", "{}", text(&labels));

    // A pod with a memory volume: processes, mounts, a veth and cgroups to clean.
    let pod = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: sleeper, namespace: default}}\nspec:\n  containers:\n  - name: c\n    image: {}\n    command: [sleep, '3600']\n    volumeMounts: [{{name: m, mountPath: /m}}]\n  volumes: [{{name: m, emptyDir: {{medium: Memory}}}}]\n",
        common::node::BUSYBOX
    );
    let pod_file = outside.path().join("pod.yaml");
    std::fs::write(&pod_file, pod).expect("pod file");
    let (ok, out) = kubectl(&netns, &kubeconfig, &["apply", "-f", pod_file.to_str().expect("utf-8")]);
    assert!(ok, "{out}");
    common::eventually_within("the pod running", Duration::from_secs(90), || {
        kubectl(&netns, &kubeconfig, &["get", "pod", "sleeper", "-o", "jsonpath={.status.phase}"]).1 == "Running"
    });
    assert!(!mounts_under(root.path()).is_empty(), "the pod mounted nothing");
    assert!(netns.run(&["nft", "list", "table", "inet", "ferrok"]).0);
    assert!(netns.must(&["ip", "-o", "link"]).contains("ferrok0"));
    assert!(!cgroups_named(&cgroup_root).is_empty());
    let sandboxes: Vec<String> = std::fs::read_dir(data.join("agent/containerd/io.containerd.grpc.v1.cri/sandboxes"))
        .expect("sandboxes")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!sandboxes.is_empty());

    // killall: nothing of this install runs, is mounted or is in its network; the data stays.
    let t = Instant::now();
    let out = netns.command(bin.join("ferrok-killall.sh")).output().expect("killall");
    assert!(out.status.success(), "{}", text(&out));
    eprintln!("ferrok-killall.sh: {:.2} s", t.elapsed().as_secs_f64());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !service.exited() {
        assert!(Instant::now() < deadline, "ferrok still runs after killall");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(processes_under(root.path()), vec![], "processes left");
    assert_eq!(mounts_under(root.path()), Vec::<String>::new(), "mounts left");
    let (table, _) = netns.run(&["nft", "list", "table", "inet", "ferrok"]);
    assert!(!table, "the nftables table inet ferrok is left");
    let links: Vec<String> = netns
        .must(&["ip", "-o", "link"])
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|l| l.split('@').next().unwrap_or(l).to_string())
        .collect();
    assert_eq!(links, ["lo", "fkpeer", "fkhost"], "links left");
    let routes = netns.must(&["ip", "route"]);
    assert!(routes.lines().all(|l| l.contains("dev fkhost")), "routes left:\n{routes}");
    assert_eq!(cgroups_named(&cgroup_root), Vec::<PathBuf>::new(), "cgroups left");
    for id in &sandboxes {
        for e in std::fs::read_dir("/var/lib/cni/results").into_iter().flatten().filter_map(Result::ok) {
            let name = e.file_name().to_string_lossy().into_owned();
            assert!(!name.contains(id.as_str()), "CNI result {name} left");
        }
    }
    assert!(data.join("server/db/state.db").exists(), "killall removed the data");

    // The uninstaller: not a file left under the root.
    let out = Command::new(bin.join("ferrok-uninstall.sh")).output().expect("uninstall");
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(listing(root.path()), BTreeSet::new(), "the uninstaller left files");
}

/// `FERROK_URL` and `FERROK_TOKEN` given to the installer make an agent
/// service (`ferrok-agent`, its own uninstaller) whose env file carries
/// them: started from its OpenRC script on a second host, it joins the
/// server installed the same way and its node becomes Ready.
#[test]
fn agent_installed_with_ferrok_url_joins_the_server() {
    let release = Release::serve(Path::new(ferrok_bin()), None);
    let server_ns = Netns::new();
    let agent_ns = server_ns.neighbour();
    let server_root = tempfile::tempdir().expect("tempdir");
    let agent_root = tempfile::tempdir().expect("tempdir");
    let exec = server_exec(&server_ns);
    let env = [
        ("INSTALL_FERROK_INIT", "openrc"),
        ("INSTALL_FERROK_DOWNLOAD_URL", release.url.as_str()),
        ("INSTALL_FERROK_EXEC", exec.as_str()),
    ];
    let out = run_install(server_root.path(), &env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let server_bin = server_root.path().join("usr/local/bin");
    let _server_cleanup = Cleanup { netns: &server_ns, killall: server_bin.join("ferrok-killall.sh") };
    let server_data = server_root.path().join("var/lib/ferrok");
    let kubeconfig = server_data.join("kubeconfig.yaml");
    let mut server = Service::start_openrc(&server_ns, &server_root.path().join("etc/init.d/ferrok"));
    assert!(
        wait_node_ready(&server_ns, &mut server, &kubeconfig, &node_name(&server_ns), Duration::from_secs(120)),
        "the server's node did not become Ready\n{}",
        std::fs::read_to_string(server_root.path().join("var/log/ferrok.log")).unwrap_or_default()
    );

    let token = read(&server_data.join("server/token"));
    let url = format!("https://10.203.{}.2:6443", server_ns.n);
    let exec = node_exec("agent", &agent_ns);
    let env = [
        ("INSTALL_FERROK_INIT", "openrc"),
        ("INSTALL_FERROK_DOWNLOAD_URL", release.url.as_str()),
        ("INSTALL_FERROK_EXEC", exec.as_str()),
        ("FERROK_URL", url.as_str()),
        ("FERROK_TOKEN", token.trim()),
    ];
    let out = run_install(agent_root.path(), &env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let agent_bin = agent_root.path().join("usr/local/bin");
    let _agent_cleanup = Cleanup { netns: &agent_ns, killall: agent_bin.join("ferrok-killall.sh") };
    let script = agent_root.path().join("etc/init.d/ferrok-agent");
    let mut agent = Service::start_openrc(&agent_ns, &script);
    assert!(
        wait_node_ready(&server_ns, &mut agent, &kubeconfig, &node_name(&agent_ns), Duration::from_secs(120)),
        "the agent's node did not become Ready\n{}",
        std::fs::read_to_string(agent_root.path().join("var/log/ferrok-agent.log")).unwrap_or_default()
    );

    for (ns, bin, root, uninstall) in [
        (&agent_ns, &agent_bin, &agent_root, "ferrok-agent-uninstall.sh"),
        (&server_ns, &server_bin, &server_root, "ferrok-uninstall.sh"),
    ] {
        let out = ns.command(bin.join("ferrok-killall.sh")).output().expect("killall");
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(processes_under(root.path()), vec![], "processes left");
        let (table, _) = ns.run(&["nft", "list", "table", "inet", "ferrok"]);
        assert!(!table, "the nftables table inet ferrok is left in {}", ns.name);
        let links = ns.must(&["ip", "-o", "link"]);
        assert!(!links.contains("ferrok"), "links left in {}:\n{links}", ns.name);
        let out = Command::new(bin.join(uninstall)).output().expect("uninstall");
        assert!(out.status.success(), "{}", text(&out));
        assert_eq!(listing(root.path()), BTreeSet::new(), "{uninstall} left files");
    }
    assert!(agent.exited() && server.exited());
}

/// The .deb (dpkg-deb from a staged tree) holds packaging/'s units and
/// killall filled in for Debian; it installs into a dpkg root and purges
/// without a trace.
#[test]
fn deb_installs_and_purges() {
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(repo().join("scripts/build-deb"))
        .arg(ferrok_bin())
        .arg(out_dir.path())
        .env("DEB_COMPRESS", "none")
        .output()
        .expect("scripts/build-deb");
    assert!(out.status.success(), "{}", text(&out));
    let deb = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let root = tempfile::tempdir().expect("tempdir");
    let admin = root.path().join("var/lib/dpkg");
    std::fs::create_dir_all(admin.join("info")).expect("dpkg dir");
    std::fs::create_dir_all(admin.join("updates")).expect("dpkg dir");
    std::fs::write(admin.join("status"), "").expect("dpkg status");
    let dpkg = |args: &[&str]| {
        let out = Command::new("dpkg")
            .arg(format!("--root={}", root.path().display()))
            .args(["--force-depends", "--force-script-chrootless"])
            .args(args)
            .output()
            .expect("dpkg");
        assert!(out.status.success(), "dpkg {args:?}: {}", text(&out));
    };
    dpkg(&["-i", &deb]);
    let r = root.path();
    let version = Command::new(r.join("usr/bin/ferrok")).arg("--version").output().expect("ferrok --version");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("ferrok "), "{}", text(&version));
    for (name, exec) in [("ferrok", "server"), ("ferrok-agent", "agent")] {
        let values = [
            ("SYSTEM_NAME", name.to_string()),
            ("BIN_DIR", "/usr/bin".to_string()),
            ("EXEC", exec.to_string()),
            ("ENV_FILE", format!("/etc/systemd/system/{name}.service.env")),
        ];
        let unit = r.join(format!("lib/systemd/system/{name}.service"));
        assert_same(&read(&unit), &render("systemd/ferrok.service", &values), &unit.to_string_lossy());
    }
    let values = [
        ("BIN_DIR", "/usr/bin".to_string()),
        ("DATA_DIR", "/var/lib/ferrok".to_string()),
        ("CLUSTER_CIDR", "10.42.0.0/16".to_string()),
        ("CGROUP_ROOT", "/kubepods".to_string()),
        ("SYSTEMD_DIR", "/lib/systemd/system".to_string()),
        ("INIT_DIR", "/etc/init.d".to_string()),
        ("ROOT", String::new()),
    ];
    let killall = r.join("usr/bin/ferrok-killall.sh");
    assert_same(&read(&killall), &render("ferrok-killall.sh", &values), "the .deb's ferrok-killall.sh");
    assert_eq!(mode(&killall), 0o755);
    dpkg(&["-P", "ferrok"]);
    let left: Vec<String> = listing(r).into_iter().filter(|p| !p.starts_with("var/lib/dpkg")).collect();
    assert_eq!(left, ["var", "var/lib"], "the purge left files");
}

/// Runs the sysv script with `action` in the namespace: its exit code and output.
fn sysv(netns: &Netns, script: &Path, action: &str) -> (i32, String) {
    let out = netns.command(script).arg(action).stdin(std::process::Stdio::null()).output().expect("the sysv script");
    (out.status.code().unwrap_or(-1), text(&out))
}

/// On a host with neither systemd nor OpenRC the installer writes an LSB
/// init script (INSTALL_FERROK_INIT=sysv here, its choice there): its
/// `start` runs the relocated install up to a Ready node (start-stop-daemon
/// with a pid file, the log in var/log/ferrok.log), `status` says so, a
/// second `start` starts nothing more; `stop` leaves no process of the
/// install; the uninstaller leaves no file.
#[test]
fn sysv_script_starts_and_stops_the_service() {
    let netns = Netns::new();
    let root = root_with_binary();
    let before = listing(root.path());
    let node = node_name(&netns);
    let exec = server_exec(&netns);
    let env = [
        ("INSTALL_FERROK_SKIP_DOWNLOAD", "true"),
        ("INSTALL_FERROK_INIT", "sysv"),
        ("INSTALL_FERROK_SYMLINK", "skip"),
        ("INSTALL_FERROK_EXEC", exec.as_str()),
    ];
    let out = run_install(root.path(), &env, &[]);
    assert!(out.status.success(), "{}", text(&out));
    let bin = root.path().join("usr/local/bin");
    let _cleanup = Cleanup { netns: &netns, killall: bin.join("ferrok-killall.sh") };
    let script = root.path().join("etc/init.d/ferrok");
    assert!(read(&script).contains("### BEGIN INIT INFO"));
    let (code, said) = sysv(&netns, &script, "status");
    assert_eq!(code, 3, "status before start: {said}");

    let started = Instant::now();
    let (code, said) = sysv(&netns, &script, "start");
    assert_eq!(code, 0, "start: {said}");
    let kubeconfig = root.path().join("var/lib/ferrok/kubeconfig.yaml");
    let log = root.path().join("var/log/ferrok.log");
    let pid_file = root.path().join("var/run/ferrok.pid");
    let ready = "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}";
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if kubeconfig.exists() && kubectl(&netns, &kubeconfig, &["get", "node", &node, "-o", ready]).1.trim() == "True"
        {
            break;
        }
        let (code, said) = sysv(&netns, &script, "status");
        assert!(
            code == 0 && Instant::now() < deadline,
            "no Ready node ({said})\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("sysv start: {:.2} s to a Ready node", started.elapsed().as_secs_f64());
    let pid: u32 = read(&pid_file).trim().parse().expect("a pid in the pid file");
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).expect("the pid file's process");
    assert_eq!(exe, bin.join("ferrok"), "the pid file names ferrok itself");
    assert!(read(&log).contains("ferrok"), "the log is empty");
    let (code, said) = sysv(&netns, &script, "status");
    assert!(code == 0 && said.contains(&format!("running (pid {pid})")), "{said}");
    let (code, said) = sysv(&netns, &script, "start");
    assert!(code == 0 && said.contains("already running"), "{said}");
    assert_eq!(read(&pid_file).trim(), pid.to_string(), "a second start started another ferrok");

    let t = Instant::now();
    let (code, said) = sysv(&netns, &script, "stop");
    assert_eq!(code, 0, "stop: {said}");
    eprintln!("sysv stop: {:.2} s", t.elapsed().as_secs_f64());
    assert!(!pid_file.exists(), "the pid file is left");
    common::eventually_within("no process of the install", Duration::from_secs(30), || {
        processes_under(root.path()).is_empty()
    });
    let (code, said) = sysv(&netns, &script, "status");
    assert_eq!(code, 3, "status after stop: {said}");

    let out = Command::new(bin.join("ferrok-uninstall.sh")).output().expect("uninstall");
    assert!(out.status.success(), "{}", text(&out));
    let mut expected = before;
    expected.remove("usr/local/bin/ferrok");
    assert_eq!(listing(root.path()), expected, "the uninstaller left files");
}
