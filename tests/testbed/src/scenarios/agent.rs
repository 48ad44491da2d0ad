//! The agent's own lifecycle under running containers: restarts (SIGTERM, SIGKILL) with a reader
//! that must never fail, a second agent beside the first (a rollout's surge), and what the NRI
//! plugin costs a container's creation.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use mockgpu_testbed::spec::{self, ContainerSpec};
use mockgpu_testbed::stats;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::bed::{Bed, alive, exec_ok, wait_for};
use crate::node::{assert_injected, sleeper};
use crate::slurm::srun_ok;

/// The agent's log, in the test bed's logs.
const AGENT_LOG: &str = "agent.log";
/// The runtime's log.
const RUNTIME_LOG: &str = "containerd.log";
/// The agent's metrics, in the node (its default `--listen`).
const METRICS: &str = "http://127.0.0.1:9464/metrics";

/// Milliseconds since the epoch, now.
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds since the epoch of a tracing timestamp (`2026-12-03T05:48:28.642750Z`).
fn timestamp_ms(ts: &str) -> Option<u64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    // days from the civil date (Howard Hinnant's algorithm)
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms: i64 = format!("{frac:0<3}").get(..3)?.parse().ok()?;
    u64::try_from(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms).ok()
}

impl Bed {
    /// The agent the test bed started last.
    fn agent_pid(&self) -> Result<u32> {
        let p = self.state.join("agent.pid");
        let s = std::fs::read_to_string(&p).with_context(|| format!("{}", p.display()))?;
        s.trim()
            .parse()
            .with_context(|| format!("{}: {s:?}", p.display()))
    }

    /// Starts an agent in the node, as `testbed.sh`'s `start_agent` (with `$AGENT_ARGS`).
    fn start_agent(&self) -> Result<u32> {
        self.start_agent_with(&[])
    }

    /// Starts an agent in the node with `$AGENT_ARGS` and `more` arguments.
    pub(crate) fn start_agent_with(&self, more: &[&str]) -> Result<u32> {
        let extra = std::env::var("AGENT_ARGS").unwrap_or_default();
        let mut args = vec![
            "RUST_LOG=info",
            "/opt/mockgpu/mockgpu-agent",
            "serve",
            "--profile-file",
            "/etc/mockgpu/profile.yaml",
            "--node-name",
            "node0",
            "--dir",
            "/run/mockgpu",
            "--nri-socket",
            "/run/nri/nri.sock",
            "--trusted-namespaces",
            "default",
        ];
        args.extend(extra.split_whitespace());
        args.extend(more);
        let pid = self.spawn("agent", AGENT_LOG, &args)?;
        std::fs::write(self.state.join("agent.pid"), format!("{pid}\n"))?;
        Ok(pid)
    }

    /// The agent serves: its FUSE mount in the node, the shim and `ld.so.preload` installed, and
    /// its plugin registered with the runtime since line `runtime_from` of the runtime's log.
    fn agent_ready(&self, runtime_from: usize) -> bool {
        let mounted = self.node_pid().is_ok_and(|p| {
            std::fs::read_to_string(format!("/proc/{p}/mountinfo")).is_ok_and(|m| {
                m.lines().any(|l| {
                    l.split(' ').nth(4) == Some("/run/mockgpu/fs")
                        && l.split(" - ").nth(1).is_some_and(|t| t.starts_with("fuse"))
                })
            })
        });
        let installed = |p: &str| std::fs::metadata(self.node_path(p)).is_ok_and(|m| m.len() > 0);
        mounted
            && installed("/run/mockgpu/lib/libmockfs.so")
            && installed("/run/mockgpu/ld.so.preload")
            && self.logged_since(RUNTIME_LOG, runtime_from, "registered as")
    }

    pub(crate) async fn wait_agent_ready(&self, runtime_from: usize, what: &str) -> Result<()> {
        wait_for(30, what, || async { self.agent_ready(runtime_from) })
            .await
            .map_err(|e| anyhow::anyhow!("{e}\n{}", self.log_tails(&[AGENT_LOG], 20)))
    }

