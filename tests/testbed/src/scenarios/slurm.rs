//! The node test bed's Slurm scenarios: slurmctld and munged in the node (loopback-only network),
//! slurmd in a container (or on the node itself under `mockgpu-agent exec`), slurmrestd and the
//! controller's client, `ConstrainDevices=yes`.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, anyhow, ensure};
use mockgpu_testbed::client::Cri;
use mockgpu_testbed::spec::{self, ContainerSpec, PodSpec};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::bed::{Bed, Ctr, exec_ok, stdout_of, tail, wait_for};
use crate::node::{ALL_MINORS, SLURMD_POD, assert_injected, gpu_uuids, ms};

/// The Slurm node name, also the agent's node name (`testbed.sh`'s `NODE`).
const NODE: &str = "node0";
/// The agent's tree, as the node sees it.
const MOCK: &str = "/run/mockgpu/fs";
/// The agent binary in the node.
const AGENT: &str = "/opt/mockgpu/mockgpu-agent";
/// munged's socket (a node path).
const MUNGE_SOCKET: &str = "/run/munge/munge.socket.2";
/// The GRES every node here registers.
const GRES: &str = "gpu:nvidia_gb300:4";

/// slurmrestd, every data_parser.
const RESTD_PORT: u16 = 6820;
/// slurmrestd with data_parser v0.0.40 only (what Slurm 23.11 serves).
const RESTD_OLD_PORT: u16 = 6821;
/// Accepts a connection and never answers.
const MUTE_PORT: u16 = 6899;
/// The dynamic node (`slurmd -Z`) slurmrestd deletes.
const DYN_NODE: &str = "gpu-0";
/// Node paths of the tokens.
const JWT: &str = "/run/mgtb-jwt";
const JWT_FORGED: &str = "/run/mgtb-jwt-forged";

/// Opening each `/dev/nvidia<m>` read-write in a job: `<m> ok` or `<m> <the shell's error>`.
pub(crate) const OPEN_GPUS: &str = r#"for m in 0 1 2 3; do if e=$( (exec 3<> /dev/nvidia$m) 2>&1); then echo "$m ok"; else echo "$m ${e##*: }"; fi; done"#;

/// The guide's verification, as a job's command (`srun --gres=gpu:2 sh -c VERIFY`).
pub(crate) const VERIFY: &str =
    r#"echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; nvidia-smi -L"#;

/// The verification's output with `ConstrainDevices=yes`: exactly the two GPUs Slurm gave the job
/// (minors 0 and 1, by their UUIDs in the agent's tree) as GPU 0 and 1.
pub(crate) fn check_verify(bed: &Bed, out: &str, what: &str) -> Result<()> {
    let uuids = gpu_uuids(bed)?;
    let uuid = |minor: u32| {
        uuids
            .iter()
            .find(|(m, _)| *m == minor)
            .map_or("", |(_, u)| u.as_str())
    };
    let s = out.trim_end();
    for l in s.lines() {
        println!("  {what}: {l}");
    }
    let want = format!(
        "CUDA_VISIBLE_DEVICES=0,1\nGPU 0: NVIDIA GB300 (UUID: {})\nGPU 1: NVIDIA GB300 (UUID: {})",
        uuid(0),
        uuid(1)
    );
    ensure!(s == want, "{what}: want\n{want}\ngot\n{s}");
    Ok(())
}

/// `OPEN_GPUS`' output in a job given GPUs 0 and 1: the device cgroup refuses the other two.
pub(crate) fn check_open(out: &str) -> Result<()> {
    let s = out.trim_end();
    println!("  open in a job with gpu:2: {}", s.replace('\n', ";"));
    ensure!(
        s == "0 ok\n1 ok\n2 Operation not permitted\n3 Operation not permitted",
        "opening the GPU nodes in a job: want 0 and 1 to open, EPERM for 2 and 3; got\n{s}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Slurm's configuration and daemons

/// Where slurmd's GPUs come from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Gres {
    /// Hand-made: the device files from the CRI request, the type from gres.conf.
    Fake,
    /// `AutoDetect=nvidia`: the agent's tree.
    Nvidia,
}

/// `slurmd -C`'s first line, in the node.
fn slurmd_c(bed: &Bed) -> Result<String> {
    let out = bed.in_node(&["slurmd", "-C"])?;
    Ok(out.lines().next().unwrap_or_default().to_owned())
}

/// `KEY=N` of `slurmd -C`'s first line.
fn slurm_hw(line: &str, key: &str) -> Result<u32> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .with_context(|| format!("slurmd -C prints no {key}=: {line}"))?
        .parse()
        .with_context(|| format!("slurmd -C: {key}= is not a number: {line}"))
}

/// slurm.conf (the host's real CPU layout, as `slurmd -C` sees it, so that the node is not
/// invalidated), gres.conf and, with `constrain`, cgroup.conf with `ConstrainDevices=yes`.
pub(crate) fn write_conf(bed: &Bed, gres: Gres, constrain: bool) -> Result<()> {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname")?
        .trim()
        .to_owned();
    let (proctrack, task) = if constrain {
        ("proctrack/cgroup", "task/cgroup")
    } else {
        ("proctrack/linuxproc", "task/none")
    };
    let c = slurmd_c(bed)?;
    let mut hw = String::new();
    for w in c.split_whitespace() {
        let key = w.split('=').next().unwrap_or_default();
        let numeric = w
            .split_once('=')
            .is_some_and(|(_, v)| !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()));
        if numeric
            && [
                "CPUs",
                "Boards",
                "SocketsPerBoard",
                "CoresPerSocket",
                "ThreadsPerCore",
            ]
            .contains(&key)
        {
            write!(hw, "{w} ")?;
        }
    }
    let conf = format!(
        "ClusterName=mgtb
SlurmctldHost={h}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldParameters=enable_configless
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
MpiDefault=none
ProctrackType={proctrack}
TaskPlugin={task}
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
ReturnToService=2
GresTypes=gpu
NodeName={NODE} NodeHostname={h} NodeAddr=127.0.0.1 {hw}RealMemory=1000 Gres={GRES} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"
    );
    std::fs::write(bed.node_path("/etc/slurm/slurm.conf"), conf)?;
    let gres_conf = match gres {
        Gres::Fake => "AutoDetect=off\nName=gpu Type=nvidia_gb300 File=/dev/nvidia[0-3]\n",
        Gres::Nvidia => "AutoDetect=nvidia\n",
    };
    std::fs::write(bed.node_path("/etc/slurm/gres.conf"), gres_conf)?;
    // Slurm's cgroup plugin for the node's hierarchy: cgroup/v2 refuses a hybrid host ("Hybrid
    // mode is not supported"), so a cgroup v1 host gets cgroup/v1 (the devices controller's deny
    // list; on v2 Slurm attaches a BPF device program: either way a refused open fails with EPERM)
    let cgroup_conf = bed.node_path("/etc/slurm/cgroup.conf");
    if constrain {
        let fs = std::process::Command::new("stat")
            .args(["-f", "-c", "%T", "/sys/fs/cgroup"])
            .output()
            .context("stat -f /sys/fs/cgroup")?;
        let plugin = if String::from_utf8_lossy(&fs.stdout).trim() == "cgroup2fs" {
            "cgroup/v2"
        } else {
            "cgroup/v1"
        };
        std::fs::write(
            &cgroup_conf,
            format!("CgroupPlugin={plugin}\nConstrainDevices=yes\n"),
        )?;
    } else if cgroup_conf.exists() {
        std::fs::remove_file(&cgroup_conf)?;
    }
    Ok(())
}

