//! The mockgpu node agent: probes the host, places the profile's GPUs onto it, renders the
//! NVIDIA driver tree and serves it over FUSE.

pub mod fs;
pub mod host;
pub mod output;
pub mod render;
pub mod tree;
