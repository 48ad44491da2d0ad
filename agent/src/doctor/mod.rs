//! `mockgpu-agent doctor`: checks what a GPU job on this node depends on and says, one line per
//! check, what is right and what is wrong, with the fix.
//!
//! Each check is a function of the options and of what it asks a [`Node`] (every host call goes
//! through it; facts several checks share are gathered once) and returns a [`Check`]; [`run`]
//! lists them in order; the Kubernetes side's checks are in `cluster`.

mod cluster;
mod node;
mod nri;

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use mockgpu_api::Layout;
use serde::Serialize;

use crate::report::Credentials;

pub(crate) use node::PRELOAD_PROGRAM;
pub use node::{ClusterView, HttpReply, Live, Node, Ran, RealDriver};

use crate::mounts::{PROBE, unescape};
use nri::Containerd;

/// What to check, and where.
#[derive(Debug, Clone)]
pub struct Options {
    /// The agent's directory and where containers see it.
    pub layout: Layout,
    /// The agent's health endpoint.
    pub health: SocketAddr,
    /// The runtime's NRI socket; `None`: containerd's `socket_path`, else the default.
    pub nri_socket: Option<PathBuf>,
    /// containerd's configuration file.
    pub containerd_config: PathBuf,
    /// Slurm's configuration file.
    pub slurm_conf: PathBuf,
    /// Where procfs is mounted (for a real NVIDIA driver).
    pub procfs: PathBuf,
    /// Where sysfs is mounted (for a real NVIDIA driver).
    pub sysfs: PathBuf,
    /// The kubelet's root directory (its `device-plugins/`).
    pub kubelet_dir: PathBuf,
    /// The device plugin's resource (`nvidia.com/gpu`).
    pub resource_name: String,
    /// The node's name in Kubernetes (the GpuNode's too).
    pub node_name: String,
    /// The agent's heartbeat period.
    pub heartbeat: std::time::Duration,
    /// The API server, when one is configured.
    pub credentials: Option<Credentials>,
}

/// The outcome of one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Right.
    Ok,
    /// Wrong: the node cannot run GPU jobs as it should.
    Fail,
    /// Not checked (real GPU node, nothing to read); the message says why.
    Skip,
}

/// One checked fact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// Short name (`fuse`, `shim`, ...).
    pub name: &'static str,
    /// The outcome.
    pub status: Status,
    /// What was found, in words.
    pub message: String,
    /// What to do about a failure.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &'static str, message: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Ok,
            message: message.into(),
            fix: None,
        }
    }

    fn skip(name: &'static str, message: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Skip,
            message: message.into(),
            fix: None,
        }
    }

    fn fail(name: &'static str, message: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            message: message.into(),
            fix: Some(fix.into()),
        }
    }
}

impl fmt::Display for Check {
    /// `ok   fuse: ...`, `FAIL shim: ...; fix: ...`: one line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let status = match self.status {
            Status::Ok => "ok",
            Status::Fail => "FAIL",
            Status::Skip => "skip",
        };
        write!(f, "{status:<4} {}: {}", self.name, self.message)?;
        match &self.fix {
            Some(fix) => write!(f, "; fix: {fix}"),
            None => Ok(()),
        }
    }
}

/// Whether any check failed.
pub fn failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

/// The facts several checks share, gathered once.
struct Facts {
    /// Mock mode: no real driver lists a GPU.
    mock: bool,
    /// This doctor runs in a container the NRI plugin injected (its shim is loaded).
    injected: bool,
    /// The agent's `/metrics`.
    metrics: io::Result<HttpReply>,
    /// containerd's configuration.
    containerd: Containerd,
    /// The NRI socket checked.
    nri_socket: PathBuf,
    /// Whether it is a socket.
    nri_socket_state: io::Result<bool>,
    /// What the API server says, when one is configured.
    cluster: Option<Result<ClusterView, String>>,
}

