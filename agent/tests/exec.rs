//! Real programs under `mockgpu-agent exec` (needs root, /dev/fuse, fusermount3, the shim, and
//! the programs: coreutils, findutils, python3, pciutils, hwloc, util-linux; CI installs them).
//! Tests that mount something, or whose agent is killed, run in a private mount namespace of
//! their own, so that no mount outlives them, even when they fail.
//!
//! The agent reads a fake sysfs (`--sysfs`), never this machine's PCI devices: the fixture
//! `two-socket`, or for programs that read the machine's CPUs themselves (lspci, hwloc) a tree of
//! this machine's CPUs and NUMA nodes without PCI devices. Expected bus ids come from the same
//! tree.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use mockgpu_agent::host::SysfsHost;
use mockgpu_agent::sys::{Linux, Sys};
use mockgpu_api::{NodeTopology, Profile};
use nix::mount::MsFlags;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

mod common;

use common::{fixture, in_private_namespace, wait_for};

fn agent() -> Command {
    Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
}

/// `agent exec --sysfs <sysfs>`, to be followed by options and `-- cmd…`.
fn agent_exec(mut agent: Command, sysfs: &Path) -> Command {
    agent.arg("exec").arg("--sysfs").arg(sysfs);
    agent
}

/// A sysfs below `dir` with this machine's CPUs and NUMA nodes (a link to
/// `/sys/devices/system`) and no PCI devices, for programs that read the machine's CPUs
/// themselves: the GPUs' local CPUs are then the machine's, and no host device is listed.
fn cpus_only_sysfs(dir: &Path) -> PathBuf {
    let root = dir.join("sysfs");
    fs::create_dir_all(root.join("bus/pci/devices")).unwrap();
    fs::create_dir(root.join("devices")).unwrap();
    std::os::unix::fs::symlink("/sys/devices/system", root.join("devices/system")).unwrap();
    root
}

/// The bus ids of the GB300 (default profile) GPUs that `exec` places on `sysfs` for node
/// `node-0`, in order.
fn gb300(sysfs: &Path) -> Vec<String> {
    let host = SysfsHost::new(sysfs).probe().unwrap();
    let profile = Profile::builtin("gb300").unwrap();
    let gpus = NodeTopology::build(&profile, "node-0", &host).unwrap().gpus;
    let mut ids: Vec<String> = gpus.iter().map(|g| g.bus_id.to_string()).collect();
    ids.sort();
    assert_eq!(ids.len(), 4, "{ids:?}");
    ids
}

