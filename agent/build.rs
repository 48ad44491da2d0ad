//! Builds `libmockfs.so` (the `mockfs-shim` crate) so that the agent can carry it: `exec` and
//! `serve` install it from the agent's own binary, and no separate artifact has to be found.
//! Also generates the kubelet device plugin API's gRPC code from `proto/deviceplugin.proto`.
//!
//! The shim is built in release mode with a nested cargo into its own target directory under
//! `OUT_DIR` (a different directory than the outer build's, so the two never wait on each other),
//! for the agent's target triple: an aarch64 agent built on an x86-64 host carries an aarch64 shim.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    device_plugin_api();
    shim();
}

/// Compiles the device plugin `.proto` with protox (a protobuf compiler written in Rust, so a
/// machine without `protoc` builds the agent) and generates its messages and services.
fn device_plugin_api() {
    let proto = "proto/deviceplugin.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors =
        protox::compile([proto], ["proto"]).expect("compiling proto/deviceplugin.proto");
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)
        .expect("generating the device plugin API code");
}

/// Builds the shim and tells the agent's code where it is.
fn shim() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let shim_dir = manifest_dir.join("../mockfs-shim");
    let workspace_dir = manifest_dir.join("..");
    // The shim's sources, and the workspace files that choose its dependencies and profile.
    for path in [
        shim_dir.join("src"),
        shim_dir.join("build.rs"),
        shim_dir.join("Cargo.toml"),
        workspace_dir.join("Cargo.toml"),
        workspace_dir.join("Cargo.lock"),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    let target = env::var("TARGET").expect("TARGET");
    // The linker cargo chose for the target (`target.<triple>.linker` in a config file or
    // `--config`), handed to the nested cargo in the variable it reads.
    let linker_var = format!(
        "CARGO_TARGET_{}_LINKER",
        target.to_uppercase().replace(['-', '.'], "_")
    );
    println!("cargo:rerun-if-env-changed={linker_var}");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let target_dir = out_dir.join("shim-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    // `--target` even when it equals the host: one layout (`<dir>/<triple>/release`) for native
    // and cross builds, so every build exercises the path a cross build takes.
    build
        .args(["build", "--release", "--quiet", "--target", &target])
        .arg("--manifest-path")
        .arg(shim_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        build.env(&linker_var, linker);
    }
    let status = build
        .status()
        .expect("cannot run cargo to build mockfs-shim");
    assert!(
        status.success(),
        "building mockfs-shim (libmockfs.so) for {target} failed"
    );
    let lib = target_dir.join(&target).join("release/libmockfs.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    println!("cargo:rustc-env=MOCKGPU_SHIM_PATH={}", lib.display());
}
