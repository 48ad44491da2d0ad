//! Each check's logic against a fake node: a healthy one, then one thing broken at a time.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt as _;
use std::process::ExitStatus;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use mockgpu_api::gpunode::{GpuNode, GpuNodeSpec, GpuNodeStatus, Mode};

use super::*;

const HEALTH: &str = "127.0.0.1:9464";
const METRICS: &str = "mockgpu_gpus 4\nmockgpu_nri_connected 1\nmockgpu_nri_ready 1\nmockgpu_nri_registrations_total 1\n";
/// The device plugin's part of the agent's metrics.
const DP_METRICS: &str =
    "mockgpu_device_plugin_registrations_total 1\nmockgpu_device_plugin_healthy_gpus 4\n";
const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
const DP_SOCKET: &str = "/var/lib/kubelet/device-plugins/mockgpu-nvidia.com_gpu.sock";

/// A node that answers from tables; what is not in them does not exist (`ENOENT`).
struct FakeNode {
    mountinfo: String,
    /// Lookups that succeed, or fail with the given errno.
    lookups: BTreeMap<PathBuf, Option<i32>>,
    files: BTreeMap<PathBuf, Vec<u8>>,
    sockets: Vec<PathBuf>,
    preload: Ran,
    /// What `nvidia-smi -L` does, or the errno its start fails with.
    smi: Result<Ran, i32>,
    /// The names in each listed directory.
    dirs: BTreeMap<PathBuf, Vec<String>>,
    http: BTreeMap<&'static str, HttpReply>,
    real: RealDriver,
    cluster: Result<ClusterView, String>,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Node for FakeNode {
    fn mountinfo(&self) -> io::Result<String> {
        Ok(self.mountinfo.clone())
    }

    fn lookup(&self, path: &Path) -> io::Result<()> {
        match self.lookups.get(path) {
            Some(None) => Ok(()),
            Some(Some(e)) => Err(errno(*e)),
            None => Err(errno(libc::ENOENT)),
        }
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        self.files
            .get(path)
            .cloned()
            .ok_or_else(|| errno(libc::ENOENT))
    }

    fn is_socket(&self, path: &Path) -> io::Result<bool> {
        if self.sockets.iter().any(|s| s == path) {
            Ok(true)
        } else if self.files.contains_key(path) {
            Ok(false)
        } else {
            Err(errno(libc::ENOENT))
        }
    }

    fn preload(&self, _shim: &Path, _root: &Path) -> io::Result<Ran> {
        Ok(self.preload.clone())
    }

    fn nvidia_smi(&self, nvidia_smi: &Path, lib_dir: &Path, root: &Path) -> io::Result<Ran> {
        assert_eq!(
            (nvidia_smi, lib_dir, root),
            (
                Path::new("/run/mockgpu/bin/nvidia-smi"),
                Path::new("/run/mockgpu/lib"),
                Path::new("/run/mockgpu/fs")
            )
        );
        self.smi.clone().map_err(errno)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.dirs
            .get(dir)
            .cloned()
            .ok_or_else(|| errno(libc::ENOENT))
    }

    fn glibc(&self) -> Option<String> {
        Some("2.41".into())
    }

    fn http_get(&self, addr: SocketAddr, path: &str) -> io::Result<HttpReply> {
        if addr.to_string() != HEALTH {
            return Err(errno(libc::ECONNREFUSED));
        }
        self.http
            .get(path)
            .cloned()
            .ok_or_else(|| errno(libc::ECONNREFUSED))
    }

    fn real_driver(&self, _procfs: &Path, _sysfs: &Path) -> RealDriver {
        self.real.clone()
    }

    fn cluster(&self, credentials: &Credentials, node: &str) -> Result<ClusterView, String> {
        assert_eq!((credentials, node), (&Credentials::Infer, "node-0"));
        self.cluster.clone()
    }
}

fn opts() -> Options {
    Options {
        layout: Layout::default(),
        health: HEALTH.parse().unwrap(),
        nri_socket: None,
        containerd_config: "/etc/containerd/config.toml".into(),
        slurm_conf: "/etc/slurm/slurm.conf".into(),
        procfs: "/proc".into(),
        sysfs: "/sys".into(),
        kubelet_dir: "/var/lib/kubelet".into(),
        resource_name: "nvidia.com/gpu".into(),
        node_name: "node-0".into(),
        heartbeat: Duration::from_secs(30),
        credentials: Some(Credentials::Infer),
    }
}

const NOW: i64 = 1_800_000_000;

/// A GpuNode reported `age` seconds before [`NOW`], with `Ready` `ready`.
fn reported(age: i64, ready: &str) -> GpuNode {
    let mut g = GpuNode::new(
        "node-0",
        GpuNodeSpec::new("node-0", Mode::Mock, "gb300", Vec::new()),
    );
    let at = Time(Timestamp::from_second(NOW - age).unwrap());
    g.status = Some(GpuNodeStatus {
        last_heartbeat: Some(at.clone()),
        held_gpus: 2,
        conditions: vec![Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: "TreeMounted".into(),
            message: "mounted".into(),
            last_transition_time: at,
            observed_generation: None,
        }],
        ..Default::default()
    });
    g
}

