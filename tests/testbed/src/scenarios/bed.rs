//! The test bed as a scenario sees it: its paths and its node (from what `testbed.sh env`
//! exports), commands inside the node, containers through CRI, waits with deadlines, timings.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::future::Future;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use mockgpu_testbed::client::{Cri, ExecOutput};
use mockgpu_testbed::spec::{ContainerSpec, PodSpec};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// The environment a command inside the node gets (as `testbed.sh`'s `innode`).
const NODE_ENV: [&str; 5] = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "TERM=dumb",
    "LANG=C.UTF-8",
    "DEBIAN_FRONTEND=noninteractive",
];

/// Characters of a log line in a failure's report.
const LOG_LINE_MAX: usize = 240;

/// Bound on one CRI request.
const CRI_TIMEOUT: Duration = Duration::from_secs(60);

/// A running test bed.
pub struct Bed {
    /// The node's root file system, as the host sees it.
    pub root: PathBuf,
    /// The logs of the test bed's processes (`containerd.log`, `agent.log`, …).
    pub logs: PathBuf,
    /// State the steps share (`node.pid`, `<key>.env` of containers).
    pub state: PathBuf,
    cri_socket: PathBuf,
    /// The cgroup below which every pod lives.
    pub cgroup_parent: String,
    /// `<kind> <pid> <start time>` of every process the test bed started (`testbed.sh` reads it
    /// at teardown).
    pids: PathBuf,
}

/// A running container.
#[derive(Debug, Clone)]
pub struct Ctr {
    pub id: String,
    /// Host PID of its first process.
    pub pid: u32,
    pub create: Duration,
    pub start: Duration,
}

fn var(name: &str) -> Result<String> {
    std::env::var(name).with_context(|| {
        format!("${name} is not set: run through testbed.sh, or after `eval \"$(testbed.sh env)\"`")
    })
}

impl Bed {
    /// The test bed `testbed.sh` describes in the environment.
    pub fn from_env() -> Result<Self> {
        Ok(Bed {
            root: var("R")?.into(),
            logs: var("LOGS")?.into(),
            state: var("ST")?.into(),
            cri_socket: var("CRI_SOCKET")?.into(),
            cgroup_parent: var("MGTB_CGROUP_PARENT")?,
            pids: PathBuf::from(var("TB")?).join("pids.txt"),
        })
    }

    /// The bed of the worker `node` (cluster mode: cluster.sh's `worker_vars`): its own root,
    /// state, logs and cgroup parent; the same PID list, where its daemons are `<kind>@<node>`.
    pub fn worker(&self, node: &str) -> Bed {
        let root = self.root.with_file_name(format!("rootfs-{node}"));
        Bed {
            cri_socket: root.join("run/containerd/containerd.sock"),
            root,
            logs: self.logs.join(node),
            state: self.state.join(node),
            cgroup_parent: format!("{}-{node}", self.cgroup_parent),
            pids: self.pids.clone(),
        }
    }

    /// A host path of a path in the node.
    pub fn node_path(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }

    /// The PID whose namespaces are the node's.
    pub fn node_pid(&self) -> Result<u32> {
        let p = self.state.join("node.pid");
        let s = std::fs::read_to_string(&p)
            .with_context(|| format!("{}: is the test bed up?", p.display()))?;
        s.trim()
            .parse()
            .with_context(|| format!("{}: not a PID: {s:?}", p.display()))
    }

    /// `args` inside the node (its mount and network namespaces), with a clean environment.
    pub fn innode(&self, args: &[&str]) -> Result<Command> {
        let mut c = Command::new("nsenter");
        c.args([
            "-t",
            &self.node_pid()?.to_string(),
            "-m",
            "-n",
            "--",
            "/usr/bin/env",
            "-i",
        ]);
        c.args(NODE_ENV).args(args);
        Ok(c)
    }

    /// `args` inside the node; its standard output, or an error with its standard error.
    pub fn in_node(&self, args: &[&str]) -> Result<String> {
        let out = self
            .innode(args)?
            .output()
            .with_context(|| format!("nsenter {args:?}"))?;
        stdout_of(&format!("{args:?} in the node"), out)
    }