/// Runs `mockgpu-agent exec --sysfs <sysfs> [args] -- cmd…` and returns (exit code, stdout,
/// stderr).
fn exec_on(sysfs: &Path, profile: &[&str], cmd: &[&str]) -> (i32, String, String) {
    let out = agent_exec(agent(), sysfs)
        .args(["--node-name", "node-0"])
        .args(profile)
        .arg("--")
        .args(cmd)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// [`exec_on`] the `two-socket` fixture.
fn exec(profile: &[&str], cmd: &[&str]) -> (i32, String, String) {
    exec_on(&fixture("two-socket"), profile, cmd)
}

/// The stdout of a successful [`exec_on`].
fn ok_on(sysfs: &Path, profile: &[&str], cmd: &[&str]) -> String {
    let (code, stdout, stderr) = exec_on(sysfs, profile, cmd);
    assert_eq!(code, 0, "{cmd:?} failed: {stderr}");
    stdout
}

/// [`ok_on`] the `two-socket` fixture.
fn ok(profile: &[&str], cmd: &[&str]) -> String {
    ok_on(&fixture("two-socket"), profile, cmd)
}

#[test]
fn coreutils_see_the_driver_tree() {
    let gpus = gb300(&fixture("two-socket"));
    let lines = |ids: &[String]| ids.iter().map(|id| format!("{id}\n")).collect::<String>();
    let out = ok(&[], &["cat", "/proc/driver/nvidia/version"]);
    assert!(
        out.starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.173.02 "),
        "{out}"
    );
    let out = ok(&[], &["ls", "/proc/driver/nvidia/gpus"]);
    assert_eq!(out, lines(&gpus));
    let out = ok(
        &[],
        &["ls", "-l", &format!("/proc/driver/nvidia/gpus/{}", gpus[0])],
    );
    assert!(
        out.contains(" information\n") && out.contains(" power\n"),
        "{out}"
    );
    let out = ok(
        &[],
        &["find", "/proc/driver/nvidia/gpus", "-name", "information"],
    );
    assert_eq!(out.lines().count(), 4, "{out}");
    let out = ok(
        &[],
        &["stat", "-c", "%F %t:%T", "/dev/nvidia2", "/dev/nvidiactl"],
    );
    assert_eq!(
        out,
        "character special file c3:2\ncharacter special file c3:ff\n"
    );
    let out = ok(
        &[],
        &[
            "readlink",
            &format!("/sys/bus/pci/drivers/nvidia/{}", gpus[2]),
        ],
    );
    let root = gpus[2].rsplit_once(':').unwrap().0;
    assert_eq!(out, format!("../../../../devices/pci{root}/{}\n", gpus[2]));
    let out = ok(
        &[],
        &["cat", &format!("/sys/bus/pci/devices/{}/device", gpus[3])],
    );
    assert_eq!(out, "0x31c2\n");
    // The fixture's PCI devices are listed beside the GPUs, as absolute links to their sysfs.
    let out = ok(&[], &["ls", "/sys/bus/pci/devices"]);
    let mut all = gpus.clone();
    all.extend(["0000:00:00.0".to_string(), "0000:00:1e.0".to_string()]);
    all.sort();
    assert_eq!(out, lines(&all));
    let out = ok(&[], &["readlink", "/sys/bus/pci/devices/0000:00:1e.0"]);
    assert_eq!(out, "/sys/devices/pci0000:00/0000:00:1e.0\n");
    // Paths outside the prefixes are untouched.
    let out = ok(&[], &["cat", "/proc/self/comm"]);
    assert_eq!(out, "cat\n");
}

#[test]
fn the_exit_status_is_the_commands() {
    assert_eq!(exec(&[], &["sh", "-c", "exit 7"]).0, 7);
    assert_eq!(exec(&[], &["sh", "-c", "kill -TERM $$"]).0, 128 + 15);
    assert_eq!(exec(&[], &["/nonexistent/program"]).0, 127);
}

#[test]
fn python_lists_and_reads_from_many_threads() {
    let script = r#"
import os, threading
gpus = sorted(os.listdir("/proc/driver/nvidia/gpus"))
errors = []
def work():
    for _ in range(200):
        for g in gpus:
            with open(f"/proc/driver/nvidia/gpus/{g}/information") as f:
                if not f.read().startswith("Model: \t\t NVIDIA H100 80GB HBM3\n"):
                    errors.append(g)
threads = [threading.Thread(target=work) for _ in range(8)]
[t.start() for t in threads]; [t.join() for t in threads]
print(len(gpus), len(errors))
"#;
    assert_eq!(
        ok(&["--profile", "h100"], &["python3", "-c", script]),
        "8 0\n"
    );
}

#[test]
fn nvidia_smi_lists_the_profiles_gpus() {
    let out = ok(&[], &["nvidia-smi", "-L"]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "{out}");
    for (i, line) in lines.iter().enumerate() {
        assert!(
            line.starts_with(&format!("GPU {i}: NVIDIA GB300 (UUID: GPU-")),
            "{out}"
        );
    }
}

#[test]
fn the_gpu_nodes_open_as_on_a_gpu_node() {
    // The tree's nodes lie on a nodev mount (EACCES); the shim opens /dev/null in their place.
    let script = r#"
import os
for n in ["0", "1", "2", "3", "ctl", "-uvm", "-uvm-tools", "9"]:
    p = "/dev/nvidia" + n
    try:
        fd = os.open(p, os.O_RDWR)
        print(p, len(os.read(fd, 8)))
        os.close(fd)
    except OSError as e:
        print(p, e.strerror)
"#;
    assert_eq!(
        ok(&[], &["python3", "-c", script]),
        "/dev/nvidia0 0\n/dev/nvidia1 0\n/dev/nvidia2 0\n/dev/nvidia3 0\n/dev/nvidiactl 0\n\
         /dev/nvidia-uvm 0\n/dev/nvidia-uvm-tools 0\n/dev/nvidia9 No such file or directory\n"
    );
}

#[test]
fn a_program_dlopens_the_nvml_by_either_name() {
    // As go-nvml and pynvml do (the SONAME), and Slurm (the name without version).
    let script = r#"
import ctypes, sys
for name in ["libnvidia-ml.so.1", "libnvidia-ml.so"]:
    nvml = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    count = ctypes.c_uint(0)
    assert nvml.nvmlInit_v2() == 0, name
    assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0, name
    assert nvml.nvmlShutdown() == 0, name
    print(name, count.value)
"#;
    assert_eq!(
        ok(&["--profile", "h100"], &["python3", "-c", script]),
        "libnvidia-ml.so.1 8\nlibnvidia-ml.so 8\n"
    );
}

#[test]
fn lspci_lists_the_mock_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = cpus_only_sysfs(dir.path());
    let gpus = gb300(&sysfs);
    let want: String = gpus
        .iter()
        .map(|g| format!("{g} 0302: 10de:31c2 (rev a1)\n"))
        .collect();
    assert_eq!(ok_on(&sysfs, &[], &["lspci", "-d", "10de:", "-n"]), want);
    // No host device in this sysfs: the GPUs are all there is.
    assert_eq!(ok_on(&sysfs, &[], &["lspci", "-n"]), want);
    let kernel = ok_on(&sysfs, &[], &["lspci", "-k", "-d", "10de:"]);
    assert_eq!(
        kernel.matches("Kernel driver in use: nvidia").count(),
        4,
        "{kernel}"
    );
    let verbose = ok_on(&sysfs, &[], &["lspci", "-vv", "-s", &gpus[0]]);
    assert!(
        verbose.contains("Subsystem: NVIDIA Corporation Device 21f1"),
        "{verbose}"
    );
}

