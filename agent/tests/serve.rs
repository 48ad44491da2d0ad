//! `mockgpu-agent serve` as a process (needs root and /dev/fuse): mounts, installs the shim,
//! answers health checks, follows a ConfigMap-style profile swap, survives a SIGKILLed
//! predecessor's stale mount and unmounts on SIGTERM.

use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(port: u16, path: &str) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

/// Writes `content` as a new ConfigMap data version and swaps `..data` atomically.
fn configmap_write(dir: &Path, version: u32, content: &str) {
    let v = dir.join(format!("..v{version}"));
    fs::create_dir(&v).unwrap();
    fs::write(v.join("profile.yaml"), content).unwrap();
    let tmp = dir.join("..data_tmp");
    symlink(format!("..v{version}"), &tmp).unwrap();
    fs::rename(&tmp, dir.join("..data")).unwrap();
}

struct Agent {
    child: Child,
    port: u16,
}

impl Drop for Agent {
    /// A failing assertion must not leave an agent running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(profile: &Path, mountpoint: &Path) -> Agent {
    let port = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args([
            "serve",
            "--node-name",
            "node-0",
            "--reload-interval",
            "0.1",
            "--listen",
        ])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--profile-file")
        .arg(profile)
        .arg("--dir")
        .arg(mountpoint.parent().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    Agent { child, port }
}

fn gpu_count(mountpoint: &Path) -> usize {
    fs::read_dir(mountpoint.join("proc/driver/nvidia/gpus")).map_or(0, |d| d.count())
}

#[test]
fn serve_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    let cm = dir.path().join("config");
    fs::create_dir(&cm).unwrap();
    configmap_write(&cm, 1, "base: gb300\n");
    symlink("..data/profile.yaml", cm.join("profile.yaml")).unwrap();
    let run: PathBuf = dir.path().join("run");
    let mnt = run.join("fs");

    let mut agent = start(&cm.join("profile.yaml"), &mnt);
    wait_for("the tree", || gpu_count(&mnt) == 4);
    assert!(http_get(agent.port, "/healthz").starts_with("HTTP/1.1 200"));
    wait_for("readiness", || {
        http_get(agent.port, "/readyz").starts_with("HTTP/1.1 200")
    });
    let metrics = http_get(agent.port, "/metrics");
    assert!(metrics.contains("mockgpu_gpus 4"), "{metrics}");
    assert_eq!(
        &fs::read(run.join("lib/libmockfs.so")).unwrap()[..4],
        b"\x7fELF"
    );
    assert_eq!(
        fs::read_to_string(run.join("ld.so.preload")).unwrap(),
        "/run/mockgpu/lib/libmockfs.so\n"
    );
    assert!(
        mockgpu_agent::mounts::is_mount_point(&run),
        "parent made a mount point"
    );

    // ConfigMap update: 4 -> 2 GPUs without a remount.
    configmap_write(&cm, 2, "base: gb300\ngpus: 2\n");
    wait_for("the reload", || gpu_count(&mnt) == 2);
    // A broken profile is rejected and the previous tree stays.
    configmap_write(&cm, 3, "base: gb300\ngpus: [\n");
    wait_for("the rejection", || {
        http_get(agent.port, "/metrics").contains("mockgpu_profile_reload_errors_total 1")
    });
    assert_eq!(gpu_count(&mnt), 2);

    // SIGKILL leaves a dead mount behind; the next agent detaches it and serves again.
    agent.child.kill().unwrap();
    agent.child.wait().unwrap();
    // The dead mount still answers what the agent had warmed into the kernel's caches; anything
    // that needs the agent fails with ENOTCONN.
    let err = fs::metadata(mnt.join("not-there")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOTCONN), "{err}");
    assert!(
        fs::read_to_string(mnt.join("proc/driver/nvidia/version"))
            .unwrap()
            .starts_with("NVRM")
    );
    configmap_write(&cm, 4, "base: gb300\n");
    drop(agent);
    let mut agent = start(&cm.join("profile.yaml"), &mnt);
    wait_for("the restarted tree", || gpu_count(&mnt) == 4);

    // SIGTERM: clean unmount and exit status 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(agent.child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = agent.child.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!mockgpu_agent::mounts::is_mount_point(&mnt));
    nix::mount::umount2(&run, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

#[test]
fn real_driver_means_report_only() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("real");
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["render", "--profile", "h100", "--out"])
        .arg(&real)
        .output()
        .unwrap();
    assert!(out.status.success());
    let port = free_port();
    let mnt = dir.path().join("run/fs");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["serve", "--listen"])
        .arg(format!("127.0.0.1:{port}"))
        .arg("--procfs")
        .arg(real.join("proc"))
        .arg("--sysfs")
        .arg(real.join("sys"))
        .arg("--dir")
        .arg(mnt.parent().unwrap())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the report", || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
            && http_get(port, "/metrics").contains("mockgpu_real_gpus 8")
    });
    assert!(http_get(port, "/readyz").starts_with("HTTP/1.1 200"));
    assert!(
        !mnt.exists(),
        "nothing is mounted or installed on a real GPU node"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}
