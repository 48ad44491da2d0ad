//! Building a library under test with cargo. Shared by the shim's tests and the NVML library's
//! (`nvml/tests`, through `#[path]`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// `cargo build --target TARGET ARGS` of the package at `manifest_dir`, into the target
/// directory `dir` beside the one running the tests (which stays locked by the outer
/// `cargo test`: cargo does not build a cdylib for integration tests). Returns that directory's
/// folder for TARGET (which holds `release/` and `debug/`). `$CARGO` names the cargo to run
/// (under emulation: one outside the emulated root).
pub fn build(target: &str, manifest_dir: &Path, dir: &str, args: &[&str]) -> PathBuf {
    // <target>/[<triple>/]<profile>/deps/<test binary>
    let exe = std::env::current_exe().unwrap();
    let out = exe.ancestors().nth(3).unwrap().join(dir);
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .arg("build")
        .args(["--target", target])
        .args(args)
        .arg("--manifest-path")
        .arg(manifest_dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &out)
        .status()
        .unwrap();
    assert!(
        status.success(),
        "cargo build --target {target} {args:?} failed"
    );
    out.join(target)
}
