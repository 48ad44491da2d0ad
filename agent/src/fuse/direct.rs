//! Serving the device a keeper passed (its word [`word::DEVICE`]): fuser's descriptor, the
//! keeper's socket until the handshake, is made the device, and a thread watches the keeper's
//! connection. Stopping points the descriptor at `/dev/null` and interrupts the FUSE threads'
//! reads; once they have ended, the connection's writing side is shut, and the keeper has the
//! kernel resend what they had read and not answered.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::Duration;

use fuser::BackgroundSession;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::socket::{self, MsgFlags, Shutdown};

use crate::wire::{self, word};

/// How long an agent waits for the keeper's word once it answered `INIT`.
const WORD_TIMEOUT: Duration = Duration::from_secs(10);

/// The signal that interrupts a FUSE thread's read (ignored by default, so never fatal).
const INTERRUPT: Signal = Signal::SIGURG;

/// The keeper's word after `INIT`, on `conn`: the device to read (`Some`), or the relay (`None`).
pub(super) fn keeper_word(conn: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    wire::set_recv_timeout(conn, WORD_TIMEOUT);
    let mut buf = [0u8; 64];
    let received = wire::recv_fds(conn, &mut buf);
    wire::set_recv_timeout(conn, Duration::ZERO);
    let (n, mut fds) = received?;
    match (&buf[..n], fds.len()) {
        (word::DEVICE, 1) => Ok(fds.pop()),
        (word::RELAY, 0) => Ok(None),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the keeper did not say how to serve after INIT ({n} bytes, {} descriptors): a keeper older than this agent? Restart it",
                fds.len()
            ),
        )),
    }
}

/// An agent's session on the device, and its keeper's connection.
pub(super) struct Direct {
    /// fuser's descriptor, made the device.
    fd: RawFd,
    /// Taken by whoever stops it first: the watcher or the agent's unmount.
    session: Mutex<Option<BackgroundSession>>,
    conn: OwnedFd,
    /// A newer agent took over: this one stopped reading, and that is no failure.
    superseded: AtomicBool,
}

impl Direct {
    /// `session`, reading the device through `fd` (see [`replace_fd`]), and the thread that
    /// stops it when the keeper says a newer agent took over, or goes away.
    pub(super) fn start(
        session: BackgroundSession,
        fd: RawFd,
        conn: OwnedFd,
    ) -> io::Result<(Arc<Direct>, JoinHandle<()>)> {
        let direct = Arc::new(Direct {
            fd,
            session: Mutex::new(Some(session)),
            conn,
            superseded: AtomicBool::new(false),
        });
        let watched = direct.clone();
        let watcher = std::thread::Builder::new()
            .name("keeper-watch".into())
            .spawn(move || watched.watch())?;
        Ok((direct, watcher))
    }

    /// Waits on the keeper's connection: its `STOP` (a newer agent reads the device) or its
    /// end (the keeper died, or [`Direct::release`]) stops the session.
    fn watch(&self) {
        let mut buf = [0u8; 64];
        let said = socket::recv(self.conn.as_raw_fd(), &mut buf, MsgFlags::empty());
        if let Ok(n) = said
            && &buf[..n] == word::STOP
        {
            tracing::info!("a newer agent reads the device: this one stops reading");
            self.superseded.store(true, Ordering::Release);
        }
        if let Err(e) = self.stop() {
            tracing::warn!(error = %e, "cannot stop reading the device");
        }
    }

    /// Whether this agent still serves, or stopped for a newer agent.
    pub(super) fn serving(&self) -> bool {
        self.superseded.load(Ordering::Acquire)
            || self
                .session
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_ref()
                .is_some_and(|s| !s.guard.is_finished())
    }

    /// Stops the FUSE threads (if nobody did yet), waits for them, and shuts the connection's
    /// writing side: the keeper reads its end and has the kernel resend what they left.
    pub(super) fn stop(&self) -> io::Result<()> {
        let session = self
            .session
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(session) = session else {
            return Ok(());
        };
        stop_reading(self.fd)?;
        let joined = joined(session.join());
        let _ = socket::shutdown(self.conn.as_raw_fd(), Shutdown::Write);
        joined
    }

    /// Ends the watcher (stopping the session first, if it still runs).
    pub(super) fn release(&self, watcher: JoinHandle<()>) -> io::Result<()> {
        let stopped = self.stop();
        let _ = socket::shutdown(self.conn.as_raw_fd(), Shutdown::Read);
        let _ = watcher.join();
        stopped
    }
}

/// Makes descriptor `fd` (held by fuser) refer to what `src` refers to: done before fuser's
/// threads start, since a read already waiting goes on with the file it started with.
pub(super) fn replace_fd(src: &impl AsRawFd, fd: RawFd) -> io::Result<()> {
    // SAFETY: dup3 only swaps what the number `fd` refers to; `fd` stays open and owned by
    // fuser's session, which reads and writes it as before.
    if unsafe { libc::dup3(src.as_raw_fd(), fd, libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Ends the FUSE threads that read the device through `fd`: `fd` becomes `/dev/null`, whose
/// end of file ends a fuser thread, and this process's FUSE threads blocked in a read are
/// interrupted, so that they read again, from `/dev/null` (another session's threads just read
/// again). What a thread had read is answered into `/dev/null`, for the kernel to resend.
fn stop_reading(fd: RawFd) -> io::Result<()> {
    replace_fd(&std::fs::File::open("/dev/null")?, fd)?;
    static HANDLER: Once = Once::new();
    HANDLER.call_once(|| {
        extern "C" fn interrupted(_: libc::c_int) {}
        // Without SA_RESTART, a read the signal interrupts fails with EINTR; fuser reads again.
        let action = SigAction::new(
            SigHandler::Handler(interrupted),
            SaFlags::empty(),
            SigSet::empty(),
        );
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        let _ = unsafe { nix::sys::signal::sigaction(INTERRUPT, &action) };
    });
    let pid = std::process::id() as libc::pid_t;
    for task in std::fs::read_dir("/proc/self/task")?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        let tid = task.file_name().to_str().and_then(|t| t.parse().ok());
        if let (true, Some(tid)) = (comm.starts_with("fuser-"), tid) {
            let tid: libc::pid_t = tid;
            // SAFETY: tgkill only sends a signal, to a thread of this process.
            unsafe { libc::syscall(libc::SYS_tgkill, pid, tid, INTERRUPT as libc::c_int) };
        }
    }
    Ok(())
}

/// A FUSE session's end, once joined: an end of file is how a keeper's connection or a stopped
/// reader ends, which fuser calls an invalid request.
pub(super) fn joined(r: io::Result<()>) -> io::Result<()> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::InvalidData => Ok(()),
        other => other,
    }
}
