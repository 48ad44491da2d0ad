//! `mockgpu-agent keeper`: the process that owns the FUSE connection, so that the agent can
//! crash, restart or be upgraded without the mount going away and without a failed read.
//!
//! The keeper opens `/dev/fuse` and mounts it (as root). It serves nothing itself: it relays.
//! Each request it reads from the device goes to the current agent over a `SOCK_SEQPACKET` Unix
//! socket (one request per message, as the device hands them out, so fuser runs unchanged on the
//! agent's end), and each reply comes back the same way and is written to the device. Requests
//! that expect a reply stay in the keeper's in-flight table until one arrives; when an agent's
//! connection ends, the keeper gives what it left unanswered to the next agent. While no agent is
//! connected the keeper reads nothing from the device, so the kernel queues requests and readers
//! wait. The kernel's `INIT` is recorded: a later agent gets it first (fuser starts with that
//! handshake), and its reply is swallowed, since the kernel was answered once already.
//!
//! A keeper that starts while another one listens on the socket takes over from it: the old one
//! stops reading, passes the device, its agents' connections (`SCM_RIGHTS`), the recorded `INIT`
//! and the in-flight table, and exits without unmounting once the new one has them all.

use std::collections::{BTreeMap, VecDeque};
use std::io::{self, BufRead as _, IoSlice, IoSliceMut, Write as _};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mockgpu_api::Layout;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    self, AddressFamily, Backlog, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag,
    SockType, UnixAddr, sockopt,
};
use nix::sys::time::TimeVal;

use crate::mounts::{self, MountError};
use crate::sys::Linux;

/// What an agent sends first on its connection.
const AGENT_HELLO: &[u8] = b"mockgpu-agent 1";
/// What a keeper that takes over sends first.
const KEEPER_HELLO: &[u8] = b"mockgpu-keeper 1";
/// What an agent sends when it stops taking requests, followed by one byte: how many FUSE
/// threads it runs. The keeper sends it no new request and answers with as many `DESTROY`
/// requests, behind those it sent before: each thread serves what came first, then ends there.
pub const BYE: &[u8] = b"mockgpu-agent bye";
/// The `unique` of those made-up `DESTROY` requests (the kernel's never come near it).
const DESTROY_UNIQUE: u64 = u64::MAX;
/// The new keeper's word that it holds everything: the old one may exit.
const ACK: &[u8] = b"ack";
/// What a keeper prints on its standard output once it listens (read by the agent that
/// started it).
const READY: &str = "listening";

/// Room for the largest request the device hands out and the largest reply: the kernel
/// refuses read buffers smaller than fuser's maximum write (16 MiB) plus the headers.
const MSG_MAX: usize = (16 << 20) + 4096;
/// Socket buffers of relay connections: a reply must fit in one message.
const SOCK_BUF: usize = 4 << 20;
/// Most agent connections a handover passes.
const MAX_AGENTS: usize = 250;
/// How long a new connection may take to say who it is, and a takeover to be acknowledged.
const HELLO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long an agent waits for the keeper it started to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

// The FUSE opcodes (linux/fuse.h) the relay tells apart.
const FUSE_FORGET: u32 = 2;
const FUSE_INIT: u32 = 26;
const FUSE_DESTROY: u32 = 38;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_BATCH_FORGET: u32 = 42;

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

fn io_err<E: Into<io::Error>>(what: impl Into<String>) -> impl FnOnce(E) -> KeeperError {
    let what = what.into();
    move |e| KeeperError::Io {
        what,
        source: e.into(),
    }
}

/// `(opcode, unique)` of a request, from its `fuse_in_header`.
fn request_header(msg: &[u8]) -> Option<(u32, u64)> {
    let opcode = u32::from_ne_bytes(msg.get(4..8)?.try_into().ok()?);
    let unique = u64::from_ne_bytes(msg.get(8..16)?.try_into().ok()?);
    Some((opcode, unique))
}

/// The `unique` of a reply (0 for a notification), from its `fuse_out_header`.
fn reply_unique(msg: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(msg.get(8..16)?.try_into().ok()?))
}

