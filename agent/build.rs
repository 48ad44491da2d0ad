//! Builds `libmockfs.so` (the `mockfs-shim` crate) so that the agent can carry it: `exec` and
//! `serve` install it from the agent's own binary, and no separate artifact has to be found.
//!
//! The shim is built in release mode with a nested cargo into its own target directory under
//! `OUT_DIR` (a different directory than the outer build's, so the two never wait on each other).

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let shim_dir = manifest_dir.join("../mockfs-shim");
    for path in ["src", "build.rs", "Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", shim_dir.join(path).display());
    }
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let target_dir = out_dir.join("shim-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(shim_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .status()
        .expect("cannot run cargo to build mockfs-shim");
    assert!(
        status.success(),
        "building mockfs-shim (libmockfs.so) failed"
    );
    let lib = target_dir.join("release/libmockfs.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    println!("cargo:rustc-env=MOCKGPU_SHIM_PATH={}", lib.display());
}