fn view(allocatable: Option<&str>, gpunode: Option<GpuNode>) -> ClusterView {
    ClusterView {
        allocatable: Some(
            allocatable
                .map(|n| ("nvidia.com/gpu".to_string(), n.to_string()))
                .into_iter()
                .chain([("cpu".to_string(), "8".to_string())])
                .collect(),
        ),
        gpunode,
        now: Timestamp::from_second(NOW).unwrap(),
    }
}

const SMI: &str = "/run/mockgpu/bin/nvidia-smi";
const GPUS_DIR: &str = "/run/mockgpu/fs/proc/driver/nvidia/gpus";

const MOUNTINFO: &str = "22 1 0:21 / / rw - ext4 /dev/root rw\n\
    30 22 0:30 /run/mockgpu /run/mockgpu rw shared:7 - tmpfs tmpfs rw\n\
    31 30 0:31 / /run/mockgpu/fs ro shared:8 - fuse.mockgpu mockgpu ro\n";

fn healthy() -> FakeNode {
    let file = |p: &str, c: &str| (PathBuf::from(p), c.as_bytes().to_vec());
    let reply = |body: &str| HttpReply {
        status: 200,
        body: body.into(),
    };
    FakeNode {
        mountinfo: MOUNTINFO.into(),
        lookups: [
            (PathBuf::from("/run/mockgpu/lib/libmockfs.so"), None),
            (PathBuf::from(SMI), None),
        ]
        .into(),
        files: [
            file(
                "/run/mockgpu/fs/proc/driver/nvidia/version",
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\nGCC version: gcc\n",
            ),
            file("/run/mockgpu/ld.so.preload", "/run/mockgpu/lib/libmockfs.so\n"),
            file(
                "/etc/containerd/config.toml",
                "version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = false\n  socket_path = \"/var/run/nri/nri.sock\"\n",
            ),
            file("/etc/slurm/slurm.conf", "ClusterName=c\nGresTypes=gpu\n"),
        ]
        .into(),
        sockets: vec![
            "/var/run/nri/nri.sock".into(),
            KUBELET_SOCKET.into(),
            DP_SOCKET.into(),
        ],
        preload: Ran {
            status: ExitStatus::from_raw(0),
            stdout: String::new(),
            stderr: "mockfs: mock root /run/mockgpu/fs\nmockfs: prefix /proc/driver/nvidia\n".into(),
        },
        smi: Ok(Ran {
            status: ExitStatus::from_raw(0),
            stdout: (0..4)
                .map(|i| format!("GPU {i}: NVIDIA GB300 (UUID: GPU-{i}0000000-0000-0000-0000-000000000000)\n"))
                .collect(),
            stderr: String::new(),
        }),
        dirs: [(
            PathBuf::from(GPUS_DIR),
            (0..4).map(|i| format!("0000:0{i}:00.0")).collect(),
        )]
        .into(),
        http: [
            ("/healthz", reply("ok\n")),
            ("/metrics", reply(&format!("{METRICS}{DP_METRICS}"))),
        ]
        .into(),
        real: RealDriver::Absent,
        cluster: Ok(view(Some("4"), Some(reported(5, "True")))),
    }
}

/// The check `name` on `node`, asserted to have `status` and a message containing `fragment`.
fn check(node: &FakeNode, name: &str, status: Status, fragment: &str) -> Check {
    let c = run(node, &opts())
        .into_iter()
        .find(|c| c.name == name)
        .unwrap();
    assert_eq!(c.status, status, "{c}");
    assert!(c.message.contains(fragment), "{c}");
    c
}

/// Asserts that `name` fails, with `message` and `fix` fragments, and that every other check
/// keeps the healthy node's outcome, or is skipped for it ("(see NAME)").
fn only_fails(node: &FakeNode, name: &str, message: &str, fix: &str) -> Check {
    let checks = run(node, &opts());
    let healthy = run(&healthy(), &opts());
    let deferred = format!("(see {name})");
    for (c, h) in checks.iter().zip(&healthy) {
        if c.name != name && !(c.status == Status::Skip && c.message.contains(&deferred)) {
            assert_eq!(c.status, h.status, "{c}");
        }
    }
    let c = checks.into_iter().find(|c| c.name == name).unwrap();
    assert_eq!(c.status, Status::Fail, "{c}");
    assert!(c.message.contains(message), "{c}");
    assert!(c.fix.as_deref().unwrap().contains(fix), "{c}");
    c
}