/// Reason given by the checks that only concern mock mode.
const REAL_NODE: &str = "real GPU node: the agent mocks nothing";

/// Runs every check, in order.
pub fn run<N: Node>(node: &N, opts: &Options) -> Vec<Check> {
    let real = node.real_driver(&opts.procfs, &opts.sysfs);
    let containerd = Containerd::read(node, &opts.containerd_config);
    let nri_socket = opts
        .nri_socket
        .clone()
        .or_else(|| containerd.socket_path())
        .unwrap_or_else(|| mockgpu_nri::config::DEFAULT_SOCKET.into());
    let facts = Facts {
        mock: matches!(real, RealDriver::Absent | RealDriver::UnderShim),
        injected: real == RealDriver::UnderShim,
        metrics: node.http_get(opts.health, "/metrics"),
        nri_socket_state: node.is_socket(&nri_socket),
        nri_socket,
        containerd,
        cluster: opts
            .credentials
            .as_ref()
            .map(|c| node.cluster(c, &opts.node_name)),
    };
    let fuse = fuse(node, opts, &facts);
    let tree_answers = fuse.status == Status::Ok;
    vec![
        mode(&real, opts),
        agent(node, opts),
        fuse,
        shim(node, opts, &facts),
        nvml(node, opts, &facts, tree_answers),
        propagation(node, opts, &facts),
        nri::socket(&facts),
        nri::config(opts, &facts),
        nri::plugin(opts, &facts),
        cluster::device_plugin(node, opts, &facts),
        cluster::allocatable(opts, &facts),
        cluster::gpunode(opts, &facts),
        slurm(node, &opts.slurm_conf),
    ]
}

fn mode(real: &RealDriver, opts: &Options) -> Check {
    const NAME: &str = "mode";
    match real {
        RealDriver::Absent => Check::ok(
            NAME,
            format!(
                "mock mode: no NVIDIA driver lists a GPU in {}, so the agent serves mock GPUs",
                opts.procfs.join("driver/nvidia/gpus").display()
            ),
        ),
        RealDriver::Gpus(models) => {
            let mut distinct = models.clone();
            distinct.sort();
            distinct.dedup();
            Check::ok(
                NAME,
                format!(
                    "real mode: the NVIDIA driver lists {} GPUs ({}); the agent mocks nothing",
                    models.len(),
                    distinct.join(", ")
                ),
            )
        }
        RealDriver::UnderShim => Check::ok(
            NAME,
            "mock mode: this doctor runs under mockgpu's shim (the NRI plugin injected its \
             container), so the driver files it reads are the mock's",
        ),
        RealDriver::Unreadable(why) => Check::fail(
            NAME,
            format!("a real NVIDIA driver is loaded but its files cannot be read: {why}"),
            "check the driver's installation (nvidia-smi); the agent mocks nothing on this node",
        ),
    }
}

fn agent<N: Node>(node: &N, opts: &Options) -> Check {
    const NAME: &str = "agent";
    let addr = opts.health;
    let start = "start the agent (`mockgpu-agent serve`, the chart's DaemonSet), or point \
                 --health at its --listen address";
    match node.http_get(addr, "/healthz") {
        Ok(r) if r.status == 200 => Check::ok(NAME, format!("the agent answers at {addr}")),
        Ok(r) => Check::fail(
            NAME,
            format!("{addr}/healthz answers {}: {}", r.status, r.body.trim()),
            start,
        ),
        Err(e) => Check::fail(NAME, format!("no agent answers at {addr}: {e}"), start),
    }
}

/// One line of mountinfo: the file system type and the optional fields (propagation).
struct MountEntry {
    fstype: String,
    optional: Vec<String>,
}