    /// Starts a daemon inside the node, in a session of its own, its output appended to
    /// `<logs>/<log>`; kept in the PID list under `kind`, so that `stop` and teardown find it.
    pub fn spawn(&self, kind: &str, log: &str, args: &[&str]) -> Result<u32> {
        let out = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.logs.join(log))?;
        let mut c = Command::new("setsid");
        c.args([
            "nsenter",
            "-t",
            &self.node_pid()?.to_string(),
            "-m",
            "-n",
            "--",
        ]);
        c.args(["/usr/bin/env", "-i"]).args(NODE_ENV).args(args);
        let child = c
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("spawn {kind}: {args:?}"))?;
        // (setsid and nsenter exec what follows: the PID is the daemon's)
        let pid = child.id();
        self.track(kind, pid)?;
        Ok(pid)
    }

    /// The command line of the running daemon of `kind` the test bed started, to start it again
    /// as it was (its arguments stay where they were written: `cluster.sh`, `testbed.sh`).
    pub fn cmdline_of(&self, kind: &str) -> Result<Vec<String>> {
        let list =
            std::fs::read_to_string(&self.pids).with_context(|| self.pids.display().to_string())?;
        for l in list.lines() {
            if let [k, pid, start] = l.split(' ').collect::<Vec<_>>()[..]
                && k == kind
                && start_time(pid.parse()?).as_deref() == Some(start)
            {
                let raw = std::fs::read(format!("/proc/{pid}/cmdline"))?;
                return Ok(raw
                    .split(|b| *b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect());
            }
        }
        bail!("no running {kind} in {}", self.pids.display())
    }

    /// Keeps a daemon the test bed started in the PID list under `kind`, with its start time.
    pub fn track(&self, kind: &str, pid: u32) -> Result<()> {
        let start = start_time(pid).with_context(|| format!("{kind} (pid {pid}) ended at once"))?;
        let mut list = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&self.pids)?;
        std::io::Write::write_all(&mut list, format!("{kind} {pid} {start}\n").as_bytes())?;
        Ok(())
    }

    /// Sends `signal` to the test bed's processes of `kinds` (those still the processes it
    /// started: the start time guards against a reused PID), drops them from the PID list and
    /// waits up to 10 s for each to end (one still running then is noted, not an error: the
    /// caller checks what matters to it, and teardown stops whatever is left).
    pub async fn stop(&self, signal: Signal, kinds: &[&str]) -> Result<()> {
        let list = std::fs::read_to_string(&self.pids).unwrap_or_default();
        let (ours, rest): (Vec<&str>, Vec<&str>) = list
            .lines()
            .partition(|l| l.split(' ').next().is_some_and(|k| kinds.contains(&k)));
        let mut signalled = Vec::new();
        for line in ours {
            let mut f = line.split(' ').skip(1);
            let (Some(pid), Some(start)) = (f.next().and_then(|p| p.parse::<u32>().ok()), f.next())
            else {
                continue;
            };
            if start_time(pid).as_deref() == Some(start) {
                let target = Pid::from_raw(i32::try_from(pid)?);
                if kill(target, signal).is_ok() {
                    signalled.push((pid, start.to_owned()));
                }
            }
        }
        let kept: String = rest.iter().map(|l| format!("{l}\n")).collect();
        std::fs::write(&self.pids, kept)?;
        for (pid, start) in signalled {
            let what = format!("pid {pid} to end after {signal}");
            let ended = wait_for(10, &what, || async {
                start_time(pid).as_deref() != Some(start.as_str())
            });
            if let Err(e) = ended.await {
                // as testbed.sh's stop_kinds: the caller checks what it needs; teardown kills it
                println!("  {e}");
            }
        }
        Ok(())
    }

    /// The CRI runtime of the node.
    pub async fn cri(&self) -> Result<Cri> {
        Cri::connect(&self.cri_socket, CRI_TIMEOUT)
            .await
            .with_context(|| format!("CRI socket {}", self.cri_socket.display()))
    }

    /// A host-network pod of the test bed.
    pub fn pod(&self, name: &str) -> PodSpec {
        PodSpec {
            name: name.into(),
            namespace: "default".into(),
            cgroup_parent: self.cgroup_parent.clone(),
            ..PodSpec::default()
        }
    }

    /// Runs a container and waits until it runs its own program (StartContainer returns while
    /// runc's init may still be its process).
    pub async fn up(&self, cri: &mut Cri, pod: &PodSpec, c: &ContainerSpec) -> Result<Ctr> {
        let s = cri
            .up(pod, c, true)
            .await
            .with_context(|| format!("up {}/{}", pod.name, c.name))?;
        let ctr = Ctr {
            id: s.container_id,
            pid: s.pid,
            create: s.create,
            start: s.start,
        };
        let comm = format!("/proc/{}/comm", ctr.pid);
        wait_for(
            10,
            &format!("container {} to exec its program", c.name),
            || async {
                std::fs::read_to_string(&comm).is_ok_and(|s| s.trim_end() != "runc:[2:INIT]")
            },
        )
        .await?;
        Ok(ctr)
    }

    /// A container an earlier step started, from its `<key>.env` (CTR=, PID=).
    pub fn container(&self, key: &str) -> Result<Ctr> {
        let p = self.state.join(format!("{key}.env"));
        let s = std::fs::read_to_string(&p).with_context(|| {
            format!(
                "{}: needs the container {key} of an earlier step",
                p.display()
            )
        })?;
        let kv: HashMap<&str, &str> = s.lines().filter_map(|l| l.split_once('=')).collect();
        let get = |k: &str| {
            kv.get(k)
                .copied()
                .with_context(|| format!("{}: no {k}=", p.display()))
        };
        Ok(Ctr {
            id: get("CTR")?.into(),
            pid: get("PID")?
                .parse()
                .with_context(|| format!("{}: PID", p.display()))?,
            create: Duration::ZERO,
            start: Duration::ZERO,
        })
    }

    /// Prints a timing line and keeps it in `timings.txt`, as `testbed.sh`'s `timing`.
    pub fn timing(&self, what: &str, value: &str) {
        let line = format!("TIMING {what}: {value}\n");
        print!("{line}");
        let path = self.logs.join("timings.txt");
        let kept = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
        if let Err(e) = kept {
            eprintln!("{}: {e}", path.display());
        }
    }

    /// The last `n` lines of each log, for a failure's report.
    pub fn log_tails(&self, names: &[&str], n: usize) -> String {
        let mut out = String::new();
        for name in names {
            let p = self.logs.join(name);
            writeln!(out, "--- {} (last {n} lines)\n{}", p.display(), tail(&p, n)).ok();
        }
        out
    }
}

