//! CreateContainer round trips against the mock runtime, all on one thread (one core):
//! latency p50/p99 of sequential calls, throughput sequential and with 16 calls in flight,
//! and the idle resident memory of the `mockgpu-nri` binary.
//!
//! Run: `cargo bench -p mockgpu-nri --bench create_container` (or `bench/nri.sh`).

#[path = "../tests/common/mod.rs"]
mod common;

use std::{
    process::{Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use common::{Connected, FixedInventory, Handshake, MockRuntime, pod, realistic, write_tree};
use futures::{StreamExt, stream};
use mockgpu_nri::{Config, Plugin};
use tokio::net::UnixStream;

const WARMUP: usize = 2_000;
const CALLS: usize = 20_000;
const IN_FLIGHT: usize = 16;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn round_trips(conn: &Connected) {
    let p = pod("bench", &[]);
    let c = realistic(&p, "slurmd");
    let reply = conn.create(&p, &c).await.unwrap();
    assert!(
        reply.adjust.is_some(),
        "realistic container must be injected"
    );
    for _ in 0..WARMUP {
        conn.create(&p, &c).await.unwrap();
    }
    let mut latencies = Vec::with_capacity(CALLS);
    let cpu_before = cpu_time();
    let started = Instant::now();
    for _ in 0..CALLS {
        let t = Instant::now();
        conn.create(&p, &c).await.unwrap();
        latencies.push(t.elapsed());
    }
    let sequential = CALLS as f64 / started.elapsed().as_secs_f64();
    let cpu_per_call = (cpu_time() - cpu_before) / CALLS as u32;
    latencies.sort_unstable();
    let started = Instant::now();
    stream::iter(0..CALLS)
        .for_each_concurrent(IN_FLIGHT, |_| async {
            conn.create(&p, &c).await.unwrap();
        })
        .await;
    let pipelined = CALLS as f64 / started.elapsed().as_secs_f64();
    println!("create_container (50 env, 20 mounts, 4 devices), {CALLS} calls, one thread:");
    println!(
        "  latency p50 {:?}  p99 {:?}  max {:?}",
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies[latencies.len() - 1]
    );
    println!("  throughput sequential {sequential:.0}/s, {IN_FLIGHT} in flight {pipelined:.0}/s");
    println!(
        "  CPU time per round trip (plugin and mock runtime together) {cpu_per_call:?} = {:.0}/s per core",
        1.0 / cpu_per_call.as_secs_f64()
    );
}

/// User plus system CPU time of this process (independent of other load on the machine).
fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes the struct it is given.
    let usage = unsafe {
        let mut usage = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

async fn idle_rss() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("nri.sock");
    let runtime = MockRuntime::bind(&socket);
    write_tree(dir.path(), 4);
    let mut child = Command::new(env!("CARGO_BIN_EXE_mockgpu-nri"))
        .arg("--socket")
        .arg(&socket)
        .arg("--host-dir")
        .arg(dir.path())
        .arg("--log-level")
        .arg("warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let conn = runtime.accept(&Handshake::default()).await;
    let p = pod("idle", &[]);
    conn.create(&p, &realistic(&p, "slurmd")).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap();
    let rss = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or("VmRSS: ?");
    println!(
        "idle binary (registered, synchronized) {}",
        rss.split_whitespace().skip(1).collect::<Vec<_>>().join(" ")
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let plugin = Arc::new(
            Plugin::new(Config::default(), FixedInventory::gpus(4), Arc::new(tx)).unwrap(),
        );
        let (ours, theirs) = UnixStream::pair().unwrap();
        let serving = Arc::clone(&plugin);
        tokio::spawn(async move { serving.run_connection(ours, std::future::pending()).await });
        let conn = Connected::handshake(theirs, &Handshake::default())
            .await
            .unwrap();
        round_trips(&conn).await;
        conn.assert_frames_fit();
        idle_rss().await;
    });
}