/// The topmost mount at `path` in `mountinfo`, if any.
fn mount_at(mountinfo: &str, path: &Path) -> Option<MountEntry> {
    let wanted = path.to_string_lossy();
    mountinfo.lines().rev().find_map(|line| {
        let fields: Vec<&str> = line.split(' ').collect();
        if unescape(fields.get(4)?) != wanted {
            return None;
        }
        let dash = fields.iter().skip(6).position(|f| *f == "-")? + 6;
        Some(MountEntry {
            fstype: fields.get(dash + 1)?.to_string(),
            optional: fields[6..dash].iter().map(|f| f.to_string()).collect(),
        })
    })
}

fn fuse<N: Node>(node: &N, opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "fuse";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let mnt = opts.layout.mount_point();
    let restart = "restart the agent: it detaches a dead mount and mounts the tree afresh";
    let info = match node.mountinfo() {
        Ok(info) => info,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("cannot read the mount table: {e}"),
                "run the doctor where /proc is mounted",
            );
        }
    };
    let Some(entry) = mount_at(&info, &mnt) else {
        return Check::fail(
            NAME,
            format!("nothing is mounted at {}", mnt.display()),
            format!(
                "start the agent with --dir {}: it mounts the driver tree there",
                opts.layout.host_dir().display()
            ),
        );
    };
    if !entry.fstype.starts_with("fuse") {
        return Check::fail(
            NAME,
            format!(
                "{} is a {} mount, not the agent's FUSE tree",
                mnt.display(),
                entry.fstype
            ),
            format!(
                "unmount it and restart the agent (umount {})",
                mnt.display()
            ),
        );
    }
    // A dead server still answers from the kernel's caches; a name it never holds reaches it.
    match node.lookup(&mnt.join(PROBE)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Check::fail(
                NAME,
                format!(
                    "the FUSE mount at {} is left by a dead agent (a lookup answers: {e})",
                    mnt.display()
                ),
                restart,
            );
        }
        Err(e) => {
            return Check::fail(
                NAME,
                format!("a lookup in {} answers: {e}", mnt.display()),
                restart,
            );
        }
        Ok(()) => {
            return Check::fail(
                NAME,
                format!(
                    "{} holds {PROBE}: it is not the agent's tree",
                    mnt.display()
                ),
                restart,
            );
        }
    }
    let version = mnt.join("proc/driver/nvidia/version");
    match node.read(&version) {
        Ok(text) if text.starts_with(b"NVRM") => {
            let text = String::from_utf8_lossy(&text);
            let first = text.lines().next().unwrap_or_default();
            let first = first.split_whitespace().collect::<Vec<_>>().join(" ");
            Check::ok(
                NAME,
                format!(
                    "driver tree mounted at {} and answering ({first})",
                    mnt.display()
                ),
            )
        }
        Ok(_) => Check::fail(
            NAME,
            format!("{} does not start with NVRM", version.display()),
            restart,
        ),
        Err(e) => Check::fail(
            NAME,
            format!("cannot read {}: {e}", version.display()),
            restart,
        ),
    }
}

