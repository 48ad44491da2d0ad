//! `mockgpu-agent serve` as a process (needs root and /dev/fuse): mounts, installs the shim,
//! answers health checks, follows a ConfigMap-style profile swap, survives a SIGKILLed
//! predecessor's stale mount, leaves a live agent's mount alone and unmounts on SIGTERM. Each
//! test runs in a private mount namespace of its own (agents inherit it), so that no mount
//! outlives it, even when it fails.

mod common;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{in_private_namespace, wait_for};
use mockgpu_agent::mounts::is_mount_point;

fn http_get(addr: SocketAddr, path: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
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
    /// The health endpoint's address.
    addr: SocketAddr,
    /// Everything the agent logged so far.
    log: Arc<Mutex<String>>,
}

impl Drop for Agent {
    /// A failing assertion must not leave an agent running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Agent {
    /// Starts `mockgpu-agent serve ARGS --listen 127.0.0.1:0`, keeps its stderr drained into
    /// `log` and waits for the address it logs.
    fn start(args: &[&std::ffi::OsStr]) -> Agent {
        let mut child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .arg("serve")
            // never report to a cluster that a developer's kubeconfig names
            .env("MOCKGPU_REPORT", "off")
            // The agent mounts by itself: a keeper would outlive the test (tests/handover.rs covers it).
            .env("MOCKGPU_KEEPER", "off")
            .args(args)
            .args(["--listen", "127.0.0.1:0"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in stderr.lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut agent = Agent {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            log,
        };
        let mut addr = None;
        wait_for("the health endpoint's address", || {
            addr = agent
                .logged("health endpoint listening addr=")
                .and_then(|a| a.parse().ok());
            addr.is_some()
        });
        agent.addr = addr.unwrap();
        agent
    }

    /// The rest of the first logged line's word that starts with `prefix`, once it is logged.
    fn logged(&self, prefix: &str) -> Option<String> {
        let log = self.log.lock().unwrap();
        let (_, rest) = log.split_once(prefix)?;
        let word = rest.split_whitespace().next()?;
        Some(word.to_string())
    }

    /// Waits for the agent to exit; returns its status and its log.
    fn exit(&mut self) -> (std::process::ExitStatus, String) {
        let mut status = None;
        wait_for("the agent to exit", || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        // The drain thread ends with the pipe; wait for what it still holds.
        wait_for("the agent's last log lines", || {
            Arc::strong_count(&self.log) == 1
        });
        (status.unwrap(), self.log.lock().unwrap().clone())
    }
}

fn start(profile: &Path, mountpoint: &Path) -> Agent {
    Agent::start(&[
        "--node-name".as_ref(),
        "node-0".as_ref(),
        "--reload-interval".as_ref(),
        "0.1".as_ref(),
        "--profile-file".as_ref(),
        profile.as_os_str(),
        "--dir".as_ref(),
        mountpoint.parent().unwrap().as_os_str(),
    ])
}

fn gpu_count(mountpoint: &Path) -> usize {
    fs::read_dir(mountpoint.join("proc/driver/nvidia/gpus")).map_or(0, |d| d.count())
}

#[test]
fn serve_lifecycle() {
    let dir = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let cm = dir.path().join("config");
        fs::create_dir(&cm).unwrap();
        configmap_write(&cm, 1, "base: gb300\n");
        symlink("..data/profile.yaml", cm.join("profile.yaml")).unwrap();
        let run: PathBuf = dir.path().join("run");
        let mnt = run.join("fs");

        let mut agent = start(&cm.join("profile.yaml"), &mnt);
        wait_for("the tree", || gpu_count(&mnt) == 4);
        assert!(http_get(agent.addr, "/healthz").starts_with("HTTP/1.1 200"));
        wait_for("readiness", || {
            http_get(agent.addr, "/readyz").starts_with("HTTP/1.1 200")
        });
        let metrics = http_get(agent.addr, "/metrics");
        assert!(metrics.contains("mockgpu_gpus 4"), "{metrics}");
        // the carried files (the mock NVML also under the name without version)
        for file in [
            "lib/libmockfs.so",
            "lib/libnvidia-ml.so.1",
            "lib/libnvidia-ml.so",
            "bin/nvidia-smi",
        ] {
            assert_eq!(
                &fs::read(run.join(file)).unwrap()[..4],
                b"\x7fELF",
                "{file}"
            );
        }
        assert_eq!(
            fs::read_to_string(run.join("ld.so.preload")).unwrap(),
            "/run/mockgpu/lib/libmockfs.so\n"
        );
        assert!(is_mount_point(&run), "parent made a mount point");

        // ConfigMap update: 4 -> 2 GPUs without a remount.
        configmap_write(&cm, 2, "base: gb300\ngpus: 2\n");
        wait_for("the reload", || gpu_count(&mnt) == 2);
        // A broken profile is rejected and the previous tree stays.
        configmap_write(&cm, 3, "base: gb300\ngpus: [\n");
        wait_for("the rejection", || {
            http_get(agent.addr, "/metrics").contains("mockgpu_profile_reload_errors_total 1")
        });
        assert_eq!(gpu_count(&mnt), 2);

        // A second agent on the same mount point leaves the live one alone.
        let other = dir.path().join("other.yaml");
        fs::write(&other, "base: gb300\n").unwrap();
        let (status, log) = start(&other, &mnt).exit();
        assert_eq!(status.code(), Some(1), "{log}");
        assert!(
            log.contains(&format!(
                "another process serves the mount point {}",
                mnt.display()
            )),
            "{log}"
        );
        assert_eq!(gpu_count(&mnt), 2, "the live agent still serves");
        assert!(http_get(agent.addr, "/readyz").starts_with("HTTP/1.1 200"));

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
        assert!(
            agent.log.lock().unwrap().contains("detached a stale mount"),
            "{}",
            agent.log.lock().unwrap()
        );

        // SIGTERM: clean unmount and exit status 0.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(agent.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let (status, log) = agent.exit();
        assert!(status.success(), "{status}: {log}");
        assert!(log.contains("driver tree unmounted"), "{log}");
        assert!(!is_mount_point(&mnt));
    })
}

/// Runs `mockgpu-agent fault ARGS` on the fault file of `run` (the gb300 profile); its status
/// and output.
fn fault(run: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .arg("fault")
        .args(args)
        .arg("--dir")
        .arg(run)
        .env_remove("MOCKGPU_FAULTS")
        .env("MOCKGPU_PROFILE", "gb300")
        .env("MOCKGPU_NODE_NAME", "node-0")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status, text)
}

