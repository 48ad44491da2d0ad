//! The keeper protocol, shared by the agent's end and the keeper's end: the `SOCK_SEQPACKET`
//! sockets, what each side says first, the keeper's word on the data path, the agent's `BYE`,
//! the framing of relayed FUSE messages and the descriptors passed (`SCM_RIGHTS`).
//!
//! One message carries one FUSE request or reply, as the device hands them out, so fuser runs
//! on the agent's end of the socket as it would on `/dev/fuse`. An agent always gets the
//! kernel's `INIT` that way; then the keeper says whether it serves the device itself
//! ([`word::DEVICE`], with the device) or through the relay ([`word::RELAY`]).

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::socket::{
    self, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType,
    UnixAddr, sockopt,
};
use nix::sys::time::TimeVal;

/// What an agent sends first on its connection: it takes the device when the keeper offers it.
pub(crate) const AGENT_HELLO: &[u8] = b"mockgpu-agent 2";
/// What agents before the direct path sent first: they are relayed to, and told nothing.
pub(crate) const RELAYED_AGENT_HELLO: &[u8] = b"mockgpu-agent 1";
/// What a keeper that takes over sends first.
pub(crate) const KEEPER_HELLO: &[u8] = b"mockgpu-keeper 1";
/// What an agent sends when it stops taking requests, followed by one byte: how many FUSE
/// threads it runs. The keeper sends it no new request and answers with as many `DESTROY`
/// requests, behind those it sent before: each thread serves what came first, then ends there.
const BYE: &[u8] = b"mockgpu-agent bye";
/// The `unique` of those made-up `DESTROY` requests (the kernel's never come near it).
const DESTROY_UNIQUE: u64 = u64::MAX;
/// The new keeper's word that it holds everything: the old one may exit.
pub(crate) const ACK: &[u8] = b"ack";
/// What a keeper prints on its standard output once it listens (read by the agent that
/// started it).
pub(crate) const READY: &str = "listening";

/// Room for the largest request the device hands out and the largest reply: the kernel
/// refuses read buffers smaller than fuser's maximum write (16 MiB) plus the headers.
pub(crate) const MSG_MAX: usize = (16 << 20) + 4096;
/// Socket buffers of relay connections: a reply must fit in one message.
const SOCK_BUF: usize = 4 << 20;
/// Most agent connections a handover passes.
pub(crate) const MAX_AGENTS: usize = 250;
/// How long a new connection may take to say who it is, and a takeover to be acknowledged.
pub(crate) const HELLO_TIMEOUT: Duration = Duration::from_secs(1);

/// The keeper's word to an agent of [`AGENT_HELLO`], right after the `INIT` it relayed: how the
/// agent's FUSE threads get their requests.
pub(crate) mod word {
    /// Sent with the device (`SCM_RIGHTS`): read it directly. The kernel resends what an agent
    /// read but did not answer when the keeper asks (`FUSE_NOTIFY_RESEND`, Linux 6.9 and later),
    /// so the keeper needs to see no request: it asks once the agent's connection ends.
    pub(crate) const DEVICE: &[u8] = b"mockgpu-keeper device";
    /// Requests keep coming on this connection, one per message.
    pub(crate) const RELAY: &[u8] = b"mockgpu-keeper relay";
    /// Later, to an agent that reads the device: a newer agent does now, stop reading (and shut
    /// the connection's writing side once stopped, for the keeper to have the kernel resend).
    pub(crate) const STOP: &[u8] = b"mockgpu-keeper stop";
}

// The FUSE opcodes (linux/fuse.h) the relay tells apart.
pub(crate) const FUSE_FORGET: u32 = 2;
pub(crate) const FUSE_INIT: u32 = 26;
const FUSE_DESTROY: u32 = 38;
const FUSE_INTERRUPT: u32 = 36;
const FUSE_BATCH_FORGET: u32 = 42;
/// `fuse_out_header.error` of the notification that makes the kernel resend what it handed out
/// and got no reply to (linux/fuse.h, `FUSE_NOTIFY_RESEND`).
const FUSE_NOTIFY_RESEND: i32 = 7;
/// `INIT` flags (linux/fuse.h): the second flags word is there (`FUSE_INIT_EXT`), and in it the
/// kernel says it can resend (`FUSE_HAS_RESEND`, 1 << 39: bit 7 of `flags2`).
const FUSE_INIT_EXT: u32 = 1 << 30;
const FUSE_HAS_RESEND_FLAGS2: u32 = 1 << (39 - 32);