/// Whether the kernel waits for a reply to a request with `opcode`.
fn expects_reply(opcode: u32) -> bool {
    !matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT)
}

fn seqpacket() -> Result<OwnedFd, KeeperError> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io_err("create a Unix socket"))
}

/// Makes the socket's buffers hold the largest message (root may exceed the system's cap).
fn size_buffers(fd: &OwnedFd) {
    let forced = socket::setsockopt(fd, sockopt::SndBufForce, &SOCK_BUF)
        .and_then(|()| socket::setsockopt(fd, sockopt::RcvBufForce, &SOCK_BUF));
    if forced.is_err() {
        let _ = socket::setsockopt(fd, sockopt::SndBuf, &SOCK_BUF);
        let _ = socket::setsockopt(fd, sockopt::RcvBuf, &SOCK_BUF);
    }
}

fn set_recv_timeout(fd: &OwnedFd, timeout: Duration) {
    let tv = TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
    let _ = socket::setsockopt(fd, sockopt::ReceiveTimeout, &tv);
}

/// Connects to the keeper socket at `path` and says who is calling.
fn connect(path: &Path, hello: &[u8]) -> nix::Result<OwnedFd> {
    let fd = socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    socket::connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    size_buffers(&fd);
    socket::send(fd.as_raw_fd(), hello, MsgFlags::MSG_NOSIGNAL)?;
    Ok(fd)
}

/// Whether a failed connect means that no keeper listens there.
fn nobody_listens(e: Errno) -> bool {
    matches!(e, Errno::ENOENT | Errno::ECONNREFUSED)
}

/// The agent's connection to the keeper of `layout`, on which it serves FUSE requests. Starts a
/// keeper (this executable, in a session of its own so that it outlives the agent) when none
/// listens.
pub fn attach(layout: &Layout) -> Result<OwnedFd, KeeperError> {
    let path = layout.keeper_socket();
    match connect(&path, AGENT_HELLO) {
        Ok(conn) => {
            tracing::info!(socket = %path.display(), "connected to the running keeper");
            return Ok(conn);
        }
        Err(e) if nobody_listens(e) => {}
        Err(e) => return Err(io_err(format!("connect to {}", path.display()))(e)),
    }
    let start_error = |reason: String| KeeperError::Start {
        path: path.clone(),
        reason,
    };
    let mut command = Command::new(crate::SELF_EXE);
    command
        .arg("keeper")
        .arg("--dir")
        .arg(layout.host_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it runs in the child between fork and exec.
    unsafe {
        command.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .map_err(io_err("start a keeper (/proc/self/exe keeper)"))?;
    let pid = child.id();
    // The keeper says when it listens, or closes its output when it fails.
    let stdout = child.stdout.take().expect("stdout is piped");
    let (ready_tx, ready_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = io::BufReader::new(stdout).read_line(&mut line);
        let _ = ready_tx.send(line);
    });
    let line = ready_rx.recv_timeout(START_TIMEOUT).unwrap_or_default();
    if !line.starts_with(READY) {
        let _ = child.kill();
        let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
        return Err(start_error(format!("it exited ({status})")));
    }
    tracing::info!(pid, socket = %path.display(), "started a keeper");
    // Reaps the keeper should it end while this agent runs.
    std::thread::spawn(move || {
        if let Ok(status) = child.wait() {
            tracing::warn!(pid, %status, "the keeper ended");
        }
    });
    connect(&path, AGENT_HELLO).map_err(|e| start_error(e.to_string()))
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
pub fn run(layout: &Layout) -> Result<Outcome, KeeperError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(KeeperError::NotRoot);
    }
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
            let relay = take_over(&conn).map_err(|reason| KeeperError::Takeover {
                path: path.clone(),
                reason,
            })?;
            tracing::info!(
                socket = %path.display(), agents = relay.agents.len(), inflight = relay.inflight.len(),
                "took the FUSE connection over from the running keeper"
            );
            relay
        }
        Err(e) if nobody_listens(e) => Relay::new(mount_device(layout)?, None)?,
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

