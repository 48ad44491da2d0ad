//! A keeper's handover to the next one: the device, the agents' connections (`SCM_RIGHTS`),
//! the recorded `INIT` and the relay's queues, then the new keeper's acknowledgement.

use std::os::fd::{AsRawFd as _, OwnedFd, RawFd};

use nix::sys::socket::{self, MsgFlags};

use super::relay::{Agent, Pending, Relay};
use crate::wire::{
    self, ACK, HELLO_TIMEOUT, MAX_AGENTS, handover, request_header, set_recv_timeout, size_buffers,
};

impl Relay {
    /// Passes the device, the agents' connections and the relay's state to a new keeper and
    /// waits for its acknowledgement.
    pub(super) fn hand_over(&mut self, conn: &OwnedFd) -> Result<(), String> {
        size_buffers(conn);
        let agents = &self.agents[self.agents.len().saturating_sub(MAX_AGENTS)..];
        let mut fds: Vec<RawFd> = vec![self.fuse.as_raw_fd()];
        fds.extend(agents.iter().map(|a| a.conn.as_raw_fd()));
        let mut head = vec![handover::HEAD];
        head.extend(
            agents.iter().map(|a| {
                u8::from(a.closing) | u8::from(a.direct) << 1 | u8::from(a.awaits_word) << 2
            }),
        );
        let send = |msg: &[u8]| wire::send(conn, msg).map(drop).map_err(|e| e.to_string());
        wire::send_fds(conn, &head, &fds).map_err(|e| e.to_string())?;
        let init = [
            (handover::INIT, &self.init),
            (handover::INIT_REPLY, &self.init_reply),
        ];
        for (tag, bytes) in init {
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
            send(&[&[handover::INFLIGHT, idx as u8], p.request.as_slice()].concat())?;
        }
        for msg in &self.backlog {
            send(&[&[handover::BACKLOG], msg.as_slice()].concat())?;
        }
        send(&[handover::END])?;
        set_recv_timeout(conn, HELLO_TIMEOUT);
        let mut ack = [0u8; 8];
        match socket::recv(conn.as_raw_fd(), &mut ack, MsgFlags::empty()) {
            Ok(n) if &ack[..n] == ACK => Ok(()),
            Ok(_) => Err("the new keeper did not acknowledge".into()),
            Err(e) => Err(format!("no acknowledgement: {e}")),
        }
    }
}

/// Receives a running keeper's handover on `conn` and acknowledges it; `relay_only` as in
/// [`Relay::new`].
pub(super) fn take_over(conn: &OwnedFd, relay_only: bool) -> Result<Relay, String> {
    set_recv_timeout(conn, HELLO_TIMEOUT);
    let mut head = [0u8; 1 + MAX_AGENTS];
    let (n, fds) = wire::recv_fds(conn, &mut head).map_err(|e| format!("no handover: {e}"))?;
    if n == 0 || head[0] != handover::HEAD || fds.len() != n {
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
        .map(|(i, (conn, &flags))| Agent {
            closing: flags & 1 != 0,
            direct: flags & 2 != 0,
            ..Agent::new(i as u64, conn, flags & 4 != 0)
        })
        .collect();
    let mut relay = Relay::new(fuse, Some(agents), relay_only).map_err(|e| e.to_string())?;
    loop {
        let n = socket::recv(conn.as_raw_fd(), &mut relay.buf, MsgFlags::empty())
            .map_err(|e| format!("handover cut short: {e}"))?;
        let msg = relay.buf[..n].to_vec();
        match msg.split_first() {
            Some((&handover::INIT, init)) => relay.init = Some(init.to_vec()),
            Some((&handover::INIT_REPLY, reply)) => relay.init_reply = Some(reply.to_vec()),
            Some((&handover::INFLIGHT, rest)) => {
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
            Some((&handover::BACKLOG, request)) => relay.queue(request.to_vec()),
            Some((&handover::END, _)) => break,
            _ => return Err(format!("unexpected handover message of {n} bytes")),
        }
    }
    wire::send(conn, ACK).map_err(|e| e.to_string())?;
    Ok(relay)
}