    /// The first line after the first `from` lines of a log that contains `text`.
    fn logged_line(&self, log: &str, from: usize, text: &str) -> Option<String> {
        let s = std::fs::read_to_string(self.logs.join(log)).ok()?;
        s.lines()
            .skip(from)
            .find(|l| l.contains(text))
            .map(str::to_owned)
    }

    /// A metric's value on the agent's `/metrics`.
    fn metric(&self, name: &str) -> Result<u64> {
        let text = self.in_node(&["busybox", "wget", "-q", "-T", "5", "-O", "-", METRICS])?;
        let value = text.lines().find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name).then_some(v)
        });
        value
            .with_context(|| format!("no metric {name} at {METRICS}"))?
            .parse()
            .with_context(|| format!("metric {name}"))
    }
}

fn pid_of(pid: u32) -> Result<Pid> {
    Ok(Pid::from_raw(i32::try_from(pid)?))
}

/// A reader in the slurmd container reads the driver files 50 times a second across a SIGTERM
/// and a SIGKILL of the agent (each successor started at once): no read may fail (the keeper
/// holds the mount), the container is not restarted, and a job still sees the GPUs.
pub async fn agent_restart(bed: &Bed) -> Result<()> {
    let slurmd = bed.container("slurmd")?;
    let mut cri = bed.cri().await?;
    exec_ok(&mut cri, &slurmd, &["sh", "-c", "rm -f /tmp/reader.log; (while :; do
        if cat /proc/driver/nvidia/gpus/*/information > /dev/null 2>&1; then r=ok; else r=fail; fi
        echo \"$(date +%s%3N) $r\"; sleep 0.02; done > /tmp/reader.log 2>&1 < /dev/null & echo $! > /tmp/reader.pid)"]).await?;
    let probe = cri.clone();
    let reads_since = |t: u64| {
        let mut c = probe.clone();
        let slurmd = slurmd.clone();
        async move {
            let log = exec_ok(&mut c, &slurmd, &["cat", "/tmp/reader.log"])
                .await
                .unwrap_or_default();
            log.lines()
                .filter(|l| {
                    l.split(' ')
                        .next()
                        .and_then(|t| t.parse::<u64>().ok())
                        .is_some_and(|x| x > t)
                })
                .count()
        }
    };
    wait_for(10, "the reader's first reads", || async {
        reads_since(0).await >= 10
    })
    .await?;
    let before = exec_ok(&mut cri, &slurmd, &["cat", "/tmp/reader.log"]).await?;
    ensure!(
        before.lines().any(|l| l.ends_with(" ok")),
        "the reader cannot read the driver files before the restart"
    );
    ensure!(
        !before.lines().any(|l| l.ends_with(" fail")),
        "the reader failed before the restart"
    );
    ensure!(
        bed.logged_since(AGENT_LOG, 0, "started a keeper"),
        "the agent serves without a keeper"
    );
    let pause: u64 = std::env::var("AGENT_RESTART_PAUSE")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let t0 = now_ms();
    for (signal, name) in [(Signal::SIGTERM, "TERM"), (Signal::SIGKILL, "KILL")] {
        let n0 = bed.log_lines(RUNTIME_LOG);
        let l0 = bed.log_lines(AGENT_LOG);
        let t_sig = now_ms();
        let old = bed.agent_pid()?;
        kill(pid_of(old)?, signal)
            .with_context(|| format!("SIG{name} to the agent (pid {old})"))?;
        if signal == Signal::SIGKILL && pause > 0 {
            // AGENT_RESTART_PAUSE: an experiment's gap between the kill and the successor
            tokio::time::sleep(Duration::from_secs(pause)).await;
        }
        let t_start = Instant::now();
        let start_ms = now_ms();
        bed.start_agent()?;
        bed.wait_agent_ready(
            n0,
            &format!("the agent restarted after SIG{name} to be ready"),
        )
        .await?;
        // the keeper's mount and the runtime's registration can come before the new agent
        // serves: it joins the keeper and registers with the runtime in either order
        wait_for(
            10,
            &format!("the agent restarted after SIG{name} to join the keeper and serve"),
            || async {
                bed.logged_since(AGENT_LOG, l0, "connected to the running keeper")
                    && bed.logged_since(AGENT_LOG, l0, "mockgpu_agent::serve: ready ")
            },
        )
        .await?;
        bed.timing(
            &format!("agent-restart-sig{name}-to-ready"),
            &format!("{} ms", t_start.elapsed().as_millis()),
        );
        let registered = "registered with the NRI runtime";
        wait_for(
            10,
            "the restarted agent to log its NRI registration",
            || async { bed.logged_since(AGENT_LOG, l0, registered) },
        )
        .await?;
        let line = bed
            .logged_line(AGENT_LOG, l0, registered)
            .unwrap_or_default();
        let t_reg = line
            .split(' ')
            .next()
            .and_then(timestamp_ms)
            .with_context(|| format!("no timestamp on the NRI registration line {line:?}"))?;
        bed.timing(
            &format!("agent-restart-sig{name}-nri-reconnect"),
            &format!(
                "{} ms from the new agent's start to its NRI registration ({} ms from SIG{name})",
                t_reg.saturating_sub(start_ms),
                t_reg.saturating_sub(t_sig)
            ),
        );
        // (a process killed while it waits for a FUSE reply cannot exit until one comes)
        wait_for(
            10,
            &format!("the agent stopped with SIG{name} (pid {old}) to exit"),
            || async { !alive(old) },
        )
        .await?;
    }
    let after = now_ms();
    wait_for(10, "the reader's reads after the restarts", || async {
        reads_since(after).await >= 10
    })
    .await?;
    exec_ok(
        &mut cri,
        &slurmd,
        &["sh", "-c", "kill $(cat /tmp/reader.pid)"],
    )
    .await?;
    let log = exec_ok(&mut cri, &slurmd, &["cat", "/tmp/reader.log"]).await?;
    std::fs::write(bed.logs.join("reader.log"), &log)?;
    ensure!(alive(slurmd.pid), "the slurmd container was restarted");
    let reads: Vec<(u64, bool)> = log
        .lines()
        .filter_map(|l| {
            let (t, r) = l.split_once(' ')?;
            Some((t.parse().ok()?, r == "ok"))
        })
        .filter(|(t, _)| *t > t0)
        .collect();
    let fails = reads.iter().filter(|(_, ok)| !ok).count();
    let gap = reads
        .windows(2)
        .map(|w| w[1].0.saturating_sub(w[0].0))
        .max()
        .unwrap_or(0);
    println!(
        "  reader: {} reads across the two restarts, {fails} failed; longest gap between two reads {gap} ms (20 ms when none waited)",
        reads.len()
    );
    bed.timing(
        "agent-restart-failed-reads",
        &format!(
            "{fails} of {} (SIGTERM and SIGKILL restarts; longest gap between reads {gap} ms)",
            reads.len()
        ),
    );
    ensure!(
        fails == 0,
        "{fails} reads failed inside the container across the agent restarts"
    );
    let job = srun_ok(bed, &["ls", "/proc/driver/nvidia/gpus"])?;
    let n = job.lines().count();
    ensure!(n == 4, "a job after the agent restarts sees {n} GPUs");
    Ok(())
}

/// How many times a plugin injected the mock into a pod's container since line `from`.
fn injections(bed: &Bed, from: usize, pod: &str) -> usize {
    let text = format!("injected the mock pod={pod} ");
    std::fs::read_to_string(bed.logs.join(AGENT_LOG)).map_or(0, |s| {
        s.lines().skip(from).filter(|l| l.contains(&text)).count()
    })
}

fn holding(name: &str, minor: u32) -> Result<ContainerSpec> {
    let mut c = sleeper(name);
    c.devices = vec![spec::parse_device(&format!(
        "/dev/null:/dev/nvidia{minor}"
    ))?];
    Ok(c)
}

/// A rollout (maxSurge) starts the new agent beside the old one: until the old one stops, both
/// agents' plugins adjust every GPU container, and the runtime must still create it (it fails a
/// creation when two plugins set the same mount, env or device without removing it first).
pub async fn agent_surge(bed: &Bed) -> Result<()> {
    let old = bed.agent_pid()?;
    let n0 = bed.log_lines(RUNTIME_LOG);
    let l0 = bed.log_lines(AGENT_LOG);
    bed.start_agent()?;
    bed.wait_agent_ready(n0, "the second agent registered with the runtime")
        .await?;
    wait_for(10, "the second agent to join the keeper", || async {
        bed.logged_since(AGENT_LOG, l0, "connected to the running keeper")
    })
    .await?;
    // its plugin registers before its own mount is ready and refuses GPU containers until then
    // (fail closed: the kubelet retries), so the creation below waits for it to be ready
    wait_for(10, "the second agent to be ready", || async {
        bed.logged_since(AGENT_LOG, l0, "serve: ready")
    })
    .await?;
    ensure!(
        alive(old),
        "the first agent stopped when the second started"
    );
    let mut cri = bed.cri().await?;
    let surge = bed
        .up(&mut cri, &bed.pod("surge-0"), &holding("main", 1)?)
        .await?;
    assert_injected(&mut cri, "surge", &surge, &[1]).await?;
    let n = injections(bed, l0, "surge-0");
    ensure!(
        n == 2,
        "the container was adjusted by {n} plugins, want both agents' 2"
    );
    println!(
        "  a GPU container created while two agents' NRI plugins are registered: adjusted by both, created, injected"
    );
    kill(pid_of(old)?, Signal::SIGTERM)?;
    wait_for(15, "the first agent to stop", || async { !alive(old) }).await?;
    let after = bed
        .up(&mut cri, &bed.pod("surge-1"), &holding("main", 2)?)
        .await?;
    assert_injected(&mut cri, "surge-after", &after, &[2]).await?;
    let n = injections(bed, l0, "surge-1");
    ensure!(
        n == 1,
        "after the first agent stopped, the container was adjusted by {n} plugins, want 1"
    );
    cri.down(&["surge-0".into(), "surge-1".into()]).await?;
    Ok(())
}

/// Unmeasured creations before each round's measured ones.
const LAT_WARMUP: usize = 2;

/// One round of `n` measured CreateContainer round trips in a fresh pod.
async fn latency_round(bed: &Bed, pod: &str, c: &ContainerSpec, n: usize) -> Result<Vec<Duration>> {
    let mut cri = bed.cri().await?;
    let mut p = bed.pod(pod);
    p.name = format!("{pod}-lat-{}", std::process::id());
    Ok(cri.create_latency(&p, c, LAT_WARMUP, n).await?)
}

/// A round with the plugin, which must see every creation and inject exactly the GPU containers.
async fn latency_round_on(
    bed: &Bed,
    pod: &str,
    c: &ContainerSpec,
    gpu: bool,
    n: usize,
) -> Result<Vec<Duration>> {
    let created = r#"mockgpu_nri_events_total{event="create_container"}"#;
    let injected = "mockgpu_nri_injections_total";
    let failed = r#"mockgpu_nri_errors_total{outcome="fail_open"}"#;
    let before = (
        bed.metric(created)?,
        bed.metric(injected)?,
        bed.metric(failed)?,
    );
    let sample = latency_round(bed, pod, c, n).await?;
    let after = (
        bed.metric(created)?,
        bed.metric(injected)?,
        bed.metric(failed)?,
    );
    let all = u64::try_from(n + LAT_WARMUP)?;
    let (c_n, i_n, e_n) = (after.0 - before.0, after.1 - before.1, after.2 - before.2);
    ensure!(
        c_n == all,
        "{pod}: the plugin saw {c_n} CreateContainer requests, want {all}"
    );
    let want = if gpu { all } else { 0 };
    ensure!(
        i_n == want,
        "{pod}: the plugin injected {i_n} of {all} containers, want {want}"
    );
    ensure!(e_n == 0, "{pod}: {e_n} creations failed open");
    Ok(sample)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The CreateContainer round trip with the plugin connected and without it, GPU and plain
/// containers, in alternating rounds (on, off, on, off) so that load from elsewhere on the
/// machine hits both sides alike; the median with the plugin within `LAT_MAX_RATIO` (3) times
/// the median without.
pub async fn nri_latency(bed: &Bed) -> Result<()> {
    let n: usize = env_or("LAT_N", 20);
    let max_ratio: f64 = env_or("LAT_MAX_RATIO", 3.0);
    ensure!(alive(bed.agent_pid()?), "the agent is not running");
    let mut gpu = sleeper("main");
    gpu.command.clear();
    gpu.env = vec![("NVIDIA_VISIBLE_DEVICES".into(), "all".into())];
    let mut plain = sleeper("main");
    plain.command.clear();
    let mut samples: [Vec<Duration>; 4] = Default::default();
    for _ in 0..2 {
        samples[0].extend(latency_round_on(bed, "lat-gpu", &gpu, true, n).await?);
        samples[2].extend(latency_round_on(bed, "lat-plain", &plain, false, n).await?);
        let n0 = bed.log_lines(RUNTIME_LOG);
        let agent = bed.agent_pid()?;
        bed.stop(Signal::SIGTERM, &["agent"]).await?;
        ensure!(
            !alive(agent),
            "the agent survived SIGTERM; the plugin-off rounds would not be"
        );
        wait_for(10, "the runtime to drop the plugin", || async {
            bed.logged_since(RUNTIME_LOG, n0, r#"mockgpu\" closed"#)
        })
        .await?;
        samples[1].extend(latency_round(bed, "lat-gpu", &gpu, n).await?);
        samples[3].extend(latency_round(bed, "lat-plain", &plain, n).await?);
        let n0 = bed.log_lines(RUNTIME_LOG);
        bed.start_agent()?;
        bed.wait_agent_ready(n0, "the agent to be ready again")
            .await?;
    }
    let mut medians = Vec::new();
    for (sample, kind) in samples
        .iter()
        .zip(["gpu-on", "gpu-off", "plain-on", "plain-off"])
    {
        ensure!(
            sample.len() == 2 * n,
            "{kind}: {} samples, want {}",
            sample.len(),
            2 * n
        );
        let s = stats::summarize(sample).context("no samples")?;
        bed.timing(&format!("create-latency {kind:<9}"), &s.to_string());
        medians.push(s.median_ms);
    }
    for (kind, on, off) in [
        ("gpu", medians[0], medians[1]),
        ("plain", medians[2], medians[3]),
    ] {
        if !(off > 0.0 && on <= max_ratio * off) {
            bail!(
                "{kind} container: median CreateContainer {on:.2} ms with the plugin, {off:.2} ms without: more than {max_ratio}x"
            );
        }
        println!(
            "  {kind} container: median {on:.2} ms with the plugin, {off:.2} ms without (bound {max_ratio}x)"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::timestamp_ms;

    #[test]
    fn tracing_timestamps() {
        assert_eq!(timestamp_ms("1970-01-01T00:00:01.5Z"), Some(1500));
        // date -d 2026-12-03T05:48:28.642Z +%s%3N
        assert_eq!(
            timestamp_ms("2026-12-03T05:48:28.642750Z"),
            Some(1_796_276_908_642)
        );
        assert_eq!(
            timestamp_ms("2024-02-29T23:59:59Z"),
            Some(1_709_251_199_000)
        );
        assert_eq!(timestamp_ms("not a time"), None);
    }
}
