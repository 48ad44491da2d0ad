//! The node test bed's CRI client (`mgtb-cri`): runs host-network pods and containers on the test
//! bed's containerd, execs into them, reports PIDs, measures CreateContainer latency, tears down.

use std::path::PathBuf;

pub mod client;
pub mod spec;
pub mod stats;

/// Errors of the CRI client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("connect to {0}: {1}")]
    Connect(PathBuf, String),
    #[error("{op}: {status}")]
    Rpc {
        op: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("container {0}: {1}")]
    Status(String, String),
    #[error("no container matches {0:?}")]
    NotFound(String),
    #[error("more than one container matches {0:?}")]
    Ambiguous(String),
    #[error("{0}")]
    Parse(String),
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
