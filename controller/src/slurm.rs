//! What the controller needs of Slurm: deleting a node's record so that its slurmd registers
//! afresh (with the GPUs it has now), and draining a node whose GPUs are faulty (and resuming it
//! once they are not). The HTTP client for slurmrestd implements [`SlurmNodes`].

use std::future::Future;

/// How a node deletion ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDeleted {
    /// The record existed and is gone now.
    Deleted,
    /// There was no such node (already deleted, or never registered).
    AlreadyGone,
}

/// The start of the reason of every drain the controller sets: a drain whose reason starts
/// otherwise is someone else's, and the controller never resumes it nor changes its reason.
pub const DRAIN_REASON_PREFIX: &str = "mockgpu:";

/// Whether a Slurm node's `reason` is one the controller set.
pub fn reason_is_ours(reason: &str) -> bool {
    reason.starts_with(DRAIN_REASON_PREFIX)
}

/// How a drain ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drain {
    /// The node was drained (or its reason, one of ours, updated) now.
    Drained,
    /// The node was already drained with this very reason: nothing was sent.
    AlreadyDrained,
    /// The node carries a reason that is not ours (drained or downed by someone else): left as
    /// it is.
    Foreign(String),
    /// There is no such node.
    NoSuchNode,
}

/// How a resume ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// The node was drained by us and is resumed now.
    Resumed,
    /// The node is drained with a reason that is not ours: left drained.
    NotOurs(String),
    /// The node is not drained: nothing to do.
    NotDrained,
    /// There is no such node.
    NoSuchNode,
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

/// Slurm's node records. Implementations may write `async fn`s; the futures must be `Send` (the
/// controller runs them on a multi-threaded runtime).
pub trait SlurmNodes: Send + Sync {
    /// Deletes the node record `name`.
    fn delete_node(
        &self,
        name: &str,
    ) -> impl Future<Output = Result<NodeDeleted, SlurmError>> + Send;

    /// Drains node `name` with `reason` (which starts with [`DRAIN_REASON_PREFIX`]), unless it
    /// already is with that reason or carries a reason that is not ours.
    fn drain_node(
        &self,
        name: &str,
        reason: &str,
    ) -> impl Future<Output = Result<Drain, SlurmError>> + Send;

    /// Resumes node `name` if it is drained with a reason of ours ([`reason_is_ours`]).
    fn resume_node(&self, name: &str) -> impl Future<Output = Result<Resume, SlurmError>> + Send;
}

/// The Slurm side of a controller without slurmrestd: no value exists, so `None::<NoSlurm>`
/// is "not configured".
#[derive(Debug)]
pub enum NoSlurm {}

impl SlurmNodes for NoSlurm {
    async fn delete_node(&self, _: &str) -> Result<NodeDeleted, SlurmError> {
        match *self {}
    }

    async fn drain_node(&self, _: &str, _: &str) -> Result<Drain, SlurmError> {
        match *self {}
    }

    async fn resume_node(&self, _: &str) -> Result<Resume, SlurmError> {
        match *self {}
    }
}
