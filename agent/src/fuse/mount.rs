//! The mount's lifecycle: mounting `/dev/fuse` through fuser, or serving a keeper's connection,
//! and letting go of either.

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};

use super::filesystem::DriverFs;
use super::handle::TreeHandle;
use super::state::Shared;
use crate::tree::Tree;
use crate::wire;

/// A mounted driver tree; unmounts when dropped or on [`Mounted::unmount`]. Served through a
/// keeper ([`serve_relayed`]), it is never unmounted: the agent only lets go of its connection.
pub struct Mounted {
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// The connection to the keeper, when the keeper holds the mount.
    relay: Option<OwnedFd>,
    /// Replaces the served tree.
    pub handle: TreeHandle,
}

impl Mounted {
    /// Unmounts and waits for the FUSE thread to end. A mount still in use (an open file, a
    /// process's working directory) is detached lazily instead: it leaves the mount table at
    /// once and the FUSE thread serves its last users until they let go. Through a keeper: stops
    /// taking requests, answers those already taken and closes the connection; the keeper gives
    /// the rest to the next agent, and the mount stays.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    /// Whether a keeper holds the mount (see [`serve_relayed`]).
    pub(crate) fn is_relayed(&self) -> bool {
        self.relay.is_some()
    }

    /// Whether the FUSE threads still serve (they end when the keeper's connection closes).
    pub(crate) fn serving(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|s| !s.guard.is_finished())
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        self.handle.unpin();
        if let Some(conn) = self.relay.take() {
            // The keeper answers with one DESTROY per thread, behind what it sent before.
            if wire::send(&conn, &wire::bye(FUSE_THREADS as u8)).is_err() {
                // The keeper is gone: the threads read an end of file, if they have not yet.
                nix::sys::socket::shutdown(conn.as_raw_fd(), nix::sys::socket::Shutdown::Read)?;
            }
            return match session.join() {
                // fuser calls an end of file an invalid request.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(()),
                other => other,
            };
        }
        match session.umount_and_join() {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                tracing::warn!(mountpoint = %self.mountpoint.display(), "driver tree busy: detaching it lazily");
                nix::mount::umount2(&self.mountpoint, nix::mount::MntFlags::MNT_DETACH)
                    .map_err(io::Error::from)
            }
            other => other,
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = self.unmount_inner();
    }
}

/// Mounts `tree` read-only (`nodev`, `nosuid`) at `mountpoint`: readable by every user when
/// mounted by root (`allow_other`), by the mounting user only otherwise (an unprivileged
/// `allow_other` needs `user_allow_other` in `/etc/fuse.conf`). With `sysfs`, the host's entries
/// of `sys/bus/pci/devices` are listed live from `<sysfs>/bus/pci/devices` instead of the copies
/// rendered into `tree`.
pub fn mount(tree: &Tree, mountpoint: &Path, sysfs: Option<&Path>) -> io::Result<Mounted> {
    let inner = Arc::new(Shared::new(tree, sysfs));
    let config = config();
    let session = fuser::spawn_mount(DriverFs::new(inner.clone()), mountpoint, &config)?;
    Ok(mounted(session, mountpoint, inner, None))
}

/// Serves `tree` on `conn`, a connection to the keeper (`mockgpu-agent keeper`) that holds the
/// mount at `mountpoint`: fuser runs on the socket as it would on `/dev/fuse`, since the keeper
/// relays one request or reply per message. With `sysfs` as in [`mount`].
pub(crate) fn serve_relayed(
    tree: &Tree,
    conn: OwnedFd,
    mountpoint: &Path,
    sysfs: Option<&Path>,
) -> io::Result<Mounted> {
    let inner = Arc::new(Shared::new(tree, sysfs));
    let stop = conn.try_clone()?;
    let config = config();
    let fs = DriverFs::new(inner.clone());
    let session = fuser::Session::from_fd(fs, conn, config.acl, config)?.spawn()?;
    Ok(mounted(session, mountpoint, inner, Some(stop)))
}

fn mounted(
    session: BackgroundSession,
    mountpoint: &Path,
    inner: Arc<Shared>,
    relay: Option<OwnedFd>,
) -> Mounted {
    Mounted {
        handle: TreeHandle::new(inner, session.notifier(), mountpoint),
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        relay,
    }
}

/// Threads reading FUSE requests.
const FUSE_THREADS: usize = 2;

/// The session settings of the driver tree's mount.
fn config() -> Config {
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::RO,
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::DefaultPermissions,
        MountOption::FSName("mockgpu".into()),
        MountOption::Subtype("mockgpu".into()),
    ];
    config.acl = if nix::unistd::geteuid().is_root() {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(FUSE_THREADS);
    config
}