/// Opens `/dev/fuse` and mounts it at the layout's mount point (read-only, `nosuid`, `nodev`,
/// readable by every user), in the host directory made a shared mount first.
fn mount_device(layout: &Layout) -> Result<OwnedFd, KeeperError> {
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
    let fd = seqpacket()?;
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

/// A request the kernel waits on, and the agent it went to (none: waiting for an agent).
struct Pending {
    request: Vec<u8>,
    agent: Option<u64>,
}

/// One agent's connection.
struct Agent {
    id: u64,
    conn: OwnedFd,
    /// The agent stopped taking requests (it shut its end for reading): it only answers.
    closing: bool,
}

/// The relay's state: what a handover passes on.
struct Relay {
    fuse: OwnedFd,
    /// The kernel's `INIT` request, and the reply it got.
    init: Option<Vec<u8>>,
    init_reply: Option<Vec<u8>>,
    /// Requests waiting for their reply, by unique.
    inflight: BTreeMap<u64, Pending>,
    /// Requests not yet sent to an agent, oldest first.
    backlog: VecDeque<Vec<u8>>,
    /// Connected agents, oldest first; the newest that is not closing gets the requests.
    agents: Vec<Agent>,
    next_id: u64,
    buf: Vec<u8>,
    /// Notifications (invalidations) go to a thread of their own: writing one can block until
    /// the kernel gets an inode lock that a request waiting on this relay holds.
    notify: Option<mpsc::Sender<Vec<u8>>>,
    notifier: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn new(fuse: OwnedFd, agents: Option<Vec<Agent>>) -> Result<Relay, KeeperError> {
        let out = fuse.try_clone().map_err(io_err("duplicate /dev/fuse"))?;
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let notifier = std::thread::Builder::new()
            .name("notify".into())
            .spawn(move || {
                for msg in rx {
                    if let Err(e) = nix::unistd::write(&out, &msg) {
                        tracing::debug!(error = %e, "notification not taken");
                    }
                }
            })
            .map_err(io_err("start the notification thread"))?;
        let agents = agents.unwrap_or_default();
        Ok(Relay {
            fuse,
            init: None,
            init_reply: None,
            inflight: BTreeMap::new(),
            backlog: VecDeque::new(),
            next_id: agents.len() as u64,
            agents,
            buf: vec![0; MSG_MAX],
            notify: Some(tx),
            notifier: Some(notifier),
        })
    }

    /// Writes the notifications still queued.
    fn finish(&mut self) {
        self.notify = None;
        if let Some(t) = self.notifier.take() {
            let _ = t.join();
        }
    }

    fn current(&self) -> Option<&Agent> {
        self.agents.iter().rev().find(|a| !a.closing)
    }

    fn serve(&mut self, listener: &OwnedFd, signal_fd: &SignalFd) -> Result<Outcome, KeeperError> {
        loop {
            let read_kernel = self.current().is_some() && self.backlog.is_empty();
            let write_agent = self.current().is_some() && !self.backlog.is_empty();
            let current = self.current().map(|a| a.id);
            let revents: Vec<PollFlags> = {
                let mut fds = vec![
                    PollFd::new(listener.as_fd(), PollFlags::POLLIN),
                    PollFd::new(signal_fd.as_fd(), PollFlags::POLLIN),
                    PollFd::new(
                        self.fuse.as_fd(),
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
                match nix::poll::poll(&mut fds, PollTimeout::NONE) {
                    Err(Errno::EINTR) => continue,
                    r => r.map_err(io_err("poll"))?,
                };
                fds.iter()
                    .map(|f| f.revents().unwrap_or(PollFlags::empty()))
                    .collect()
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

    /// Reads requests from the device while the current agent takes them; true once the
    /// connection is gone (unmounted).
    fn read_kernel(&mut self) -> bool {
        for _ in 0..64 {
            if !self.backlog.is_empty() || self.current().is_none() {
                return false;
            }
            // The poll said readable; another reader of the device (none) could have won.
            let mut fds = [PollFd::new(self.fuse.as_fd(), PollFlags::POLLIN)];
            if !matches!(nix::poll::poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
                return false;
            }
            match nix::unistd::read(self.fuse.as_raw_fd(), &mut self.buf) {
                Ok(n) => {
                    let msg = self.buf[..n].to_vec();
                    self.queue(msg);
                    self.flush();
                }
                Err(Errno::ENOENT | Errno::EINTR | Errno::EAGAIN) => {}
                Err(Errno::ENODEV) => return true,
                Err(e) => {
                    tracing::error!(error = %e, "cannot read /dev/fuse");
                    return true;
                }
            }
        }
        false
    }

    /// Records a request from the kernel and queues it for the current agent.
    fn queue(&mut self, msg: Vec<u8>) {
        let Some((opcode, unique)) = request_header(&msg) else {
            tracing::warn!(bytes = msg.len(), "short request from the kernel dropped");
            return;
        };
        if opcode == FUSE_INIT {
            self.init = Some(msg.clone());
        }
        if expects_reply(opcode) {
            self.inflight.insert(
                unique,
                Pending {
                    request: msg.clone(),
                    agent: None,
                },
            );
        }
        self.backlog.push_back(msg);
    }

    /// Sends the backlog to the current agent until its socket is full.
    fn flush(&mut self) {
        while let Some(msg) = self.backlog.front() {
            let Some(agent) = self.current() else {
                return;
            };
            let id = agent.id;
            match socket::send(
                agent.conn.as_raw_fd(),
                msg,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            ) {
                Ok(_) => {
                    if let Some((_, unique)) = request_header(msg)
                        && let Some(p) = self.inflight.get_mut(&unique)
                    {
                        p.agent = Some(id);
                    }
                    self.backlog.pop_front();
                }
                Err(Errno::EAGAIN | Errno::EINTR) => return,
                Err(e) => {
                    // The agent shut its end for reading (a graceful stop) or went away: it
                    // still answers what it has, and takes nothing new.
                    tracing::info!(agent = id, error = %e, "agent takes no more requests");
                    if let Some(a) = self.agents.iter_mut().find(|a| a.id == id) {
                        a.closing = true;
                    }
                }
            }
        }
    }

    /// Passes on every reply agent `id` sent; on the end of its connection, queues what it left
    /// unanswered for the next agent.
    fn pump(&mut self, id: u64) {
        let Some(idx) = self.agents.iter().position(|a| a.id == id) else {
            return;
        };
        let fd = self.agents[idx].conn.as_raw_fd();
        loop {
            match socket::recv(fd, &mut self.buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => break,
                Ok(n) => {
                    let msg = self.buf[..n].to_vec();
                    match msg.strip_prefix(BYE) {
                        Some(&[threads]) => self.bye(idx, threads),
                        _ => self.reply(&msg),
                    }
                }
                Err(Errno::EAGAIN) => return,
                Err(Errno::EINTR) => {}
                Err(e) => {
                    tracing::warn!(agent = id, error = %e, "agent connection failed");
                    break;
                }
            }
        }
        self.agents.remove(idx);
        let mut requeued = 0;
        for p in self.inflight.values_mut().rev() {
            if p.agent == Some(id) {
                p.agent = None;
                self.backlog.push_front(p.request.clone());
                requeued += 1;
            }
        }
        tracing::info!(
            agent = id,
            requeued,
            agents = self.agents.len(),
            "agent disconnected"
        );
    }

    /// Agent `idx` stops: it gets nothing new, and one `DESTROY` per FUSE thread.
    fn bye(&mut self, idx: usize, threads: u8) {
        let agent = &mut self.agents[idx];
        agent.closing = true;
        let mut destroy = vec![0u8; 40];
        destroy[0..4].copy_from_slice(&40u32.to_ne_bytes());
        destroy[4..8].copy_from_slice(&FUSE_DESTROY.to_ne_bytes());
        destroy[8..16].copy_from_slice(&DESTROY_UNIQUE.to_ne_bytes());
        for _ in 0..threads {
            if let Err(e) = socket::send(agent.conn.as_raw_fd(), &destroy, MsgFlags::MSG_NOSIGNAL) {
                tracing::debug!(agent = agent.id, error = %e, "agent gone before its DESTROY");
                break;
            }
        }
        tracing::info!(agent = agent.id, "agent stops taking requests");
    }

    /// Writes an agent's reply to the kernel, unless it answers the replayed `INIT`.
    fn reply(&mut self, msg: &[u8]) {
        let Some(unique) = reply_unique(msg) else {
            tracing::warn!(bytes = msg.len(), "short reply from an agent dropped");
            return;
        };
        if unique == 0 {
            if let Some(tx) = &self.notify {
                let _ = tx.send(msg.to_vec());
            }
            return;
        }
        let init_unique = self.init.as_deref().and_then(request_header).map(|h| h.1);
        if Some(unique) == init_unique
            && let Some(first) = &self.init_reply
        {
            if first.as_slice() != msg {
                tracing::warn!(
                    "an agent answered INIT unlike the first one; the kernel keeps the first answer"
                );
            }
            return;
        }
        if self.inflight.remove(&unique).is_none() {
            tracing::debug!(unique, "reply to no pending request dropped");
            return;
        }
        if Some(unique) == init_unique {
            self.init_reply = Some(msg.to_vec());
        }
        if let Err(e) = nix::unistd::write(&self.fuse, msg) {
            // ENOENT: the kernel gave up on the request (interrupted or aborted).
            tracing::debug!(unique, error = %e, "reply not taken by the kernel");
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
            AGENT_HELLO => {
                self.join(conn);
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

    /// A new agent becomes the current one: it gets the recorded `INIT` when the kernel was
    /// answered already, then the backlog.
    fn join(&mut self, conn: OwnedFd) {
        size_buffers(&conn);
        let id = self.next_id;
        self.next_id += 1;
        if self.init_reply.is_some()
            && let Some(init) = &self.init
            && let Err(e) = socket::send(conn.as_raw_fd(), init, MsgFlags::MSG_NOSIGNAL)
        {
            tracing::warn!(agent = id, error = %e, "cannot replay INIT to the agent");
            return;
        }
        tracing::info!(agent = id, waiting = self.backlog.len(), "agent connected");
        self.agents.push(Agent {
            id,
            conn,
            closing: false,
        });
        self.flush();
    }

    /// Passes the device, the agents' connections and the relay's state to a new keeper and
    /// waits for its acknowledgement.
    fn hand_over(&mut self, conn: &OwnedFd) -> Result<(), String> {
        size_buffers(conn);
        let agents = &self.agents[self.agents.len().saturating_sub(MAX_AGENTS)..];
        let mut fds: Vec<RawFd> = vec![self.fuse.as_raw_fd()];
        fds.extend(agents.iter().map(|a| a.conn.as_raw_fd()));
        let mut head = vec![b'H'];
        head.extend(agents.iter().map(|a| u8::from(a.closing)));
        let send = |msg: &[u8]| {
            socket::send(conn.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL)
                .map(drop)
                .map_err(|e| e.to_string())
        };
        socket::sendmsg::<()>(
            conn.as_raw_fd(),
            &[IoSlice::new(&head)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(|e| e.to_string())?;
        for (tag, bytes) in [(b'I', &self.init), (b'R', &self.init_reply)] {
            if let Some(b) = bytes {
                send(&[&[tag], b.as_slice()].concat())?;
            }
        }
        for p in self.inflight.values() {
            let Some(idx) = p
                .agent
                .and_then(|id| agents.iter().position(|a| a.id == id))
            else {
                continue;
            };
            send(&[&[b'Q', idx as u8], p.request.as_slice()].concat())?;
        }
        for msg in &self.backlog {
            send(&[b"B".as_slice(), msg.as_slice()].concat())?;
        }
        send(b"E")?;
        set_recv_timeout(conn, HELLO_TIMEOUT);
        let mut ack = [0u8; 8];
        match socket::recv(conn.as_raw_fd(), &mut ack, MsgFlags::empty()) {
            Ok(n) if &ack[..n] == ACK => Ok(()),
            Ok(_) => Err("the new keeper did not acknowledge".into()),
            Err(e) => Err(format!("no acknowledgement: {e}")),
        }
    }
}

/// Receives a running keeper's handover on `conn` and acknowledges it.
fn take_over(conn: &OwnedFd) -> Result<Relay, String> {
    set_recv_timeout(conn, HELLO_TIMEOUT);
    let mut head = [0u8; 1 + MAX_AGENTS];
    let mut cmsg = nix::cmsg_space!([RawFd; 1 + MAX_AGENTS]);
    let (n, fds) = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = socket::recvmsg::<()>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| format!("no handover: {e}"))?;
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(|e| e.to_string())? {
            if let ControlMessageOwned::ScmRights(received) = c {
                // SAFETY: SCM_RIGHTS installed these descriptors in this process for us alone.
                fds.extend(
                    received
                        .into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, fds)
    };
    if n == 0 || head[0] != b'H' || fds.len() != n {
        return Err(format!(
            "malformed handover header ({n} bytes, {} descriptors)",
            fds.len()
        ));
    }
    let mut fds = fds.into_iter();
    let fuse = fds.next().expect("checked: one descriptor per header byte");
    let agents: Vec<Agent> = fds
        .zip(&head[1..n])
        .enumerate()
        .map(|(i, (conn, &closing))| Agent {
            id: i as u64,
            conn,
            closing: closing != 0,
        })
        .collect();
    let mut relay = Relay::new(fuse, Some(agents)).map_err(|e| e.to_string())?;
    loop {
        let n = socket::recv(conn.as_raw_fd(), &mut relay.buf, MsgFlags::empty())
            .map_err(|e| format!("handover cut short: {e}"))?;
        let msg = relay.buf[..n].to_vec();
        match msg.split_first() {
            Some((b'I', init)) => relay.init = Some(init.to_vec()),
            Some((b'R', reply)) => relay.init_reply = Some(reply.to_vec()),
            Some((b'Q', rest)) => {
                let (&idx, request) = rest.split_first().ok_or("empty in-flight entry")?;
                let (_, unique) = request_header(request).ok_or("short in-flight request")?;
                relay.inflight.insert(
                    unique,
                    Pending {
                        request: request.to_vec(),
                        agent: Some(u64::from(idx)),
                    },
                );
            }
            Some((b'B', request)) => relay.queue(request.to_vec()),
            Some((b'E', _)) => break,
            _ => return Err(format!("unexpected handover message of {n} bytes")),
        }
    }
    socket::send(conn.as_raw_fd(), ACK, MsgFlags::MSG_NOSIGNAL).map_err(|e| e.to_string())?;
    Ok(relay)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(opcode: u32, unique: u64) -> Vec<u8> {
        let mut m = vec![0u8; 40];
        m[0..4].copy_from_slice(&40u32.to_ne_bytes());
        m[4..8].copy_from_slice(&opcode.to_ne_bytes());
        m[8..16].copy_from_slice(&unique.to_ne_bytes());
        m
    }

    fn reply(unique: u64, body: &[u8]) -> Vec<u8> {
        let mut m = vec![0u8; 16];
        m[0..4].copy_from_slice(&(16 + body.len() as u32).to_ne_bytes());
        m[8..16].copy_from_slice(&unique.to_ne_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A relay whose "device" is one end of a socketpair (the test plays the kernel on the other)
    /// and a connected agent whose far end the test holds.
    fn relay() -> (Relay, OwnedFd) {
        let (kernel, device) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        (Relay::new(device, None).unwrap(), kernel)
    }

    fn agent(relay: &mut Relay) -> OwnedFd {
        let (ours, theirs) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        relay.join(ours);
        theirs
    }

    fn recv(fd: &OwnedFd) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)
            .ok()
            .map(|n| buf[..n].to_vec())
    }

    #[test]
    fn forgets_and_interrupts_expect_no_reply() {
        assert!(!expects_reply(FUSE_FORGET));
        assert!(!expects_reply(FUSE_BATCH_FORGET));
        assert!(!expects_reply(FUSE_INTERRUPT));
        assert!(expects_reply(FUSE_INIT));
        assert!(expects_reply(15)); // READ
        assert_eq!(request_header(&request(15, 7)), Some((15, 7)));
        assert_eq!(request_header(&[0; 10]), None);
    }

    #[test]
    fn unanswered_requests_go_to_the_next_agent_after_the_replayed_init() {
        let (mut relay, kernel) = relay();
        let first = agent(&mut relay);
        relay.queue(request(FUSE_INIT, 1));
        relay.queue(request(1, 2)); // LOOKUP
        relay.queue(request(FUSE_FORGET, 3));
        relay.flush();
        assert_eq!(recv(&first), Some(request(FUSE_INIT, 1)));
        assert_eq!(recv(&first), Some(request(1, 2)));
        assert_eq!(recv(&first), Some(request(FUSE_FORGET, 3)));
        // The first agent answers INIT, then dies before answering the lookup.
        socket::send(first.as_raw_fd(), &reply(1, b"init-1"), MsgFlags::empty()).unwrap();
        drop(first);
        relay.pump(0);
        assert_eq!(recv(&kernel), Some(reply(1, b"init-1")));
        assert_eq!(relay.inflight.keys().collect::<Vec<_>>(), [&2]);
        assert!(relay.agents.is_empty());

        let second = agent(&mut relay);
        assert_eq!(recv(&second), Some(request(FUSE_INIT, 1)), "INIT first");
        assert_eq!(recv(&second), Some(request(1, 2)), "then the lookup, once");
        assert_eq!(recv(&second), None, "the forget is not replayed");
        socket::send(second.as_raw_fd(), &reply(1, b"init-1"), MsgFlags::empty()).unwrap();
        socket::send(second.as_raw_fd(), &reply(2, b"entry"), MsgFlags::empty()).unwrap();
        socket::send(second.as_raw_fd(), &reply(0, b"inval"), MsgFlags::empty()).unwrap();
        relay.pump(1);
        assert_eq!(
            recv(&kernel),
            Some(reply(2, b"entry")),
            "INIT reply swallowed"
        );
        relay.finish();
        assert_eq!(
            recv(&kernel),
            Some(reply(0, b"inval")),
            "notification written"
        );
        assert_eq!(recv(&kernel), None);
        assert!(relay.inflight.is_empty());
    }

    #[test]
    fn a_draining_agent_keeps_its_requests_while_the_new_one_gets_the_rest() {
        let (mut relay, kernel) = relay();
        let old = agent(&mut relay);
        relay.queue(request(15, 10));
        relay.flush();
        let new = agent(&mut relay);
        relay.queue(request(15, 11));
        relay.flush();
        assert_eq!(recv(&old), Some(request(15, 10)));
        assert_eq!(recv(&old), None);
        assert_eq!(recv(&new), Some(request(15, 11)));
        socket::send(old.as_raw_fd(), &reply(10, b"a"), MsgFlags::empty()).unwrap();
        // A second reply to the same request (impossible from fuser) is not passed on twice.
        socket::send(old.as_raw_fd(), &reply(10, b"a"), MsgFlags::empty()).unwrap();
        relay.pump(0);
        assert_eq!(recv(&kernel), Some(reply(10, b"a")));
        assert_eq!(recv(&kernel), None);
        assert_eq!(relay.inflight.keys().collect::<Vec<_>>(), [&11]);
    }

    #[test]
    fn an_agent_that_says_bye_gets_one_destroy_per_thread_and_nothing_new() {
        let (mut relay, _kernel) = relay();
        let agent = agent(&mut relay);
        relay.queue(request(15, 20));
        relay.flush();
        socket::send(agent.as_raw_fd(), &[BYE, &[2]].concat(), MsgFlags::empty()).unwrap();
        relay.pump(0);
        relay.queue(request(15, 21));
        relay.flush();
        assert_eq!(recv(&agent), Some(request(15, 20)), "what it had first");
        let destroy = Some(request(FUSE_DESTROY, DESTROY_UNIQUE));
        assert_eq!(recv(&agent), destroy);
        assert_eq!(recv(&agent), destroy);
        assert_eq!(recv(&agent), None, "nothing new");
        assert_eq!(
            relay.backlog.len(),
            1,
            "the new request waits for the next agent"
        );
    }
}
