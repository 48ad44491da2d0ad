//! The crate's error type and its one mapping onto ttrpc statuses.

use std::{io, path::PathBuf};

use ttrpc::Code;

use crate::{config::ConfigError, mux::MuxError, policy::PolicyError};

/// Errors of the plugin.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Invalid configuration (file, flags or the runtime's Configure request).
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The policy refused a container.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The multiplexed connection failed.
    #[error(transparent)]
    Mux(#[from] MuxError),
    /// Connecting to the runtime's socket failed.
    #[error("cannot connect to the NRI socket {path}: {source}")]
    Connect {
        /// The socket.
        path: PathBuf,
        /// Underlying error.
        source: io::Error,
    },
    /// The pre-installed mode's inherited socket is unusable.
    #[error("inherited NRI socket (fd {fd}) is unusable: {source}")]
    Inherited {
        /// The descriptor.
        fd: i32,
        /// Underlying error.
        source: io::Error,
    },
    /// A ttrpc operation failed.
    #[error("ttrpc {context} failed: {source}")]
    Ttrpc {
        /// What was being done.
        context: &'static str,
        /// Underlying error.
        source: ttrpc::Error,
    },
    /// The runtime broke the protocol (too much data, an impossible request).
    #[error("NRI protocol: {0}")]
    Protocol(String),
    /// The runtime did not answer RegisterPlugin in time.
    #[error("runtime did not answer RegisterPlugin within {0:?}")]
    RegisterTimeout(std::time::Duration),
}

/// Local result type of the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<Error> for ttrpc::Error {
    fn from(err: Error) -> Self {
        let code = match &err {
            Error::Config(_) | Error::Protocol(_) => Code::INVALID_ARGUMENT,
            Error::Policy(PolicyError::NotReady { .. }) => Code::FAILED_PRECONDITION,
            Error::Policy(PolicyError::UnknownGpu { .. }) => Code::INVALID_ARGUMENT,
            _ => Code::INTERNAL,
        };
        ttrpc::Error::RpcStatus(ttrpc::get_status(code, err.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_errors_keep_their_message() {
        let err = Error::Policy(PolicyError::NotReady {
            tree: "/run/mockgpu/fs".into(),
            reason: "gone".into(),
        });
        let ttrpc::Error::RpcStatus(status) = ttrpc::Error::from(err) else {
            panic!("not a status");
        };
        assert_eq!(status.code(), Code::FAILED_PRECONDITION);
        assert!(
            status
                .message()
                .starts_with("mockgpu: driver tree not ready")
        );
    }
}