fn is_socket(path: PathBuf) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// munged and slurmctld, fresh (state, logs and munge's socket directory emptied).
async fn ctl_up(bed: &Bed) -> Result<()> {
    ctl_down(bed).await?;
    bed.in_node(&[
        "sh",
        "-c",
        "rm -rf /var/lib/slurm/slurmctld /var/log/slurm /run/munge
        mkdir -p /var/lib/slurm/slurmctld /var/log/slurm /run/munge && chown munge:munge /run/munge",
    ])?;
    std::fs::write(bed.logs.join("munged.log"), "")?;
    std::fs::write(bed.logs.join("slurmctld.out"), "")?;
    bed.spawn(
        "munged",
        "munged.log",
        &[
            "setpriv",
            "--reuid=munge",
            "--regid=munge",
            "--clear-groups",
            "munged",
            "-F",
        ],
    )?;
    wait_for(10, "munged", || async {
        is_socket(bed.node_path(MUNGE_SOCKET))
    })
    .await?;
    bed.spawn(
        "slurmctld",
        "slurmctld.out",
        &["slurmctld", "-D", "-f", "/etc/slurm/slurm.conf"],
    )?;
    wait_for(20, "slurmctld", || async {
        bed.in_node(&["scontrol", "ping"]).is_ok()
    })
    .await
}

async fn ctl_down(bed: &Bed) -> Result<()> {
    bed.stop(Signal::SIGTERM, &["slurmctld", "munged"]).await
}

/// The slurmd container's spec: privileged, the node's `/run/munge`, `/bin/sh -c <cmd>`.
fn slurmd_spec(cmd: &str) -> Result<ContainerSpec> {
    Ok(ContainerSpec {
        name: "slurmd".into(),
        image: "localhost/slurmd:1".into(),
        privileged: true,
        mounts: vec![spec::parse_mount("/run/munge:/run/munge")?],
        command: vec!["/bin/sh".into(), "-c".into(), cmd.into()],
        ..ContainerSpec::default()
    })
}

fn nvidia_devices() -> Result<Vec<spec::DeviceSpec>> {
    ALL_MINORS
        .iter()
        .map(|m| Ok(spec::parse_device(&format!("/dev/null:/dev/nvidia{m}"))?))
        .collect()
}

fn gpu_env() -> Vec<(String, String)> {
    vec![
        ("NVIDIA_VISIBLE_DEVICES".into(), "all".into()),
        ("SLURMD_NODENAME".into(), NODE.into()),
    ]
}

/// A Slinky-shaped slurmd container, kept as `key` (configless as in Slinky: slurm.conf and
/// gres.conf come from slurmctld, not from a mount); `shape` adds env or devices.
async fn slurmd_up(
    bed: &Bed,
    cri: &mut Cri,
    key: &str,
    shape: impl FnOnce(&mut ContainerSpec) -> Result<()>,
) -> Result<Ctr> {
    cri.down(&[SLURMD_POD.into()]).await?;
    let mut pod = bed.pod(SLURMD_POD);
    pod.labels = HashMap::from([
        ("app.kubernetes.io/name".into(), "slurmd".into()),
        ("app.kubernetes.io/component".into(), "worker".into()),
    ]);
    pod.annotations = HashMap::from([(
        "kubectl.kubernetes.io/default-container".into(),
        "slurmd".into(),
    )]);
    let mut c = slurmd_spec(&format!(
        "mkdir -p /var/spool/slurmd && exec slurmd -D -N {NODE} --conf-server 127.0.0.1:6817"
    ))?;
    shape(&mut c)?;
    bed.up_kept(key, cri, &pod, &c).await
}

/// `sinfo -N`: `<node> <state> <gres>` a line.
fn sinfo(bed: &Bed) -> Result<String> {
    Ok(bed
        .in_node(&["sinfo", "-h", "-N", "-o", "%N %T %G"])?
        .trim_end()
        .to_owned())
}

fn idle(bed: &Bed, node: &str) -> bool {
    let prefix = format!("{node} idle ");
    sinfo(bed).is_ok_and(|s| s.lines().any(|l| l.starts_with(&prefix)))
}

/// `srun -D / -N1 ARGS` in the node, bounded to 60 s.
fn srun(bed: &Bed, args: &[&str]) -> Result<Output> {
    let mut all = vec!["timeout", "60", "srun", "-D", "/", "-N1"];
    all.extend_from_slice(args);
    bed.innode(&all)?
        .output()
        .with_context(|| format!("srun {args:?}"))
}

/// `srun ARGS`' standard output, or an error with its status and standard error.
pub(crate) fn srun_ok(bed: &Bed, args: &[&str]) -> Result<String> {
    stdout_of(&format!("srun {args:?}"), srun(bed, args)?)
}

/// The `CUDA_VISIBLE_DEVICES=` lines of `srun ARGS env`.
fn srun_cuda_visible(bed: &Bed, args: &[&str]) -> Result<String> {
    let mut all = args.to_vec();
    all.push("env");
    let out = srun_ok(bed, &all)?;
    let lines: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("CUDA_VISIBLE_DEVICES="))
        .collect();
    ensure!(!lines.is_empty(), "the job has no CUDA_VISIBLE_DEVICES");
    Ok(lines.join("\n"))
}