fn shim<N: Node>(node: &N, opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "shim";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let layout = &opts.layout;
    let lib = layout.lib_dir().join(mockgpu_api::layout::SHIM_FILE);
    let reinstall = "restart the agent: it installs the shim and ld.so.preload at start";
    if let Err(e) = node.lookup(&lib) {
        return Check::fail(
            NAME,
            format!("the shim {} is missing: {e}", lib.display()),
            reinstall,
        );
    }
    let preload = layout.ld_so_preload();
    let wanted = layout.ld_so_preload_content();
    match node.read(&preload) {
        Ok(content) if content == wanted.as_bytes() => {}
        Ok(content) => {
            return Check::fail(
                NAME,
                format!(
                    "{} names {:?}, not {}",
                    preload.display(),
                    String::from_utf8_lossy(&content).trim(),
                    wanted.trim()
                ),
                format!(
                    "{reinstall} (with --container-dir {})",
                    layout.container_dir().display()
                ),
            );
        }
        Err(e) => {
            return Check::fail(
                NAME,
                format!("cannot read {}: {e}", preload.display()),
                reinstall,
            );
        }
    }
    let glibc = node.glibc().map_or_else(
        || "a C library other than glibc".into(),
        |v| format!("glibc {v}"),
    );
    let run = match node.preload(&lib, &layout.mount_point()) {
        Ok(run) => run,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("cannot run {PRELOAD_PROGRAM} with the shim preloaded: {e}"),
                format!("run the doctor where {PRELOAD_PROGRAM} exists"),
            );
        }
    };
    // With MOCKFS_DEBUG=1 a loaded shim always notes its configuration; the loader's complaints
    // (wrong architecture, a missing GLIBC_* version) come instead.
    let noted = run.stderr.lines().any(|l| l.starts_with("mockfs: "));
    if run.status.success() && noted {
        return Check::ok(
            NAME,
            format!(
                "shim installed at {} and loadable by this node's {glibc}",
                lib.display()
            ),
        );
    }
    let complaint = run
        .stderr
        .lines()
        .find(|l| !l.starts_with("mockfs: ") && !l.trim().is_empty())
        .unwrap_or(if noted {
            "the program failed"
        } else {
            "the shim left no sign of being loaded"
        });
    Check::fail(
        NAME,
        format!(
            "{PRELOAD_PROGRAM} with {} preloaded under {glibc}: {}",
            lib.display(),
            complaint.trim()
        ),
        "the shim needs glibc 2.17 or later and the agent's architecture: install the agent \
         image built for this node",
    )
}

/// Runs the installed `nvidia-smi -L` through the installed NVML against the served tree (when
/// `tree_answers`: the `fuse` check passed) and compares the GPUs it lists with the tree's.
fn nvml<N: Node>(node: &N, opts: &Options, facts: &Facts, tree_answers: bool) -> Check {
    const NAME: &str = "nvml";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let layout = &opts.layout;
    let gpus_dir = layout.mount_point().join("proc/driver/nvidia/gpus");
    if !tree_answers {
        return Check::skip(NAME, "the served tree does not answer (see fuse)");
    }
    let served = match node.list(&gpus_dir) {
        Ok(names) => names.len(),
        Err(e) => {
            return Check::fail(
                NAME,
                format!("cannot list {}: {e}", gpus_dir.display()),
                "restart the agent: it mounts the driver tree afresh",
            );
        }
    };
    let (smi, lib) = (layout.nvidia_smi(), layout.nvml());
    let reinstall = "restart the agent: it installs the NVML and nvidia-smi at start";
    // Looked up first rather than told by the failed start: under qemu-user (an arm64 image on
    // an x86_64 node) glibc's posix_spawn cannot report an exec failure, and the child ends
    // with status 127 and no output.
    if let Err(e) = node.lookup(&smi) {
        return Check::fail(
            NAME,
            format!("nvidia-smi {} is missing: {e}", smi.display()),
            reinstall,
        );
    }
    let run = match node.nvidia_smi(&smi, &layout.lib_dir(), &layout.mount_point()) {
        Ok(run) => run,
        Err(e) => {
            return Check::fail(
                NAME,
                format!("cannot run {} -L: {e}", smi.display()),
                reinstall,
            );
        }
    };
    if !run.status.success() {
        let said = run
            .stderr
            .lines()
            .chain(run.stdout.lines())
            .find(|l| !l.trim().is_empty())
            .map_or_else(|| format!("no output, {}", run.status), |l| l.trim().into());
        return Check::fail(
            NAME,
            format!("{} -L with {} fails: {said}", smi.display(), lib.display()),
            format!(
                "{reinstall}; the NVML and nvidia-smi need glibc 2.17 or later and the agent's \
                 architecture: install the agent image built for this node"
            ),
        );
    }
    let listed = run.stdout.lines().filter(|l| l.starts_with("GPU ")).count();
    if listed != served {
        return Check::fail(
            NAME,
            format!(
                "{} -L lists {listed} GPUs through {}, the served tree {served}",
                smi.display(),
                lib.display()
            ),
            reinstall,
        );
    }
    Check::ok(
        NAME,
        format!(
            "{} -L lists the {served} GPUs of the served tree through {}",
            smi.display(),
            lib.display()
        ),
    )
}