/// The last `n` lines of a file, each cut at `LOG_LINE_MAX` characters (the runtime's debug lines
/// hold whole OCI specs), or what is wrong with the file.
pub fn tail(path: &std::path::Path, n: usize) -> String {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return format!("({}: {e})", path.display()),
    };
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for l in &lines[lines.len().saturating_sub(n)..] {
        match l.char_indices().nth(LOG_LINE_MAX) {
            Some((i, _)) => writeln!(out, "{}…", &l[..i]),
            None => writeln!(out, "{l}"),
        }
        .ok();
    }
    out
}

/// Runs `cmd` in a container; retried twice when the runtime could not start it (runc's rare
/// "init-p" races), as `mgtb-cri exec` does.
pub async fn exec(cri: &mut Cri, ctr: &Ctr, cmd: &[&str]) -> Result<ExecOutput> {
    let cmd: Vec<String> = cmd.iter().map(|s| s.to_string()).collect();
    let mut attempt = 0;
    loop {
        match cri.exec(&ctr.id, &cmd, 60).await {
            Ok(out) => return Ok(out),
            Err(e) if attempt < 2 => {
                eprintln!("exec {cmd:?} in {}: {e}; retrying", ctr.id);
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("exec {cmd:?} in {}", ctr.id)),
        }
    }
}

