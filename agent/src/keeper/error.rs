//! The errors of the keeper and of an agent's connection to it.

use std::io;
use std::path::PathBuf;

use crate::mounts::MountError;

/// Errors of the keeper and of an agent's connection to it.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// A system call failed.
    #[error("cannot {what}: {source}")]
    Io {
        /// What was being done, with its path.
        what: String,
        /// Why.
        source: io::Error,
    },
    /// Preparing the mount point failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// Only root can mount the device itself.
    #[error("the keeper must run as root (it mounts /dev/fuse itself)")]
    NotRoot,
    /// The running keeper's handover was incomplete or malformed.
    #[error("cannot take over from the keeper at {path}: {reason}")]
    Takeover {
        /// The socket.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The keeper an agent started did not come up.
    #[error("the keeper started for {path} did not listen: {reason}")]
    Start {
        /// The socket.
        path: PathBuf,
        /// What happened to it.
        reason: String,
    },
}

/// Makes an error of what was being done, for `map_err`.
pub(super) fn io_err<E: Into<io::Error>>(what: impl Into<String>) -> impl FnOnce(E) -> KeeperError {
    let what = what.into();
    move |e| KeeperError::Io {
        what,
        source: e.into(),
    }
}