#[test]
fn a_healthy_node_passes_every_check() {
    let checks = run(&healthy(), &opts());
    assert_eq!(checks.len(), 13);
    for c in &checks {
        assert_eq!(c.status, Status::Ok, "{c}");
        assert_eq!(c.fix, None);
    }
    assert!(!failed(&checks));
    assert_eq!(
        checks[2].to_string(),
        "ok   fuse: driver tree mounted at /run/mockgpu/fs and answering (NVRM version: NVIDIA \
         UNIX Open Kernel Module for x86_64 580.95.05 Release Build)"
    );
    assert_eq!(
        checks[3].message,
        "shim installed at /run/mockgpu/lib/libmockfs.so and loadable by this node's glibc 2.41"
    );
    assert_eq!(
        checks[4].message,
        "/run/mockgpu/bin/nvidia-smi -L lists the 4 GPUs of the served tree through \
         /run/mockgpu/lib/libnvidia-ml.so.1"
    );
    assert_eq!(
        checks[5].message,
        "/run/mockgpu is a shared mount (peer group 7): mounts inside it reach containers"
    );
}

#[test]
fn one_line_and_one_json_object_per_check() {
    let c = Check::fail("slurm", "no GresTypes", "add GresTypes=gpu");
    assert_eq!(
        c.to_string(),
        "FAIL slurm: no GresTypes; fix: add GresTypes=gpu"
    );
    assert_eq!(
        serde_json::to_string(&c).unwrap(),
        r#"{"name":"slurm","status":"fail","message":"no GresTypes","fix":"add GresTypes=gpu"}"#
    );
    let s = Check::skip("slurm", "none");
    assert_eq!(
        serde_json::to_string(&s).unwrap(),
        r#"{"name":"slurm","status":"skip","message":"none","fix":null}"#
    );
    assert!(failed(&[s.clone(), c]));
    assert!(!failed(&[s]));
}

#[test]
fn a_dead_agent_leaves_a_mount_that_answers_enotconn() {
    let mut node = healthy();
    node.lookups.insert(
        "/run/mockgpu/fs/.mockgpu-liveness-probe".into(),
        Some(libc::ENOTCONN),
    );
    let c = only_fails(
        &node,
        "fuse",
        "is left by a dead agent",
        "restart the agent",
    );
    assert!(c.message.contains("not connected"), "{c}");
}

#[test]
fn fuse_fails_unmounted_or_foreign_or_unreadable() {
    let mut node = healthy();
    node.mountinfo = MOUNTINFO.lines().take(2).collect::<Vec<_>>().join("\n");
    only_fails(
        &node,
        "fuse",
        "nothing is mounted at /run/mockgpu/fs",
        "start the agent with --dir /run/mockgpu",
    );
    let mut node = healthy();
    node.mountinfo = MOUNTINFO.replace("fuse.mockgpu", "tmpfs");
    only_fails(
        &node,
        "fuse",
        "is a tmpfs mount, not the agent's FUSE tree",
        "umount",
    );
    let mut node = healthy();
    node.files
        .remove(Path::new("/run/mockgpu/fs/proc/driver/nvidia/version"));
    only_fails(
        &node,
        "fuse",
        "cannot read /run/mockgpu/fs/proc/driver/nvidia/version",
        "restart",
    );
}

#[test]
fn a_missing_shim_or_preload_file_fails() {
    let mut node = healthy();
    node.lookups
        .remove(Path::new("/run/mockgpu/lib/libmockfs.so"));
    only_fails(
        &node,
        "shim",
        "the shim /run/mockgpu/lib/libmockfs.so is missing",
        "restart the agent",
    );
    let mut node = healthy();
    node.files.insert(
        "/run/mockgpu/ld.so.preload".into(),
        b"/opt/m/lib/libmockfs.so\n".to_vec(),
    );
    only_fails(
        &node,
        "shim",
        "names \"/opt/m/lib/libmockfs.so\", not /run/mockgpu/lib/libmockfs.so",
        "--container-dir /run/mockgpu",
    );
}

#[test]
fn a_shim_the_loader_refuses_fails_with_its_words() {
    let mut node = healthy();
    node.preload = Ran {
        status: ExitStatus::from_raw(127 << 8),
        stdout: String::new(),
        stderr: "/bin/true: /lib/x86_64-linux-gnu/libc.so.6: version `GLIBC_2.99' not found (required by /run/mockgpu/lib/libmockfs.so)\n".into(),
    };
    only_fails(
        &node,
        "shim",
        "version `GLIBC_2.99' not found",
        "glibc 2.17 or later",
    );
    // ld.so ignores an unloadable preload and runs the program anyway.
    node.preload = Ran {
        status: ExitStatus::from_raw(0),
        stdout: String::new(),
        stderr: "ERROR: ld.so: object '/run/mockgpu/lib/libmockfs.so' from LD_PRELOAD cannot be preloaded (invalid ELF header): ignored.\n".into(),
    };
    only_fails(
        &node,
        "shim",
        "cannot be preloaded (invalid ELF header)",
        "architecture",
    );
    node.preload.stderr.clear();
    only_fails(
        &node,
        "shim",
        "the shim left no sign of being loaded",
        "glibc",
    );
}