/// The tag byte that starts each message of a handover, in the order they are sent.
pub(crate) mod handover {
    /// The header: one byte per agent connection passed (bit 0: it is closing; 1: it reads
    /// the device; 2: it awaits its word), with the device and those connections as
    /// descriptors.
    pub(crate) const HEAD: u8 = b'H';
    /// The kernel's recorded `INIT` request.
    pub(crate) const INIT: u8 = b'I';
    /// The reply the kernel got to it.
    pub(crate) const INIT_REPLY: u8 = b'R';
    /// An in-flight request: the index of the agent it went to, then the request.
    pub(crate) const INFLIGHT: u8 = b'Q';
    /// A request not yet sent to an agent.
    pub(crate) const BACKLOG: u8 = b'B';
    /// The end of the handover.
    pub(crate) const END: u8 = b'E';
}

/// `(opcode, unique)` of a request, from its `fuse_in_header`.
pub(crate) fn request_header(msg: &[u8]) -> Option<(u32, u64)> {
    let opcode = u32::from_ne_bytes(msg.get(4..8)?.try_into().ok()?);
    let unique = u64::from_ne_bytes(msg.get(8..16)?.try_into().ok()?);
    Some((opcode, unique))
}

/// The `unique` of a reply (0 for a notification), from its `fuse_out_header`.
pub(crate) fn reply_unique(msg: &[u8]) -> Option<u64> {
    Some(u64::from_ne_bytes(msg.get(8..16)?.try_into().ok()?))
}

