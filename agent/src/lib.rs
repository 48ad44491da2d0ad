//! The mockgpu node agent: probes the host, places the profile's GPUs onto it, renders the
//! NVIDIA driver tree and serves it over FUSE.
//!
//! The public modules are those the binary, the integration tests and the benchmarks use.

mod carried;
pub mod device_plugin;
pub mod doctor;
pub mod dra;
pub mod exec;
pub mod faults;
pub mod fuse;
pub mod gpufaults;
pub mod host;
pub mod keeper;
pub mod mounts;
mod node;
pub mod output;
pub mod pinner;
pub mod profile;
pub mod real;
pub mod render;
pub mod report;
pub mod serve;
pub mod sys;
pub mod tree;
mod wire;

/// This program's own executable, which `serve` runs again for its helper processes (the
/// keeper, `pin-tree`).
pub(crate) const SELF_EXE: &str = "/proc/self/exe";