#[test]
fn nvidia_smi_must_list_the_served_gpus_through_the_nvml() {
    let mut node = healthy();
    node.lookups.remove(Path::new(SMI));
    only_fails(
        &node,
        "nvml",
        "nvidia-smi /run/mockgpu/bin/nvidia-smi is missing",
        "restart the agent: it installs the NVML and nvidia-smi",
    );
    let mut node = healthy();
    node.smi = Err(libc::EACCES);
    only_fails(
        &node,
        "nvml",
        "cannot run /run/mockgpu/bin/nvidia-smi -L: Permission denied",
        "restart the agent: it installs the NVML and nvidia-smi",
    );
    // what nvidia-smi says when the loader does not find the library
    let mut node = healthy();
    let failed = |stdout: &str, stderr: &str, status: i32| {
        Ok(Ran {
            status: ExitStatus::from_raw(status),
            stdout: stdout.into(),
            stderr: stderr.into(),
        })
    };
    node.smi = failed(
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
        "",
        9 << 8,
    );
    only_fails(
        &node,
        "nvml",
        "-L with /run/mockgpu/lib/libnvidia-ml.so.1 fails: NVIDIA-SMI has failed",
        "glibc 2.17 or later",
    );
    node.smi = failed("", "nvidia-smi: version `GLIBC_2.99' not found\n", 1 << 8);
    only_fails(
        &node,
        "nvml",
        "fails: nvidia-smi: version `GLIBC_2.99'",
        "architecture",
    );
    // nothing said: the exit status, or the signal, is all there is
    node.smi = failed("", "\n", 127 << 8);
    only_fails(
        &node,
        "nvml",
        "fails: no output, exit status: 127",
        "architecture",
    );
    node.smi = failed("", "", libc::SIGSEGV);
    only_fails(
        &node,
        "nvml",
        "fails: no output, signal: 11 (SIGSEGV)",
        "architecture",
    );
    // a library that disagrees with the tree
    let mut node = healthy();
    let smi = node.smi.as_mut().unwrap();
    smi.stdout = smi
        .stdout
        .lines()
        .take(2)
        .map(|l| format!("{l}\n"))
        .collect();
    only_fails(
        &node,
        "nvml",
        "lists 2 GPUs through /run/mockgpu/lib/libnvidia-ml.so.1, the served tree 4",
        "restart the agent",
    );
    let mut node = healthy();
    node.dirs.clear();
    only_fails(
        &node,
        "nvml",
        "cannot list /run/mockgpu/fs/proc/driver/nvidia/gpus",
        "restart the agent",
    );
    // no tree to compare with: the fuse check says why
    let mut node = healthy();
    node.files
        .remove(Path::new("/run/mockgpu/fs/proc/driver/nvidia/version"));
    check(&node, "nvml", Status::Skip, "(see fuse)");
    let mut node = healthy();
    node.real = RealDriver::Gpus(vec!["NVIDIA H100".into()]);
    check(&node, "nvml", Status::Skip, REAL_NODE);
}

#[test]
fn propagation_must_be_shared() {
    let mut node = healthy();
    node.mountinfo = MOUNTINFO.replace("rw shared:7", "rw");
    only_fails(
        &node,
        "propagation",
        "/run/mockgpu is a private mount",
        "--make-shared",
    );
    node.mountinfo = MOUNTINFO.replace("rw shared:7", "rw master:3");
    only_fails(
        &node,
        "propagation",
        "/run/mockgpu is a slave mount",
        "--make-shared",
    );
    // A shared mount stacked on a private one: the topmost counts.
    node.mountinfo = format!("{MOUNTINFO}40 30 0:40 / /run/mockgpu rw - tmpfs t rw\n");
    only_fails(&node, "propagation", "is a private mount", "--make-shared");
    node.mountinfo = MOUNTINFO.lines().next().unwrap().into();
    let c = check(
        &node,
        "propagation",
        Status::Fail,
        "/run/mockgpu is not a mount point",
    );
    assert!(
        c.fix
            .unwrap()
            .contains("mount --bind /run/mockgpu /run/mockgpu")
    );
}