#[test]
fn hwloc_places_each_gpu_at_its_local_cpus() {
    let dir = tempfile::tempdir().unwrap();
    let sysfs = cpus_only_sysfs(dir.path());
    let gpus = gb300(&sysfs);
    let topo = ok_on(&sysfs, &[], &["lstopo-no-graphics"]);
    for gpu in &gpus {
        assert!(
            topo.contains(&format!("PCI {gpu} (3D)")),
            "{gpu} missing from:\n{topo}"
        );
    }
    let parse = |s: &str| {
        u128::from_str_radix(&s.trim().trim_start_matches("0x").replace(',', ""), 16).unwrap()
    };
    for gpu in &gpus {
        let hwloc = ok_on(&sysfs, &[], &["hwloc-calc", &format!("pci={gpu}")]);
        let local = ok_on(
            &sysfs,
            &[],
            &["cat", &format!("/sys/bus/pci/devices/{gpu}/local_cpus")],
        );
        assert_eq!(parse(&hwloc), parse(&local), "{gpu}");
    }
    let xml = ok_on(
        &sysfs,
        &["--profile", "h100"],
        &["lstopo-no-graphics", "--of", "xml", "--whole-io"],
    );
    let gpus = xml
        .lines()
        .filter(|l| l.contains("pci_type=\"0302 [10de:2330] [10de:16c1] a1\""))
        .count();
    assert_eq!(gpus, 8, "{xml}");
}

/// An `exec` whose command reports its pid in a file once it runs, then sleeps.
struct Running {
    agent: Child,
    /// The command's pid.
    command: Pid,
}

impl Drop for Running {
    /// A failing assertion must not leave an agent running.
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
    }
}

