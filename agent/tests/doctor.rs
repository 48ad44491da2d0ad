//! `mockgpu-agent doctor` on a real node of its own (needs root and /dev/fuse): a running
//! `serve` with its NRI plugin registered with a mock runtime, a containerd configuration and a
//! slurm.conf, all below a temporary directory, in a private mount namespace. A healthy node
//! passes every check; then one thing at a time is broken, and exactly its check fails, with its
//! fix, and the exit status is 1. A rendered tree read as a real driver's files (no root needed)
//! gives real mode, in which the checks of the mock are skipped.

mod common;
// The mock NRI runtime of the plugin's own tests: it runs the handshake as containerd does.
#[path = "../../nri-plugin/tests/common/mod.rs"]
mod nri_runtime;

use std::ffi::OsStr;
use std::fs;
use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use common::{fixture, in_private_namespace, wait_for};
use mockgpu_agent::doctor::{Live, Node as _};
use nix::mount::MsFlags;
use nri_runtime::{Handshake, MockRuntime};
use serde_json::Value;

const CONTAINERD: &str = "version = 2\n\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  disable_connections = false\n";
const SLURM: &str = "ClusterName=test\nGresTypes=gpu\nNodeName=node-0 Gres=gpu:4\n";

/// The node's files, below one temporary directory.
struct Node {
    run: PathBuf,
    socket: PathBuf,
    containerd: PathBuf,
    slurm: PathBuf,
    procfs: PathBuf,
    sysfs: PathBuf,
}

impl Node {
    fn new(root: &Path) -> Node {
        let node = Node {
            run: root.join("run"),
            socket: root.join("nri.sock"),
            containerd: root.join("config.toml"),
            slurm: root.join("slurm.conf"),
            procfs: root.join("proc"),
            sysfs: fixture("two-socket"),
        };
        fs::create_dir(&node.procfs).unwrap();
        fs::write(node.procfs.join("devices"), common::HOST_DEVICES).unwrap();
        fs::write(&node.containerd, CONTAINERD).unwrap();
        fs::write(&node.slurm, SLURM).unwrap();
        node
    }

    /// `mockgpu-agent doctor --json` on this node: its exit code and `(name, status, message,
    /// fix)` per check.
    fn doctor(&self, health: SocketAddr) -> (Option<i32>, Vec<[String; 4]>) {
        let out = self.doctor_command(health).arg("--json").output().unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        let checks = stdout
            .lines()
            .map(|line| {
                let v: Value = serde_json::from_str(line).unwrap();
                ["name", "status", "message", "fix"].map(|k| match &v[k] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => panic!("{k}: {other} in {line}"),
                })
            })
            .collect();
        (out.status.code(), checks)
    }

    fn doctor_command(&self, health: SocketAddr) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"));
        command
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("HOME", &self.procfs);
        command.arg("doctor").args(
            [
                ("--dir", self.run.as_os_str()),
                ("--health", health.to_string().as_ref()),
                ("--nri-socket", self.socket.as_os_str()),
                ("--containerd-config", self.containerd.as_os_str()),
                ("--slurm-conf", self.slurm.as_os_str()),
                ("--procfs", self.procfs.as_os_str()),
                ("--sysfs", self.sysfs.as_os_str()),
            ]
            .iter()
            .flat_map(|(k, v)| [OsStr::new(k).to_os_string(), v.to_os_string()]),
        );
        command
    }
}

/// The `serve` process, killed when dropped; it logs into `log`.
struct Agent {
    child: Child,
    health: SocketAddr,
    log: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!(
                "agent log:\n{}",
                fs::read_to_string(&self.log).unwrap_or_default()
            );
        }
    }
}

impl Agent {
    fn start(node: &Node) -> Agent {
        let log = node.run.with_extension("log");
        let child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .arg("serve")
            // never report to a cluster that a developer's kubeconfig names
            .env("MOCKGPU_REPORT", "off")
            // The agent mounts by itself: a keeper would outlive the test (tests/handover.rs covers it).
            .env("MOCKGPU_KEEPER", "off")
            .args(["--node-name", "node-0", "--profile", "gb300"])
            .args(["--listen", "127.0.0.1:0"])
            .arg("--dir")
            .arg(&node.run)
            .arg("--nri-socket")
            .arg(&node.socket)
            .arg("--procfs")
            .arg(&node.procfs)
            .arg("--sysfs")
            .arg(&node.sysfs)
            .env("RUST_LOG", "info")
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut health = None;
        wait_for("the health endpoint's address", || {
            let text = fs::read_to_string(&log).unwrap_or_default();
            health = text
                .split_once("health endpoint listening addr=")
                // Only a whole line: a port cut short would parse too.
                .and_then(|(_, rest)| rest.split_once('\n'))
                .and_then(|(line, _)| line.split_whitespace().next()?.parse().ok());
            health.is_some()
        });
        Agent {
            child,
            health: health.unwrap(),
            log,
        }
    }
}