#[test]
fn mountinfo_names_are_unescaped() {
    let info = "30 22 0:30 / /run/mock\\040gpu rw shared:9 - tmpfs t rw\n";
    let e = mount_at(info, Path::new("/run/mock gpu")).unwrap();
    assert_eq!(e.fstype, "tmpfs");
    assert_eq!(e.optional, ["shared:9"]);
    assert!(mount_at(info, Path::new("/run/mock")).is_none());
    assert!(mount_at("garbage\n", Path::new("/")).is_none());
}

#[test]
fn the_nri_socket_must_exist_and_be_a_socket() {
    let mut node = healthy();
    node.sockets
        .retain(|s| s != Path::new("/var/run/nri/nri.sock"));
    only_fails(
        &node,
        "nri-socket",
        "no NRI socket at /var/run/nri/nri.sock",
        "enable NRI",
    );
    node.files.insert("/var/run/nri/nri.sock".into(), vec![]);
    only_fails(&node, "nri-socket", "is not a socket", "restart containerd");
}

#[test]
fn the_socket_checked_is_the_option_then_containerds_then_the_default() {
    let mut node = healthy();
    node.sockets = vec!["/x/nri.sock".into()];
    let mut o = opts();
    o.nri_socket = Some("/x/nri.sock".into());
    let c = run(&node, &o)
        .into_iter()
        .find(|c| c.name == "nri-socket")
        .unwrap();
    assert_eq!(c.status, Status::Ok, "{c}");
    node.files.insert(
        "/etc/containerd/config.toml".into(),
        b"version = 3\n[plugins.'io.containerd.nri.v1.nri']\nsocket_path = '/x/nri.sock'\n"
            .to_vec(),
    );
    check(
        &node,
        "nri-socket",
        Status::Ok,
        "the runtime's NRI socket is at /x/nri.sock",
    );
    node.files.remove(Path::new("/etc/containerd/config.toml"));
    check(
        &node,
        "nri-socket",
        Status::Fail,
        "no NRI socket at /var/run/nri/nri.sock: No such file or directory (os error 2)",
    );
}

fn with_config(config: &str) -> FakeNode {
    let mut node = healthy();
    node.files.insert(
        "/etc/containerd/config.toml".into(),
        config.as_bytes().to_vec(),
    );
    node
}

#[test]
fn nri_disabled_in_containerds_configuration_fails() {
    let node = with_config("version = 2\n[plugins.\"io.containerd.nri.v1.nri\"]\ndisable = true\n");
    only_fails(
        &node,
        "nri-config",
        "NRI is disabled in /etc/containerd/config.toml (disable = true in [plugins.\"io.containerd.nri.v1.nri\"])",
        "set disable = false in [plugins.\"io.containerd.nri.v1.nri\"]",
    );
    let node = with_config("version = 3\n[plugins.'io.containerd.nri.v1.nri']\ndisable = true\n");
    only_fails(
        &node,
        "nri-config",
        "disable = true in [plugins.'io.containerd.nri.v1.nri']",
        "restart containerd",
    );
    let node = with_config(
        "version = 3\n[plugins.'io.containerd.nri.v1.nri']\ndisable_connections = true\n",
    );
    only_fails(
        &node,
        "nri-config",
        "lets no external plugin connect",
        "disable_connections = false",
    );
    let node = with_config("[plugins.nri]\ndisable = true\n");
    only_fails(
        &node,
        "nri-config",
        "disable = true in [plugins.nri]",
        "disable = false",
    );
}

#[test]
fn nri_left_at_containerds_default_depends_on_the_version() {
    // Version 3 is containerd 2.x: NRI on by default.
    let node = with_config("version = 3\n");
    check(
        &node,
        "nri-config",
        Status::Ok,
        "(version 3, containerd 2.x) leaves NRI at its default: on",
    );
    // Version 2 is read by 1.7 (off by default) and 2.x (on): the socket tells.
    let mut node = with_config("version = 2\n[plugins.\"io.containerd.grpc.v1.cri\"]\n");
    check(&node, "nri-config", Status::Ok, "its NRI socket exists");
    node.sockets.clear();
    check(
        &node,
        "nri-config",
        Status::Fail,
        "containerd 1.7 leaves it off by default",
    );
}

#[test]
fn a_broken_or_absent_containerd_configuration() {
    let node = with_config("version = 2\n[plugins\n");
    let c = only_fails(
        &node,
        "nri-config",
        "cannot parse /etc/containerd/config.toml: ",
        "correct the file",
    );
    assert!(!c.message.contains('\n'), "one line: {c}");
    let node = with_config("version = 2\nplugins = { \"io.containerd.nri.v1.nri\" = 1 }\n");
    only_fails(
        &node,
        "nri-config",
        "plugins.\"io.containerd.nri.v1.nri\" is not a table",
        "correct",
    );
    let mut node = healthy();
    node.files.remove(Path::new("/etc/containerd/config.toml"));
    check(
        &node,
        "nri-config",
        Status::Skip,
        "no containerd configuration readable at /etc/containerd/config.toml: No such file",
    );
}

