//! A mock NRI runtime (the containerd side of the protocol, see docs/nri.md) plus fixtures.
//!
//! It serves the Runtime service on connection 2 and calls the Plugin service on connection 1,
//! sends Configure *before* answering RegisterPlugin, can split Synchronize with `more=true`,
//! bounds every call by the 2 s request timeout, and checks with its own frame parser that no
//! frame the plugin sends exceeds 4096 bytes.
#![allow(dead_code)] // each test binary uses a different part

use std::{
    io,
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex},
    task::{Context, Poll},
    time::Duration,
};

use async_trait::async_trait;
use futures::{StreamExt, future, stream};
use mockgpu_api::{DeviceNumbers, Gpu};
use mockgpu_nri::{
    Config, GpuInventory, Inventory, NotReady,
    mux::Trunk,
    proto::{
        api::{
            CDIDevice, ConfigureRequest, Container, ContainerState, CreateContainerRequest,
            CreateContainerResponse, Empty, Event, LinuxContainer, LinuxDevice, Mount, PodSandbox,
            RegisterPluginRequest, RemoveContainerRequest, RemovePodSandboxRequest,
            StateChangeEvent, StopContainerRequest, SynchronizeRequest,
        },
        api_ttrpc::{self, PluginClient},
    },
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
    time::timeout,
};
use ttrpc::r#async::{
    Client, Server, TtrpcContext,
    transport::{Listener, Socket},
};

/// NRI's default per-request timeout, enforced on every runtime→plugin call.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Bound for waits in tests that are not protocol calls.
pub const WAIT: Duration = Duration::from_secs(10);
/// Largest frame (header included) the Go runtime can read.
pub const GO_FRAME_LIMIT: usize = 4096;

/// Awaits `f` under [`WAIT`], panicking with `what` on timeout.
pub async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    timeout(WAIT, f)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Records the frames read from the plugin, parsed independently of the crate's multiplexer.
#[derive(Debug, Default)]
pub struct FrameLog {
    header: Vec<u8>,
    remaining: usize,
    /// Total sizes (header + payload) of all frames seen.
    pub sizes: Vec<usize>,
}

impl FrameLog {
    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = self.remaining.min(data.len());
                self.remaining -= n;
                data = &data[n..];
                continue;
            }
            let need = 8 - self.header.len();
            let n = need.min(data.len());
            self.header.extend_from_slice(&data[..n]);
            data = &data[n..];
            if self.header.len() == 8 {
                let len = u32::from_be_bytes(self.header[4..8].try_into().unwrap()) as usize;
                self.sizes.push(8 + len);
                self.remaining = len;
                self.header.clear();
            }
        }
    }
}

/// A trunk stream whose reads are also fed to a [`FrameLog`].
pub struct Inspected {
    inner: UnixStream,
    log: Arc<Mutex<FrameLog>>,
}

impl AsyncRead for Inspected {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = poll {
            self.log.lock().unwrap().feed(&buf.filled()[before..]);
        }
        poll
    }
}

