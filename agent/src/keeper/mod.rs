//! `mockgpu-agent keeper`: the process that owns the FUSE connection, so that the agent can
//! crash, restart or be upgraded without the mount going away and without a failed read.
//!
//! The keeper opens `/dev/fuse` and mounts it (as root). It serves nothing itself. Agents
//! connect over a `SOCK_SEQPACKET` Unix socket; each gets the kernel's `INIT` on it (recorded: a
//! later agent gets it first, since fuser starts with that handshake, and its reply is
//! swallowed, the kernel being answered once already). Then one of two data paths:
//!
//! - **Direct** (the kernel resends, Linux 6.9 and later): the agent gets the device itself
//!   (`SCM_RIGHTS`) and reads it; the keeper sees no request. When the agent's connection ends,
//!   the keeper asks the kernel to queue again what it had handed out and got no reply to
//!   (`FUSE_NOTIFY_RESEND`), and the next agent reads those.
//! - **Relay** (older kernels, `--relay`, agents before the direct path): each request the
//!   keeper reads from the device goes to the current agent, one per message, so fuser runs
//!   unchanged on the agent's end; each reply comes back the same way and is written to the
//!   device. Requests that expect a reply stay in the keeper's in-flight table until one arrives;
//!   when an agent's connection ends, the keeper gives what it left unanswered to the next agent.
//!
//! While no agent is connected nobody reads the device, so the kernel queues requests and
//! readers wait.
//!
//! A keeper that starts while another one listens on the socket takes over from it: the old one
//! stops reading, passes the device, its agents' connections (`SCM_RIGHTS`), the recorded `INIT`
//! and the in-flight table, and exits without unmounting once the new one has them all.
mod device;
mod error;
mod relay;
mod spawn;
mod takeover;

use std::io::{self, Write as _};
use std::os::fd::{AsFd as _, AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::Duration;

use mockgpu_api::Layout;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{self, Backlog, MsgFlags, SockFlag, UnixAddr, sockopt};

pub use error::KeeperError;
pub(crate) use spawn::attach;

use crate::wire::{
    AGENT_HELLO, HELLO_TIMEOUT, KEEPER_HELLO, READY, RELAYED_AGENT_HELLO, connect, nobody_listens,
    seqpacket, set_recv_timeout,
};
use error::io_err;
use relay::Relay;

/// How FUSE requests reach the agents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataPath {
    /// Agents read the device themselves where the kernel resends (Linux 6.9 and later);
    /// otherwise through the relay.
    Auto,
    /// Every request through the keeper's relay (for comparison, and for tests of the path that
    /// older kernels take).
    Relay,
}

/// What [`run`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A new keeper took the connection over.
    HandedOver,
    /// Asked to stop (SIGTERM, SIGINT): the mount was detached.
    Stopped,
    /// The mount went away (unmounted from outside).
    Unmounted,
}

/// Runs the keeper of `layout` until it hands the connection over, is stopped or the mount
/// goes away: takes over from a running keeper when one listens, else mounts the driver tree's
/// mount point itself. Prints `listening` on standard output once it accepts agents.
/// Agents get their requests by `path`.
pub fn run(layout: &Layout, data_path: DataPath) -> Result<Outcome, KeeperError> {
    let relay_only = data_path == DataPath::Relay;
    if !nix::unistd::geteuid().is_root() {
        return Err(KeeperError::NotRoot);
    }
    // `ps` shows the executable's name otherwise: `exe`, for `/proc/self/exe keeper`.
    let _ = nix::sys::prctl::set_name(c"mockgpu-keeper");
    let path = layout.keeper_socket();
    // SIGTERM and SIGINT arrive through a descriptor that the relay loop polls.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals
        .thread_block()
        .map_err(io_err("block SIGTERM and SIGINT"))?;
    // As PID 1 of a container (the chart's keeper) a signal left at its default disposition is
    // dropped before it is queued, blocked or not: a handler (never run while the signals are
    // blocked; they are read from the descriptor) makes the kernel queue them.
    extern "C" fn queued(_: libc::c_int) {}
    let action = SigAction::new(
        SigHandler::Handler(queued),
        SaFlags::empty(),
        SigSet::empty(),
    );
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        unsafe { nix::sys::signal::sigaction(signal, &action) }
            .map_err(io_err("install a SIGTERM and SIGINT handler"))?;
    }
    let signal_fd = SignalFd::with_flags(&signals, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(io_err("create a signalfd"))?;
    let mut relay = match connect(&path, KEEPER_HELLO) {
        Ok(conn) => {
            let relay =
                takeover::take_over(&conn, relay_only).map_err(|reason| KeeperError::Takeover {
                    path: path.clone(),
                    reason,
                })?;
            tracing::info!(
                socket = %path.display(), agents = relay.agents.len(), inflight = relay.inflight.len(),
                "took the FUSE connection over from the running keeper"
            );
            relay
        }
        Err(e) if nobody_listens(e) => Relay::new(device::mount_device(layout)?, None, relay_only)?,
        Err(e) => return Err(io_err(format!("connect to {}", path.display()))(e)),
    };
    let listener = listen(&path)?;
    // Read by the agent that started this keeper; nobody may read it (a closed pipe).
    let _ = writeln!(io::stdout(), "{READY} {}", path.display());
    tracing::info!(socket = %path.display(), mountpoint = %layout.mount_point().display(), "keeper listening");
    let outcome = relay.serve(&listener, &signal_fd)?;
    match outcome {
        Outcome::Stopped => {
            let mountpoint = layout.mount_point();
            if let Err(e) = nix::mount::umount2(&mountpoint, nix::mount::MntFlags::MNT_DETACH) {
                tracing::warn!(mountpoint = %mountpoint.display(), error = %e, "cannot detach the driver tree");
            }
            // The next keeper binds its own socket; a stale file would only refuse connections.
            let _ = std::fs::remove_file(&path);
            tracing::info!("keeper stopped; driver tree detached");
        }
        Outcome::HandedOver => {
            tracing::info!("handed the FUSE connection over; exiting without unmounting")
        }
        Outcome::Unmounted => tracing::info!("the driver tree was unmounted; keeper exits"),
    }
    relay.finish();
    Ok(outcome)
}