#[test]
fn the_agents_nri_plugin_must_be_registered() {
    let mut node = healthy();
    let metrics = |node: &mut FakeNode, body: &str| {
        node.http.insert(
            "/metrics",
            HttpReply {
                status: 200,
                body: format!("{body}{DP_METRICS}"),
            },
        );
    };
    metrics(&mut node, "mockgpu_gpus 4\n");
    only_fails(&node, "nri-plugin", "runs without its NRI plugin", "--nri");
    metrics(&mut node, "mockgpu_nri_connected 0\nmockgpu_nri_ready 0\n");
    only_fails(
        &node,
        "nri-plugin",
        "is not connected to the runtime",
        "--nri-socket",
    );
    metrics(&mut node, "mockgpu_nri_connected 1\nmockgpu_nri_ready 0\n");
    only_fails(&node, "nri-plugin", "connected but not registered", "logs");
    // No agent: the agent check fails and this one is not made.
    node.http.clear();
    let checks = run(&node, &opts());
    let status: Vec<_> = checks
        .iter()
        .map(|c| (c.name, c.status))
        .filter(|(_, s)| *s != Status::Ok)
        .collect();
    assert_eq!(
        status,
        [
            ("agent", Status::Fail),
            ("nri-plugin", Status::Skip),
            ("device-plugin", Status::Skip),
            ("allocatable", Status::Skip),
        ]
    );
    assert!(
        checks[1]
            .message
            .starts_with("no agent answers at 127.0.0.1:9464: "),
        "{}",
        checks[1]
    );
}

#[test]
fn slurm_needs_gres_types_gpu_when_a_slurm_conf_is_readable() {
    let mut node = healthy();
    let conf = |node: &mut FakeNode, text: &str| {
        node.files
            .insert("/etc/slurm/slurm.conf".into(), text.as_bytes().to_vec());
    };
    conf(&mut node, "ClusterName=c\n#GresTypes=gpu\n");
    only_fails(
        &node,
        "slurm",
        "has no GresTypes",
        "add GresTypes=gpu to /etc/slurm/slurm.conf",
    );
    conf(&mut node, "gres_types=gpu\ngrestypes=mps\n");
    only_fails(
        &node,
        "slurm",
        "sets GresTypes=mps without gpu",
        "scontrol reconfigure",
    );
    conf(
        &mut node,
        "NodeName=n CPUs=8  GRESTYPES=mps,gpu # comment\n",
    );
    check(
        &node,
        "slurm",
        Status::Ok,
        "/etc/slurm/slurm.conf sets GresTypes=mps,gpu",
    );
    node.files.remove(Path::new("/etc/slurm/slurm.conf"));
    check(
        &node,
        "slurm",
        Status::Skip,
        "no slurm.conf readable at /etc/slurm/slurm.conf: No such file",
    );
}

#[test]
fn a_real_gpu_node_skips_what_concerns_the_mock() {
    let mut node = healthy();
    node.real = RealDriver::Gpus(vec!["NVIDIA H200".into(); 8]);
    node.mountinfo.clear();
    node.http.remove("/metrics");
    let checks = run(&node, &opts());
    let status: Vec<_> = checks.iter().map(|c| (c.name, c.status)).collect();
    assert_eq!(
        status,
        [
            ("mode", Status::Ok),
            ("agent", Status::Ok),
            ("fuse", Status::Skip),
            ("shim", Status::Skip),
            ("nvml", Status::Skip),
            ("propagation", Status::Skip),
            ("nri-socket", Status::Skip),
            ("nri-config", Status::Skip),
            ("nri-plugin", Status::Skip),
            ("device-plugin", Status::Skip),
            ("allocatable", Status::Skip),
            ("gpunode", Status::Ok),
            ("slurm", Status::Ok),
        ]
    );
    assert_eq!(
        checks[0].message,
        "real mode: the NVIDIA driver lists 8 GPUs (NVIDIA H200); the agent mocks nothing"
    );
    assert_eq!(checks[2].message, REAL_NODE);
    node.real = RealDriver::Unreadable("cannot read /proc/driver/nvidia/gpus/x: EACCES".into());
    check(
        &node,
        "mode",
        Status::Fail,
        "its files cannot be read: cannot read /proc/driver/nvidia/gpus/x: EACCES",
    );
}