impl AsyncWrite for Inspected {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How the mock runtime runs the handshake.
#[derive(Debug, Clone, Default)]
pub struct Handshake {
    /// `ConfigureRequest.config` (the pre-installed plugin's drop-in file).
    pub config: String,
    /// Pods and containers already present.
    pub pods: Vec<PodSandbox>,
    /// Containers already present.
    pub containers: Vec<Container>,
    /// Containers per Synchronize message (`None`: one message).
    pub split: Option<usize>,
}

struct RuntimeService {
    registered: mpsc::UnboundedSender<(RegisterPluginRequest, oneshot::Sender<()>)>,
}

#[async_trait]
impl api_ttrpc::Runtime for RuntimeService {
    async fn register_plugin(
        &self,
        _: &TtrpcContext,
        req: RegisterPluginRequest,
    ) -> ttrpc::Result<Empty> {
        // Like containerd: signal registration first, answer later (after Configure).
        let (answer, answered) = oneshot::channel();
        self.registered
            .send((req, answer))
            .map_err(|_| ttrpc::Error::Others("mock runtime gone".into()))?;
        let _ = answered.await;
        Ok(Empty::new())
    }
}

/// One connected, configured and synchronized plugin as seen by the mock runtime.
pub struct Connected {
    /// What the plugin registered as.
    pub registration: RegisterPluginRequest,
    /// Events mask from Configure.
    pub events: i32,
    /// Number of Synchronize calls made.
    pub sync_calls: usize,
    client: PluginClient,
    log: Arc<Mutex<FrameLog>>,
    server: Server,
    _trunk: Trunk,
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(REQUEST_TIMEOUT.as_nanos() as i64)
}

/// Bounds a plugin call by the request timeout, as the runtime does.
async fn call<T>(
    what: &str,
    f: impl std::future::Future<Output = ttrpc::Result<T>>,
) -> ttrpc::Result<T> {
    timeout(REQUEST_TIMEOUT, f).await.unwrap_or_else(|_| {
        panic!("{what} exceeded the runtime's {REQUEST_TIMEOUT:?} request timeout")
    })
}

impl Connected {
    /// Runs the runtime side of the handshake over `stream`.
    pub async fn handshake(stream: UnixStream, hs: &Handshake) -> Result<Connected, String> {
        let log = Arc::new(Mutex::new(FrameLog::default()));
        let (trunk, conns) = Trunk::start(Inspected {
            inner: stream,
            log: Arc::clone(&log),
        });
        let (reg_tx, mut reg_rx) = mpsc::unbounded_channel();
        let listener =
            Listener::new(stream::once(future::ready(Ok(conns.runtime))).chain(stream::pending()));
        let mut server =
            Server::new()
                .add_listener(listener)
                .register_service(api_ttrpc::create_runtime(Arc::new(RuntimeService {
                    registered: reg_tx,
                })));
        server.start().await.map_err(|e| e.to_string())?;
        let client = PluginClient::new(Client::new(Socket::new(conns.plugin)));
        let (registration, answer) = timeout(Duration::from_secs(5), reg_rx.recv())
            .await
            .map_err(|_| "plugin registration timed out".to_owned())?
            .ok_or("runtime service gone")?;
        let mut configure = ConfigureRequest::new();
        configure.config.clone_from(&hs.config);
        configure.runtime_name = "mock-runtime".into();
        configure.runtime_version = "1.7.24".into();
        configure.registration_timeout = 5000;
        configure.request_timeout = REQUEST_TIMEOUT.as_millis() as i64;
        // Configure goes out while RegisterPlugin is still unanswered.
        let reply = call("Configure", client.configure(ctx(), &configure))
            .await
            .map_err(|e| format!("Configure failed: {e}"))?;
        if reply.events == 0 || reply.events & !0x3fff != 0 {
            return Err(format!("invalid event mask {:#x}", reply.events));
        }
        let _ = answer.send(());
        let chunks: Vec<Vec<Container>> = match hs.split {
            Some(n) => hs.containers.chunks(n.max(1)).map(<[_]>::to_vec).collect(),
            None => vec![hs.containers.clone()],
        };
        let chunks = if chunks.is_empty() {
            vec![vec![]]
        } else {
            chunks
        };
        let last = chunks.len() - 1;
        for (i, containers) in chunks.into_iter().enumerate() {
            let mut sync = SynchronizeRequest::new();
            if i == 0 {
                sync.pods.clone_from(&hs.pods);
            }
            sync.containers = containers;
            sync.more = i != last;
            let reply = call("Synchronize", client.synchronize(ctx(), &sync))
                .await
                .map_err(|e| format!("Synchronize failed: {e}"))?;
            if reply.more != sync.more {
                return Err(format!(
                    "plugin does not handle split sync requests (more={})",
                    reply.more
                ));
            }
        }
        Ok(Connected {
            registration,
            events: reply.events,
            sync_calls: last + 1,
            client,
            log,
            server,
            _trunk: trunk,
        })
    }