const NAMES: [&str; 13] = [
    "mode",
    "agent",
    "fuse",
    "shim",
    "nvml",
    "propagation",
    "nri-socket",
    "nri-config",
    "nri-plugin",
    "device-plugin",
    "allocatable",
    "gpunode",
    "slurm",
];

/// Skipped on every node here: the agent runs without --device-plugin, and no API server is
/// configured (the doctor runs without KUBECONFIG and with a HOME of its own).
const CLUSTER_SKIPPED: [&str; 3] = ["device-plugin", "allocatable", "gpunode"];

/// Asserts that the doctor exits 1 and that exactly the checks in `failing` fail, each with its
/// message and fix fragments; every other check is ok, except `skipped`.
fn expect(
    node: &Node,
    health: SocketAddr,
    failing: &[(&str, &str, &str)],
    skipped: &[&str],
) -> Vec<[String; 4]> {
    let (code, checks) = node.doctor(health);
    let names: Vec<&str> = checks.iter().map(|c| c[0].as_str()).collect();
    assert_eq!(names, NAMES, "{checks:?}");
    for [name, status, message, fix] in &checks {
        match failing.iter().find(|(n, ..)| n == name) {
            Some((_, want_message, want_fix)) => {
                assert_eq!(status, "fail", "{name}: {message}");
                assert!(message.contains(want_message), "{name}: {message}");
                assert!(fix.contains(want_fix), "{name}: {fix}");
            }
            None if skipped.contains(&name.as_str())
                || CLUSTER_SKIPPED.contains(&name.as_str()) =>
            {
                assert_eq!(status, "skip", "{message}")
            }
            None => assert_eq!(status, "ok", "{name}: {message}; {fix}"),
        }
    }
    let want = if failing.is_empty() { 0 } else { 1 };
    assert_eq!(code, Some(want), "{checks:?}");
    checks
}

fn set_propagation(dir: &Path, flags: MsFlags) {
    nix::mount::mount(None::<&str>, dir, None::<&str>, flags, None::<&str>).unwrap();
}

