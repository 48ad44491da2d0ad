//! No failed read while the agent restarts (needs root and /dev/fuse): a reader loops over the
//! GPUs' `information` files (and a lookup that always reaches the agent) while real
//! `mockgpu-agent serve` processes are restarted 10 times with SIGTERM (the successor started
//! at once) and 10 times with SIGKILL, and while a second keeper takes the connection over, on
//! both data paths: agents reading the device (this kernel resends) and the keeper's relay.
//! Everything runs in a private mount namespace; every process the test starts is killed when
//! it ends, even when it fails.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{fixture, in_private_namespace, wait_for};
use mockgpu_agent::mounts::is_mount_point;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// Processes the test started (agents, keepers), killed when it ends.
#[derive(Default)]
struct Procs(Vec<i32>);

impl Drop for Procs {
    fn drop(&mut self) {
        for &pid in &self.0 {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

struct Setup {
    /// `serve --keeper`: `auto` (agents read the device where the kernel resends) or `relay`.
    keeper: &'static str,
    run: PathBuf,
    sysfs: PathBuf,
    procfs: PathBuf,
    logs: PathBuf,
}

impl Setup {
    fn mount_point(&self) -> PathBuf {
        self.run.join("fs")
    }

    /// Starts `mockgpu-agent ARGS`, logging to `<logs>/<name>.log`.
    fn spawn(&self, name: &str, args: &[&std::ffi::OsStr]) -> Child {
        let log = fs::File::create(self.logs.join(format!("{name}.log"))).unwrap();
        Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn agent(&self, n: usize) -> Child {
        self.agent_with(n, "gb300")
    }

    /// Agent `n` serving built-in profile `profile`.
    fn agent_with(&self, n: usize, profile: &str) -> Child {
        self.spawn(
            &format!("agent-{n}"),
            &[
                "serve".as_ref(),
                "--profile".as_ref(),
                profile.as_ref(),
                "--node-name".as_ref(),
                "node-0".as_ref(),
                "--keeper".as_ref(),
                self.keeper.as_ref(),
                "--listen".as_ref(),
                "127.0.0.1:0".as_ref(),
                "--dir".as_ref(),
                self.run.as_os_str(),
                "--sysfs".as_ref(),
                self.sysfs.as_os_str(),
                "--procfs".as_ref(),
                self.procfs.as_os_str(),
            ],
        )
    }

    fn log(&self, name: &str) -> String {
        fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Waits until agent `n` logged that it serves; fails with its log and the first agent's
    /// (the keeper's lines are there) after 15 seconds.
    fn wait_ready(&self, n: usize) {
        let name = format!("agent-{n}");
        let start = Instant::now();
        while !self.log(&name).contains(" ready ") {
            assert!(
                start.elapsed() < Duration::from_secs(15),
                "{name} did not serve within 15 s:\n{}\nagent-0 and its keeper:\n{}",
                self.log(&name),
                self.log("agent-0")
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// What the reader saw.
#[derive(Default, Debug)]
struct Reads {
    done: u64,
    failed: Vec<String>,
    longest: Duration,
}

/// One round of the reader: a lookup that the kernel never caches (the agent must answer it),
/// the GPU listing and every GPU's `information`.
fn read_round(mnt: &Path) -> Result<(), String> {
    match fs::symlink_metadata(mnt.join(".mockgpu-liveness-probe")) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => return Err(format!("probe lookup: {other:?}")),
    }
    let gpus = mnt.join("proc/driver/nvidia/gpus");
    let mut n = 0;
    for entry in fs::read_dir(&gpus).map_err(|e| format!("list {}: {e}", gpus.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path().join("information");
        let text = fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !text.starts_with("Model:") {
            return Err(format!("{}: unexpected content {text:?}", path.display()));
        }
        n += 1;
    }
    if n != 4 {
        return Err(format!("{n} GPUs listed, want 4"));
    }
    Ok(())
}

/// Loops [`read_round`] until `stop`, on a thread started from the calling thread (so in its
/// mount namespace), counting rounds in `rounds`.
fn reader(
    mnt: PathBuf,
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
) -> std::thread::JoinHandle<Reads> {
    std::thread::spawn(move || {
        let mut reads = Reads::default();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let result = read_round(&mnt);
            reads.longest = reads.longest.max(t.elapsed());
            reads.done += 1;
            rounds.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = result {
                reads.failed.push(e);
            }
        }
        reads
    })
}

fn logged_pid(log: &str, prefix: &str) -> Option<i32> {
    let (_, rest) = log.split_once(prefix)?;
    rest.split_whitespace().next()?.parse().ok()
}

fn alive(pid: i32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, r)| !r.starts_with('Z'))
    })
}

impl Setup {
    /// Directories below `dir`: the agent's (`run`), a fake procfs and the logs.
    fn new(dir: &Path, keeper: &'static str) -> Setup {
        let setup = Setup {
            keeper,
            run: dir.join("run"),
            sysfs: fixture("two-socket"),
            procfs: dir.join("proc"),
            logs: dir.join("logs"),
        };
        fs::create_dir_all(&setup.procfs).unwrap();
        fs::write(setup.procfs.join("devices"), common::HOST_DEVICES).unwrap();
        fs::create_dir_all(&setup.logs).unwrap();
        setup
    }

    /// The keeper that agent `n` started.
    fn keeper_of(&self, n: usize) -> i32 {
        let log = self.log(&format!("agent-{n}"));
        logged_pid(&log, "started a keeper pid=")
            .unwrap_or_else(|| panic!("agent {n} started no keeper:\n{log}"))
    }

    /// The first agent, serving through the keeper it started (both in `procs`), and one read
    /// round through them.
    fn first_agent(&self, procs: &mut Procs) -> Child {
        let agent = self.agent(0);
        procs.0.push(agent.id() as i32);
        self.wait_ready(0);
        procs.0.push(self.keeper_of(0));
        read_round(&self.mount_point()).unwrap();
        agent
    }
}

/// Runs `test` in a private mount namespace with the first agent serving (its keeper is
/// `procs.0[1]`), in a temporary directory, agents reading the device.
fn with_first_agent(test: impl FnOnce(&Setup, &mut Procs, Child) + Send) {
    with_first_agent_on("auto", test)
}

/// [`with_first_agent`] with `serve --keeper keeper`.
fn with_first_agent_on(keeper: &'static str, test: impl FnOnce(&Setup, &mut Procs, Child) + Send) {
    let dir = tempfile::tempdir().unwrap();
    let setup = Setup::new(dir.path(), keeper);
    in_private_namespace(|| {
        let mut procs = Procs::default();
        let agent = setup.first_agent(&mut procs);
        test(&setup, &mut procs, agent);
    })
}

/// The times keeper `pid`'s threads gave up the CPU to wait: it waits for every request it
/// relays, and for nothing while agents read the device.
fn waits(pid: i32) -> u64 {
    fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
        .filter_map(|t| fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .sum()
}

#[test]
fn where_agents_read_the_device_requests_never_wake_the_keeper() {
    for (path, direct) in [("auto", true), ("relay", false)] {
        with_first_agent_on(path, |setup, procs, _agent| {
            let keeper = procs.0[1];
            let log = setup.log("agent-0");
            let told = format!("agent told its data path agent=0 direct={direct}");
            assert!(log.contains(&told), "{path}: {log}");
            let before = waits(keeper);
            for _ in 0..200 {
                read_round(&setup.mount_point()).unwrap();
            }
            let woke = waits(keeper) - before;
            if direct {
                assert!(woke < 10, "the keeper woke {woke} times for 200 lookups");
            } else {
                assert!(woke >= 200, "the relay woke {woke} times for 200 lookups");
            }
        })
    }
}

#[test]
fn reads_never_fail_across_agent_restarts_and_a_keeper_handover_reading_the_device() {
    reads_never_fail_across_agent_restarts_and_a_keeper_handover("auto")
}

#[test]
fn reads_never_fail_across_agent_restarts_and_a_keeper_handover_through_the_relay() {
    reads_never_fail_across_agent_restarts_and_a_keeper_handover("relay")
}

fn reads_never_fail_across_agent_restarts_and_a_keeper_handover(path: &'static str) {
    with_first_agent_on(path, |setup, procs, mut agent| {
        let mnt = setup.mount_point();
        let keeper = procs.0[1];

        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let reading = reader(mnt.clone(), stop.clone(), rounds.clone());
        let mut n = 0;
        // Restarts `agent` with `signal`; returns the successor's number.
        let mut restart = |signal: Signal, agent: &mut Child, procs: &mut Procs| {
            n += 1;
            kill(Pid::from_raw(agent.id() as i32), signal).unwrap();
            let mut next = setup.agent(n);
            procs.0.push(next.id() as i32);
            let status = agent.wait().unwrap();
            if signal == Signal::SIGTERM {
                assert!(status.success(), "agent {}: {status}", n - 1);
                let log = setup.log(&format!("agent-{}", n - 1));
                assert!(log.contains("driver tree left to the keeper"), "{log}");
            }
            setup.wait_ready(n);
            // A reader stuck on a request nobody answers fails the test (the processes it
            // started are killed, which ends the read), rather than hanging it.
            let seen = rounds.load(Ordering::Relaxed);
            wait_for(&format!("a whole read round through agent {n}"), || {
                rounds.load(Ordering::Relaxed) >= seen + 2
            });
            std::mem::swap(agent, &mut next);
            n
        };
        for _ in 0..10 {
            restart(Signal::SIGTERM, &mut agent, procs);
        }
        let mut last = 0;
        for _ in 0..10 {
            last = restart(Signal::SIGKILL, &mut agent, procs);
        }
        let log = setup.log(&format!("agent-{last}"));
        assert!(log.contains("connected to the running keeper"), "{log}");

        // A second keeper takes the connection over; the first exits without unmounting.
        let mut args = vec!["keeper".as_ref(), "--dir".as_ref(), setup.run.as_os_str()];
        if path == "relay" {
            args.push("--relay".as_ref());
        }
        let mut second = setup.spawn("keeper-2", &args);
        procs.0.push(second.id() as i32);
        wait_for("the first keeper to hand over and exit", || !alive(keeper));
        // The second one logs the takeover once it has the connection, which may be after the
        // first one has exited (often so under qemu-user).
        wait_for("the second keeper to log the takeover", || {
            setup
                .log("keeper-2")
                .contains("took the FUSE connection over")
        });
        // The agent kept its connection; one more crash goes to the new keeper.
        restart(Signal::SIGKILL, &mut agent, procs);
        stop.store(true, Ordering::Relaxed);
        let reads = reading.join().unwrap();
        println!(
            "{} read rounds across 10 SIGTERM and 11 SIGKILL restarts and a keeper handover; longest round {:?}; {} failed",
            reads.done,
            reads.longest,
            reads.failed.len()
        );
        assert!(reads.failed.is_empty(), "failed reads: {:?}", reads.failed);
        assert!(reads.done > 100, "{reads:?}");
        assert!(is_mount_point(&mnt));

        // SIGTERM to the keeper detaches the tree.
        agent.kill().unwrap();
        agent.wait().unwrap();
        kill(Pid::from_raw(second.id() as i32), Signal::SIGTERM).unwrap();
        let status = second.wait().unwrap();
        assert!(status.success(), "{status}: {}", setup.log("keeper-2"));
        assert!(!is_mount_point(&mnt), "the keeper left its mount");
    })
}

#[test]
fn keeper_help_names_the_socket_and_the_handover() {
    let out = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
        .args(["keeper", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("keeper.sock"), "{help}");
    assert!(help.contains("--idle-after-handover"), "{help}");
}

#[test]
fn a_killed_keeper_ends_the_agent_and_the_next_agent_mounts_afresh() {
    with_first_agent(|setup, procs, mut agent| {
        let mnt = setup.mount_point();
        let keeper = procs.0[1];

        // The connection dies with its last descriptor: what needs the agent fails.
        kill(Pid::from_raw(keeper), Signal::SIGKILL).unwrap();
        wait_for("the mount to be dead", || {
            fs::symlink_metadata(mnt.join(".mockgpu-liveness-probe"))
                .is_err_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
        });
        let mut status = None;
        wait_for("the agent to exit", || {
            status = agent.try_wait().unwrap();
            status.is_some()
        });
        let log = setup.log("agent-0");
        assert!(!status.unwrap().success(), "{log}");
        assert!(log.contains("closed the FUSE connection"), "{log}");

        // The next agent starts a new keeper, which detaches the dead mount and mounts afresh.
        let mut next = setup.agent(1);
        procs.0.push(next.id() as i32);
        setup.wait_ready(1);
        let second = setup.keeper_of(1);
        procs.0.push(second);
        assert!(
            setup.log("agent-1").contains("detached a stale mount"),
            "{}",
            setup.log("agent-1")
        );
        read_round(&mnt).unwrap();
        next.kill().unwrap();
        next.wait().unwrap();
    })
}

/// The bus ids listed in `gpus`, sorted, and the models their `information` files name.
fn listed(mnt: &Path) -> (Vec<String>, Vec<String>) {
    let gpus = mnt.join("proc/driver/nvidia/gpus");
    let mut ids: Vec<String> = fs::read_dir(&gpus)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    ids.sort();
    let models = ids
        .iter()
        .map(|id| {
            let text = fs::read_to_string(gpus.join(id).join("information")).unwrap();
            text.lines().next().unwrap_or_default().to_string()
        })
        .collect();
    (ids, models)
}

#[test]
fn a_successor_with_another_profile_is_seen_at_once() {
    with_first_agent(|setup, procs, mut first| {
        let mnt = setup.mount_point();
        let (before, models) = listed(&mnt);
        assert_eq!(before.len(), 4);
        assert!(models.iter().all(|m| m.contains("GB300")), "{models:?}");

        // The next agent serves h100 through the same keeper; the kernel cached gb300's tree
        // (for a day) and must not answer from it.
        first.kill().unwrap();
        first.wait().unwrap();
        let mut next = setup.agent_with(1, "h100");
        procs.0.push(next.id() as i32);
        setup.wait_ready(1);
        let (after, models) = listed(&mnt);
        assert_eq!(after.len(), 8, "{after:?}");
        assert!(
            after.iter().all(|id| !before.contains(id)),
            "{before:?} -> {after:?}"
        );
        assert!(models.iter().all(|m| m.contains("H100")), "{models:?}");
        for id in &before {
            let gone = mnt.join("proc/driver/nvidia/gpus").join(id);
            assert!(
                fs::symlink_metadata(&gone).is_err(),
                "{} still there",
                gone.display()
            );
        }
        next.kill().unwrap();
        next.wait().unwrap();
    })
}

/// Whether a thread of process `pid` waits for the reply to a FUSE request.
fn waits_for_fuse(pid: u32) -> bool {
    fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|t| {
            fs::read_to_string(t.path().join("wchan")).is_ok_and(|w| w == "request_wait_answer")
        })
}

/// `pid` and the processes it started.
fn and_children(pid: u32) -> Vec<u32> {
    let mut all = vec![pid];
    for task in fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
        all.extend(
            children
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok()),
        );
    }
    all
}

#[test]
fn an_agent_killed_while_it_warms_the_tree_exits_and_the_next_one_serves() {
    // The warm-up reads the agent's own mount. A process killed while it waits for a FUSE
    // reply waits on (the request was sent); were the agent to wait on its own mount, nothing
    // would answer, its descriptors would never close, and the keeper would go on relaying to it.
    const ROUNDS: usize = 6;
    with_first_agent(|setup, procs, mut agent| {
        let mnt = setup.mount_point();
        let mut caught = 0;
        for n in 1..=ROUNDS {
            agent.kill().unwrap();
            agent.wait().unwrap();
            let mut next = setup.agent(n);
            procs.0.push(next.id() as i32);
            // No reader runs: whatever of the agent's waits for a reply, its warm-up sent.
            let name = format!("agent-{n}");
            let start = Instant::now();
            let waiting = loop {
                let waiting: Vec<u32> = and_children(next.id())
                    .into_iter()
                    .filter(|&p| waits_for_fuse(p))
                    .collect();
                if !waiting.is_empty() || setup.log(&name).contains(" ready ") {
                    break waiting;
                }
                assert!(
                    start.elapsed() < Duration::from_secs(15),
                    "{name} never warmed its tree"
                );
            };
            kill(Pid::from_raw(next.id() as i32), Signal::SIGKILL).unwrap();
            if !waiting.is_empty() {
                caught += 1;
            }
            wait_for(
                &format!("{name}, killed during its warm-up, to exit"),
                || next.try_wait().unwrap().is_some(),
            );
            for &p in &waiting {
                procs.0.push(p as i32);
            }
            agent = setup.agent(n + ROUNDS);
            procs.0.push(agent.id() as i32);
            setup.wait_ready(n + ROUNDS);
            read_round(&mnt).unwrap();
            for &p in waiting.iter().filter(|&&p| p != next.id()) {
                wait_for(&format!("{name}'s warm-up process {p} to exit"), || {
                    !alive(p as i32)
                });
            }
        }
        println!("{caught} of {ROUNDS} agents killed with a warm-up request in flight");
        assert!(
            caught > 0,
            "no agent was killed while its warm-up waited for a reply"
        );
        agent.kill().unwrap();
        agent.wait().unwrap();
    })
}