    /// CreateContainer under the request timeout.
    pub async fn create(
        &self,
        pod: &PodSandbox,
        container: &Container,
    ) -> ttrpc::Result<CreateContainerResponse> {
        let mut req = CreateContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        call("CreateContainer", self.client.create_container(ctx(), &req)).await
    }

    /// StopContainer (dedicated RPC).
    pub async fn stop(&self, pod: &PodSandbox, container: &Container) {
        let mut req = StopContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        call("StopContainer", self.client.stop_container(ctx(), &req))
            .await
            .unwrap();
    }

    /// RemoveContainer (dedicated RPC, NRI ≥ 0.12).
    pub async fn remove(&self, pod: &PodSandbox, container: &Container) {
        let mut req = RemoveContainerRequest::new();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        call("RemoveContainer", self.client.remove_container(ctx(), &req))
            .await
            .unwrap();
    }

    /// RemovePodSandbox (dedicated RPC).
    pub async fn remove_pod(&self, pod: &PodSandbox) {
        let mut req = RemovePodSandboxRequest::new();
        req.pod = Some(pod.clone()).into();
        call(
            "RemovePodSandbox",
            self.client.remove_pod_sandbox(ctx(), &req),
        )
        .await
        .unwrap();
    }

    /// StateChange (how runtimes before NRI 0.12 deliver removals).
    pub async fn state_change(&self, event: Event, pod: &PodSandbox, container: &Container) {
        let mut req = StateChangeEvent::new();
        req.event = event.into();
        req.pod = Some(pod.clone()).into();
        req.container = Some(container.clone()).into();
        call("StateChange", self.client.state_change(ctx(), &req))
            .await
            .unwrap();
    }

    /// Sizes of all frames the plugin sent so far; panics if one exceeds the Go limit.
    pub fn assert_frames_fit(&self) -> Vec<usize> {
        let sizes = self.log.lock().unwrap().sizes.clone();
        assert!(!sizes.is_empty(), "no frames seen");
        if let Some(big) = sizes.iter().find(|s| **s > GO_FRAME_LIMIT) {
            panic!("plugin sent a {big}-byte frame; the Go runtime reads at most {GO_FRAME_LIMIT}");
        }
        sizes
    }

    /// Closes the connection like a runtime that goes away.
    pub async fn close(mut self) {
        let _ = timeout(WAIT, self.server.shutdown()).await;
    }
}

/// A listening mock runtime in a temporary directory (external plugin mode).
pub struct MockRuntime {
    listener: UnixListener,
}

impl MockRuntime {
    /// Listens on `path` (removing a stale socket first, like containerd).
    pub fn bind(path: &Path) -> MockRuntime {
        let _ = std::fs::remove_file(path);
        MockRuntime {
            listener: UnixListener::bind(path).unwrap(),
        }
    }