#[test]
fn doctor_names_exactly_what_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let node = Node::new(dir.path());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let runtime = {
            let _in_runtime = rt.enter();
            MockRuntime::bind(&node.socket)
        };
        let mut agent = Agent::start(&node);
        let _plugin = rt.block_on(runtime.accept(&Handshake::default()));
        let health = agent.health;
        wait_for("the agent's readiness", || {
            Live.http_get(health, "/readyz")
                .is_ok_and(|r| r.status == 200)
        });

        // Healthy: every line ok (or skipped), exit status 0; the words as a person reads them.
        let out = node.doctor_command(health).output().unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(out.status.success(), "{text}");
        assert_eq!(text.lines().count(), NAMES.len(), "{text}");
        for (line, name) in text.lines().zip(NAMES) {
            let status = if CLUSTER_SKIPPED.contains(&name) {
                "skip"
            } else {
                "ok"
            };
            assert!(line.starts_with(&format!("{status:<4} {name}: ")), "{text}");
        }
        let checks = expect(&node, health, &[], &[]);
        let mnt = node.run.join("fs");
        assert!(
            checks[2][2].starts_with(&format!(
                "driver tree mounted at {} and answering (NVRM version: NVIDIA ",
                mnt.display()
            )),
            "{checks:?}"
        );

        // slurm.conf without GresTypes.
        fs::write(&node.slurm, "ClusterName=test\n").unwrap();
        expect(
            &node,
            health,
            &[("slurm", "has no GresTypes", "add GresTypes=gpu")],
            &[],
        );
        fs::write(&node.slurm, SLURM).unwrap();

        // NRI disabled in containerd's configuration.
        fs::write(
            &node.containerd,
            CONTAINERD.replace("disable = false", "disable = true"),
        )
        .unwrap();
        expect(
            &node,
            health,
            &[(
                "nri-config",
                "NRI is disabled in",
                "set disable = false in [plugins.\"io.containerd.nri.v1.nri\"]",
            )],
            &[],
        );
        fs::write(&node.containerd, CONTAINERD).unwrap();

        // The NRI socket gone (the connected plugin stays connected).
        let moved = node.socket.with_extension("moved");
        fs::rename(&node.socket, &moved).unwrap();
        expect(
            &node,
            health,
            &[("nri-socket", "no NRI socket at", "restart containerd")],
            &[],
        );
        fs::rename(&moved, &node.socket).unwrap();

        // The agent's directory no longer a shared mount.
        set_propagation(&node.run, MsFlags::MS_PRIVATE);
        expect(
            &node,
            health,
            &[("propagation", "is a private mount", "--make-shared")],
            &[],
        );
        set_propagation(&node.run, MsFlags::MS_SHARED);

        // The shim removed, then replaced by something the loader refuses.
        let shim = node.run.join("lib/libmockfs.so");
        let library = fs::read(&shim).unwrap();
        fs::remove_file(&shim).unwrap();
        expect(
            &node,
            health,
            &[("shim", "is missing", "restart the agent")],
            &[],
        );
        fs::write(&shim, "not a library\n").unwrap();
        expect(
            &node,
            health,
            &[("shim", "cannot be preloaded", "glibc 2.17 or later")],
            &[],
        );
        fs::write(&shim, library).unwrap();
        expect(&node, health, &[], &[]);

        // nvidia-smi removed, then the NVML replaced by something the loader refuses.
        let smi = node.run.join("bin/nvidia-smi");
        let program = fs::read(&smi).unwrap();
        fs::remove_file(&smi).unwrap();
        expect(
            &node,
            health,
            &[("nvml", "is missing", "restart the agent")],
            &[],
        );
        fs::write(&smi, program).unwrap();
        fs::set_permissions(&smi, fs::Permissions::from_mode(0o755)).unwrap();
        let nvml = node.run.join("lib/libnvidia-ml.so.1");
        let library = fs::read(&nvml).unwrap();
        fs::write(&nvml, "not a library\n").unwrap();
        expect(
            &node,
            health,
            &[("nvml", "libnvidia-ml.so.1 fails", "glibc 2.17 or later")],
            &[],
        );
        fs::write(&nvml, library).unwrap();
        expect(&node, health, &[], &[]);

        // The agent killed: its mount is left dead, its endpoint gone.
        agent.child.kill().unwrap();
        agent.child.wait().unwrap();
        expect(
            &node,
            health,
            &[
                ("agent", "no agent answers at", "start the agent"),
                ("fuse", "is left by a dead agent", "restart the agent"),
            ],
            &["nri-plugin", "nvml"],
        );
    })
}

#[test]
fn a_real_gpu_node_is_reported_and_not_checked_as_a_mock() {
    // The h100 tree of a fixed host, written as files, stands in for a loaded driver's.
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    mockgpu_agent::output::write_tree(&common::fixed_tree("h100").1, &real).unwrap();
    let node = Node {
        procfs: real.join("proc"),
        sysfs: real.join("sys"),
        ..Node::new(dir.path())
    };
    // Nothing listens on port 1: the agent check fails; the plugin's is skipped with the rest.
    let (code, checks) = node.doctor("127.0.0.1:1".parse().unwrap());
    assert_eq!(code, Some(1), "{checks:?}");
    let status: Vec<(&str, &str)> = checks
        .iter()
        .map(|c| (c[0].as_str(), c[1].as_str()))
        .collect();
    assert_eq!(
        status,
        [
            ("mode", "ok"),
            ("agent", "fail"),
            ("fuse", "skip"),
            ("shim", "skip"),
            ("nvml", "skip"),
            ("propagation", "skip"),
            ("nri-socket", "skip"),
            ("nri-config", "skip"),
            ("nri-plugin", "skip"),
            ("device-plugin", "skip"),
            ("allocatable", "skip"),
            ("gpunode", "skip"),
            ("slurm", "ok"),
        ]
    );
    assert_eq!(
        checks[0][2],
        "real mode: the NVIDIA driver lists 8 GPUs (NVIDIA H100 80GB HBM3); the agent mocks nothing"
    );
}

#[test]
fn a_relative_directory_is_refused_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["doctor", "--dir", "run/mockgpu"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(out.stdout, b"", "no check is made");
    assert_eq!(
        String::from_utf8(out.stderr).unwrap(),
        "mockgpu-agent: host directory \"run/mockgpu\" must be an absolute path other than /\n"
    );
}