/// `srun --gres=gpu:5 true` must be refused (four GPUs); its output goes to `srun-gpu5.log`.
fn gpu5_refused(bed: &Bed) -> Result<()> {
    let out = srun(bed, &["--gres=gpu:5", "true"])?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(bed.logs.join("srun-gpu5.log"), &text)?;
    ensure!(!out.status.success(), "srun --gres=gpu:5 was not refused");
    println!(
        "  srun --gres=gpu:5 refused: {}",
        text.lines().next().unwrap_or_default()
    );
    Ok(())
}

/// What helps when a Slurm step fails: sinfo, slurmd's container log, slurmctld's log.
fn slurm_logs(bed: &Bed) -> String {
    let mut s = String::from("--- sinfo:\n");
    match sinfo(bed) {
        Ok(o) => s.push_str(&o),
        Err(e) => s.push_str(&format!("{e:#}")),
    }
    s.push_str("\n--- slurmd (container log):\n");
    let dir = bed.node_path(&format!("/var/log/pods/default_{SLURMD_POD}/slurmd"));
    let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    logs.sort();
    for l in logs
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
    {
        writeln!(s, "==> {} <==\n{}", l.display(), tail(l, 20)).ok();
    }
    s.push_str("\n--- slurmctld:\n");
    s.push_str(&tail(&bed.node_path("/var/log/slurm/slurmctld.log"), 20));
    s
}

/// An error with the Slurm logs appended.
fn with_logs(bed: &Bed, e: anyhow::Error) -> anyhow::Error {
    anyhow!("{e:#}\n{}", slurm_logs(bed))
}

/// `Err(what + the Slurm logs)` unless `ok`.
fn check(bed: &Bed, ok: bool, what: impl FnOnce() -> String) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(with_logs(bed, anyhow!(what())))
    }
}

/// Waits for `node` to be idle in sinfo; the Slurm logs when it is not.
async fn wait_idle(bed: &Bed, secs: u64, what: &str, node: &str) -> Result<()> {
    wait_for(secs, what, || async { idle(bed, node) })
        .await
        .map_err(|e| with_logs(bed, e))
}

// ---------------------------------------------------------------------------------------------
// the node's CPU layout, read from its sysfs, and what Slurm should make of the agent's GPUs

/// `0-2,8` → `[0, 1, 2, 8]`.
fn cpus_of(list: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for part in list.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u32, u32) = (
            a.parse().with_context(|| format!("CPU list {list:?}"))?,
            b.parse().with_context(|| format!("CPU list {list:?}"))?,
        );
        out.extend(a..=b);
    }
    Ok(out)
}

/// `0-2,8` → `0,1,2,8` (sorted, one id each).
fn canon(ids: &[u32]) -> String {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// `[0, 1, 2, 8]` → `0-2,8`.
fn ranges(ids: &[u32]) -> String {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let s = v[i];
        let mut p = s;
        while i + 1 < v.len() && v[i + 1] == p + 1 {
            i += 1;
            p = v[i];
        }
        out.push(if s == p {
            s.to_string()
        } else {
            format!("{s}-{p}")
        });
        i += 1;
    }
    out.join(",")
}

/// The node's sockets (physical_package_id), in Slurm's order: `(rank, canonical CPU list)`.
fn node_sockets(bed: &Bed) -> Result<Vec<(u32, String)>> {
    let online = bed.in_node(&["cat", "/sys/devices/system/cpu/online"])?;
    let mut by_pkg: Vec<(u32, u32)> = Vec::new();
    for c in cpus_of(&online)? {
        let p = bed.node_path(&format!(
            "/sys/devices/system/cpu/cpu{c}/topology/physical_package_id"
        ));
        let pkg = std::fs::read_to_string(&p)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        by_pkg.push((pkg, c));
    }
    by_pkg.sort_unstable();
    let mut sockets: Vec<(u32, Vec<u32>)> = Vec::new();
    for (pkg, c) in by_pkg {
        match sockets.last_mut() {
            Some((p, cpus)) if *p == pkg => cpus.push(c),
            _ => sockets.push((pkg, vec![c])),
        }
    }
    Ok(sockets
        .iter()
        .zip(0..)
        .map(|((_, cpus), rank)| (rank, canon(cpus)))
        .collect())
}

/// `(minor, bus id)` of every GPU the agent serves, by minor.
fn gpus_by_minor(bed: &Bed) -> Result<Vec<(u32, String)>> {
    let out = bed.in_node(&[
        "sh",
        "-c",
        &format!("grep -H '^Device Minor:' {MOCK}/proc/driver/nvidia/gpus/*/information"),
    ])?;
    let mut gpus = Vec::new();
    for line in out.lines() {
        let (path, minor) = line
            .split_once(":Device Minor:")
            .with_context(|| format!("not a Device Minor line: {line}"))?;
        let bus = path
            .strip_suffix("/information")
            .and_then(|p| p.rsplit('/').next())
            .with_context(|| format!("no bus id in {path}"))?;
        let minor: u32 = minor
            .trim()
            .parse()
            .with_context(|| format!("Device Minor of {bus}: {minor:?}"))?;
        gpus.push((minor, bus.to_owned()));
    }
    gpus.sort();
    Ok(gpus)
}

/// The socket a GPU is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Socket {
    Rank(u32),
    /// Its local_cpulist is all CPUs of the node.
    All,
}

/// The socket whose CPUs are exactly the GPU's local_cpulist, or all; anything else is what
/// slurmctld rejects.
fn gpu_socket(bed: &Bed, sockets: &[(u32, String)], bus: &str) -> Result<Socket> {
    let list = bed.in_node(&[
        "cat",
        &format!("{MOCK}/sys/bus/pci/drivers/nvidia/{bus}/local_cpulist"),
    ])?;
    let cpus = canon(&cpus_of(&list)?);
    if let Some((r, _)) = sockets.iter().find(|(_, l)| *l == cpus) {
        return Ok(Socket::Rank(*r));
    }
    let mut all = Vec::new();
    for (_, l) in sockets {
        all.extend(cpus_of(l)?);
    }
    ensure!(
        canon(&all) == cpus,
        "GPU {bus}: local_cpulist ({cpus}) is neither one whole socket nor all CPUs of the node"
    );
    Ok(Socket::All)
}

