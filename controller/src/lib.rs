//! mockgpu's central controller: node labels and GpuNode conditions from the agents' GpuNodes,
//! ComputeDomains, leader election, opt-in remediation through Slurm.

pub mod cleanup;
mod common;
pub mod compute_domain;
pub mod crd;
pub mod labels;
pub mod lease;
pub mod metrics;
#[cfg(test)]
mod mock_api;
pub mod plan;
pub mod reconcile;
pub mod run;
pub mod slim;
pub mod slurm;
pub mod slurmrestd;
pub mod write;