/// Whether the kernel that sent `init` (an `INIT` request) resends on [`resend`]: its
/// `fuse_init_in` (after the 40-byte `fuse_in_header`: major, minor, max_readahead, flags,
/// flags2) says so.
pub(crate) fn can_resend(init: &[u8]) -> bool {
    let word = |at: usize| {
        init.get(at..at + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
    };
    matches!(request_header(init), Some((FUSE_INIT, _)))
        && word(52).is_some_and(|flags| flags & FUSE_INIT_EXT != 0)
        && word(56).is_some_and(|flags2| flags2 & FUSE_HAS_RESEND_FLAGS2 != 0)
}

/// The notification (a `fuse_out_header` alone, `unique` 0) that makes the kernel queue again
/// every request it handed out and got no reply to, marked as resent.
pub(crate) fn resend() -> [u8; 16] {
    let mut m = [0u8; 16];
    m[0..4].copy_from_slice(&16u32.to_ne_bytes());
    m[4..8].copy_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    m
}

/// Whether the kernel waits for a reply to a request with `opcode`.
pub(crate) fn expects_reply(opcode: u32) -> bool {
    !matches!(opcode, FUSE_FORGET | FUSE_BATCH_FORGET | FUSE_INTERRUPT)
}

/// A request of `opcode` numbered `unique`, with no body (a `fuse_in_header` alone).
pub(crate) fn bare_request(opcode: u32, unique: u64) -> Vec<u8> {
    let mut m = vec![0u8; 40];
    m[0..4].copy_from_slice(&40u32.to_ne_bytes());
    m[4..8].copy_from_slice(&opcode.to_ne_bytes());
    m[8..16].copy_from_slice(&unique.to_ne_bytes());
    m
}

/// The made-up `DESTROY` request that ends one of a departing agent's FUSE threads.
pub(crate) fn destroy_request() -> Vec<u8> {
    bare_request(FUSE_DESTROY, DESTROY_UNIQUE)
}

/// The agent's `BYE` for `threads` FUSE threads.
pub(crate) fn bye(threads: u8) -> Vec<u8> {
    [BYE, &[threads]].concat()
}

/// The number of FUSE threads `msg` says goodbye for, when it is a `BYE`.
pub(crate) fn bye_threads(msg: &[u8]) -> Option<u8> {
    match msg.strip_prefix(BYE) {
        Some(&[threads]) => Some(threads),
        _ => None,
    }
}

/// A new `SOCK_SEQPACKET` Unix socket.
pub(crate) fn seqpacket() -> nix::Result<OwnedFd> {
    socket::socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
}

/// Makes the socket's buffers hold the largest message (root may exceed the system's cap).
pub(crate) fn size_buffers(fd: &OwnedFd) {
    let forced = socket::setsockopt(fd, sockopt::SndBufForce, &SOCK_BUF)
        .and_then(|()| socket::setsockopt(fd, sockopt::RcvBufForce, &SOCK_BUF));
    if forced.is_err() {
        let _ = socket::setsockopt(fd, sockopt::SndBuf, &SOCK_BUF);
        let _ = socket::setsockopt(fd, sockopt::RcvBuf, &SOCK_BUF);
    }
}

/// Makes receives on `fd` fail after `timeout` (never, for zero).
pub(crate) fn set_recv_timeout(fd: &OwnedFd, timeout: Duration) {
    let tv = TimeVal::new(timeout.as_secs() as _, timeout.subsec_micros() as _);
    let _ = socket::setsockopt(fd, sockopt::ReceiveTimeout, &tv);
}

/// Connects to the keeper socket at `path` and says who is calling.
pub(crate) fn connect(path: &Path, hello: &[u8]) -> nix::Result<OwnedFd> {
    let fd = seqpacket()?;
    socket::connect(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    size_buffers(&fd);
    socket::send(fd.as_raw_fd(), hello, MsgFlags::MSG_NOSIGNAL)?;
    Ok(fd)
}

/// Whether a failed connect means that no keeper listens there.
pub(crate) fn nobody_listens(e: Errno) -> bool {
    matches!(e, Errno::ENOENT | Errno::ECONNREFUSED)
}

/// Sends `msg` on `conn`, never raising `SIGPIPE`.
pub(crate) fn send(conn: &OwnedFd, msg: &[u8]) -> nix::Result<usize> {
    socket::send(conn.as_raw_fd(), msg, MsgFlags::MSG_NOSIGNAL)
}

/// Sends `msg` with the descriptors `fds` (`SCM_RIGHTS`).
pub(crate) fn send_fds(conn: &OwnedFd, msg: &[u8], fds: &[RawFd]) -> nix::Result<usize> {
    socket::sendmsg::<()>(
        conn.as_raw_fd(),
        &[IoSlice::new(msg)],
        &[ControlMessage::ScmRights(fds)],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
}

/// Receives a message into `buf` with up to `1 + MAX_AGENTS` descriptors, which become this
/// process's own (close-on-exec); returns the message's length and the descriptors.
pub(crate) fn recv_fds(conn: &OwnedFd, buf: &mut [u8]) -> nix::Result<(usize, Vec<OwnedFd>)> {
    let mut cmsg = nix::cmsg_space!([RawFd; 1 + MAX_AGENTS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = socket::recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: SCM_RIGHTS installed these descriptors in this process for us alone.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    Ok((msg.bytes, fds))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::bare_request as request;
    use super::*;

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

    /// An `INIT` request as the kernel sends it: headers, then major 7, minor 45, readahead,
    /// `flags` and `flags2`.
    pub(crate) fn init(flags: u32, flags2: u32) -> Vec<u8> {
        let mut m = request(FUSE_INIT, 2);
        for w in [7u32, 45, 131072, flags, flags2] {
            m.extend_from_slice(&w.to_ne_bytes());
        }
        m.extend_from_slice(&[0; 44]);
        let len = m.len() as u32;
        m[0..4].copy_from_slice(&len.to_ne_bytes());
        m
    }

    #[test]
    fn an_init_tells_whether_the_kernel_resends() {
        assert!(can_resend(&init(FUSE_INIT_EXT | 1, 1 << 7)));
        assert!(!can_resend(&init(FUSE_INIT_EXT, 1 << 6)), "another flag");
        assert!(!can_resend(&init(0, 1 << 7)), "flags2 not there");
        assert!(!can_resend(&init(FUSE_INIT_EXT, 1 << 7)[..56]), "cut short");
        let mut lookup = init(FUSE_INIT_EXT, 1 << 7);
        lookup[4..8].copy_from_slice(&1u32.to_ne_bytes());
        assert!(!can_resend(&lookup), "not an INIT");
        let r = resend();
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().unwrap()), 16);
        assert_eq!(i32::from_ne_bytes(r[4..8].try_into().unwrap()), 7);
        assert_eq!(reply_unique(&r), Some(0), "a notification");
    }

    #[test]
    fn a_bye_says_how_many_threads_end() {
        assert_eq!(bye_threads(&bye(2)), Some(2));
        assert_eq!(bye_threads(BYE), None, "no thread count");
        assert_eq!(bye_threads(&[BYE, &[1, 2]].concat()), None);
        assert_eq!(
            request_header(&destroy_request()),
            Some((FUSE_DESTROY, u64::MAX))
        );
    }
}