/// The `(S:...)` sinfo shows for the served GPUs.
pub(crate) fn gres_sockets(bed: &Bed) -> Result<String> {
    let sockets = node_sockets(bed)?;
    let mut ranks = Vec::new();
    for (_, bus) in gpus_by_minor(bed)? {
        match gpu_socket(bed, &sockets, &bus)? {
            Socket::Rank(r) => ranks.push(r),
            Socket::All => ranks.extend(sockets.iter().map(|(r, _)| *r)),
        }
    }
    Ok(ranges(&ranks))
}

/// The `Cores=` slurmd derives for a GPU on that socket (socket-major core ids).
fn slurm_cores(c_line: &str, socket: Socket) -> Result<String> {
    let c = slurm_hw(c_line, "CoresPerSocket")?;
    let (lo, hi) = match socket {
        Socket::All => (
            0,
            slurm_hw(c_line, "Boards")? * slurm_hw(c_line, "SocketsPerBoard")? * c - 1,
        ),
        Socket::Rank(r) => (r * c, r * c + c - 1),
    };
    Ok(if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    })
}

/// Whether a text is a PCI bus id as the driver's `gpus` directory names them
/// (`[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}.[0-9a-f]`).
pub(crate) fn is_bus_id(s: &str) -> bool {
    let hex = |p: &str, lo: usize, hi: usize| {
        (lo..=hi).contains(&p.len()) && p.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    let parts: Vec<&str> = s.split(':').collect();
    let [dom, bus, devfn] = parts.as_slice() else {
        return false;
    };
    let Some((dev, func)) = devfn.split_once('.') else {
        return false;
    };
    hex(dom, 4, 8) && hex(bus, 2, 2) && hex(dev, 2, 2) && hex(func, 1, 1)
}

// ---------------------------------------------------------------------------------------------
// the scenarios

/// Slurm alone, without mockgpu: slurmd in a container with hand-made GPUs (`AutoDetect=off`,
/// `/dev/nvidia[0-3]` from CRI) registers `gpu:nvidia_gb300:4`; `--gres=gpu:2` gets
/// `CUDA_VISIBLE_DEVICES=0,1`, `--gres=gpu:5` is refused.
pub async fn smoke_slurm(bed: &Bed) -> Result<()> {
    write_conf(bed, Gres::Fake, false)?;
    ctl_up(bed).await?;
    let mut cri = bed.cri().await?;
    let t = Instant::now();
    slurmd_up(bed, &mut cri, "slurm-fake", |c| {
        c.devices = nvidia_devices()?;
        Ok(())
    })
    .await?;
    wait_idle(bed, 30, "slurmd to register idle", NODE).await?;
    bed.timing(
        "smoke-slurmd-idle",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let s = sinfo(bed)?;
    println!("  sinfo: {s}");
    check(bed, s.contains(GRES), || format!("sinfo shows no {GRES}"))?;
    let s = srun_cuda_visible(bed, &["--gres=gpu:2"])
        .map_err(|e| with_logs(bed, e.context("srun --gres=gpu:2")))?;
    println!("  srun --gres=gpu:2: {s}");
    ensure!(
        s == "CUDA_VISIBLE_DEVICES=0,1",
        "want CUDA_VISIBLE_DEVICES=0,1, got {s}"
    );
    gpu5_refused(bed)?;
    cri.down(&[SLURMD_POD.into()]).await?;
    ctl_down(bed).await
}

/// The Slinky-shaped slurmd (privileged, `NVIDIA_VISIBLE_DEVICES=all`, configless,
/// `AutoDetect=nvidia`) is injected and registers the agent's four GPUs on the node's sockets;
/// jobs get them, and a job without `LD_PRELOAD` sees them through `/etc/ld.so.preload`. The
/// container stays for the later steps (`slurmd`).
pub async fn seed_verification(bed: &Bed) -> Result<()> {
    write_conf(bed, Gres::Nvidia, false)?;
    ctl_up(bed).await?;
    let mut cri = bed.cri().await?;
    let t = Instant::now();
    let slurmd = slurmd_up(bed, &mut cri, "slurmd", |c| {
        c.env = gpu_env();
        Ok(())
    })
    .await?;
    bed.timing(
        "container-create-with-injection",
        &format!("{} ms (start {} ms)", ms(slurmd.create), ms(slurmd.start)),
    );
    assert_injected(&mut cri, "slurmd", &slurmd, &ALL_MINORS).await?;
    wait_idle(bed, 30, "slurmd to register idle", NODE).await?;
    bed.timing(
        "slurmd-idle-with-mock-gpus",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let s = sinfo(bed)?;
    println!("  sinfo -N -o '%N %T %G': {s}");
    // the sockets follow the node's layout (S:0 on one socket, S:0-1 when the GPUs span two)
    let sockets = gres_sockets(bed)?;
    ensure!(!sockets.is_empty(), "no socket found for the served GPUs");
    let want = format!("{GRES}(S:{sockets})");
    check(bed, s.contains(&want), || {
        format!("sinfo does not show {want}: {s}")
    })?;
    let s = srun_cuda_visible(bed, &["--gres=gpu:2"])
        .map_err(|e| with_logs(bed, e.context("srun --gres=gpu:2")))?;
    println!("  srun --gres=gpu:2 env: {s}");
    ensure!(
        s == "CUDA_VISIBLE_DEVICES=0,1",
        "want CUDA_VISIBLE_DEVICES=0,1, got {s}"
    );
    gpu5_refused(bed)?;
    // the job's environment is the caller's (no LD_PRELOAD): only /etc/ld.so.preload can reach it
    let s = srun_ok(
        bed,
        &[
            "/bin/sh",
            "-c",
            r#"echo "LD_PRELOAD=${LD_PRELOAD:-}"; ls /proc/driver/nvidia/gpus"#,
        ],
    )
    .context("srun ls")?;
    for l in s.lines() {
        println!("  job: {l}");
    }
    ensure!(
        s.lines().any(|l| l == "LD_PRELOAD="),
        "the job inherited LD_PRELOAD; the ld.so.preload route is untested"
    );
    let n = s.lines().filter(|l| is_bus_id(l)).count();
    ensure!(n == 4, "the job does not see 4 GPUs (it lists {n})");
    Ok(())
}

/// Runs `slurmd ARGS` under `mockgpu-agent exec` on the node (env first, as `env` takes it);
/// its `Gres Name=gpu` lines (stdout and stderr), or an error naming `what`.
fn exec_gres_lines(bed: &Bed, env: &[&str], what: &str) -> Result<Vec<String>> {
    let mut args = vec!["env"];
    args.extend_from_slice(env);
    args.extend_from_slice(&[
        AGENT,
        "exec",
        "--node-name",
        NODE,
        "--",
        "slurmd",
        "-G",
        "-N",
        NODE,
    ]);
    let out = bed.innode(&args)?.output().context(what.to_owned())?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = text
        .lines()
        .filter(|l| l.contains("Gres Name=gpu"))
        .map(str::to_owned)
        .collect();
    ensure!(
        out.status.success() && !lines.is_empty(),
        "{what} ({}): {}",
        out.status,
        text.trim()
    );
    Ok(lines)
}

/// `Type=... File=/dev/nvidia<m> Cores=...` of a `slurmd -G` line, without the fields in which
/// two detections may differ (Count, Index, ID).
fn gres_key(line: &str, m: u32) -> Option<String> {
    let start = line.find("Type=")?;
    let needle = format!("File=/dev/nvidia{m} Cores=");
    let at = start + line[start..].rfind(&needle)?;
    let rest = &line[at + needle.len()..];
    let end = at + needle.len() + rest.find(' ').unwrap_or(rest.len());
    Some(
        line[start..end]
            .split(' ')
            .filter(|w| !["Count=", "Index=", "ID="].iter().any(|p| w.starts_with(p)))
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// `mockgpu-agent exec` runs slurmd on the node itself, under the shim: `slurmd -C` prints the
/// GRES; `slurmd -G` with `AutoDetect=nvidia` lists four GPUs, their device files and the cores of
/// their sockets; `AutoDetect=nvml` (Slurm's NVML plugin on the mock library) agrees, with NVLink.
pub async fn exec_slurmd(bed: &Bed) -> Result<()> {
    ensure!(
        is_socket(bed.node_path(MUNGE_SOCKET)),
        "needs munged of seed-verification"
    );
    let c = bed
        .in_node(&[AGENT, "exec", "--node-name", NODE, "--", "slurmd", "-C"])
        .context("exec -- slurmd -C")?;
    println!("  slurmd -C: {}", c.lines().next().unwrap_or_default());
    ensure!(
        c.contains(&format!(" Gres={GRES}")),
        "slurmd -C does not print Gres={GRES}: {c}"
    );
    // slurmd -G with the node's gres.conf (AutoDetect=nvidia): four GPUs, device files,
    // whole-socket cores
    let gres_conf = std::fs::read_to_string(bed.node_path("/etc/slurm/gres.conf"))?;
    ensure!(
        gres_conf.lines().any(|l| l == "AutoDetect=nvidia"),
        "gres.conf is not AutoDetect=nvidia"
    );
    let g = exec_gres_lines(bed, &[], "exec -- slurmd -G lists no GPU")?;
    for l in &g {
        println!(
            "  slurmd -G: {}",
            l.rsplit_once("Gres ").map_or(l.as_str(), |(_, r)| r)
        );
    }
    ensure!(g.len() == 4, "slurmd -G lists {} GPUs, want 4", g.len());
    // the cores each GPU should get, from its local_cpulist in the served tree (exec renders the
    // same profile on the same host) and the node's sockets
    let sockets = node_sockets(bed)?;
    let c_line = slurmd_c(bed)?;
    let gpus = gpus_by_minor(bed)?;
    for (m, bus) in &gpus {
        let cores = slurm_cores(&c_line, gpu_socket(bed, &sockets, bus)?)?;
        let want = format!(" File=/dev/nvidia{m} Cores={cores} ");
        let found = g.iter().any(|l| {
            l.find("Type=nvidia_gb300 ")
                .is_some_and(|i| l[i + "Type=nvidia_gb300 ".len()..].contains(&want))
        });
        ensure!(
            found,
            "slurmd -G: no nvidia_gb300 with File=/dev/nvidia{m} Cores={cores}"
        );
    }
    ensure!(
        gpus.len() == 4,
        "the agent serves {} GPUs, want 4",
        gpus.len()
    );
    // AutoDetect=nvml: Slurm's own NVML plugin (slurm-wlm-nvml-plugin) loads the mock
    // libnvidia-ml.so.1 that exec provides, and must register the same GPUs, types, files and
    // cores, and, GB300 having NVLink, a Links= list with -1 at the GPU's own index
    let d = bed.node_path("/etc/slurm-nvml");
    if d.exists() {
        std::fs::remove_dir_all(&d)?;
    }
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(bed.node_path("/etc/slurm"))
        .arg(&d)
        .status()?;
    ensure!(cp.success(), "cp -a /etc/slurm /etc/slurm-nvml: {cp}");
    let gn = std::fs::write(d.join("gres.conf"), "AutoDetect=nvml\n")
        .map_err(anyhow::Error::from)
        .and_then(|()| {
            exec_gres_lines(
                bed,
                &["SLURM_CONF=/etc/slurm-nvml/slurm.conf"],
                "exec -- slurmd -G with AutoDetect=nvml lists no GPU",
            )
        });
    std::fs::remove_dir_all(&d)?;
    let gn = gn?;
    for l in &gn {
        println!(
            "  slurmd -G (nvml): {}",
            l.rsplit_once("Gres ").map_or(l.as_str(), |(_, r)| r)
        );
    }
    ensure!(
        gn.len() == 4,
        "slurmd -G (AutoDetect=nvml) lists {} GPUs, want 4",
        gn.len()
    );
    for m in ALL_MINORS {
        let want: Vec<String> = g.iter().filter_map(|l| gres_key(l, m)).collect();
        let want = want.join("\n");
        let file = format!("File=/dev/nvidia{m} ");
        let lines: Vec<&String> = gn.iter().filter(|l| l.contains(&file)).collect();
        ensure!(
            !lines.is_empty(),
            "AutoDetect=nvml: no GPU with File=/dev/nvidia{m}"
        );
        let got: Vec<String> = lines.iter().filter_map(|l| gres_key(l, m)).collect();
        let line = lines
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n");
        ensure!(
            got.join("\n") == want,
            "AutoDetect=nvml and AutoDetect=nvidia differ for /dev/nvidia{m}: '{line}' against '{want}'"
        );
        let links: Vec<&str> = line
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("Links="))
            .collect();
        let links = links.join("\n");
        ensure!(
            links.split(',').nth(m as usize) == Some("-1"),
            "AutoDetect=nvml: /dev/nvidia{m} has Links={links}, want -1 at index {m}"
        );
    }
    Ok(())
}

/// A TCP socket (IPv4 or IPv6) listens on `port` in the node's network namespace.
fn listening(bed: &Bed, port: u16) -> bool {
    let Ok(pid) = bed.node_pid() else {
        return false;
    };
    let suffix = format!(":{port:04X}");
    ["tcp", "tcp6"].iter().any(|f| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() > 3 && w[3] == "0A" && w[1].ends_with(&suffix)
            })
        })
    })
}

