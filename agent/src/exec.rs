//! `mockgpu-agent exec -- CMD…`: runs one command on this machine as if it had the profile's
//! GPUs. The tree is served over FUSE in a private temporary mount (a private mount namespace
//! as root, `fusermount3` otherwise, a rendered temporary directory when FUSE is unavailable)
//! and the command runs with the shim preloaded.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, unshare};
use nix::sys::signal::{SigHandler, Signal, signal};

use crate::{fs as fuse, output, shim, tree::Tree};

/// Why `exec` could not run the command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The temporary directory could not be prepared.
    #[error("cannot prepare {path}: {source}")]
    Prepare {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The fallback rendering failed.
    #[error(transparent)]
    Render(#[from] output::OutputError),
    /// The command could not be started.
    #[error("cannot run {command:?}: {source}")]
    Spawn {
        /// The command.
        command: OsString,
        /// Why.
        source: io::Error,
    },
}

/// How the tree reached the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// FUSE in a private mount namespace (root).
    PrivateFuse,
    /// FUSE mounted through `fusermount3` (unprivileged).
    Fuse,
    /// Plain files in a temporary directory (FUSE unavailable).
    Rendered,
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Removes the temporary directory on every exit path.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Serves `tree` privately and runs `command` under the shim; returns its exit code (128 +
/// signal number when it was killed by a signal). Call it before the process starts threads:
/// entering a private mount namespace requires a single-threaded process.
pub fn run(tree: &Tree, command: &[OsString]) -> Result<(i32, Backing), ExecError> {
    let private = nix::unistd::geteuid().is_root() && enter_private_namespace();
    let tmp =
        nix::unistd::mkdtemp(&std::env::temp_dir().join("mockgpu-exec.XXXXXX")).map_err(|e| {
            ExecError::Prepare {
                path: std::env::temp_dir(),
                source: e.into(),
            }
        })?;
    let tmp = TempDir(tmp);
    let root = tmp.0.join("fs");
    std::fs::create_dir(&root).map_err(|source| ExecError::Prepare {
        path: root.clone(),
        source,
    })?;
    let lib = shim::install(&tmp.0.join("lib")).map_err(|source| ExecError::Prepare {
        path: tmp.0.join("lib"),
        source,
    })?;
    let (mounted, backing) = match fuse::mount(tree, &root, None) {
        Ok(m) => (
            Some(m),
            if private {
                Backing::PrivateFuse
            } else {
                Backing::Fuse
            },
        ),
        Err(e) => {
            tracing::warn!(error = %e, "FUSE unavailable; serving a rendered copy of the tree instead");
            std::fs::remove_dir(&root).map_err(|source| ExecError::Prepare {
                path: root.clone(),
                source,
            })?;
            output::write_tree(tree, &root)?;
            (None, Backing::Rendered)
        }
    };
    tracing::debug!(root = %root.display(), ?backing, "mock root ready");
    let code = spawn_and_wait(command, &lib, &root);
    if let Some(m) = mounted {
        if let Err(e) = m.unmount() {
            tracing::warn!(error = %e, "unmounting the temporary tree failed");
        }
    }
    Ok((code?, backing))
}

/// Enters a private mount namespace whose mounts never reach the host and vanish with the
/// process. Returns false (and stays put) when that is not possible.
fn enter_private_namespace() -> bool {
    if unshare(CloneFlags::CLONE_NEWNS).is_err() {
        return false;
    }
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .is_ok()
}

fn spawn_and_wait(command: &[OsString], lib: &Path, root: &Path) -> Result<i32, ExecError> {
    let (program, args) = command.split_first().ok_or_else(|| ExecError::Spawn {
        command: OsString::new(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "no command given"),
    })?;
    let mut preload = lib.as_os_str().to_owned();
    if let Some(existing) = std::env::var_os("LD_PRELOAD").filter(|v| !v.is_empty()) {
        preload.push(":");
        preload.push(existing);
    }
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("LD_PRELOAD", preload)
        .env("MOCKFS_ROOT", root)
        .env("MOCKFS_DEV", "1");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    // The terminal's Ctrl-C reaches the command directly; SIGTERM and SIGHUP sent to the agent
    // are forwarded to it. Either way the agent lives on to clean up.
    // SAFETY: the handlers only touch an atomic and call kill.
    unsafe {
        let _ = signal(Signal::SIGINT, SigHandler::SigIgn);
        let _ = signal(Signal::SIGQUIT, SigHandler::SigIgn);
        let _ = signal(Signal::SIGTERM, SigHandler::Handler(forward));
        let _ = signal(Signal::SIGHUP, SigHandler::Handler(forward));
    }
    let mut child = cmd.spawn().map_err(|source| ExecError::Spawn {
        command: program.clone(),
        source,
    })?;
    CHILD.store(child.id() as i32, Ordering::Relaxed);
    let status = loop {
        match child.wait() {
            Ok(s) => break s,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(source) => {
                return Err(ExecError::Spawn {
                    command: program.clone(),
                    source,
                });
            }
        }
    };
    CHILD.store(0, Ordering::Relaxed);
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}