/// Starts `agent exec --sysfs <sysfs> -- sh -c …` with `tmp` as its `TMPDIR` and waits until the
/// command runs.
fn start_sleeper(agent: Command, sysfs: &Path, tmp: &Path) -> Running {
    let ready = tempfile::tempdir().unwrap();
    fs::set_permissions(ready.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let file = ready.path().join("pid");
    // The pid file appears (atomically) only once the command can read the tree.
    let script = format!(
        "ls /proc/driver/nvidia/gpus > /dev/null && echo $$ > {f}.tmp && mv {f}.tmp {f} && exec sleep 30",
        f = file.display()
    );
    let agent = agent_exec(agent, sysfs)
        .args(["--", "sh", "-c", &script])
        .env("TMPDIR", tmp)
        .spawn()
        .unwrap();
    let mut running = Running {
        agent,
        command: Pid::from_raw(0),
    };
    wait_for("the command to run", || file.exists());
    running.command = Pid::from_raw(fs::read_to_string(&file).unwrap().trim().parse().unwrap());
    running
}

/// Whether the process is gone (or a zombie nobody has reaped yet).
fn gone(pid: Pid) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(") ").next().unwrap_or("").starts_with('Z')
    })
}

fn empty(dir: &Path) -> bool {
    fs::read_dir(dir).unwrap().count() == 0
}

fn mounted_below(dir: &Path) -> bool {
    Linux.mountinfo().unwrap().contains(dir.to_str().unwrap())
}

#[test]
fn sigterm_reaches_the_command_and_everything_is_cleaned_up() {
    let tmp = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let mut run = start_sleeper(agent(), &fixture("two-socket"), tmp.path());
        kill(Pid::from_raw(run.agent.id() as i32), Signal::SIGTERM).unwrap();
        let status = run.agent.wait().unwrap();
        assert_eq!(status.code(), Some(128 + 15), "{status}");
        assert!(gone(run.command), "the command outlived the agent");
        assert!(empty(tmp.path()), "temporary files left behind");
        assert!(!mounted_below(tmp.path()), "mount left behind");
    })
}

#[test]
fn sigterm_while_exec_sets_up_still_reaches_the_command() {
    let tmp = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let mut agent = agent_exec(agent(), &fixture("two-socket"))
            .args(["--", "sleep", "30"])
            .env("TMPDIR", tmp.path())
            .spawn()
            .unwrap();
        // The temporary directory appears before the tree is mounted and the command started.
        let start = Instant::now();
        while empty(tmp.path()) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "no temporary directory"
            );
            std::thread::yield_now();
        }
        kill(Pid::from_raw(agent.id() as i32), Signal::SIGTERM).unwrap();
        let status = agent.wait().unwrap();
        assert_eq!(status.code(), Some(128 + 15), "{status}");
        assert!(empty(tmp.path()), "temporary files left behind");
    })
}

/// SIGKILLs the agent: its command dies with it, and its temporary directory (with the mount in
/// it, if the test's namespace holds one) goes soon after.
fn kill_agent_and_check(mut run: Running, tmp: &Path) {
    run.agent.kill().unwrap();
    let status = run.agent.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    wait_for("the command to die with the agent", || gone(run.command));
    wait_for("the temporary directory to be removed", || empty(tmp));
    assert!(!mounted_below(tmp), "mount left behind");
}

#[test]
fn sigkill_of_the_agent_takes_the_command_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let run = start_sleeper(agent(), &fixture("two-socket"), tmp.path());
        kill_agent_and_check(run, tmp.path());
    })
}

const NOBODY: u32 = 65534;

/// A copy of the agent that an ordinary user may run, a sysfs that user may read (see
/// [`cpus_only_sysfs`]) and a `TMPDIR` that user may write.
struct Unprivileged {
    bin: PathBuf,
    sysfs: PathBuf,
    tmp: tempfile::TempDir,
    dir: tempfile::TempDir,
}

impl Unprivileged {
    fn new() -> Unprivileged {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("mockgpu-agent");
        // Copied by another process: a write descriptor open in this one could leak into a
        // child another test thread forks meanwhile, and running the copy would fail with
        // ETXTBSY.
        let status = Command::new("install")
            .args(["-m", "0755", env!("CARGO_BIN_EXE_mockgpu-agent")])
            .arg(&bin)
            .status()
            .unwrap();
        assert!(status.success(), "install: {status}");
        let sysfs = cpus_only_sysfs(dir.path());
        let tmp = tempfile::tempdir().unwrap();
        fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o777)).unwrap();
        Unprivileged {
            bin,
            sysfs,
            tmp,
            dir,
        }
    }

    /// The agent as uid and gid 65534 without supplementary groups.
    fn agent(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.env("TMPDIR", self.tmp.path())
            .current_dir(self.tmp.path());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setgid(NOBODY) != 0
                    || libc::setuid(NOBODY) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd
    }

    /// Runs `exec -- sh -c script` as [`Unprivileged::agent`] with debug logs; returns (stdout,
    /// stderr) of a successful run that left nothing behind.
    fn exec(&self, script: &str) -> (String, String) {
        let out = agent_exec(self.agent(), &self.sysfs)
            .env("RUST_LOG", "mockgpu_agent=debug")
            .args(["--node-name", "node-0", "--", "sh", "-c", script])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{}: {stderr}", out.status);
        assert!(empty(self.tmp.path()), "temporary files left behind");
        (String::from_utf8(out.stdout).unwrap(), stderr)
    }
}