/// slurmrestd on `port`: JWT authentication only, as user slurm (it refuses to run as root or
/// SlurmUser); SLURM_JWT=daemon: it talks to slurmctld with the client's token, not munge. Only
/// the slurmctld OpenAPI plugin: no slurmdbd here.
async fn slurmrestd_up(bed: &Bed, port: u16, flags: &[&str]) -> Result<()> {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec![
        "SLURM_JWT=daemon",
        "slurmrestd",
        "-s",
        "openapi/slurmctld",
        "-a",
        "rest_auth/jwt",
        "-u",
        "slurm",
        "-g",
        "slurm",
    ];
    args.extend_from_slice(flags);
    args.push(&listen);
    bed.spawn("slurmrestd", "slurmrestd.log", &args)?;
    wait_for(10, &format!("slurmrestd on port {port}"), || async {
        listening(bed, port)
    })
    .await
    .map_err(|e| anyhow!("{e:#}\n{}", tail(&bed.logs.join("slurmrestd.log"), 10)))
}

/// The controller's client in the node: `slurm-delete-node` of `node` through slurmrestd on
/// `port` with a token file.
fn delete_node(bed: &Bed, port: u16, token: &str, node: &str, flags: &[&str]) -> Result<Output> {
    let url = format!("http://127.0.0.1:{port}");
    let mut args = vec![
        "/opt/mockgpu/mockgpu-controller",
        "slurm-delete-node",
        "--slurmrestd-url",
        &url,
        "--slurm-user",
        "root",
        "--token-file",
        token,
    ];
    args.extend_from_slice(flags);
    args.push(node);
    bed.innode(&args)?
        .output()
        .with_context(|| format!("slurm-delete-node {node}"))
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
    .trim_end()
    .to_owned()
}

