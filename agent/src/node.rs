//! Setting the node up for `serve`: the agent's directory (a shared mount, or the keeper's), the
//! mount point, the carried files (the shim, the mock NVML, `nvidia-smi`) and `ld.so.preload`.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use mockgpu_api::Layout;

use crate::keeper::DataPath;
use crate::{carried, mounts};

/// Errors of setting the node up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// A mount chore failed.
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
    /// A file of the installation could not be written.
    #[error("cannot install {path}: {source}")]
    Install {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A carried file could not be installed.
    #[error(transparent)]
    Carried(#[from] carried::InstallError),
    /// The keeper could not be reached or started.
    #[error(transparent)]
    Keeper(#[from] crate::keeper::KeeperError),
}

/// Readies the node for the tree's mount at `layout` and installs the carried files. With `keeper` (root
/// only) through the keeper, whose connection it returns: the keeper makes the directory shared
/// and mounts, and a live keeper's mount stays as it is. Otherwise for the agent's own mount: the
/// directory made a shared mount (as root), a stale mount detached, the mount point created.
pub(crate) fn set_up(
    layout: &Layout,
    keeper: Option<DataPath>,
) -> Result<Option<OwnedFd>, SetupError> {
    let root = nix::unistd::geteuid().is_root();
    let relay = keeper
        .filter(|_| root)
        .map(|path| crate::keeper::attach(layout, path))
        .transpose()?;
    if relay.is_none() {
        prepare_mount_point(layout, root)?;
    }
    install(layout)?;
    Ok(relay)
}

/// Makes the agent's directory a shared mount (as `root`; otherwise warns), detaches a stale
/// mount a previous agent left at the mount point and creates the mount point.
fn prepare_mount_point(layout: &Layout, root: bool) -> Result<(), SetupError> {
    let dir = layout.host_dir();
    let mountpoint = layout.mount_point();
    if root {
        mounts::make_shared(&crate::sys::Linux, dir)?;
    } else {
        tracing::warn!(dir = %dir.display(), "not root: cannot make the directory a shared mount; containers will not see agent restarts");
    }
    if mounts::detach_stale(&crate::sys::Linux, &mountpoint)? {
        tracing::warn!(mountpoint = %mountpoint.display(), "detached a stale mount left by a previous agent");
    }
    fs::create_dir_all(&mountpoint).map_err(|source| SetupError::Install {
        path: mountpoint.clone(),
        source,
    })
}

/// Writes the carried files and `ld.so.preload` (naming the shim where containers see it).
fn install(layout: &Layout) -> Result<(), SetupError> {
    carried::install_all(&layout.lib_dir(), &layout.bin_dir())?;
    let preload = layout.ld_so_preload();
    fs::write(&preload, layout.ld_so_preload_content()).map_err(|source| SetupError::Install {
        path: preload,
        source,
    })
}