#[test]
fn a_doctor_under_the_shim_checks_the_mock() {
    let mut node = healthy();
    node.real = RealDriver::UnderShim;
    let checks = run(&node, &opts());
    assert!(checks.iter().all(|c| c.status == Status::Ok), "{checks:?}");
    // its /run/mockgpu is the NRI plugin's mount: a slave of the host's shared one
    node.mountinfo = node.mountinfo.replace("shared:", "master:");
    check(
        &node,
        "propagation",
        Status::Ok,
        "is the injected slave of peer group",
    );
    node.real = RealDriver::Absent;
    check(&node, "propagation", Status::Fail, "is a slave mount");
    node.real = RealDriver::UnderShim;
    assert!(
        checks[0]
            .message
            .starts_with("mock mode: this doctor runs under mockgpu's shim")
    );
    // the live node tells from its own memory map, whatever the driver files say
    let procfs = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(procfs.path().join("self")).unwrap();
    std::fs::create_dir_all(procfs.path().join("driver/nvidia/gpus/0000:01:00.0")).unwrap();
    let maps = "7f00-7f01 r-xp 00000000 00:1f 12 /run/mockgpu/lib/libmockfs.so\n";
    std::fs::write(procfs.path().join("self/maps"), maps).unwrap();
    assert_eq!(
        node::Live.real_driver(procfs.path(), procfs.path()),
        RealDriver::UnderShim
    );
    std::fs::write(
        procfs.path().join("self/maps"),
        "7f00-7f01 r-xp 0 00:1f 12 /usr/lib/libc.so.6\n",
    )
    .unwrap();
    assert_ne!(
        node::Live.real_driver(procfs.path(), procfs.path()),
        RealDriver::UnderShim
    );
}