/// The delete must succeed and print `want`.
fn delete_prints(bed: &Bed, port: u16, what: &str, want: &str) -> Result<()> {
    let out = delete_node(bed, port, JWT, DYN_NODE, &[])?;
    ensure!(out.status.success(), "{what}: {}", both(&out));
    let s = stdout(&out);
    ensure!(s == want, "{what} printed '{s}', want '{want}'");
    Ok(())
}

/// A dynamic slurmd (`-Z`) with four hand-made GPUs (gres.conf of `Gres::Fake`).
async fn dyn_slurmd_up(bed: &Bed, cri: &mut Cri) -> Result<Ctr> {
    cri.down(&[SLURMD_POD.into()]).await?;
    let mut pod: PodSpec = bed.pod(SLURMD_POD);
    pod.labels = HashMap::from([("app.kubernetes.io/name".into(), "slurmd".into())]);
    let mut c = slurmd_spec(&format!(
        "mkdir -p /var/spool/slurmd && exec slurmd -D -Z -N {DYN_NODE} --conf-server 127.0.0.1:6817 --conf 'Gres={GRES}'"
    ))?;
    c.devices = nvidia_devices()?;
    bed.up_kept("slurmd-dyn", cri, &pod, &c).await
}

fn dyn_known(bed: &Bed) -> bool {
    bed.in_node(&["scontrol", "show", "node", DYN_NODE]).is_ok()
}

/// The same token, one character of its signature (the third dot-separated field) changed.
fn forge(token: &str) -> String {
    let mut out = String::new();
    for line in token.lines() {
        let mut f: Vec<String> = line.split('.').map(str::to_owned).collect();
        if let Some(s) = f.get_mut(2) {
            let chars: Vec<char> = s.chars().collect();
            if chars.len() >= 5 {
                let c = if chars[4] == 'A' { 'B' } else { 'A' };
                *s = chars[..4]
                    .iter()
                    .chain([c].iter())
                    .chain(chars[5..].iter())
                    .collect();
            }
        }
        out.push_str(&f.join("."));
        out.push('\n');
    }
    out
}

/// The controller binary to copy into the node: `$CONTROLLER_BIN`, or the one beside this binary.
fn controller_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CONTROLLER_BIN").filter(|p| !p.is_empty()) {
        return Ok(p.into());
    }
    let exe = std::env::current_exe()?;
    Ok(exe.with_file_name("mockgpu-controller"))
}

