//! Agent restarts under a reader, through the keeper, on both data paths (agents reading the
//! device, and the keeper's relay): 100 restarts each (SIGTERM and SIGKILL in turn, the
//! successor started at once) while a reader loops over a lookup that always reaches the agent
//! and the GPUs' `information` files. Prints the read rounds completed during each handover
//! (from the signal to the successor serving) and the longest round overlapping it (median and
//! max over the 100). Before that, what a request costs on an agent's own mount and through a
//! keeper on each path, in alternating runs: the wall time of an uncached lookup, and the CPU
//! time summed over every process of the agent (from `/proc/<pid>/task/*/schedstat`) of that
//! lookup (agent and keeper) and of a cold open+read+close of an `information` file after
//! `drop_caches` (agent, keeper and `pin-tree`).
//!
//! Run as root (FUSE mounts; a private mount namespace):
//! `cargo bench -p mockgpu-agent --bench handover`.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const PROBE: &str = ".mockgpu-liveness-probe";
const HANDOVERS: usize = 100;
const RUNS: usize = 5;
const LOOKUPS: usize = 2000;
const COLD_READS: usize = 30;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Bench {
    dir: PathBuf,
    sysfs: PathBuf,
    procfs: PathBuf,
    started: usize,
}

impl Bench {
    /// Starts `serve` on `<dir>/<run>` (`keeper`: auto or off) and waits until it serves.
    fn agent(&mut self, run: &str, keeper: &str) -> (Child, PathBuf) {
        self.started += 1;
        let log = self.dir.join(format!("agent-{}.log", self.started));
        let child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .args(["serve", "--profile", "gb300", "--node-name", "node-0"])
            .args(["--listen", "127.0.0.1:0", "--keeper", keeper, "--dir"])
            .arg(self.dir.join(run))
            .arg("--sysfs")
            .arg(&self.sysfs)
            .arg("--procfs")
            .arg(&self.procfs)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (child, log)
    }
}

fn wait_ready(log: &Path) -> String {
    let start = Instant::now();
    loop {
        let text = fs::read_to_string(log).unwrap_or_default();
        if text.contains(" ready ") {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "agent not ready:\n{text}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// A lookup that the kernel never caches: one request to the agent.
fn probe(mnt: &Path) {
    let e = fs::symlink_metadata(mnt.join(PROBE)).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
}

fn read_round(mnt: &Path) -> Result<(), String> {
    match fs::symlink_metadata(mnt.join(PROBE)) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        other => return Err(format!("probe: {other:?}")),
    }
    let gpus = mnt.join("proc/driver/nvidia/gpus");
    for entry in fs::read_dir(&gpus).map_err(|e| e.to_string())? {
        let path = entry.map_err(|e| e.to_string())?.path().join("information");
        fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// CPU time each thread of processes `pids` has spent so far (the first field of
/// `/proc/<pid>/task/*/schedstat`), by thread id.
fn cpu(pids: &[i32]) -> HashMap<String, u64> {
    let mut ns = HashMap::new();
    for pid in pids {
        for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let sched = fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            let spent = sched.split_whitespace().next().and_then(|f| f.parse().ok());
            ns.insert(
                task.file_name().to_string_lossy().into_owned(),
                spent.unwrap_or(0),
            );
        }
    }
    ns
}

/// The CPU time spent between two [`cpu`] readings, by the threads alive at the second (a
/// thread that ended meanwhile, an idle pool thread, takes its figure with it).
fn spent(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> Duration {
    Duration::from_nanos(
        after
            .iter()
            .map(|(tid, &ns)| ns.saturating_sub(before.get(tid).copied().unwrap_or(0)))
            .sum(),
    )
}

/// The median wall time of an uncached lookup, and the CPU time of `pids` per lookup.
fn lookups(mnt: &Path, pids: &[i32]) -> (Duration, Duration) {
    let mut t = Vec::with_capacity(LOOKUPS);
    let before = cpu(pids);
    for _ in 0..LOOKUPS {
        let s = Instant::now();
        probe(mnt);
        t.push(s.elapsed());
    }
    (median(t), spent(&before, &cpu(pids)) / LOOKUPS as u32)
}

/// The CPU time of `pids` and their children (the agent's `pin-tree`) for one cold
/// open+read+close of an `information` file: the median and the most of [`COLD_READS`].
fn cold_reads(mnt: &Path, pids: &[i32]) -> (Duration, Duration) {
    let mut pids = pids.to_vec();
    for pid in pids.clone() {
        for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<i32>().ok()),
            );
        }
    }
    pids.sort_unstable();
    pids.dedup();
    let pids = &pids[..];
    let gpus = mnt.join("proc/driver/nvidia/gpus");
    let first = fs::read_dir(&gpus).unwrap().next().unwrap().unwrap();
    let info = first.path().join("information");
    let mut t = Vec::with_capacity(COLD_READS);
    for _ in 0..COLD_READS {
        fs::write("/proc/sys/vm/drop_caches", "3").unwrap();
        let before = cpu(pids);
        fs::read(&info).unwrap();
        t.push(spent(&before, &cpu(pids)));
    }
    let most = t.iter().copied().max().unwrap_or_default();
    (median(t), most)
}

/// The started keeper's pid, from the log of the agent that started it.
fn keeper_of(log: &str) -> i32 {
    log.split_once("started a keeper pid=")
        .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .expect("the agent started a keeper")
}

/// `v`'s range in microseconds.
fn range(v: &[Duration]) -> String {
    let us = |d: &Duration| d.as_secs_f64() * 1e6;
    let (lo, hi) = v
        .iter()
        .map(us)
        .fold((f64::MAX, 0f64), |(l, h), x| (l.min(x), h.max(x)));
    format!("{lo:.1}-{hi:.1} us")
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    std::thread::spawn(|| {
        use mockgpu_agent::sys::{Linux, enter_private_namespace};
        enter_private_namespace(&Linux).expect("a private mount namespace (run as root)");
        run();
    })
    .join()
    .unwrap();
}

fn run() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bench = Bench {
        dir: tmp.path().to_path_buf(),
        sysfs: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/two-socket"),
        procfs: tmp.path().join("proc"),
        started: 0,
    };
    fs::create_dir_all(&bench.procfs).unwrap();
    fs::write(
        bench.procfs.join("devices"),
        "Character devices:\n  1 mem\n 10 misc\n\nBlock devices:\n  7 loop\n",
    )
    .unwrap();

    // What a request costs: on an agent's own mount, and through a keeper on each path.
    let mut paths = Vec::new();
    for (name, keeper) in [("own", "off"), ("direct", "auto"), ("relay", "relay")] {
        let (child, log) = bench.agent(name, keeper);
        let text = wait_ready(&log);
        let mut pids = vec![child.id() as i32];
        if keeper != "off" {
            pids.push(keeper_of(&text));
        }
        paths.push((name, child, pids));
    }
    // per path: lookup wall medians, CPU per lookup, cold-read CPU medians and most (one each
    // per run)
    let mut seen = vec![(Vec::new(), Vec::new(), Vec::new(), Vec::new()); paths.len()];
    for _ in 0..RUNS {
        for ((name, _, pids), seen) in paths.iter().zip(&mut seen) {
            let mnt = bench.dir.join(name).join("fs");
            let (wall, cpu) = lookups(&mnt, pids);
            seen.0.push(wall);
            seen.1.push(cpu);
            let (cold, most) = cold_reads(&mnt, pids);
            seen.2.push(cold);
            seen.3.push(most);
        }
    }
    for ((name, _, _), (wall, cpu, cold, most)) in paths.iter().zip(&seen) {
        println!(
            "{name:>6}: uncached lookup wall {} (median per run, {RUNS} runs of {LOOKUPS}), CPU {} per lookup; cold open+read+close of an information file, CPU {} (median per run of {COLD_READS}; the most in a run {}), summed over the agent's processes",
            range(wall),
            range(cpu),
            range(cold),
            range(most)
        );
    }
    for (_, mut child, pids) in paths {
        let _ = child.kill();
        let _ = child.wait();
        if let Some(&keeper) = pids.get(1) {
            stop_keeper(keeper);
        }
    }
    for keeper in ["auto", "relay"] {
        restarts(&mut bench, keeper);
    }
}

