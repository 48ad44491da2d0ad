//! Agent restarts under a reader, through the keeper: 100 restarts (SIGTERM and SIGKILL in
//! turn, the successor started at once) while a reader loops over a lookup that always reaches
//! the agent and the GPUs' `information` files. Prints the read rounds completed during each
//! handover (from the signal to the successor serving) and the longest round overlapping it
//! (median and max over the 100), and what the relay costs a request: the same lookup through a
//! keeper and on an agent's own mount, in alternating runs.
//!
//! Run as root (FUSE mounts; a private mount namespace):
//! `cargo bench -p mockgpu-agent --bench handover`.

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

fn lookups(mnt: &Path) -> Duration {
    let mut t = Vec::with_capacity(LOOKUPS);
    for _ in 0..LOOKUPS {
        let s = Instant::now();
        probe(mnt);
        t.push(s.elapsed());
    }
    median(t)
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

    // What the relay costs: one request through the keeper and on the agent's own mount.
    let (mut direct, log) = bench.agent("direct", "off");
    wait_ready(&log);
    let (mut agent, log) = bench.agent("relay", "auto");
    let text = wait_ready(&log);
    let keeper: i32 = text
        .split_once("started a keeper pid=")
        .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .expect("the agent started a keeper");
    let (dmnt, rmnt) = (bench.dir.join("direct/fs"), bench.dir.join("relay/fs"));
    let (mut ratios, mut d_med, mut r_med) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..RUNS {
        let d = lookups(&dmnt);
        let r = lookups(&rmnt);
        ratios.push(r.as_secs_f64() / d.as_secs_f64());
        d_med.push(d);
        r_med.push(r);
    }
    let _ = direct.kill();
    let _ = direct.wait();
    let range = |v: &[Duration]| {
        let us = |d: &Duration| d.as_secs_f64() * 1e6;
        let (lo, hi) = v
            .iter()
            .map(us)
            .fold((f64::MAX, 0f64), |(l, h), x| (l.min(x), h.max(x)));
        format!("{lo:.0}-{hi:.0} us")
    };
    let (rlo, rhi) = ratios
        .iter()
        .fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
    println!(
        "one request (uncached lookup), median per run over {RUNS} runs of {LOOKUPS}: own mount {}, through the keeper {}, ratio {rlo:.2}-{rhi:.2}",
        range(&d_med),
        range(&r_med)
    );

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
        let (next, log) = bench.agent("relay", "auto");
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
            "{kind:?} x{}: signal to successor serving median {:?}; read rounds completed meanwhile median {} (min {}, max {}); longest round overlapping a handover median {:?}, max {max_stall:?}",
            served.len(),
            median(spans),
            served[served.len() / 2],
            served[0],
            served[served.len() - 1],
            median(stalls)
        );
    }
    println!("{} read rounds in all, {failed} failed", rounds.len());
    assert_eq!(failed, 0, "reads failed across the restarts");
    let _ = agent.kill();
    let _ = agent.wait();
    let _ = kill(Pid::from_raw(keeper), Signal::SIGTERM);
    // The keeper detaches the tree and exits; the namespace goes with it.
    let start = Instant::now();
    while fs::metadata(format!("/proc/{keeper}")).is_ok()
        && start.elapsed() < Duration::from_secs(5)
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}