/// Remediation's Slurm side: `mockgpu-controller slurm-delete-node` (the controller's slurmrestd
/// client) against slurmrestd with auth/jwt deletes a dynamic node's record (slurmd -Z, as
/// Slinky's NodeSets register their pods); a forged token is refused; a second delete finds it
/// gone; the recreated pod registers again; an older data parser; a server that never answers.
pub async fn slurmrestd_delete_node(bed: &Bed) -> Result<()> {
    let bin = controller_bin()?;
    let exe =
        std::fs::metadata(&bin).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    ensure!(
        exe,
        "no controller binary at {} (bash tests/build-bins.sh)",
        bin.display()
    );
    let opt = bed.node_path("/opt/mockgpu");
    std::fs::create_dir_all(&opt)?;
    std::fs::copy(&bin, opt.join("mockgpu-controller.new"))
        .with_context(|| format!("copy {}", bin.display()))?;
    std::fs::rename(
        opt.join("mockgpu-controller.new"),
        opt.join("mockgpu-controller"),
    )?;
    bed.stop(Signal::SIGTERM, &["mute", "slurmrestd"]).await?; // left by an earlier failed run
    write_conf(bed, Gres::Fake, false)?;
    let key = bed.node_path("/etc/slurm/jwt_hs256.key");
    let mut random = [0u8; 32];
    std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut random)?;
    std::fs::write(&key, random)?;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))?;
    let conf = bed.node_path("/etc/slurm/slurm.conf");
    let mut f = std::fs::OpenOptions::new().append(true).open(&conf)?;
    std::io::Write::write_all(
        &mut f,
        b"AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=/etc/slurm/jwt_hs256.key\nMaxNodeCount=8\n",
    )?;
    drop(f);
    ctl_up(bed).await?;
    std::fs::write(bed.logs.join("slurmrestd.log"), "")?;
    slurmrestd_up(bed, RESTD_PORT, &[]).await?;
    let mut cri = bed.cri().await?;
    let t = Instant::now();
    dyn_slurmd_up(bed, &mut cri).await?;
    wait_idle(
        bed,
        30,
        &format!("dynamic node {DYN_NODE} to register idle"),
        DYN_NODE,
    )
    .await?;
    bed.timing(
        "dynamic-slurmd-idle",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let token = bed.in_node(&["scontrol", "token", "username=root", "lifespan=600"])?;
    std::fs::write(bed.node_path(JWT), &token)?;
    ensure!(
        token.lines().any(|l| l.starts_with("SLURM_JWT=eyJ")),
        "scontrol token printed no JWT: {}",
        token.chars().take(100).collect::<String>()
    );
    let forged = forge(&token);
    std::fs::write(bed.node_path(JWT_FORGED), &forged)?;
    ensure!(forged != token, "the forged token equals the real one");

    // a forged token: slurmctld rejects it (slurmrestd: 511, error 1007) and the node stays
    let out = delete_node(bed, RESTD_PORT, JWT_FORGED, DYN_NODE, &[])?;
    let s = both(&out);
    ensure!(!out.status.success(), "a forged token was accepted: {s}");
    ensure!(
        s.contains("slurmrestd rejected the token"),
        "forged token: {s}"
    );
    ensure!(dyn_known(bed), "a forged token deleted {DYN_NODE}");
    let rejected: Vec<&str> = s
        .lines()
        .filter(|l| l.contains("rejected"))
        .map(str::trim_start)
        .collect();
    println!("  forged token: refused ({})", rejected.join("\n"));

    // the real one: the record goes, and stays gone while the old slurmd runs
    let t = Instant::now();
    let out = delete_node(bed, RESTD_PORT, JWT, DYN_NODE, &[])?;
    ensure!(
        out.status.success(),
        "slurm-delete-node {DYN_NODE}: {}",
        both(&out)
    );
    bed.timing(
        "slurmrestd-delete-node",
        &format!("{} ms (the whole subcommand)", t.elapsed().as_millis()),
    );
    let s = stdout(&out);
    ensure!(
        s == "deleted",
        "slurm-delete-node printed '{s}', want 'deleted'"
    );
    ensure!(
        !dyn_known(bed),
        "scontrol show node still lists {DYN_NODE} after the delete"
    );
    let shown = bed
        .innode(&["scontrol", "show", "node", DYN_NODE])?
        .output()?;
    println!("  after the delete: {}", both(&shown));
    let prefix = format!("{DYN_NODE} ");
    ensure!(
        !sinfo(bed)?.lines().any(|l| l.starts_with(&prefix)),
        "sinfo still lists {DYN_NODE}"
    );

    // already gone: slurmrestd answers 500 with error 2018, the client says so and succeeds
    delete_prints(
        bed,
        RESTD_PORT,
        &format!("second delete of {DYN_NODE}"),
        "already gone",
    )?;

    // the pod deleted and recreated (what remediation does to slurmd pods): a fresh registration
    let t = Instant::now();
    dyn_slurmd_up(bed, &mut cri).await?;
    wait_idle(bed, 30, &format!("{DYN_NODE} to register again"), DYN_NODE).await?;
    bed.timing(
        "dynamic-slurmd-reregistered",
        &format!("{} ms", t.elapsed().as_millis()),
    );
    let s = sinfo(bed)?;
    check(bed, s.contains(&format!("{DYN_NODE} idle {GRES}")), || {
        format!("{DYN_NODE} registered without its GPUs")
    })?;
    let out = srun_cuda_visible(bed, &["-w", DYN_NODE, "--gres=gpu:2"])
        .map_err(|e| with_logs(bed, e.context(format!("srun --gres=gpu:2 on {DYN_NODE}"))))?;
    ensure!(
        out == "CUDA_VISIBLE_DEVICES=0,1",
        "srun --gres=gpu:2: {out}"
    );
    let line: Vec<&str> = s.lines().filter(|l| l.starts_with(&prefix)).collect();
    println!(
        "  re-registered: {}; srun --gres=gpu:2: {out}",
        line.join("\n")
    );

    // an older API only (data_parser v0.0.40): v0.0.42 and v0.0.41 are 404 there, the client
    // falls back; a Slurm without that parser (26.05 serves v0.0.42-45) cannot show it
    let old = bed
        .innode(&["sh", "-c", "ls /usr/lib/*/slurm-wlm/data_parser_v0_0_40.so"])?
        .output()?;
    if old.status.success() {
        slurmrestd_up(bed, RESTD_OLD_PORT, &["-d", "data_parser/v0.0.40"]).await?;
        delete_prints(bed, RESTD_OLD_PORT, "delete through v0.0.40", "deleted")?;
        ensure!(
            !dyn_known(bed),
            "scontrol show node still lists {DYN_NODE} after the delete through v0.0.40"
        );
        println!("  slurmrestd with data_parser v0.0.40 only: deleted");
    } else {
        let v = bed.in_node(&["slurmd", "-V"])?;
        println!(
            "  the fallback to v0.0.40 left out: this Slurm ({}) has no data_parser v0.0.40",
            v.trim()
        );
    }

    // a server that never answers: the request times out
    bed.in_node(&["sh", "-c", "rm -f /run/mgtb-mute; mkfifo /run/mgtb-mute"])?;
    bed.spawn(
        "mute",
        "mute.log",
        &[
            "sh",
            "-c",
            &format!("exec busybox nc -l -p {MUTE_PORT} <> /run/mgtb-mute"),
        ],
    )?;
    wait_for(10, "the mute listener", || async {
        listening(bed, MUTE_PORT)
    })
    .await?;
    let t = Instant::now();
    let out = delete_node(bed, MUTE_PORT, JWT, DYN_NODE, &["--timeout", "1"])?;
    let took = t.elapsed().as_millis();
    let s = both(&out);
    ensure!(
        !out.status.success(),
        "a server that never answers: the delete succeeded: {s}"
    );
    ensure!(
        s.contains("slurmrestd did not answer in time"),
        "a server that never answers: {s}"
    );
    ensure!(
        (1000..5000).contains(&took),
        "the 1 s timeout took {took} ms"
    );
    println!("  a server that never answers: timed out after {took} ms");
    bed.stop(Signal::SIGTERM, &["mute", "slurmrestd"]).await?;
    cri.down(&[SLURMD_POD.into()]).await?;
    ctl_down(bed).await
}

