//! Bad input to the command line: every case exits non-zero with a message naming the problem,
//! and never panics.

use std::process::Command;

fn render(profile_yaml: &str) -> (i32, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.yaml");
    std::fs::write(&file, profile_yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .arg("render")
        .arg("--profile-file")
        .arg(&file)
        .arg("--out")
        .arg(dir.path().join("out"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    (out.status.code().unwrap_or(-1), stderr)
}

#[test]
fn bad_profiles_fail_with_named_errors() {
    let cases = [
        ("base: gb300\ngpus: [\n", "p.yaml"),
        ("base: gb300\ngpuz: 4\n", "unknown field `gpuz`"),
        ("base: gb300\ngpus: 0\n", "field `gpus`"),
        ("base: gb300\ngpus: 1000\n", "field `gpus`"),
        ("base: gb300\nsockets: [3, 3]\n", "field `sockets`"),
        (
            "base: gb300\nmodel: \"NVIDIA\\u0007GB300\"\n",
            "field `model`",
        ),
        ("name: custom\n", "field `model`"),
        ("- a\n- b\n", "p.yaml"),
    ];
    for (yaml, needle) in cases {
        let (code, stderr) = render(yaml);
        assert_eq!(code, 1, "{yaml:?}: {stderr}");
        assert!(stderr.contains(needle), "{yaml:?}: {stderr}");
    }
}

#[test]
fn unknown_builtin_and_occupied_output_are_errors() {
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args([
            "render",
            "--profile",
            "nope",
            "--out",
            "/tmp/never-written-mockgpu",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no such built-in profile"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("keep"), "x").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["render", "--out"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to overwrite"));
    assert_eq!(
        std::fs::read_to_string(dir.path().join("keep")).unwrap(),
        "x"
    );
}
