//! The agent's way to its keeper: connect to the one that listens, or start one.

use std::io::{self, BufRead as _};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mockgpu_api::Layout;

use super::DataPath;
use super::error::{KeeperError, io_err};
use crate::wire::{AGENT_HELLO, READY, connect, nobody_listens};

/// How long an agent waits for the keeper it started to listen.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// The agent's connection to the keeper of `layout`, on which it gets the kernel's `INIT` and
/// the keeper's word. Starts a keeper (this executable, in a session of its own so that it
/// outlives the agent; `keeper --relay` for [`DataPath::Relay`]) when none listens.
pub(crate) fn attach(layout: &Layout, data_path: DataPath) -> Result<OwnedFd, KeeperError> {
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
        .arg0("mockgpu-agent")
        .arg("keeper")
        .arg("--dir")
        .arg(layout.host_dir())
        .args((data_path == DataPath::Relay).then_some("--relay"))
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
