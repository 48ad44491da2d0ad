//! `mockgpu-agent serve` with its in-process NRI plugin keeps answering CreateContainer and
//! health checks while a profile reload is stuck reading the host (needs root and /dev/fuse).
//!
//! The test is the container runtime: it listens on the NRI socket, serves the Runtime service
//! and calls the plugin. The fake sysfs's `devices/system/cpu/online` is a FIFO, so every build
//! of the tree blocks until the test writes into it; the reload that a profile change starts is
//! held there while the test creates a GPU container and asks `/readyz`.

mod common;

use std::fs;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{StreamExt, future, stream};
use mockgpu_nri::mux::Trunk;
use mockgpu_nri::plugin::EVENT_MASK;
use mockgpu_nri::proto::api::{
    ConfigureRequest, Container, ContainerAdjustment, CreateContainerRequest, Empty, PodSandbox,
    RegisterPluginRequest, SynchronizeRequest,
};
use mockgpu_nri::proto::api_ttrpc::{self, PluginClient};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use tokio::net::UnixListener;
use tokio::sync::mpsc as async_mpsc;
use ttrpc::r#async::transport::{Listener, Socket};
use ttrpc::r#async::{Client, Server, TtrpcContext};

/// Bound on start-up, on the reload finishing and on the agent's exit.
const WAIT: Duration = Duration::from_secs(20);
/// How long a request may take while a reload is stuck: NRI's default request timeout.
const ANSWER: Duration = Duration::from_secs(2);
/// Namespace whose pods may claim GPUs by `NVIDIA_VISIBLE_DEVICES`.
const TRUSTED: &str = "gpu-jobs";

/// Polls `probe` until it yields a value; panics with `what` after [`WAIT`].
fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(start.elapsed() < WAIT, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Moves this thread, and every process and thread it starts from now on, into a private
/// mount namespace: the agent's mounts never reach the host and vanish with the test.
fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .expect("entering a private mount namespace (the test needs root)");
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("making / private");
}

fn write(root: &Path, rel: &str, content: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, content).unwrap();
}

/// A one-socket, two-CPU host below `root` (`sys/`, `proc/`) without an NVIDIA driver, whose
/// `cpu/online` is a FIFO; returns the FIFO.
fn fake_host(root: &Path) -> PathBuf {
    let sys = root.join("sys");
    write(&sys, "devices/system/cpu/possible", "0-1\n");
    for cpu in 0..2 {
        write(
            &sys,
            &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
            "0\n",
        );
    }
    write(&sys, "devices/system/node/node0/cpulist", "0-1\n");
    fs::create_dir_all(sys.join("bus/pci/devices")).unwrap();
    let online = sys.join("devices/system/cpu/online");
    nix::unistd::mkfifo(&online, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    write(&root.join("proc"), "devices", common::HOST_DEVICES);
    online
}

/// Waits until the agent has opened `fifo` for reading and returns the write end: the agent's
/// build is now blocked reading it, until the test writes and closes.
fn blocked_reader(fifo: &Path) -> fs::File {
    // Opening the write end without blocking succeeds only while a reader has it open.
    wait_for("the agent to read the host's CPU list", || {
        fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(fifo)
            .ok()
    })
}

/// Lets the blocked build go on: it reads `cpus` and then end of file.
fn release(mut writer: fs::File, cpus: &str) {
    writer.write_all(cpus.as_bytes()).unwrap();
}

/// The `serve` process; dropping it kills it and detaches what it mounted, so that a failed
/// assertion leaves neither a process nor a mount behind.
struct Agent {
    child: Child,
    /// The agent's stderr, line by line, from a thread that keeps draining it.
    lines: mpsc::Receiver<String>,
    /// The lines read so far (printed when the test fails).
    log: Vec<String>,
    run: PathBuf,
}

impl Agent {
    fn start(args: &[&std::ffi::OsStr], run: &Path) -> Agent {
        let mut command = Command::new(env!("CARGO_BIN_EXE_mockgpu-agent"));
        command
            .arg("serve")
            // never report to a cluster that a developer's kubeconfig names
            .env("MOCKGPU_REPORT", "off")
            // The agent mounts by itself: a keeper would outlive the test (tests/handover.rs covers it).
            .env("MOCKGPU_KEEPER", "off")
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // SAFETY: prctl is async-signal-safe; it only sets this child's parent-death signal, so
        // that the agent dies with the test even when the test process is killed.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == 0 {
                    Ok(())
                } else {
                    Err(io::Error::last_os_error())
                }
            });
        }
        let mut child = command.spawn().expect("starting mockgpu-agent serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Agent {
            child,
            lines,
            log: Vec::new(),
            run: run.to_path_buf(),
        }
    }

    /// The first stderr line (within [`WAIT`]) that `find` extracts a value from.
    fn wait_line<T>(&mut self, what: &str, find: impl Fn(&str) -> Option<T>) -> T {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    let found = find(&line);
                    self.log.push(line);
                    if let Some(v) = found {
                        return v;
                    }
                }
                Err(e) => panic!("no agent log line with {what} ({e})"),
            }
        }
    }

    /// Sends SIGTERM and returns the exit status (within [`WAIT`]).
    fn terminate(&mut self) -> ExitStatus {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        wait_for("the agent to exit", || self.child.try_wait().unwrap())
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for mount in [self.run.join("fs"), self.run.clone()] {
            let _ = nix::mount::umount2(&mount, MntFlags::MNT_DETACH);
        }
        if std::thread::panicking() {
            self.log.extend(self.lines.try_iter());
            eprintln!("agent log:\n{}", self.log.join("\n"));
        }
    }
}

