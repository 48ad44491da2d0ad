//! The keeper's loop state: the relay between `/dev/fuse` and the agents (requests go to the
//! current agent, replies go back to the kernel, and what an agent left unanswered goes to the
//! next one), and the agents that read the device themselves (when one of those goes, the
//! kernel is asked to resend what it left unanswered).

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};
use std::sync::mpsc;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{self, MsgFlags};

use super::error::{KeeperError, io_err};
use crate::wire::{
    self, FUSE_INIT, MSG_MAX, expects_reply, reply_unique, request_header, size_buffers, word,
};

/// A request the kernel waits on, and the agent it went to (none: waiting for an agent).
pub(super) struct Pending {
    pub(super) request: Vec<u8>,
    pub(super) agent: Option<u64>,
}

/// One agent's connection.
pub(super) struct Agent {
    pub(super) id: u64,
    pub(super) conn: OwnedFd,
    /// The agent stopped taking requests (it shut its end for reading): it only answers.
    pub(super) closing: bool,
    /// It reads the device itself (it was sent [`word::DEVICE`]): nothing is relayed to it.
    pub(super) direct: bool,
    /// It waits for the keeper's [`word`], due once the kernel's `INIT` is answered.
    pub(super) awaits_word: bool,
}

impl Agent {
    /// Agent `id` on `conn`, relayed to; `awaits_word` when it said [`wire::AGENT_HELLO`].
    pub(super) fn new(id: u64, conn: OwnedFd, awaits_word: bool) -> Agent {
        Agent {
            id,
            conn,
            closing: false,
            direct: false,
            awaits_word,
        }
    }
}

/// The relay's state: what a handover passes on.
pub(super) struct Relay {
    pub(super) fuse: OwnedFd,
    /// The kernel's `INIT` request, and the reply it got.
    pub(super) init: Option<Vec<u8>>,
    pub(super) init_reply: Option<Vec<u8>>,
    /// Requests waiting for their reply, by unique.
    pub(super) inflight: BTreeMap<u64, Pending>,
    /// Requests not yet sent to an agent, oldest first.
    pub(super) backlog: VecDeque<Vec<u8>>,
    /// Connected agents, oldest first; the newest that is not closing gets the requests.
    pub(super) agents: Vec<Agent>,
    next_id: u64,
    /// Room for one message.
    pub(super) buf: Vec<u8>,
    /// Notifications (invalidations) go to a thread of their own: writing one can block until
    /// the kernel gets an inode lock that a request waiting on this relay holds.
    notify: Option<mpsc::Sender<Vec<u8>>>,
    notifier: Option<std::thread::JoinHandle<()>>,
    /// Relay to every agent, even where the kernel can resend (`keeper --relay`).
    relay_only: bool,
}

