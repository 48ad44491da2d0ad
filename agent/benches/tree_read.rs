//! Reads the whole driver tree through FUSE and the same tree rendered on tmpfs, side by side in
//! one run, warm and cold; measures a cold open+read+close of one `information` file (wall time,
//! the serving threads' CPU time from `/proc/<pid>/task/*/schedstat` and the requests that reach
//! them), the agent's resident memory serving `gb300`, and its time from start to mounted.
//!
//! Run as root (FUSE mount, `drop_caches`): `cargo bench -p mockgpu-agent --bench tree_read`.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mockgpu_agent::host::SysfsHost;
use mockgpu_agent::render::driver_tree;
use mockgpu_agent::tree::Kind;
use mockgpu_api::{NodeTopology, Profile};

fn median<T: Ord + Copy>(mut v: Vec<T>) -> T {
    v.sort();
    v[v.len() / 2]
}

/// The median over all samples and the range of the per-run medians, in microseconds.
fn summary(runs: &[Vec<Duration>]) -> String {
    let medians: Vec<Duration> = runs.iter().map(|r| median(r.clone())).collect();
    let all = median(runs.concat());
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    format!(
        "{:.0}us (runs {:.0}-{:.0})",
        us(all),
        us(*medians.iter().min().unwrap()),
        us(*medians.iter().max().unwrap())
    )
}

/// CPU time the threads of process `pid` have spent so far, those named `prefix...` only,
/// summed from the first field of `/proc/<pid>/task/*/schedstat` (nanoseconds on a CPU). Waits
/// until none of them is running: a running thread's figure lags behind until it stops.
fn cpu_time(pid: u32, prefix: &str) -> Duration {
    let start = Instant::now();
    loop {
        let (mut ns, mut running) = (0, false);
        for task in fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
            let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if !comm.starts_with(prefix) {
                continue;
            }
            let stat = fs::read_to_string(task.path().join("stat")).unwrap_or_default();
            // The state follows the parenthesised name: "pid (name) S ...".
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next());
            running |= state == Some("R");
            let sched = fs::read_to_string(task.path().join("schedstat")).unwrap_or_default();
            ns += sched
                .split_whitespace()
                .next()
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0);
        }
        if !running || start.elapsed() > Duration::from_millis(100) {
            return Duration::from_nanos(ns);
        }
        std::thread::yield_now();
    }
}

/// A cold open+read+close of `file` after `drop_caches`: (wall time, CPU time of `pid`'s
/// threads named `prefix...` meanwhile).
fn cold_read(file: &Path, pid: u32, prefix: &str) -> (Duration, Duration) {
    drop_caches();
    let before = cpu_time(pid, prefix);
    let wall = time(|| fs::read(file).unwrap());
    (wall, cpu_time(pid, prefix) - before)
}

fn drop_caches() {
    // SAFETY: plain syscall.
    unsafe { libc::sync() };
    fs::write("/proc/sys/vm/drop_caches", "3")
        .expect("write /proc/sys/vm/drop_caches (run as root)");
}

fn read_all(root: &Path, files: &[PathBuf]) -> usize {
    let mut buf = Vec::with_capacity(8192);
    let mut total = 0;
    for f in files {
        buf.clear();
        fs::File::open(root.join(f))
            .unwrap()
            .read_to_end(&mut buf)
            .unwrap();
        total += buf.len();
    }
    total
}

fn time<T>(f: impl FnOnce() -> T) -> Duration {
    let t = Instant::now();
    std::hint::black_box(f());
    t.elapsed()
}

