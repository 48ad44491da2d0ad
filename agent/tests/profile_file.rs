//! A profile path that is not a small regular file is refused at once, with a message: a FIFO
//! used to hang `render` and `serve` for ever, and a huge file was read whole.

use std::process::Command;
use std::time::{Duration, Instant};

fn render(profile: &std::path::Path, out: &std::path::Path) -> (i32, String, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["render", "--node-name", "n", "--profile-file"])
        .arg(profile)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("profile.yaml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let (code, stderr, took) = render(&fifo, &dir.path().join("out"));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("profile.yaml is a FIFO, not a regular file"),
        "{stderr}"
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
}

#[test]
fn a_huge_file_is_refused_and_a_directory_named() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.yaml");
    let mut text = String::from("base: gb300\n");
    while text.len() < 50 << 20 {
        text.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, &text).unwrap();
    let (code, stderr, _) = render(&big, &dir.path().join("out"));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains(&format!(
            "big.yaml has {} bytes, more than the 1048576 accepted",
            text.len()
        )),
        "{stderr}"
    );
    let (code, stderr, _) = render(dir.path(), &dir.path().join("out"));
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("is a directory, not a regular file"),
        "{stderr}"
    );
    // A small regular file is still a profile.
    let ok = dir.path().join("ok.yaml");
    std::fs::write(&ok, "base: t4\n").unwrap();
    let (code, stderr, _) = render(&ok, &dir.path().join("out"));
    assert_eq!(code, 0, "{stderr}");
}