#[test]
fn http_replies_are_split_into_status_and_body() {
    let r =
        node::parse_http("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 9\r\n\r\nnot ready")
            .unwrap();
    assert_eq!(
        r,
        HttpReply {
            status: 503,
            body: "not ready".into()
        }
    );
    for bad in [
        "",
        "HTTP/1.1 200 OK\r\n",
        "SSH-2.0\r\n\r\n",
        "HTTP/1.1 abc\r\n\r\n",
    ] {
        assert!(node::parse_http(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn metric_samples_are_read_by_exact_name() {
    let m = "mockgpu_nri_ready_x 5\nmockgpu_nri_ready 1\nmockgpu_nri_errors_total{outcome=\"refused\"} 0\n";
    assert_eq!(sample(m, "mockgpu_nri_ready"), Some(1.0));
    assert_eq!(sample(m, "mockgpu_nri_errors_total"), None);
    assert_eq!(sample(m, "absent"), None);
}

#[test]
fn the_device_plugin_must_be_registered_with_the_kubelet() {
    let mut node = healthy();
    node.sockets.retain(|s| s != Path::new(KUBELET_SOCKET));
    only_fails(
        &node,
        "device-plugin",
        "no kubelet registration socket at /var/lib/kubelet/device-plugins/kubelet.sock",
        "--kubelet-dir",
    );
    let mut node = healthy();
    node.sockets.retain(|s| s != Path::new(DP_SOCKET));
    only_fails(
        &node,
        "device-plugin",
        "socket /var/lib/kubelet/device-plugins/mockgpu-nvidia.com_gpu.sock is missing",
        "restart the agent",
    );
    let mut node = healthy();
    node.http.insert(
        "/metrics",
        HttpReply {
            status: 200,
            body: format!(
                "{METRICS}mockgpu_device_plugin_registrations_total 0\nmockgpu_device_plugin_healthy_gpus 4\n"
            ),
        },
    );
    only_fails(
        &node,
        "device-plugin",
        "has not registered nvidia.com/gpu",
        "kubelet",
    );
    // an agent without --device-plugin: neither it nor the allocatable count is checked
    node.http.insert(
        "/metrics",
        HttpReply {
            status: 200,
            body: METRICS.into(),
        },
    );
    check(
        &node,
        "device-plugin",
        Status::Skip,
        "runs without --device-plugin",
    );
    check(
        &node,
        "allocatable",
        Status::Skip,
        "without --device-plugin",
    );
    assert_eq!(
        check(
            &healthy(),
            "device-plugin",
            Status::Ok,
            "registered with the kubelet"
        )
        .message,
        "the agent's device plugin serves nvidia.com/gpu at \
         /var/lib/kubelet/device-plugins/mockgpu-nvidia.com_gpu.sock and is registered with the \
         kubelet (1 registrations)"
    );
}

#[test]
fn a_device_plugin_standing_down_for_another_fails_and_names_it() {
    let mut node = healthy();
    node.http.insert(
        "/metrics",
        HttpReply {
            status: 200,
            body: format!(
                "{METRICS}mockgpu_device_plugin_registrations_total 0\nmockgpu_device_plugin_healthy_gpus 0\nmockgpu_device_plugin_stood_down 1\n"
            ),
        },
    );
    // the GpuNode's condition names the other plugin
    let mut gpunode = reported(5, "True");
    let status = gpunode.status.as_mut().unwrap();
    let mut conflict = status.conditions[0].clone();
    conflict.type_ = "DevicePluginConflict".into();
    conflict.status = "True".into();
    conflict.reason = "AnotherPluginServes".into();
    conflict.message = "another device plugin serves nvidia.com/gpu on this node (socket /var/lib/kubelet/device-plugins/nvidia-gpu.sock, devices GPU-x): the agent's device plugin stands down".into();
    status.conditions.push(conflict);
    node.cluster = Ok(view(Some("4"), Some(gpunode)));
    let c = check(
        &node,
        "device-plugin",
        Status::Fail,
        "the agent's device plugin stands down: another device plugin serves nvidia.com/gpu on this node (GpuNode node-0: another device plugin serves nvidia.com/gpu on this node (socket /var/lib/kubelet/device-plugins/nvidia-gpu.sock",
    );
    assert!(c.fix.unwrap().contains("agent.devicePlugin.enabled=false"));
    // the allocatable count is the other plugin's: not compared with ours
    check(
        &node,
        "allocatable",
        Status::Skip,
        "stands down for another plugin",
    );
    // without the API server, the log names it
    node.cluster = Err("no API".into());
    check(
        &node,
        "device-plugin",
        Status::Fail,
        "(the agent's log names it)",
    );
}

#[test]
fn the_node_must_allocate_the_healthy_gpus() {
    let mut node = healthy();
    node.cluster = Ok(view(Some("3"), Some(reported(5, "True"))));
    only_fails(
        &node,
        "allocatable",
        "node node-0 has 3 nvidia.com/gpu allocatable, the agent advertises 4 healthy GPUs",
        "run the doctor again",
    );
    node.cluster = Ok(view(None, Some(reported(5, "True"))));
    only_fails(
        &node,
        "allocatable",
        "node node-0 has no nvidia.com/gpu allocatable",
        "kubelet's log",
    );
    let mut v = view(Some("4"), Some(reported(5, "True")));
    v.allocatable = None;
    node.cluster = Ok(v);
    only_fails(
        &node,
        "allocatable",
        "the API server has no node node-0",
        "--node-name",
    );
    check(
        &healthy(),
        "allocatable",
        Status::Ok,
        "node node-0 has 4 nvidia.com/gpu allocatable",
    );
}

#[test]
fn the_gpunode_must_be_there_ready_and_fresh() {
    let mut node = healthy();
    node.cluster = Ok(view(Some("4"), None));
    only_fails(
        &node,
        "gpunode",
        "no GpuNode node-0",
        "install the chart's CRD",
    );
    node.cluster = Ok(view(Some("4"), Some(reported(5, "False"))));
    only_fails(
        &node,
        "gpunode",
        "GpuNode node-0 is not Ready (TreeMounted: mounted)",
        "agent's log",
    );
    // three heartbeats of 30 s and a tenth: 99 s is fresh, 100 s is not
    node.cluster = Ok(view(Some("4"), Some(reported(99, "True"))));
    check(&node, "gpunode", Status::Ok, "last heartbeat 99s ago");
    node.cluster = Ok(view(Some("4"), Some(reported(100, "True"))));
    only_fails(
        &node,
        "gpunode",
        "last heartbeat is 100s old, more than 3 heartbeats of 30s",
        "--heartbeat",
    );
    let mut stripped = reported(5, "True");
    stripped.status = None;
    node.cluster = Ok(view(Some("4"), Some(stripped)));
    only_fails(
        &node,
        "gpunode",
        "has no Ready condition",
        "gpunodes/status",
    );
    assert_eq!(
        check(&healthy(), "gpunode", Status::Ok, "reported").message,
        "GpuNode node-0 reported: mock gb300, 0 GPUs, 2 held, Ready, last heartbeat 5s ago"
    );
}

#[test]
fn the_cluster_checks_skip_without_an_api_server_and_fail_when_it_cannot_be_read() {
    let node = healthy();
    let mut o = opts();
    o.credentials = None;
    let checks = run(&node, &o);
    let skipped: Vec<_> = checks
        .iter()
        .filter(|c| c.status != Status::Ok)
        .map(|c| (c.name, c.status))
        .collect();
    assert_eq!(
        skipped,
        [("allocatable", Status::Skip), ("gpunode", Status::Skip)]
    );
    assert!(
        checks[11]
            .message
            .starts_with("no Kubernetes API server configured"),
        "{}",
        checks[11]
    );
    let mut node = healthy();
    node.cluster = Err("cannot get node node-0: connection refused".into());
    let checks = run(&node, &opts());
    let failed: Vec<_> = checks.iter().filter(|c| c.status == Status::Fail).collect();
    assert_eq!(failed.len(), 2, "{checks:?}");
    for c in failed {
        assert_eq!(
            c.message,
            "cannot read from the API server: cannot get node node-0: connection refused"
        );
        assert!(c.fix.as_deref().unwrap().contains("RBAC"), "{c}");
    }
}