/// `n` one-byte ping-pongs between two processes over pipes: the two cross-process wake-ups
/// that every FUSE request also pays, measured on this machine; with `cold`, each after
/// `drop_caches`, as the cold reads below. Returns the median round trip and the answering
/// process's median CPU time per round trip (from its schedstat): the floor of what a server
/// that sleeps between requests spends on each.
fn pipe_round_trip(n: u32, cold: bool) -> (Duration, Duration) {
    let (r1, w1) = nix::unistd::pipe().unwrap();
    let (r2, w2) = nix::unistd::pipe().unwrap();
    // SAFETY: the child only does read/write/_exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let mut b = [0u8; 1];
            // One more read than round trips: the last one waits for the parent's goodbye.
            for _ in 0..=n {
                let _ = nix::unistd::read(&r1, &mut b);
                let _ = nix::unistd::write(&w2, &b);
            }
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let mut b = [0u8; 1];
            let pid = child.as_raw() as u32;
            let (times, cpus) = (0..n)
                .map(|_| {
                    if cold {
                        drop_caches();
                    }
                    let cpu = cpu_time(pid, "");
                    let t = time(|| {
                        nix::unistd::write(&w1, &b).unwrap();
                        nix::unistd::read(&r2, &mut b).unwrap();
                    });
                    (t, cpu_time(pid, "") - cpu)
                })
                .unzip();
            nix::unistd::write(&w1, &b).unwrap();
            nix::sys::wait::waitpid(child, None).unwrap();
            (median(times), median(cpus))
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let (rtt, rtt_cpu) = pipe_round_trip(2000, false);
    let (cold_rtt, cold_rtt_cpu) = pipe_round_trip(100, true);
    println!(
        "platform: pipe ping-pong round trip between two processes {rtt:?}, the answering process's CPU {rtt_cpu:?}; after drop_caches {cold_rtt:?}, CPU {cold_rtt_cpu:?} (medians)"
    );
    let host = SysfsHost::default().probe().unwrap();
    let topo = NodeTopology::build(&Profile::builtin("gb300").unwrap(), "bench", &host).unwrap();
    let tree = driver_tree(&topo, &host);
    let files: Vec<PathBuf> = tree
        .iter()
        .filter(|(_, e)| matches!(e.kind, Kind::File(_)) && e.mode & 0o444 != 0)
        .map(|(p, _)| PathBuf::from(p))
        .collect();

    let dir = tempfile::tempdir().unwrap();
    let fuse_root = dir.path().join("fs");
    fs::create_dir(&fuse_root).unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let tmpfs_root = shm.path().join("tree");
    mockgpu_agent::output::write_tree(&tree, &tmpfs_root).unwrap();
    let mounted =
        mockgpu_agent::fuse::mount(&tree, &fuse_root, None).expect("FUSE mount (run as root)");
    let bytes = read_all(&fuse_root, &files);
    assert_eq!(bytes, read_all(&tmpfs_root, &files));

    println!(
        "tree: {} files, {bytes} bytes (gb300 on this host)",
        files.len()
    );
    let rounds = 200;
    let (mut fw, mut tw) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        fw.push(time(|| read_all(&fuse_root, &files)));
        tw.push(time(|| read_all(&tmpfs_root, &files)));
    }
    let (fw, tw) = (median(fw), median(tw));
    let misses_before = mounted.handle.reads();
    read_all(&fuse_root, &files);
    let misses = mounted.handle.reads() - misses_before;
    println!(
        "warm whole tree: FUSE {fw:?}  tmpfs {tw:?}  ratio {:.2} (target <= 1.4); reads reaching the agent in a warm pass: {misses}",
        fw.as_secs_f64() / tw.as_secs_f64()
    );

    let (mut fc, mut tc) = (Vec::new(), Vec::new());
    for _ in 0..20 {
        drop_caches();
        fc.push(time(|| read_all(&fuse_root, &files)));
        drop_caches();
        tc.push(time(|| read_all(&tmpfs_root, &files)));
    }
    let (fc, tc) = (median(fc), median(tc));
    println!(
        "cold whole tree (drop_caches): FUSE {fc:?}  tmpfs {tc:?}  ratio {:.2}",
        fc.as_secs_f64() / tc.as_secs_f64()
    );

    let info = PathBuf::from(format!(
        "proc/driver/nvidia/gpus/{}/information",
        topo.gpus[0].bus_id
    ));
    let (mut f1, mut t1) = (Vec::new(), Vec::new());
    for _ in 0..100 {
        drop_caches();
        f1.push(time(|| read_all(&fuse_root, std::slice::from_ref(&info))));
        drop_caches();
        t1.push(time(|| read_all(&tmpfs_root, std::slice::from_ref(&info))));
    }
    // The FUSE threads' CPU per cold read, without and with the tree's entries pinned by
    // `warm`, alternating, in 5 runs of 20.
    let me = std::process::id();
    let info_path = fuse_root.join(&info);
    let (mut unpinned, mut pinned) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (mut u, mut p) = ((Vec::new(), Vec::new(), 0), (Vec::new(), Vec::new(), 0));
        for _ in 0..20 {
            for (pin, out) in [(false, &mut u), (true, &mut p)] {
                if pin {
                    mounted
                        .handle
                        .warm(&tree, Path::new(env!("CARGO_BIN_EXE_mockgpu-agent")));
                } else {
                    mounted.handle.unpin();
                }
                let requests = mounted.handle.requests();
                let (wall, cpu) = cold_read(&info_path, me, "fuser-");
                out.0.push(wall);
                out.1.push(cpu);
                out.2 = out.2.max(mounted.handle.requests() - requests);
            }
        }
        unpinned.push(u);
        pinned.push(p);
    }
    for (what, runs) in [("unpinned", &unpinned), ("pinned by warm", &pinned)] {
        let wall: Vec<_> = runs.iter().map(|r| r.0.clone()).collect();
        let cpu: Vec<_> = runs.iter().map(|r| r.1.clone()).collect();
        let requests = runs.iter().map(|r| r.2).max().unwrap();
        println!(
            "cold open+read+close after drop_caches, in-process mount, {what}: {requests} requests reach the FUSE threads; their CPU {} (target <= 35us), wall {}",
            summary(&cpu),
            summary(&wall)
        );
    }
    mounted.handle.unpin();
    // First read after a fresh mount: neither the path nor the content has been seen, and the
    // agent's own code stays warm (drop_caches above also evicts the agent's code pages).
    let mut f1_fresh = Vec::new();
    for i in 0..100 {
        let mnt = dir.path().join(format!("fresh{i}"));
        fs::create_dir(&mnt).unwrap();
        let m = mockgpu_agent::fuse::mount(&tree, &mnt, None).unwrap();
        f1_fresh.push(time(|| read_all(&mnt, std::slice::from_ref(&info))));
        m.unmount().unwrap();
    }
    // Cold content, warm path: the file's page cache dropped through the FUSE notifier, as after
    // a tree change.
    let mut other = tree.clone();
    other.file(info.to_str().unwrap(), "x");
    let (mut f1_inval, mut inval_cpu, mut inval_requests) = (Vec::new(), Vec::new(), 0);
    for _ in 0..100 {
        mounted.handle.replace(&other);
        mounted.handle.replace(&tree);
        let (requests, cpu) = (mounted.handle.requests(), cpu_time(me, "fuser-"));
        f1_inval.push(time(|| read_all(&fuse_root, std::slice::from_ref(&info))));
        inval_cpu.push(cpu_time(me, "fuser-") - cpu);
        inval_requests = inval_requests.max(mounted.handle.requests() - requests);
    }
    println!(
        "open+read+close after an invalidation (no drop_caches): {inval_requests} requests reach the FUSE threads; their CPU {}",
        summary(&inval_cpu.chunks(20).map(<[_]>::to_vec).collect::<Vec<_>>())
    );
    let in_rtts = |d: Duration| d.as_secs_f64() / rtt.as_secs_f64();
    let (fresh, dropped, inval) = (median(f1_fresh), median(f1), median(f1_inval));
    println!(
        "cold open+read+close of one information file (target <= 250us): FUSE first read after mount {fresh:?} ({:.1} pipe round trips), after drop_caches {dropped:?} ({:.1}), after invalidation {inval:?} ({:.1}); tmpfs after drop_caches {:?}",
        in_rtts(fresh),
        in_rtts(dropped),
        in_rtts(inval),
        median(t1)
    );
    mounted.unmount().unwrap();

    // The agent as a process: start to ready (mounted and its caches warmed), a consumer's first
    // read of an information file after that, the same after drop_caches with the agent's CPU
    // time for it, and resident memory while serving gb300.
    let run = dir.path().join("run");
    let mnt = run.join("fs");
    let agent_info = mnt.join(&info);
    let (mut ready, mut first_read, mut rss) = (Vec::new(), Vec::new(), String::new());
    let (mut cold_wall, mut cold_cpu) = (Vec::new(), Vec::new());
    for round in 0..20 {
        let start = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .args([
                "serve",
                "--profile",
                "gb300",
                "--listen",
                "127.0.0.1:0",
                "--dir",
            ])
            .arg(&run)
            // The agent's own mount (start to mounted); the keeper is measured in `handover`.
            .env("MOCKGPU_KEEPER", "off")
            .env("RUST_LOG", "info")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let addr = listening_addr(child.stderr.take().unwrap());
        while !readyz(addr) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent did not become ready"
            );
            std::thread::sleep(Duration::from_micros(500));
        }
        ready.push(start.elapsed());
        first_read.push(time(|| fs::read(&agent_info).unwrap()));
        if round == 19 {
            // Last, as drop_caches also evicts the agent's binary that the next start reads.
            for _ in 0..5 {
                let (mut w, mut c) = (Vec::new(), Vec::new());
                for _ in 0..20 {
                    let (wall, cpu) = cold_read(&agent_info, child.id(), "");
                    w.push(wall);
                    c.push(cpu);
                }
                cold_wall.push(w);
                cold_cpu.push(c);
            }
            for _ in 0..20 {
                read_all(&mnt, &files);
            }
            let status = fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
            rss = status
                .lines()
                .find(|l| l.starts_with("VmRSS:"))
                .unwrap_or("VmRSS: ?")
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
        }
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        child.wait().unwrap();
    }
    println!(
        "agent serving gb300: start to ready {:?} (target <= 200ms to mounted); first open+read+close of an information file by a consumer after that {:?} (target <= 250us); {rss} (target <= 16 MiB)",
        median(ready),
        median(first_read)
    );
    println!(
        "agent serving gb300, open+read+close after drop_caches: agent CPU {} (target <= 35us), wall {}",
        summary(&cold_cpu),
        summary(&cold_wall)
    );
    let _ = nix::mount::umount2(&run, nix::mount::MntFlags::MNT_DETACH);
}

/// Reads the agent's log until its `health endpoint listening addr=...` line and returns that
/// address; keeps draining the log in the background so that the agent never blocks on it.
fn listening_addr(log: impl Read + Send + 'static) -> std::net::SocketAddr {
    use std::io::BufRead;
    let mut lines = std::io::BufReader::new(log).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            let rest = l.split_once("health endpoint listening")?.1;
            rest.split_whitespace()
                .find_map(|w| w.strip_prefix("addr="))?
                .parse()
                .ok()
        })
        .expect("agent log names its health address");
    std::thread::spawn(move || lines.for_each(drop));
    addr
}

/// Whether the agent's `/readyz` answers 200.
fn readyz(addr: std::net::SocketAddr) -> bool {
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = write!(
        s,
        "GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}
