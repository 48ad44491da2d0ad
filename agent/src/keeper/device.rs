//! Mounting `/dev/fuse` at the driver tree's mount point.

use std::os::fd::{AsRawFd as _, OwnedFd};

use mockgpu_api::Layout;

use super::error::{KeeperError, io_err};
use crate::mounts;
use crate::sys::Linux;

/// Opens `/dev/fuse` and mounts it at the layout's mount point (read-only, `nosuid`, `nodev`,
/// readable by every user), in the host directory made a shared mount first.
pub(super) fn mount_device(layout: &Layout) -> Result<OwnedFd, KeeperError> {
    let dir = layout.host_dir();
    let mountpoint = layout.mount_point();
    mounts::make_shared(&Linux, dir)?;
    if mounts::detach_stale(&Linux, &mountpoint)? {
        tracing::warn!(mountpoint = %mountpoint.display(), "detached a stale mount");
    }
    std::fs::create_dir_all(&mountpoint)
        .map_err(io_err(format!("create {}", mountpoint.display())))?;
    let fuse = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(io_err("open /dev/fuse"))?;
    let fuse = OwnedFd::from(fuse);
    let options = format!(
        "fd={},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions",
        fuse.as_raw_fd()
    );
    use nix::mount::MsFlags;
    nix::mount::mount(
        Some("mockgpu"),
        &mountpoint,
        Some("fuse.mockgpu"),
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(options.as_str()),
    )
    .map_err(io_err(format!(
        "mount /dev/fuse at {}",
        mountpoint.display()
    )))?;
    tracing::info!(mountpoint = %mountpoint.display(), "mounted the driver tree's FUSE connection");
    Ok(fuse)
}
