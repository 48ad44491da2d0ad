//! What the controller needs of Slurm: deleting a node's record so that its slurmd registers
//! afresh (with the GPUs it has now). The HTTP client for slurmrestd implements [`SlurmNodes`].

use std::future::Future;

/// How a node deletion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDeleted {
    /// The record existed and is gone now.
    Deleted,
    /// There was no such node (already deleted, or never registered).
    AlreadyGone,
}

/// Errors talking to Slurm.
#[derive(Debug, thiserror::Error)]
pub enum SlurmError {
    /// The token was rejected (401/403).
    #[error("slurmrestd rejected the token")]
    Unauthorized,
    /// No answer in time.
    #[error("slurmrestd did not answer in time")]
    Timeout,
    /// Any other failure (connection, unexpected status, unreadable answer).
    #[error("slurmrestd request failed: {0}")]
    Http(String),
}

/// Slurm's node records. Implementations may write `async fn delete_node`; the future must be
/// `Send` (the controller runs it on a multi-threaded runtime).
pub trait SlurmNodes: Send + Sync {
    /// Deletes the node record `name`.
    fn delete_node(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<NodeDeleted, SlurmError>> + Send;
}

/// The Slurm side of a controller without slurmrestd: no value exists, so `None::<NoSlurm>`
/// is "not configured".
#[derive(Debug)]
pub enum NoSlurm {}

impl SlurmNodes for NoSlurm {
    async fn delete_node(&self, _: &str) -> Result<NodeDeleted, SlurmError> {
        match *self {}
    }
}