/// Bind-mounts over `/dev/fuse` (in the test thread's private namespace) a file made by `make`.
fn replace_dev_fuse(dir: &Path, make: impl FnOnce(&Path)) {
    let file = dir.join("fuse");
    make(&file);
    Linux
        .mount(Some(&file), Path::new("/dev/fuse"), MsFlags::MS_BIND)
        .unwrap();
}

/// What an ordinary user reads through `exec`: the GPUs' information files and `lspci`.
const READ: &str = "cat /proc/driver/nvidia/gpus/*/information; lspci -d 10de: -n";

/// The command's view of its own FUSE mount (the host may have other agents' mounts).
const OWN_MOUNT: &str = r#"grep ' fuse.mockgpu ' /proc/self/mountinfo | grep -F " $TMPDIR/""#;

fn assert_read(stdout: &str) {
    assert_eq!(
        stdout.matches("Model: \t\t NVIDIA GB300").count(),
        4,
        "{stdout}"
    );
    let lspci = stdout.lines().filter(|l| l.contains(" 0302: 10de:31c2"));
    assert_eq!(lspci.count(), 4, "{stdout}");
}

/// Gives the test thread's namespace a FUSE device that an ordinary user may open, as
/// distributions ship it (this host's may be 0600).
fn usable_dev_fuse(dir: &Path) {
    replace_dev_fuse(dir, |node| {
        Linux
            .mknod(
                node,
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::empty(),
                nix::sys::stat::makedev(10, 229),
            )
            .unwrap();
        fs::set_permissions(node, fs::Permissions::from_mode(0o666)).unwrap();
    });
}

#[test]
fn an_ordinary_user_gets_an_owner_only_fuse_mount_through_fusermount3() {
    let user = Unprivileged::new();
    in_private_namespace(|| {
        usable_dev_fuse(user.dir.path());
        let (stdout, stderr) = user.exec(&format!("{READ}; {OWN_MOUNT}"));
        assert!(stderr.contains("backing=Fuse"), "{stderr}");
        assert_read(&stdout);
        let mount = stdout.lines().last().unwrap();
        assert!(mount.contains("user_id=65534"), "{mount}");
        assert!(!mount.contains("allow_other"), "{mount}");
    })
}

#[test]
fn without_a_usable_fuse_device_an_ordinary_user_gets_a_rendered_copy() {
    let user = Unprivileged::new();
    in_private_namespace(|| {
        replace_dev_fuse(user.dir.path(), |file| {
            fs::write(file, "").unwrap();
            fs::set_permissions(file, fs::Permissions::from_mode(0o000)).unwrap();
        });
        let (stdout, stderr) = user.exec(&format!("{READ}; {OWN_MOUNT} | wc -l"));
        assert!(stderr.contains("backing=Rendered"), "{stderr}");
        assert!(stderr.contains("FUSE unavailable"), "{stderr}");
        assert_read(&stdout);
        assert_eq!(stdout.lines().last(), Some("0"), "no FUSE mount: {stdout}");
    })
}

#[test]
fn sigkill_of_an_ordinary_users_agent_leaves_no_fuse_mount() {
    let user = Unprivileged::new();
    in_private_namespace(|| {
        usable_dev_fuse(user.dir.path());
        let run = start_sleeper(user.agent(), &user.sysfs, user.tmp.path());
        assert!(mounted_below(user.tmp.path()), "served over fusermount3");
        kill_agent_and_check(run, user.tmp.path());
    })
}