#[test]
fn faults_change_the_served_tree() {
    let dir = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let profile = dir.path().join("profile.yaml");
        fs::write(&profile, "base: gb300\n").unwrap();
        let run: PathBuf = dir.path().join("run");
        let mnt = run.join("fs");
        let agent = start(&profile, &mnt);
        wait_for("the tree", || gpu_count(&mnt) == 4);
        let gpus = mnt.join("proc/driver/nvidia/gpus");
        let bus_dirs = || -> Vec<String> {
            let mut d: Vec<String> = fs::read_dir(&gpus)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            d.sort();
            d
        };
        let all = bus_dirs();
        let xid_log = mnt.join(mockgpu_api::fault::XID_LOG_FILE);
        assert_eq!(fs::read_to_string(&xid_log).unwrap(), "");

        // Refused: no GPU 4, no Xid 7; the file is not even created.
        let (status, out) = fault(&run, &["add", "--gpu", "4", "--xid", "79"]);
        assert_eq!(status.code(), Some(1), "{out}");
        assert!(out.contains("GPU 4: the node has 4 GPUs (0 to 3)"), "{out}");
        let (status, out) = fault(&run, &["add", "--gpu", "0", "--xid", "7"]);
        assert_eq!(status.code(), Some(1), "{out}");
        assert!(out.contains("unknown Xid 7"), "{out}");
        assert!(!run.join("faults.json").exists());

        // Xid 79 on GPU 1: its proc directory goes, the Xid line comes.
        let (status, out) = fault(&run, &["add", "--gpu", "1", "--xid", "79"]);
        assert!(status.success(), "{out}");
        assert!(out.starts_with("gpu1-xid79\t"), "{out}");
        // the swap invalidates the directory and the log one after the other: wait for both
        let logged = || fs::read_to_string(&xid_log).is_ok_and(|l| !l.is_empty());
        wait_for("the fault applied", || gpu_count(&mnt) == 3 && logged());
        assert!(!bus_dirs().contains(&all[1]), "{:?}", bus_dirs());
        let log = fs::read_to_string(&xid_log).unwrap();
        assert!(
            log.starts_with("NVRM: Xid (PCI:")
                && log.contains("): 79, ")
                && log.ends_with("GPU has fallen off the bus.\n"),
            "{log}"
        );
        let metrics = http_get(agent.addr, "/metrics");
        assert!(metrics.contains("mockgpu_faults 1\n"), "{metrics}");
        assert!(metrics.contains("mockgpu_unhealthy_gpus 1\n"), "{metrics}");
        let (_, listed) = fault(&run, &["list"]);
        assert_eq!(
            listed,
            "gpu1-xid79\tGPU 1: Xid 79 (GPU has fallen off the bus.)\n"
        );

        // A bad entry written by hand is skipped; the good one stays applied.
        let text = fs::read_to_string(run.join("faults.json")).unwrap();
        let bad = text.replacen(
            "\"faults\": [",
            "\"faults\": [{\"name\": \"x\", \"gpu\": 9, \"kind\": \"Thermal\"},",
            1,
        );
        fs::write(run.join("faults.json"), bad).unwrap();
        wait_for("the bad entry refused", || {
            http_get(agent.addr, "/metrics").contains("mockgpu_fault_errors_total 1")
        });
        assert_eq!(gpu_count(&mnt), 3);

        // Cleared: back.
        let (status, out) = fault(&run, &["clear", "--all"]);
        assert!(status.success(), "{out}");
        let unlogged = || fs::read_to_string(&xid_log).is_ok_and(|l| l.is_empty());
        wait_for("the fault cleared", || gpu_count(&mnt) == 4 && unlogged());
        assert_eq!(bus_dirs(), all);
        drop(agent);
    })
}

#[test]
fn real_driver_means_report_only() {
    let dir = tempfile::tempdir().unwrap();
    in_private_namespace(|| {
        let real = dir.path().join("real");
        let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .args(["render", "--profile", "h100", "--out"])
            .arg(&real)
            .output()
            .unwrap();
        assert!(out.status.success());
        let mnt = dir.path().join("run/fs");
        let agent = Agent::start(&[
            "--procfs".as_ref(),
            real.join("proc").as_os_str(),
            "--sysfs".as_ref(),
            real.join("sys").as_os_str(),
            "--dir".as_ref(),
            mnt.parent().unwrap().as_os_str(),
        ]);
        wait_for("the report", || {
            http_get(agent.addr, "/metrics").contains("mockgpu_real_gpus 8")
        });
        assert!(http_get(agent.addr, "/readyz").starts_with("HTTP/1.1 200"));
        assert!(
            !mnt.exists(),
            "nothing is mounted or installed on a real GPU node"
        );
    })
}
