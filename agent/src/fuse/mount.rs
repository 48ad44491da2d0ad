//! The mount's lifecycle: mounting `/dev/fuse` through fuser, or serving a keeper's connection
//! (the device the keeper passes, see [`direct`](super::direct), or its relay), and letting go
//! of either.

use std::io;
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use fuser::{BackgroundSession, Config, MountOption, SessionACL};

use super::direct::{Direct, joined, keeper_word, replace_fd};
use super::filesystem::DriverFs;
use super::handle::TreeHandle;
use super::state::Shared;
use crate::tree::Tree;
use crate::wire;

/// A mounted driver tree; unmounts when dropped or on [`Mounted::unmount`]. Served through a
/// keeper ([`serve_through_keeper`]), it is never unmounted: the agent only lets go of its
/// connection.
pub struct Mounted {
    /// fuser's session on its own mount, or on a relaying keeper's connection.
    session: Option<BackgroundSession>,
    mountpoint: PathBuf,
    /// The keeper's connection, when the keeper holds the mount.
    keeper: Option<Keeper>,
    /// Replaces the served tree.
    pub handle: TreeHandle,
}

/// The agent's end of a keeper's connection.
enum Keeper {
    /// The keeper relays: fuser serves this connection.
    Relay(OwnedFd),
    /// The agent reads the device (with the session), and the thread watching the keeper.
    Direct(Arc<Direct>, Option<JoinHandle<()>>),
}

impl Mounted {
    /// Unmounts and waits for the FUSE thread to end. A mount still in use (an open file, a
    /// process's working directory) is detached lazily instead: it leaves the mount table at
    /// once and the FUSE thread serves its last users until they let go. Through a keeper: stops
    /// taking requests and closes the connection, and the mount stays. Relayed, the agent
    /// answers what it took first, and the keeper gives the rest to the next agent; reading the
    /// device, it stops at once, and the kernel resends what it left to the next agent.
    pub fn unmount(mut self) -> io::Result<()> {
        self.unmount_inner()
    }

    /// Whether a keeper holds the mount (see [`serve_through_keeper`]).
    pub(crate) fn through_keeper(&self) -> bool {
        self.keeper.is_some()
    }

    /// Whether the FUSE threads still serve, or stopped for a newer agent (they end when the
    /// keeper goes away).
    pub(crate) fn serving(&self) -> bool {
        match &self.keeper {
            Some(Keeper::Direct(direct, _)) => direct.serving(),
            _ => self
                .session
                .as_ref()
                .is_some_and(|s| !s.guard.is_finished()),
        }
    }

    fn unmount_inner(&mut self) -> io::Result<()> {
        match self.keeper.as_mut() {
            Some(Keeper::Direct(direct, watcher)) => {
                let Some(watcher) = watcher.take() else {
                    return Ok(());
                };
                self.handle.unpin();
                return direct.release(watcher);
            }
            Some(Keeper::Relay(conn)) => {
                let Some(session) = self.session.take() else {
                    return Ok(());
                };
                self.handle.unpin();
                // The keeper answers with one DESTROY per thread, behind what it sent before.
                if wire::send(conn, &wire::bye(FUSE_THREADS as u8)).is_err() {
                    // The keeper is gone: the threads read an end of file, if they have not yet.
                    nix::sys::socket::shutdown(conn.as_raw_fd(), nix::sys::socket::Shutdown::Read)?;
                }
                return joined(session.join());
            }
            None => {}
        }
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        self.handle.unpin();
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
    Ok(Mounted {
        handle: TreeHandle::new(inner, session.notifier(), mountpoint),
        session: Some(session),
        mountpoint: mountpoint.to_path_buf(),
        keeper: None,
    })
}

/// Serves `tree` on `conn`, a connection to the keeper (`mockgpu-agent keeper`) that holds the
/// mount at `mountpoint`. fuser's handshake runs on the socket (the keeper relays the kernel's
/// `INIT`, one message each way); then the keeper passes the device, and fuser's descriptor is
/// made that device, or relays every request the same way. With `sysfs` as in [`mount`].
pub(crate) fn serve_through_keeper(
    tree: &Tree,
    conn: OwnedFd,
    mountpoint: &Path,
    sysfs: Option<&Path>,
) -> io::Result<Mounted> {
    let inner = Arc::new(Shared::new(tree, sysfs));
    let control = conn.try_clone()?;
    let fd = conn.as_raw_fd();
    let config = config();
    let fs = DriverFs::new(inner.clone());
    let session = fuser::Session::from_fd(fs, conn, config.acl, config)?;
    let device = keeper_word(&control)?;
    if let Some(device) = &device {
        replace_fd(device, fd)?;
    }
    let session = session.spawn()?;
    let notifier = session.notifier();
    let (session, keeper) = match device {
        Some(_) => {
            let (direct, watcher) = Direct::start(session, fd, control)?;
            (None, Keeper::Direct(direct, Some(watcher)))
        }
        None => (Some(session), Keeper::Relay(control)),
    };
    Ok(Mounted {
        handle: TreeHandle::new(inner, notifier, mountpoint),
        session,
        mountpoint: mountpoint.to_path_buf(),
        keeper: Some(keeper),
    })
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