impl Relay {
    pub(super) fn new(
        fuse: OwnedFd,
        agents: Option<Vec<Agent>>,
        relay_only: bool,
    ) -> Result<Relay, KeeperError> {
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
            relay_only,
        })
    }

    /// Writes the notifications still queued.
    pub(super) fn finish(&mut self) {
        self.notify = None;
        if let Some(t) = self.notifier.take() {
            let _ = t.join();
        }
    }

    /// The agent that gets new requests: the newest that is not closing nor reads the device.
    pub(super) fn current(&self) -> Option<&Agent> {
        self.agents.iter().rev().find(|a| !a.closing && !a.direct)
    }

    /// Reads requests from the device while the current agent takes them; true once the
    /// connection is gone (unmounted).
    pub(super) fn read_kernel(&mut self) -> bool {
        for _ in 0..64 {
            if !self.backlog.is_empty() || self.current().is_none() {
                return false;
            }
            // The poll said readable; another reader of the device (none) could have won.
            let mut fds = [PollFd::new(self.fuse.as_fd(), PollFlags::POLLIN)];
            if !matches!(nix::poll::poll(&mut fds, PollTimeout::ZERO), Ok(1)) {
                return false;
            }
            match nix::unistd::read(&self.fuse, &mut self.buf) {
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
    pub(super) fn queue(&mut self, msg: Vec<u8>) {
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
    pub(super) fn flush(&mut self) {
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
    pub(super) fn pump(&mut self, id: u64) {
        let Some(idx) = self.agents.iter().position(|a| a.id == id) else {
            return;
        };
        let fd = self.agents[idx].conn.as_raw_fd();
        loop {
            match socket::recv(fd, &mut self.buf, MsgFlags::MSG_DONTWAIT) {
                Ok(0) => break,
                Ok(n) => {
                    let msg = self.buf[..n].to_vec();
                    match wire::bye_threads(&msg) {
                        Some(threads) => self.bye(idx, threads),
                        None => self.reply(id, &msg),
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
        let gone = self.agents.remove(idx);
        if gone.direct {
            self.resend();
        }
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
        if self.current().is_none()
            && !self.backlog.is_empty()
            && self.agents.iter().any(|a| a.direct)
        {
            // Only agents that read the device are left: the kernel hands them what the relay
            // read and nobody answered.
            self.backlog.clear();
            self.inflight.retain(|_, p| p.agent.is_some());
            self.resend();
        }
    }

    /// Asks the kernel to queue again what it handed out and got no reply to.
    fn resend(&self) {
        match nix::unistd::write(&self.fuse, &wire::resend()) {
            Ok(_) => tracing::info!("asked the kernel to resend unanswered requests"),
            Err(e) => tracing::warn!(error = %e, "the kernel refused to resend"),
        }
    }

    /// Tells the agents that read the device, but agent `newest`, to stop (the relay, too, gives
    /// new requests to the newest agent only).
    fn supersede(&mut self, newest: usize) {
        for (i, a) in self.agents.iter_mut().enumerate() {
            if i != newest && a.direct && !a.closing {
                a.closing = true;
                if let Err(e) = wire::send(&a.conn, word::STOP) {
                    tracing::debug!(agent = a.id, error = %e, "agent gone before its stop");
                }
                tracing::info!(agent = a.id, "agent told to stop reading the device");
            }
        }
    }

    /// Sends agent `idx` the keeper's word: the device, where the kernel resends, else the relay.
    fn tell(&mut self, idx: usize) {
        let direct = !self.relay_only && self.init.as_deref().is_some_and(wire::can_resend);
        let fuse = self.fuse.as_raw_fd();
        let agent = &mut self.agents[idx];
        agent.awaits_word = false;
        let sent = if direct {
            wire::send_fds(&agent.conn, word::DEVICE, &[fuse])
        } else {
            wire::send(&agent.conn, word::RELAY)
        };
        match sent {
            Ok(_) => {
                agent.direct = direct;
                tracing::info!(agent = agent.id, direct, "agent told its data path");
                if direct {
                    self.supersede(idx);
                }
            }
            Err(e) => {
                tracing::warn!(agent = agent.id, error = %e, "cannot tell the agent its data path");
                agent.closing = true;
            }
        }
    }

    /// Agent `idx` stops: it gets nothing new, and one `DESTROY` per FUSE thread.
    fn bye(&mut self, idx: usize, threads: u8) {
        let agent = &mut self.agents[idx];
        agent.closing = true;
        let destroy = wire::destroy_request();
        for _ in 0..threads {
            if let Err(e) = wire::send(&agent.conn, &destroy) {
                tracing::debug!(agent = agent.id, error = %e, "agent gone before its DESTROY");
                break;
            }
        }
        tracing::info!(agent = agent.id, "agent stops taking requests");
    }

    /// Writes agent `id`'s reply to the kernel, unless it answers the replayed `INIT`. The
    /// first answer to `INIT` makes the agent's word due.
    fn reply(&mut self, id: u64, msg: &[u8]) {
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
        if Some(unique) == init_unique
            && let Some(idx) = self.agents.iter().position(|a| a.id == id && a.awaits_word)
        {
            self.tell(idx);
        }
    }

    /// A new agent becomes the current one: it gets the recorded `INIT` when the kernel was
    /// answered already (and then its word, when it `awaits_word`), then the backlog.
    pub(super) fn join(&mut self, conn: OwnedFd, awaits_word: bool) {
        size_buffers(&conn);
        let id = self.next_id;
        self.next_id += 1;
        if self.init_reply.is_some()
            && let Some(init) = &self.init
            && let Err(e) = wire::send(&conn, init)
        {
            tracing::warn!(agent = id, error = %e, "cannot replay INIT to the agent");
            return;
        }
        tracing::info!(agent = id, waiting = self.backlog.len(), "agent connected");
        self.agents.push(Agent::new(id, conn, awaits_word));
        if awaits_word && self.init_reply.is_some() {
            self.tell(self.agents.len() - 1);
        }
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType};

    use super::*;
    use crate::wire::{FUSE_FORGET, bare_request as request, destroy_request};

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
        relay_with(false)
    }

    /// [`relay`], relaying to every agent with `relay_only`.
    fn relay_with(relay_only: bool) -> (Relay, OwnedFd) {
        let (kernel, device) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        (Relay::new(device, None, relay_only).unwrap(), kernel)
    }

    /// An agent of the relay's days ([`wire::RELAYED_AGENT_HELLO`]): told nothing.
    fn agent(relay: &mut Relay) -> OwnedFd {
        agent_of(relay, false)
    }

    fn agent_of(relay: &mut Relay, awaits_word: bool) -> OwnedFd {
        let (ours, theirs) = socket::socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        relay.join(ours, awaits_word);
        theirs
    }

    fn recv(fd: &OwnedFd) -> Option<Vec<u8>> {
        let mut buf = vec![0u8; 4096];
        socket::recv(fd.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)
            .ok()
            .map(|n| buf[..n].to_vec())
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
        socket::send(agent.as_raw_fd(), &wire::bye(2), MsgFlags::empty()).unwrap();
        relay.pump(0);
        relay.queue(request(15, 21));
        relay.flush();
        assert_eq!(recv(&agent), Some(request(15, 20)), "what it had first");
        let destroy = Some(destroy_request());
        assert_eq!(recv(&agent), destroy);
        assert_eq!(recv(&agent), destroy);
        assert_eq!(recv(&agent), None, "nothing new");
        assert_eq!(
            relay.backlog.len(),
            1,
            "the new request waits for the next agent"
        );
    }

    /// The kernel's `INIT`, saying whether it resends.
    fn init(resends: bool) -> Vec<u8> {
        wire::tests::init(1 << 30, if resends { 1 << 7 } else { 0 })
    }

    /// Agent `conn`'s word and the descriptors sent with it.
    fn word_of(conn: &OwnedFd) -> (Vec<u8>, usize) {
        let mut buf = [0u8; 64];
        let (n, fds) = wire::recv_fds(conn, &mut buf).unwrap();
        (buf[..n].to_vec(), fds.len())
    }

    #[test]
    fn where_the_kernel_resends_agents_get_the_device_and_the_end_of_one_asks_for_a_resend() {
        let (mut relay, kernel) = relay();
        let first = agent_of(&mut relay, true);
        relay.queue(init(true));
        relay.flush();
        assert_eq!(
            recv(&first),
            Some(init(true)),
            "INIT goes through the relay"
        );
        socket::send(first.as_raw_fd(), &reply(2, b"init"), MsgFlags::empty()).unwrap();
        relay.pump(0);
        assert_eq!(
            recv(&kernel),
            Some(reply(2, b"init")),
            "the kernel is answered"
        );
        assert_eq!(
            word_of(&first),
            (word::DEVICE.to_vec(), 1),
            "then the device"
        );
        assert!(relay.current().is_none(), "nothing is relayed to it");
        // A later agent gets the recorded INIT, then the device at once.
        let second = agent_of(&mut relay, true);
        assert_eq!(recv(&second), Some(init(true)));
        assert_eq!(word_of(&second), (word::DEVICE.to_vec(), 1));
        assert_eq!(
            recv(&first),
            Some(word::STOP.to_vec()),
            "the older one stops"
        );
        assert!(relay.agents[0].closing);
        socket::send(second.as_raw_fd(), &reply(2, b"init"), MsgFlags::empty()).unwrap();
        relay.pump(1);
        assert_eq!(recv(&kernel), None, "its INIT reply is swallowed");
        // The first one dies: the kernel is asked to resend what it held.
        drop(first);
        relay.pump(0);
        assert_eq!(recv(&kernel), Some(wire::resend().to_vec()));
        assert_eq!(relay.agents.len(), 1);
    }

    #[test]
    fn where_the_kernel_cannot_resend_or_relay_is_asked_for_agents_are_relayed_to() {
        for (resends, relay_only) in [(false, false), (true, true)] {
            let (mut relay, kernel) = relay_with(relay_only);
            let agent = agent_of(&mut relay, true);
            relay.queue(init(resends));
            relay.flush();
            assert_eq!(recv(&agent), Some(init(resends)));
            socket::send(agent.as_raw_fd(), &reply(2, b"init"), MsgFlags::empty()).unwrap();
            relay.pump(0);
            assert_eq!(word_of(&agent), (word::RELAY.to_vec(), 0));
            relay.queue(request(15, 4));
            relay.flush();
            assert_eq!(
                recv(&agent),
                Some(request(15, 4)),
                "requests follow the word"
            );
            drop(agent);
            relay.pump(0);
            assert_eq!(recv(&kernel), Some(reply(2, b"init")));
            assert_eq!(recv(&kernel), None, "no resend for a relayed agent");
            assert_eq!(
                relay.backlog.len(),
                1,
                "its request waits for the next agent"
            );
        }
    }

    #[test]
    fn what_a_relayed_agent_leaves_goes_back_to_the_kernel_when_only_direct_agents_are_left() {
        let (mut relay, kernel) = relay();
        let direct = agent_of(&mut relay, true);
        relay.queue(init(true));
        relay.flush();
        recv(&direct).unwrap();
        socket::send(direct.as_raw_fd(), &reply(2, b"init"), MsgFlags::empty()).unwrap();
        relay.pump(0);
        word_of(&direct);
        // An agent of the relay's days joins, takes a request and dies.
        let old = agent(&mut relay);
        assert_eq!(recv(&old), Some(init(true)));
        relay.queue(request(15, 6));
        relay.flush();
        drop(old);
        relay.pump(1);
        assert_eq!(recv(&kernel), Some(reply(2, b"init")));
        assert_eq!(recv(&kernel), Some(wire::resend().to_vec()));
        assert!(relay.backlog.is_empty() && relay.inflight.is_empty());
    }
}