/// GET `path` from the health endpoint; an error when it does not answer within [`ANSWER`].
fn http_get(addr: SocketAddr, path: &str) -> io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, ANSWER)?;
    s.set_read_timeout(Some(ANSWER))?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn gpu_count(mountpoint: &Path) -> usize {
    fs::read_dir(mountpoint.join("proc/driver/nvidia/gpus")).map_or(0, |d| d.count())
}

/// Replaces the profile file in one rename, as a writer that never shows half a file would.
fn write_profile(path: &Path, content: &str) {
    let tmp = path.with_extension("tmp");
    fs::write(&tmp, content).unwrap();
    fs::rename(&tmp, path).unwrap();
}

/// The Runtime service: answers RegisterPlugin and reports who registered.
struct Registrar(async_mpsc::UnboundedSender<RegisterPluginRequest>);

#[async_trait]
impl api_ttrpc::Runtime for Registrar {
    async fn register_plugin(
        &self,
        _: &TtrpcContext,
        req: RegisterPluginRequest,
    ) -> ttrpc::Result<Empty> {
        let _ = self.0.send(req);
        Ok(Empty::new())
    }
}

/// The runtime's side of one plugin connection, configured and synchronized.
struct NriRuntime {
    plugin: PluginClient,
    _server: Server,
    _trunk: Trunk,
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(ANSWER.as_nanos() as i64)
}

/// Awaits a plugin call for at most [`ANSWER`].
async fn answer<T>(what: &str, call: impl Future<Output = ttrpc::Result<T>>) -> T {
    tokio::time::timeout(ANSWER, call)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within {ANSWER:?}"))
        .unwrap_or_else(|e| panic!("{what} failed: {e}"))
}

impl NriRuntime {
    /// Accepts the plugin on `listener`, serves RegisterPlugin, then calls Configure and
    /// Synchronize like a runtime with no containers yet.
    async fn accept(listener: &UnixListener) -> NriRuntime {
        let (stream, _) = tokio::time::timeout(WAIT, listener.accept())
            .await
            .expect("the plugin connects to the NRI socket")
            .unwrap();
        let (trunk, conns) = Trunk::start(stream);
        let (registered, mut registrations) = async_mpsc::unbounded_channel();
        // The listener yields connection 2 once and never ends (an ended one stops the server).
        let runtime_conn = stream::once(future::ready(Ok(conns.runtime))).chain(stream::pending());
        let mut server = Server::new()
            .add_listener(Listener::new(runtime_conn))
            .register_service(api_ttrpc::create_runtime(Arc::new(Registrar(registered))));
        server.start().await.unwrap();
        let registration = tokio::time::timeout(WAIT, registrations.recv())
            .await
            .expect("the plugin registers")
            .unwrap();
        assert_eq!(registration.plugin_name, "mockgpu");
        let plugin = PluginClient::new(Client::new(Socket::new(conns.plugin)));
        let mut configure = ConfigureRequest::new();
        configure.runtime_name = "serve-nri-test".into();
        configure.request_timeout = ANSWER.as_millis() as i64;
        let configured = answer("Configure", plugin.configure(ctx(), &configure)).await;
        assert_eq!(configured.events, EVENT_MASK);
        answer(
            "Synchronize",
            plugin.synchronize(ctx(), &SynchronizeRequest::new()),
        )
        .await;
        NriRuntime {
            plugin,
            _server: server,
            _trunk: trunk,
        }
    }

    /// CreateContainer for a container asking for all GPUs in a trusted namespace; the
    /// adjustment the plugin answers.
    async fn create_gpu_container(&self) -> ContainerAdjustment {
        let mut pod = PodSandbox::new();
        pod.id = "pod-1".into();
        pod.name = "trainer-0".into();
        pod.uid = "uid-1".into();
        pod.namespace = TRUSTED.into();
        let mut container = Container::new();
        container.id = "ctr-1".into();
        container.pod_sandbox_id = pod.id.clone();
        container.name = "trainer".into();
        container.env = vec!["NVIDIA_VISIBLE_DEVICES=all".into()];
        let mut req = CreateContainerRequest::new();
        req.pod = Some(pod).into();
        req.container = Some(container).into();
        let reply = answer("CreateContainer", self.plugin.create_container(ctx(), &req)).await;
        reply.adjust.into_option().expect("the mock is injected")
    }
}

