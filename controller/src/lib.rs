//! mockgpu's central controller.

pub mod crd;
pub mod labels;
pub mod plan;
pub mod slurm;
