//! mockgpu's central controller.

pub mod crd;