/// Runs `cmd` in a container; its standard output, or an error naming its exit code and
/// standard error.
pub async fn exec_ok(cri: &mut Cri, ctr: &Ctr, cmd: &[&str]) -> Result<String> {
    let out = exec(cri, ctr, cmd).await?;
    if out.exit_code != 0 {
        bail!(
            "{cmd:?} exited {}: {}",
            out.exit_code,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A finished command's standard output, or an error naming `what` with its status and standard
/// error.
pub fn stdout_of(what: &str, out: Output) -> Result<String> {
    if !out.status.success() {
        bail!(
            "{what}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Polls `ready` every 100 ms until it holds; an error naming `what` after `secs` seconds.
pub async fn wait_for<F, Fut>(secs: u64, what: &str, mut ready: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        if ready().await {
            return Ok(());
        }
        if Instant::now() >= end {
            bail!("timed out after {secs} s waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A running process's start time (field 22 of its `stat`); `None` when it is gone or a zombie.
pub fn start_time(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(") ")?;
    let fields: Vec<&str> = rest.split(' ').collect();
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19).map(|s| s.to_string())
}

/// Whether a process runs (a zombie does not).
pub fn alive(pid: u32) -> bool {
    start_time(pid).is_some()
}

/// The lines of a process's environment.
pub fn environ(pid: u32) -> Result<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ"))
        .with_context(|| format!("/proc/{pid}/environ"))?;
    Ok(raw
        .split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect())
}

/// The mount points of a process, with their optional fields (`master:N` …), from mountinfo.
pub fn mounts(pid: u32) -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .with_context(|| format!("/proc/{pid}/mountinfo"))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some((f.get(4)?.to_string(), f.get(6..sep)?.join(" ")))
        })
        .collect())
}

impl Bed {
    /// How many lines a log of the test bed has now.
    pub fn log_lines(&self, log: &str) -> usize {
        std::fs::read_to_string(self.logs.join(log)).map_or(0, |s| s.lines().count())
    }

    /// Whether a line after the first `from` lines of a log contains `text`.
    pub fn logged_since(&self, log: &str, from: usize, text: &str) -> bool {
        std::fs::read_to_string(self.logs.join(log))
            .is_ok_and(|s| s.lines().skip(from).any(|l| l.contains(text)))
    }

    /// Starts containerd in the node and waits for its CRI and NRI sockets.
    pub async fn start_containerd(&self) -> Result<()> {
        let args = [
            "containerd",
            "--config",
            "/etc/containerd/config.toml",
            "--log-level",
            "debug",
        ];
        let pid = self.spawn("containerd", "containerd.log", &args)?;
        std::fs::write(self.state.join("containerd.pid"), format!("{pid}\n"))?;
        wait_for(20, "containerd's CRI socket", || async {
            match self.cri().await {
                Ok(mut c) => c.version().await.is_ok(),
                Err(_) => false,
            }
        })
        .await?;
        let nri = self.node_path("/run/nri/nri.sock");
        wait_for(10, "the NRI socket", || async { nri.exists() }).await
    }
}

impl Bed {
    /// Runs a container as `up` does, and keeps it for later steps (and bash's `ctr`) in
    /// `<state>/<key>.env`, in `mgtb-cri up`'s format: POD=, CTR=, PID=, CREATE_MS=, START_MS=.
    pub async fn up_kept(
        &self,
        key: &str,
        cri: &mut Cri,
        pod: &PodSpec,
        c: &ContainerSpec,
    ) -> Result<Ctr> {
        let ctr = self.up(cri, pod, c).await?;
        let listed = cri.list_containers(None).await?;
        let pod_id = listed
            .iter()
            .find(|l| l.id == ctr.id)
            .map(|l| l.pod_id.clone())
            .with_context(|| format!("{key}: container {} is not listed", ctr.id))?;
        let kept = format!(
            "POD={pod_id}\nCTR={}\nPID={}\nCREATE_MS={:.2}\nSTART_MS={:.2}\n",
            ctr.id,
            ctr.pid,
            ctr.create.as_secs_f64() * 1e3,
            ctr.start.as_secs_f64() * 1e3
        );
        let path = self.state.join(format!("{key}.env"));
        std::fs::write(&path, &kept).with_context(|| format!("{}", path.display()))?;
        for line in kept.lines() {
            println!("  {key}: {line}");
        }
        Ok(ctr)
    }
}