/// Binds and listens on `path` (root only may connect: mode 0600, in a directory of mode 0700),
/// replacing a stale socket.
fn listen(path: &Path) -> Result<OwnedFd, KeeperError> {
    let what = || format!("listen on {}", path.display());
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io_err(what()))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(io_err(what()))?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(io_err(what())(e)),
        _ => {}
    }
    let fd = seqpacket().map_err(io_err(what()))?;
    socket::bind(
        fd.as_raw_fd(),
        &UnixAddr::new(path).map_err(io_err(what()))?,
    )
    .map_err(io_err(what()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err(what()))?;
    socket::listen(&fd, Backlog::new(16).map_err(io_err(what()))?).map_err(io_err(what()))?;
    Ok(fd)
}

impl Relay {
    /// Relays until a signal, a takeover or the end of the mount.
    fn serve(&mut self, listener: &OwnedFd, signal_fd: &SignalFd) -> Result<Outcome, KeeperError> {
        loop {
            let relaying = self.current().is_some();
            let read_kernel = relaying && self.backlog.is_empty();
            let write_agent = relaying && !self.backlog.is_empty();
            let current = self.current().map(|a| a.id);
            let revents: Vec<PollFlags> = {
                // Polling the device at all wakes the keeper at every request the kernel
                // queues: while no agent is relayed to, its place in the poll set is held by the
                // signal descriptor (asked for nothing), and its end is looked for once a second.
                let device = if relaying {
                    self.fuse.as_fd()
                } else {
                    signal_fd.as_fd()
                };
                let mut fds = vec![
                    PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                    PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
                    PollFd::new(
                        device,
                        if read_kernel {
                            PollFlags::POLLIN
                        } else {
                            PollFlags::empty()
                        },
                    ),
                ];
                for a in &self.agents {
                    let mut events = PollFlags::POLLIN;
                    if write_agent && Some(a.id) == current {
                        events |= PollFlags::POLLOUT;
                    }
                    fds.push(PollFd::new(a.conn.as_fd(), events));
                }
                let timeout = if relaying {
                    PollTimeout::NONE
                } else {
                    PollTimeout::from(1000u16)
                };
                match nix::poll::poll(&mut fds, timeout) {
                    Err(Errno::EINTR) => continue,
                    r => r.map_err(io_err("poll"))?,
                };
                let mut revents: Vec<PollFlags> = fds
                    .iter()
                    .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                    .collect();
                if !relaying {
                    let mut fds = [PollFd::new(self.fuse.as_fd(), PollFlags::empty())];
                    let _ = nix::poll::poll(&mut fds, PollTimeout::ZERO);
                    revents[2] = fds[0].revents().unwrap_or(PollFlags::empty());
                }
                revents
            };
            if revents[1].contains(PollFlags::POLLIN)
                && signal_fd.read_signal().ok().flatten().is_some()
            {
                return Ok(Outcome::Stopped);
            }
            let ready: Vec<u64> = self
                .agents
                .iter()
                .zip(&revents[3..])
                .filter(|(_, r)| !r.is_empty())
                .map(|(a, _)| a.id)
                .collect();
            for id in ready {
                self.pump(id);
            }
            if revents[2].intersects(PollFlags::POLLERR | PollFlags::POLLHUP) {
                return Ok(Outcome::Unmounted);
            }
            if revents[2].contains(PollFlags::POLLIN) && self.read_kernel() {
                return Ok(Outcome::Unmounted);
            }
            self.flush();
            if revents[0].contains(PollFlags::POLLIN) && self.accept(listener) {
                return Ok(Outcome::HandedOver);
            }
        }
    }
    /// Accepts a connection: an agent joins; a keeper takes over (true when it did).
    fn accept(&mut self, listener: &OwnedFd) -> bool {
        let conn = match socket::accept4(listener.as_raw_fd(), SockFlag::SOCK_CLOEXEC) {
            // SAFETY: accept4 returned a new descriptor that nothing else owns.
            Ok(fd) => unsafe { OwnedFd::from_raw_fd(fd) },
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                return false;
            }
        };
        let root = socket::getsockopt(&conn, sockopt::PeerCredentials).is_ok_and(|c| c.uid() == 0);
        if !root {
            tracing::warn!("connection from a process that is not root refused");
            return false;
        }
        set_recv_timeout(&conn, HELLO_TIMEOUT);
        let mut hello = [0u8; 64];
        let n = socket::recv(conn.as_raw_fd(), &mut hello, MsgFlags::empty()).unwrap_or(0);
        set_recv_timeout(&conn, Duration::ZERO);
        match &hello[..n] {
            AGENT_HELLO | RELAYED_AGENT_HELLO => {
                self.join(conn, &hello[..n] == AGENT_HELLO);
                false
            }
            KEEPER_HELLO => match self.hand_over(&conn) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "handover to a new keeper failed; serving on");
                    false
                }
            },
            other => {
                tracing::warn!(hello = %String::from_utf8_lossy(other), "connection that is neither agent nor keeper refused");
                false
            }
        }
    }
}