/// Ends keeper `pid` (it detaches its tree) and waits for it.
fn stop_keeper(pid: i32) {
    let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    let start = Instant::now();
    while fs::metadata(format!("/proc/{pid}")).is_ok() && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// 100 restarts under a reader, through a keeper started by `serve --keeper keeper`.
fn restarts(bench: &mut Bench, keeper_mode: &str) {
    let run = format!("restarts-{keeper_mode}");
    let (mut agent, log) = bench.agent(&run, keeper_mode);
    let keeper = keeper_of(&wait_ready(&log));
    let rmnt = bench.dir.join(&run).join("fs");
    // 100 restarts under a reader.
    let stop = Arc::new(AtomicBool::new(false));
    let rounds: Arc<Mutex<Vec<(Instant, Duration, bool)>>> = Arc::default();
    let reader = {
        let (stop, rounds, mnt) = (stop.clone(), rounds.clone(), rmnt.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let s = Instant::now();
                let ok = read_round(&mnt).is_ok();
                rounds.lock().unwrap().push((s, s.elapsed(), ok));
            }
        })
    };
    let mut windows = Vec::with_capacity(HANDOVERS);
    for i in 0..HANDOVERS {
        let signal = if i % 2 == 0 {
            Signal::SIGTERM
        } else {
            Signal::SIGKILL
        };
        let t0 = Instant::now();
        kill(Pid::from_raw(agent.id() as i32), signal).unwrap();
        let (next, log) = bench.agent(&run, keeper_mode);
        wait_ready(&log);
        windows.push((signal, t0, Instant::now()));
        let _ = agent.wait();
        agent = next;
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    let rounds = rounds.lock().unwrap();
    let failed = rounds.iter().filter(|r| !r.2).count();
    for kind in [Signal::SIGTERM, Signal::SIGKILL] {
        let (mut served, mut stalls, mut spans) = (Vec::new(), Vec::new(), Vec::new());
        for &(_, t0, t1) in windows.iter().filter(|w| w.0 == kind) {
            let overlapping = rounds.iter().filter(|(s, d, _)| *s < t1 && *s + *d > t0);
            served.push(
                rounds
                    .iter()
                    .filter(|(s, d, _)| *s + *d >= t0 && *s + *d <= t1)
                    .count(),
            );
            stalls.push(overlapping.map(|r| r.1).max().unwrap_or_default());
            spans.push(t1 - t0);
        }
        served.sort();
        let max_stall = *stalls.iter().max().unwrap();
        println!(
            "{keeper_mode}: {kind:?} x{}: signal to successor serving median {:?}; read rounds completed meanwhile median {} (min {}, max {}); longest round overlapping a handover median {:?}, max {max_stall:?}",
            served.len(),
            median(spans),
            served[served.len() / 2],
            served[0],
            served[served.len() - 1],
            median(stalls)
        );
    }
    println!(
        "{keeper_mode}: {} read rounds in all, {failed} failed",
        rounds.len()
    );
    assert_eq!(failed, 0, "reads failed across the restarts");
    let _ = agent.kill();
    let _ = agent.wait();
    stop_keeper(keeper);
}
