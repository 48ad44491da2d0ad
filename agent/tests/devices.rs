//! The device majors a consumer sees under `exec`: the merged `/proc/devices` (through the shim)
//! and the `/dev` nodes agree, and no NVIDIA major is one the host already lists.

use std::process::Command;

fn exec(cmd: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["exec", "--node-name", "node-0", "--"])
        .args(cmd)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn majors(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .take_while(|l| !l.starts_with("Block devices:"))
        .filter_map(|l| {
            let (major, name) = l.trim().split_once(' ')?;
            Some((major.parse().ok()?, name.to_string()))
        })
        .collect()
}

#[test]
fn proc_devices_publishes_free_majors_that_the_nodes_use() {
    let host = majors(&std::fs::read_to_string("/proc/devices").unwrap());
    let seen = majors(&exec(&["cat", "/proc/devices"]));
    // Every host line is still there.
    for entry in &host {
        assert!(seen.contains(entry), "{entry:?} missing");
    }
    let major = |name: &str| {
        seen.iter()
            .find(|(_, n)| n == name)
            .unwrap_or_else(|| panic!("no {name} in {seen:?}"))
            .0
    };
    assert_eq!(major("nvidia-frontend"), 195);
    let uvm = major("nvidia-uvm");
    for name in ["nvidia-uvm", "nvidia-caps", "nvidia-caps-imex-channels"] {
        let m = major(name);
        assert!(
            !host.iter().any(|(h, _)| *h == m),
            "{name} got {m}, which the host uses"
        );
    }
    let stat = exec(&[
        "stat",
        "-c",
        "%t:%T",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
    ]);
    assert_eq!(stat, format!("{uvm:x}:0\n{uvm:x}:1\n"));
}