    /// Accepts the next plugin and runs the handshake.
    pub async fn accept(&self, hs: &Handshake) -> Connected {
        let (stream, _) = within("plugin connect", self.listener.accept())
            .await
            .unwrap();
        Connected::handshake(stream, hs).await.unwrap()
    }
}

/// The majors of a host that uses 384 and 385: uvm 386, caps 387, IMEX channels 388.
pub const NUMBERS: DeviceNumbers = DeviceNumbers {
    uvm: 386,
    caps: 387,
    imex_channels: 388,
};

/// The default configuration with the test pods' namespace (`slurm`) trusted, so that
/// `NVIDIA_VISIBLE_DEVICES` and the inject annotation count.
pub fn trusted_config() -> Config {
    let mut config = Config::default();
    config.injection.trusted_namespaces = vec!["slurm".into()];
    config
}

/// A fixed inventory of `n` GPUs (minor = index, UUID `GPU-<n>`) with [`NUMBERS`].
pub struct FixedInventory(pub Result<GpuInventory, NotReady>);

impl FixedInventory {
    /// `n` ready GPUs.
    pub fn gpus(n: u32) -> Arc<FixedInventory> {
        Arc::new(FixedInventory(Ok(GpuInventory {
            gpus: (0..n)
                .map(|i| Gpu {
                    index: i,
                    minor: i,
                    uuid: format!("GPU-{i:08x}-1111-2222-3333-444444444444"),
                    bus_id: format!("0000:{:02x}:00.0", i + 1).parse().unwrap(),
                    irq: 0,
                    socket: 0,
                    numa_node: -1,
                    cpus: Default::default(),
                })
                .collect(),
            devices: NUMBERS,
        })))
    }
}

impl Inventory for FixedInventory {
    fn snapshot(&self) -> Result<GpuInventory, NotReady> {
        self.0.clone()
    }
}

/// Writes a driver tree with `n` GPUs (minor = index, UUID `GPU-<n>`) under `<host>/fs`.
pub fn write_tree(host: &Path, n: u32) {
    for minor in 0..n {
        let bus = format!("0000:{:02x}:00.0", minor + 1);
        let gpu = host.join("fs/proc/driver/nvidia/gpus").join(&bus);
        std::fs::create_dir_all(&gpu).unwrap();
        std::fs::write(
            gpu.join("information"),
            format!("Model: \t\t NVIDIA GB300\nGPU UUID: \t GPU-{minor}\nBus Location: \t {bus}\nDevice Minor: \t {minor}\n"),
        )
        .unwrap();
    }
    let host_devices =
        mockgpu_api::ProcDevices::parse("Character devices:\n384 a\n385 b\n").unwrap();
    std::fs::write(
        host.join("fs/proc/devices"),
        NUMBERS.merge_into(&host_devices).render(),
    )
    .unwrap();
}

/// A pod in namespace `slurm`.
pub fn pod(id: &str, annotations: &[(&str, &str)]) -> PodSandbox {
    let mut p = PodSandbox::new();
    p.id = id.into();
    p.name = format!("pod-{id}");
    p.uid = format!("uid-{id}");
    p.namespace = "slurm".into();
    p.annotations = annotations
        .iter()
        .map(|(k, v)| ((*k).into(), (*v).into()))
        .collect();
    p
}

/// A container of `pod` with env entries, device paths and CDI device names.
pub fn container(
    pod: &PodSandbox,
    name: &str,
    env: &[&str],
    devices: &[&str],
    cdi: &[&str],
) -> Container {
    let mut c = Container::new();
    c.id = format!("{}-{name}", pod.id);
    c.pod_sandbox_id = pod.id.clone();
    c.name = name.into();
    c.state = ContainerState::CONTAINER_RUNNING.into();
    c.env = env.iter().map(|e| (*e).into()).collect();
    let mut linux = LinuxContainer::new();
    linux.devices = devices
        .iter()
        .map(|p| {
            let mut d = LinuxDevice::new();
            d.path = (*p).into();
            d.type_ = "c".into();
            d.major = if p.starts_with("/dev/nvidia") { 195 } else { 1 };
            d.minor = p.trim_start_matches("/dev/nvidia").parse().unwrap_or(3);
            d
        })
        .collect();
    c.linux = Some(linux).into();
    c.CDI_devices = cdi
        .iter()
        .map(|n| {
            let mut d = CDIDevice::new();
            d.name = (*n).into();
            d
        })
        .collect();
    c
}

/// A realistic container: 50 env entries, 20 mounts, 4 GPU devices.
pub fn realistic(pod: &PodSandbox, name: &str) -> Container {
    let env: Vec<String> = (0..49)
        .map(|i| format!("VAR_{i}=value-{i}-{}", "x".repeat(24)))
        .chain(["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into()])
        .collect();
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    let mut c = container(
        pod,
        name,
        &env,
        &[
            "/dev/nvidia0",
            "/dev/nvidia1",
            "/dev/nvidia2",
            "/dev/nvidia3",
        ],
        &[],
    );
    c.mounts = (0..20)
        .map(|i| {
            let mut m = Mount::new();
            m.destination = format!("/var/lib/data/{i}");
            m.source = format!("/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/v{i}");
            m.type_ = "bind".into();
            m.options = vec!["rbind".into(), "rprivate".into(), "rw".into()];
            m
        })
        .collect();
    c
}
