//! mockgpu's central controller.

pub mod crd;
pub mod slurm;
pub mod slurmrestd;
