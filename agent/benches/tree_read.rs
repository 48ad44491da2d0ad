//! Reads the whole driver tree through FUSE and the same tree rendered on tmpfs, side by side in
//! one run, warm and cold; measures a cold open+read+close of one `information` file, the
//! agent's resident memory serving `gb300`, and its time from start to mounted.
//!
//! Run as root (FUSE mount, `drop_caches`): `cargo bench -p mockgpu-agent --bench tree_read`.

use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mockgpu_agent::host::SysfsHost;
use mockgpu_agent::render::driver_tree;
use mockgpu_agent::tree::Kind;
use mockgpu_api::{NodeTopology, Profile};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
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

/// Median round trip of a one-byte ping-pong between two processes over pipes: the cost of the
/// two cross-process wake-ups that every FUSE request also pays, measured on this machine.
fn pipe_round_trip() -> Duration {
    let (r1, w1) = nix::unistd::pipe().unwrap();
    let (r2, w2) = nix::unistd::pipe().unwrap();
    let n = 2000;
    // SAFETY: the child only does read/write/_exit.
    match unsafe { nix::unistd::fork() }.unwrap() {
        nix::unistd::ForkResult::Child => {
            let mut b = [0u8; 1];
            for _ in 0..n {
                let _ = nix::unistd::read(r1.as_raw_fd(), &mut b);
                let _ = nix::unistd::write(&w2, &b);
            }
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) }
        }
        nix::unistd::ForkResult::Parent { child } => {
            let mut b = [0u8; 1];
            let times = (0..n)
                .map(|_| {
                    time(|| {
                        nix::unistd::write(&w1, &b).unwrap();
                        nix::unistd::read(r2.as_raw_fd(), &mut b).unwrap();
                    })
                })
                .collect();
            nix::sys::wait::waitpid(child, None).unwrap();
            median(times)
        }
    }
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rtt = pipe_round_trip();
    println!("platform: pipe ping-pong round trip between two processes {rtt:?} (median)");
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
    let mounted = mockgpu_agent::fs::mount(&tree, &fuse_root).expect("FUSE mount (run as root)");
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
        "warm whole tree: FUSE {fw:?}  tmpfs {tw:?}  ratio {:.2} (target <= 1.6); reads reaching the agent in a warm pass: {misses}",
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
    // First read after a fresh mount: neither the path nor the content has been seen, and the
    // agent's own code stays warm (drop_caches above also evicts the agent's code pages).
    let mut f1_fresh = Vec::new();
    for i in 0..100 {
        let mnt = dir.path().join(format!("fresh{i}"));
        fs::create_dir(&mnt).unwrap();
        let m = mockgpu_agent::fs::mount(&tree, &mnt).unwrap();
        f1_fresh.push(time(|| read_all(&mnt, std::slice::from_ref(&info))));
        m.unmount().unwrap();
    }
    // Cold content, warm path: the file's page cache dropped through the FUSE notifier, as after
    // a tree change.
    let mut other = tree.clone();
    other.file(info.to_str().unwrap(), "x");
    let mut f1_inval = Vec::new();
    for _ in 0..100 {
        mounted.handle.replace(&other);
        mounted.handle.replace(&tree);
        f1_inval.push(time(|| read_all(&fuse_root, std::slice::from_ref(&info))));
    }
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
    // read of an information file after that, and resident memory while serving gb300.
    let run = dir.path().join("run");
    let mnt = run.join("fs");
    let agent_info = mnt.join(&info);
    let (mut ready, mut first_read, mut rss) = (Vec::new(), Vec::new(), String::new());
    for round in 0..20 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let start = Instant::now();
        let mut child = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"))
            .args([
                "serve",
                "--profile",
                "gb300",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--dir",
            ])
            .arg(&run)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        while !readyz(port) {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "agent did not become ready"
            );
            std::thread::sleep(Duration::from_micros(500));
        }
        ready.push(start.elapsed());
        first_read.push(time(|| fs::read(&agent_info).unwrap()));
        if round == 19 {
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
    let _ = nix::mount::umount2(&run, nix::mount::MntFlags::MNT_DETACH);
}

/// Whether the agent's `/readyz` answers 200.
fn readyz(port: u16) -> bool {
    use std::io::Write;
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
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
