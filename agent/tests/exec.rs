//! Real programs under `mockgpu-agent exec` (needs root or fusermount3, the shim, and the
//! programs: coreutils, findutils, python3, pciutils, hwloc; CI installs them).

use std::process::Command;

/// Runs `mockgpu-agent exec [args] -- cmd…` and returns (exit code, stdout, stderr).
fn exec(profile: &[&str], cmd: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .arg("exec")
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

fn ok(profile: &[&str], cmd: &[&str]) -> String {
    let (code, stdout, stderr) = exec(profile, cmd);
    assert_eq!(code, 0, "{cmd:?} failed: {stderr}");
    stdout
}

#[test]
fn coreutils_see_the_driver_tree() {
    let out = ok(&[], &["cat", "/proc/driver/nvidia/version"]);
    assert!(
        out.starts_with("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.173.02 "),
        "{out}"
    );
    let out = ok(&[], &["ls", "/proc/driver/nvidia/gpus"]);
    assert_eq!(
        out,
        "0008:06:00.0\n0009:06:00.0\n0018:06:00.0\n0019:06:00.0\n"
    );
    let out = ok(&[], &["ls", "-l", "/proc/driver/nvidia/gpus/0008:06:00.0"]);
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
        &["readlink", "/sys/bus/pci/drivers/nvidia/0018:06:00.0"],
    );
    assert_eq!(out, "../../../../devices/pci0018:06/0018:06:00.0\n");
    let out = ok(&[], &["cat", "/sys/bus/pci/devices/0019:06:00.0/device"]);
    assert_eq!(out, "0x31c2\n");
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

/// The same command without the mock, for comparison.
fn plain(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{cmd}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const GB300: [&str; 4] = [
    "0008:06:00.0",
    "0009:06:00.0",
    "0018:06:00.0",
    "0019:06:00.0",
];

#[test]
fn lspci_lists_the_mock_gpus_beside_the_real_devices() {
    let out = ok(&[], &["lspci", "-d", "10de:", "-n"]);
    let want: String = GB300
        .iter()
        .map(|g| format!("{g} 0302: 10de:31c2 (rev a1)\n"))
        .collect();
    assert_eq!(out, want);
    let all = ok(&[], &["lspci", "-n"]);
    for line in plain("lspci", &["-n"]).lines() {
        assert!(
            all.contains(line),
            "host device {line} missing from:\n{all}"
        );
    }
    let kernel = ok(&[], &["lspci", "-k", "-d", "10de:"]);
    assert_eq!(
        kernel.matches("Kernel driver in use: nvidia").count(),
        4,
        "{kernel}"
    );
    let verbose = ok(&[], &["lspci", "-vv", "-s", "0008:06:00.0"]);
    assert!(
        verbose.contains("Subsystem: NVIDIA Corporation Device 21f1"),
        "{verbose}"
    );
}

#[test]
fn hwloc_places_each_gpu_at_its_local_cpus() {
    let topo = ok(&[], &["lstopo-no-graphics"]);
    for gpu in GB300 {
        assert!(
            topo.contains(&format!("PCI {gpu} (3D)")),
            "{gpu} missing from:\n{topo}"
        );
    }
    // The host's own devices stay (hwloc prints the domain once several domains exist).
    for dev in plain("lstopo-no-graphics", &[])
        .lines()
        .filter_map(|l| l.trim().strip_prefix("PCI "))
    {
        let bdf = dev.split(' ').next().unwrap();
        let full = if bdf.matches(':').count() == 1 {
            format!("0000:{bdf}")
        } else {
            bdf.to_string()
        };
        assert!(
            topo.contains(&format!("PCI {full}")),
            "host device {full} missing from:\n{topo}"
        );
    }
    let parse = |s: &str| {
        u128::from_str_radix(&s.trim().trim_start_matches("0x").replace(',', ""), 16).unwrap()
    };
    for gpu in GB300 {
        let hwloc = ok(&[], &["hwloc-calc", &format!("pci={gpu}")]);
        let local = ok(
            &[],
            &["cat", &format!("/sys/bus/pci/devices/{gpu}/local_cpus")],
        );
        assert_eq!(parse(&hwloc), parse(&local), "{gpu}");
    }
    let xml = ok(
        &["--profile", "h100"],
        &["lstopo-no-graphics", "--of", "xml", "--whole-io"],
    );
    let gpus = xml
        .lines()
        .filter(|l| l.contains("pci_type=\"0302 [10de:2330] [10de:16c1] a1\""))
        .count();
    assert_eq!(gpus, 8, "{xml}");
}

#[test]
fn sigterm_reaches_the_command_and_everything_is_cleaned_up() {
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args([
            "exec",
            "--",
            "sh",
            "-c",
            "ls /proc/driver/nvidia/gpus > /dev/null && exec sleep 30",
        ])
        .env("TMPDIR", tmp.path())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while std::fs::read_dir(tmp.path()).unwrap().count() == 0 {
        assert!(
            started.elapsed().as_secs() < 10,
            "exec made no temporary directory"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    std::thread::sleep(std::time::Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status}");
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "temporary files left behind"
    );
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(tmp.path().to_str().unwrap()),
        "mount left behind"
    );
}