fn propagation<N: Node>(node: &N, opts: &Options, facts: &Facts) -> Check {
    const NAME: &str = "propagation";
    if !facts.mock {
        return Check::skip(NAME, REAL_NODE);
    }
    let dir = opts.layout.host_dir();
    let d = dir.display();
    let fix = format!(
        "restart the agent as root (it makes {d} a shared mount), or run `mount --make-shared {d}`"
    );
    let info = match node.mountinfo() {
        Ok(info) => info,
        Err(e) => return Check::fail(NAME, format!("cannot read the mount table: {e}"), fix),
    };
    let Some(entry) = mount_at(&info, dir) else {
        return Check::fail(
            NAME,
            format!(
                "{d} is not a mount point, so a new tree mounted inside it does not reach running containers"
            ),
            format!(
                "restart the agent as root (it makes {d} a shared mount), or run `mount --bind {d} {d} && mount --make-shared {d}`"
            ),
        );
    };
    if let Some(group) = entry
        .optional
        .iter()
        .find_map(|f| f.strip_prefix("shared:"))
    {
        return Check::ok(
            NAME,
            format!(
                "{d} is a shared mount (peer group {group}): mounts inside it reach containers"
            ),
        );
    }
    let master = entry
        .optional
        .iter()
        .find_map(|f| f.strip_prefix("master:"));
    if let (Some(group), true) = (master, facts.injected) {
        // what an injected container gets: the NRI plugin's mount, a slave of the host's
        return Check::ok(
            NAME,
            format!(
                "{d} is the injected slave of peer group {group}: mounts inside the host's reach this container"
            ),
        );
    }
    let kind = if master.is_some() {
        "a slave"
    } else {
        "a private"
    };
    Check::fail(
        NAME,
        format!(
            "{d} is {kind} mount, so a new tree mounted inside it does not reach running containers"
        ),
        fix,
    )
}

/// The value of the sample `name` (without labels) in a Prometheus text exposition.
fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        let (n, v) = l.split_once(' ')?;
        (n == name).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The values of the last `GresTypes=` in a slurm.conf (keys are case-insensitive).
fn gres_types(conf: &str) -> Option<Vec<String>> {
    conf.lines()
        .rev()
        .map(|l| l.split('#').next().unwrap_or_default())
        .flat_map(|l| l.split_whitespace().rev())
        .find_map(|word| {
            let (key, value) = word.split_once('=')?;
            key.eq_ignore_ascii_case("GresTypes")
                .then(|| value.split(',').map(str::to_string).collect())
        })
}

fn slurm<N: Node>(node: &N, path: &Path) -> Check {
    const NAME: &str = "slurm";
    let p = path.display();
    let conf = match node.read(path) {
        Ok(raw) => String::from_utf8_lossy(&raw).into_owned(),
        Err(e) => {
            return Check::skip(
                NAME,
                format!("no slurm.conf readable at {p}: {e}; pass --slurm-conf on a Slurm node"),
            );
        }
    };
    let fix = format!(
        "add GresTypes=gpu to {p} (Slinky's chart: controller.extraConfMap.GresTypes) and run `scontrol reconfigure`"
    );
    match gres_types(&conf) {
        Some(types) if types.iter().any(|t| t == "gpu") => {
            Check::ok(NAME, format!("{p} sets GresTypes={}", types.join(",")))
        }
        Some(types) => Check::fail(
            NAME,
            format!(
                "{p} sets GresTypes={} without gpu: slurmd ignores the GPUs it detects",
                types.join(",")
            ),
            fix,
        ),
        None => Check::fail(
            NAME,
            format!("{p} has no GresTypes: slurmd ignores the GPUs it detects"),
            fix,
        ),
    }
}

#[cfg(test)]
mod tests;