#[test]
fn nri_and_health_answer_while_a_reload_is_blocked() {
    enter_private_mount_namespace();
    let tmp = tempfile::tempdir().unwrap();
    let fifo = fake_host(tmp.path());
    let profile = tmp.path().join("profile.yaml");
    write_profile(&profile, "base: gb300\n");
    let socket = tmp.path().join("nri.sock");
    let run = tmp.path().join("run");
    let mnt = run.join("fs");
    // Worker threads are started here, inside the private mount namespace.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt.block_on(async { UnixListener::bind(&socket) }).unwrap();

    let (sys, proc) = (tmp.path().join("sys"), tmp.path().join("proc"));
    let mut agent = Agent::start(
        &[
            "--node-name".as_ref(),
            "node-0".as_ref(),
            "--nri-socket".as_ref(),
            socket.as_os_str(),
            "--trusted-namespaces".as_ref(),
            TRUSTED.as_ref(),
            "--dir".as_ref(),
            run.as_os_str(),
            "--listen".as_ref(),
            "127.0.0.1:0".as_ref(),
            "--profile-file".as_ref(),
            profile.as_os_str(),
            "--reload-interval".as_ref(),
            "0.1".as_ref(),
            "--sysfs".as_ref(),
            sys.as_os_str(),
            "--procfs".as_ref(),
            proc.as_os_str(),
        ],
        &run,
    );
    let health: SocketAddr = agent.wait_line("the health endpoint's address", |line| {
        if !line.contains("health endpoint listening") {
            return None;
        }
        let (_, rest) = line.split_once("addr=")?;
        rest.split_whitespace().next()?.parse().ok()
    });
    let nri = rt.block_on(NriRuntime::accept(&listener));

    // The first build reads the CPU list once; then the tree (gb300: 4 GPUs) is mounted.
    release(blocked_reader(&fifo), "0-1\n");
    wait_for("the mounted tree", || (gpu_count(&mnt) == 4).then_some(()));
    wait_for("readiness", || {
        http_get(health, "/readyz")
            .is_ok_and(|r| r.starts_with("HTTP/1.1 200"))
            .then_some(())
    });

    // A profile change starts a reload; it blocks reading the CPU list.
    write_profile(&profile, "base: gb300\ngpus: 2\n");
    let held = blocked_reader(&fifo);

    let adjust = rt.block_on(nri.create_gpu_container());
    let mounts: Vec<(&str, &str)> = adjust
        .mounts
        .iter()
        .map(|m| (m.source.as_str(), m.destination.as_str()))
        .collect();
    let run_dir = run.display().to_string();
    assert!(
        mounts.contains(&(run_dir.as_str(), "/run/mockgpu")),
        "{mounts:?}"
    );
    assert!(
        adjust
            .env
            .iter()
            .any(|kv| kv.key == "LD_PRELOAD" && kv.value == "/run/mockgpu/lib/libmockfs.so"),
        "{:?}",
        adjust.env
    );
    // The tree in service until the reload completes: the 4 GPUs of the first profile.
    let gpu_nodes: Vec<&str> = adjust
        .linux
        .devices
        .iter()
        .map(|d| d.path.as_str())
        .filter(|p| {
            p.strip_prefix("/dev/nvidia")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .collect();
    assert_eq!(
        gpu_nodes,
        [
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia2",
            "/dev/nvidia3"
        ]
    );
    assert_eq!(gpu_count(&mnt), 4, "the mount serves the first tree");
    let ready = http_get(health, "/readyz").expect("/readyz answers during the reload");
    assert!(ready.starts_with("HTTP/1.1 200"), "{ready}");
    let metrics = http_get(health, "/metrics").expect("/metrics answers during the reload");
    assert!(
        metrics.contains("mockgpu_profile_reloads_total 0"),
        "the reload had not completed yet: {metrics}"
    );

    // Unblocked, the reload completes: 2 GPUs.
    release(held, "0-1\n");
    // The topology is published last, after the tree is swapped and the reload counted.
    let metrics = wait_for("the reload", || {
        http_get(health, "/metrics")
            .ok()
            .filter(|m| m.contains("mockgpu_gpus 2"))
    });
    assert!(
        metrics.contains("mockgpu_profile_reloads_total 1"),
        "{metrics}"
    );
    assert_eq!(gpu_count(&mnt), 2);

    let status = agent.terminate();
    assert!(status.success(), "{status}");
    assert!(!mockgpu_agent::mounts::is_mount_point(&mnt));
    drop(nri);
}
