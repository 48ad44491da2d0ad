//! Builds the files the agent carries, so that no separate artifact has to be found: `exec` and
//! `serve` install them from the agent's own binary. They are `libmockfs.so` (the `mockfs-shim`
//! package), and `libnvidia-ml.so.1` and `nvidia-smi` (the `mockgpu-nvml` package). Also generates the gRPC
//! code of the kubelet APIs the agent serves: the device plugin API, plugin registration and the
//! DRA plugin API (`proto/*.proto`).
//!
//! One nested cargo builds them in release mode into its own target directory under `OUT_DIR` (a
//! different directory than the outer build's, so the two never wait on each other), for the
//! agent's target triple: an aarch64 agent built on an x86-64 host carries aarch64 files.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// A package whose build output the agent carries.
struct Package {
    /// The package's name.
    name: &'static str,
    /// Its directory, relative to the workspace.
    dir: &'static str,
    /// The files carried, each with the variable that tells the agent's code where it is.
    files: &'static [(&'static str, &'static str)],
}

const CARRIED: [Package; 2] = [
    Package {
        name: "mockfs-shim",
        dir: "mockfs-shim",
        files: &[("libmockfs.so", "MOCKGPU_SHIM_PATH")],
    },
    Package {
        name: "mockgpu-nvml",
        dir: "nvml",
        files: &[
            ("libnvidia_ml.so", "MOCKGPU_NVML_PATH"),
            ("nvidia-smi", "MOCKGPU_SMI_PATH"),
        ],
    },
];

fn main() {
    kubelet_apis();
    carried();
}
/// Compiles the kubelet APIs' `.proto` files with protox (a protobuf compiler written in Rust, so
/// a machine without `protoc` builds the agent) and generates their messages and services.
fn kubelet_apis() {
    let protos = [
        "proto/deviceplugin.proto",
        "proto/pluginregistration.proto",
        "proto/dra.proto",
    ];
    for proto in protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"]).expect("compiling proto/*.proto");
    tonic_prost_build::configure()
        .build_transport(false)
        .compile_fds(descriptors)
        .expect("generating the kubelet APIs' code");
}

/// Builds the carried packages and tells the agent's code where their files are.
fn carried() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let workspace_dir = manifest_dir.join("..");
    // The packages' sources, and the workspace files that choose their dependencies and profile.
    let sources = CARRIED.iter().flat_map(|p| {
        let dir = workspace_dir.join(p.dir);
        [
            dir.join("src"),
            dir.join("build.rs"),
            dir.join("Cargo.toml"),
        ]
    });
    // Plus the one crate of ours that both depend on.
    for path in sources.chain([
        workspace_dir.join("cdylib-rt/src"),
        workspace_dir.join("cdylib-rt/Cargo.toml"),
        workspace_dir.join("Cargo.toml"),
        workspace_dir.join("Cargo.lock"),
    ]) {
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
    let target_dir = out_dir.join("carried-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut build = Command::new(cargo);
    // `--target` even when it equals the host: one layout (`<dir>/<triple>/release`) for native
    // and cross builds, so every build exercises the path a cross build takes.
    build
        .args(["build", "--release", "--quiet", "--target", &target])
        .arg("--manifest-path")
        .arg(workspace_dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        // An outer `cargo clippy` sets it: the carried packages are linted as workspace members,
        // not through the agent's build
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS");
    for package in &CARRIED {
        build.args(["-p", package.name]);
    }
    if let Some(linker) = env::var_os("RUSTC_LINKER") {
        build.env(&linker_var, linker);
    }
    let names: Vec<&str> = CARRIED.iter().map(|p| p.name).collect();
    let status = build
        .status()
        .unwrap_or_else(|e| panic!("cannot run cargo to build {names:?}: {e}"));
    assert!(status.success(), "building {names:?} for {target} failed");
    for (file, var) in CARRIED.iter().flat_map(|p| p.files) {
        let path = target_dir.join(&target).join("release").join(file);
        assert!(path.exists(), "{} was not built", path.display());
        println!("cargo:rustc-env={var}={}", path.display());
    }
}