/// The `GPU-…` UUIDs in a text, in order.
pub(crate) fn uuids_in(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("GPU-") {
        let tail = &rest[i..];
        let n = 4 + tail[4..]
            .find(|c: char| !matches!(c, '0'..='9' | 'a'..='f' | '-'))
            .unwrap_or(tail.len() - 4);
        out.push(tail[..n].to_owned());
        rest = &tail[n..];
    }
    out
}

/// Signals the first job (the `timeout` in front of its srun) and reaps it.
fn end_job(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        kill(Pid::from_raw(pid), Signal::SIGTERM).ok();
    }
    child.wait().ok();
}

/// The two jobs at once: the first holds its GPUs (reading a fifo in the slurmd container) until
/// the second has listed its own. Their `nvidia-smi -L` outputs.
async fn concurrent_jobs(bed: &Bed, cri: &mut Cri, slurmd: &Ctr) -> Result<(String, String)> {
    exec_ok(
        cri,
        slurmd,
        &["sh", "-c", "rm -f /tmp/mgtb-hold; mkfifo /tmp/mgtb-hold"],
    )
    .await?;
    let job_a = bed.logs.join("job-a.txt");
    let out = std::fs::File::create(&job_a)?;
    // (--mem: the node's whole memory is each job's default, which would make them take turns)
    let mut a = bed
        .innode(&[
            "timeout",
            "60",
            "srun",
            "-D",
            "/",
            "-N1",
            "--mem=100",
            "--gres=gpu:2",
            "sh",
            "-c",
            "nvidia-smi -L; read -r _ < /tmp/mgtb-hold",
        ])?
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out)
        .spawn()
        .context("srun of the first job")?;
    let read_a = || std::fs::read_to_string(&job_a).unwrap_or_default();
    let second = async {
        wait_for(30, "the first job to list its GPUs", || async {
            read_a().lines().any(|l| l.starts_with("GPU 1: "))
        })
        .await
        .map_err(|e| anyhow!("{e:#}; the first job listed: {}", read_a()))?;
        let s = srun_ok(bed, &["--mem=100", "--gres=gpu:2", "nvidia-smi", "-L"])
            .map_err(|e| with_logs(bed, e.context("srun of the second job")))?;
        exec_ok(cri, slurmd, &["sh", "-c", "echo done > /tmp/mgtb-hold"]).await?;
        Ok::<_, anyhow::Error>(s)
    }
    .await;
    let s = match second {
        Ok(s) => s,
        Err(e) => {
            end_job(&mut a);
            return Err(e);
        }
    };
    let status = a.wait().context("the first job")?;
    ensure!(
        status.success(),
        "the first job failed ({status}): {}",
        read_a()
    );
    Ok((read_a(), s))
}

/// `ConstrainDevices=yes`: a job lists and opens only its own GPUs (nvidia-smi -L shows the UUIDs
/// of minors 0 and 1 as GPU 0 and 1; opening 2 and 3 fails with EPERM), and two jobs at once get
/// disjoint pairs.
pub async fn constrain_devices(bed: &Bed) -> Result<()> {
    write_conf(bed, Gres::Nvidia, true)?;
    ctl_up(bed).await?;
    let mut cri = bed.cri().await?;
    let slurmd = slurmd_up(bed, &mut cri, "slurmd", |c| {
        c.env = gpu_env();
        Ok(())
    })
    .await?;
    wait_idle(bed, 30, "slurmd to register idle", NODE).await?;
    let cgroup_conf = std::fs::read_to_string(bed.node_path("/etc/slurm/cgroup.conf"))?;
    println!("  cgroup.conf: {}", cgroup_conf.replace('\n', " "));
    // the guide's verification: two GPUs, those Slurm allocated (minors 0 and 1), as GPU 0 and 1
    let s = srun_ok(bed, &["--gres=gpu:2", "sh", "-c", VERIFY])
        .map_err(|e| with_logs(bed, e.context("srun --gres=gpu:2 nvidia-smi -L")))?;
    check_verify(bed, &s, "srun --gres=gpu:2 nvidia-smi -L")?;
    // opening the nodes in the job: the device cgroup refuses the other two before any driver is
    // looked up; the allocated ones pass it, find no driver behind 195:N (ENXIO), and the shim
    // (in the job through /etc/ld.so.preload) opens /dev/null in their place
    let s = srun_ok(bed, &["--gres=gpu:2", "sh", "-c", OPEN_GPUS])
        .context("srun: opening the GPU nodes")?;
    check_open(&s)?;
    // two jobs at once get disjoint pairs: the first holds its GPUs until the second has listed
    let (a, b) = concurrent_jobs(bed, &mut cri, &slurmd).await?;
    let ua = uuids_in(&a);
    let ub = uuids_in(&b);
    let show = |u: &[String]| u.iter().map(|u| format!("UUID: {u} ")).collect::<String>();
    println!("  concurrent jobs: {}| {}", show(&ua), show(&ub));
    let uuids = gpu_uuids(bed)?;
    let first: Vec<String> = uuids
        .iter()
        .filter(|(m, _)| *m < 2)
        .map(|(_, u)| u.clone())
        .collect();
    let second: Vec<String> = uuids
        .iter()
        .filter(|(m, _)| *m >= 2)
        .map(|(_, u)| u.clone())
        .collect();
    ensure!(
        ua == first,
        "the first job: want minors 0 and 1 ({first:?}), got {ua:?}"
    );
    ensure!(
        ub == second,
        "the second job: want minors 2 and 3 ({second:?}), got {ub:?}"
    );
    cri.down(&[SLURMD_POD.into()]).await?;
    ctl_down(bed).await
}
