//! The plugin: connection lifecycle (register, Configure, Synchronize, events, reconnect) and the
//! thin ttrpc handlers over the functions of [`crate::policy`].

use std::{
    collections::HashMap,
    future::Future,
    os::fd::{FromRawFd, OwnedFd, RawFd},
    pin::Pin,
    sync::{Arc, Mutex, PoisonError, RwLock},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::{StreamExt, future, stream};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::UnixStream,
};
use tracing::{debug, info, instrument, warn};
use ttrpc::r#async::{
    Client, Server, TtrpcContext,
    transport::{Listener, Socket},
};

use crate::{
    config::{Config, InjectionConfig},
    error::{Error, Result},
    inventory::Inventory,
    mux::Trunk,
    pinning::{GpuRef, PinRecord, PinTable, PinningEvent, PinningSink, PodRef},
    policy::{self, Decision},
    proto::{
        api::{
            ConfigureRequest, ConfigureResponse, Container, CreateContainerRequest,
            CreateContainerResponse, Empty, Event, PodSandbox, RegisterPluginRequest,
            RemoveContainerRequest, RemoveContainerResponse, RemovePodSandboxRequest,
            RemovePodSandboxResponse, StateChangeEvent, StopContainerRequest,
            StopContainerResponse, SynchronizeRequest, SynchronizeResponse,
        },
        api_ttrpc::{self, RuntimeClient},
    },
    status::{EventKind, Outcome, PluginStatus},
};

/// Events the plugin subscribes to (bit `1 << (event - 1)`): CreateContainer, StopContainer,
/// RemoveContainer and RemovePodSandbox. Never 0, which would subscribe to everything.
pub const EVENT_MASK: i32 = mask(&[
    Event::CREATE_CONTAINER,
    Event::STOP_CONTAINER,
    Event::REMOVE_CONTAINER,
    Event::REMOVE_POD_SANDBOX,
]);

// The runtime rejects bits outside its valid events (0x3fff); 0 would mean "all events".
const _: () = assert!(EVENT_MASK != 0 && EVENT_MASK < 0x4000);

const fn mask(events: &[Event]) -> i32 {
    let mut bits = 0;
    let mut i = 0;
    while i < events.len() {
        bits |= 1 << (events[i] as i32 - 1);
        i += 1;
    }
    bits
}

/// How long the runtime may take to answer RegisterPlugin (NRI's default registration timeout).
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// First delay before reconnecting to the runtime.
pub const RECONNECT_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between reconnection attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);
/// Most pods and containers one (split) Synchronize may carry in all; a node runs at most a few
/// hundred pods, so this only stops a runtime that never sends the last part.
pub const MAX_SYNC_ITEMS: usize = 65_536;
/// Bound on tearing down the ttrpc server of a closed connection.
const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(2);

/// An NRI plugin instance. The agent creates one and calls [`run`](Self::run); the binary does
/// the same, or [`run_inherited`](Self::run_inherited) when launched by the runtime.
pub struct Plugin {
    shared: Arc<Shared>,
    socket: std::path::PathBuf,
}

struct Shared {
    /// The configuration the plugin was started with (the runtime's drop-in merges into it).
    config: Config,
    injection: RwLock<Arc<InjectionConfig>>,
    inventory: Arc<dyn Inventory>,
    pinning: Arc<dyn PinningSink>,
    pins: Mutex<PinTable>,
    pending_sync: Mutex<(Vec<PodSandbox>, Vec<Container>)>,
    status: PluginStatus,
}

/// How a connection ended.
enum End {
    Shutdown,
    Closed,
}

impl Plugin {
    /// A plugin with a validated `config`, GPUs from `inventory`, pinning events to `pinning`.
    pub fn new(
        config: Config,
        inventory: Arc<dyn Inventory>,
        pinning: Arc<dyn PinningSink>,
    ) -> Result<Self> {
        config.validate("the plugin configuration")?;
        Ok(Self {
            socket: config.socket.clone(),
            shared: Arc::new(Shared {
                injection: RwLock::new(Arc::new(config.injection.clone())),
                config,
                inventory,
                pinning,
                pins: Mutex::default(),
                pending_sync: Mutex::default(),
                status: PluginStatus::default(),
            }),
        })
    }

    /// Readiness and metrics handle (a [`Probe`](mockgpu_health::Probe); see
    /// [`PluginStatus::register`]).
    pub fn status(&self) -> PluginStatus {
        self.shared.status.clone()
    }

    /// External mode: connects to the configured socket, registers, serves events, and on any
    /// disconnect reconnects with capped exponential backoff, until `shutdown` completes.
    pub async fn run(&self, shutdown: impl Future<Output = ()>) -> Result<()> {
        tokio::pin!(shutdown);
        let mut backoff = RECONNECT_INITIAL;
        loop {
            let connect = UnixStream::connect(&self.socket);
            let connected = tokio::select! {
                () = &mut shutdown => return Ok(()),
                connected = connect => connected,
            };
            match connected {
                Ok(stream) => {
                    info!(socket = %self.socket.display(), "connected to the NRI runtime");
                    let before = self.shared.status.registrations();
                    match self.session(stream, &mut shutdown).await {
                        Ok(End::Shutdown) => return Ok(()),
                        Ok(End::Closed) => info!("runtime closed the NRI connection"),
                        Err(err) => warn!(%err, "NRI connection failed"),
                    }
                    if self.shared.status.registrations() > before {
                        backoff = RECONNECT_INITIAL;
                    }
                }
                Err(source) => {
                    let err = Error::Connect {
                        path: self.socket.clone(),
                        source,
                    };
                    if backoff == RECONNECT_INITIAL {
                        warn!(%err, "NRI runtime not reachable (is NRI enabled in the runtime, e.g. containerd's [plugins.\"io.containerd.nri.v1.nri\"] disable = false?); retrying");
                    } else {
                        debug!(%err, "NRI runtime still not reachable");
                    }
                }
            }
            debug!(?backoff, "reconnecting to the NRI runtime");
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(RECONNECT_MAX);
        }
    }

    /// Serves one already connected stream until the runtime closes it or `shutdown` completes.
    pub async fn run_connection<S>(
        &self,
        stream: S,
        shutdown: impl Future<Output = ()>,
    ) -> Result<()>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        tokio::pin!(shutdown);
        self.session(stream, &mut shutdown).await.map(|_| ())
    }

    /// Pre-installed mode: serves the socket the runtime passed as a descriptor
    /// (`NRI_PLUGIN_SOCKET`) until the runtime closes it or `shutdown` completes.
    pub async fn run_inherited(&self, fd: RawFd, shutdown: impl Future<Output = ()>) -> Result<()> {
        let inherited = |source| Error::Inherited { fd, source };
        let std_stream = std::os::unix::net::UnixStream::from(inherited_socket(fd)?);
        std_stream.set_nonblocking(true).map_err(inherited)?;
        let stream = UnixStream::from_std(std_stream).map_err(inherited)?;
        self.run_connection(stream, shutdown).await
    }

    async fn session<S, F>(&self, stream: S, shutdown: &mut Pin<&mut F>) -> Result<End>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
        F: Future<Output = ()>,
    {
        let (mut trunk, conns) = Trunk::start(stream);
        // A split Synchronize interrupted by a disconnect must not leak into the next one.
        *self
            .shared
            .pending_sync
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Default::default();
        self.shared.status.set_connected(true);
        // Serve the Plugin service before registering: Configure may arrive before the
        // RegisterPlugin reply. The listener never ends (an ended one breaks Server::shutdown).
        let listener =
            Listener::new(stream::once(future::ready(Ok(conns.plugin))).chain(stream::pending()));
        let service = api_ttrpc::create_plugin(Arc::new(Handlers(Arc::clone(&self.shared))));
        let mut server = Server::new()
            .add_listener(listener)
            .register_service(service);
        let result = match server.start().await {
            Ok(()) => {
                let client = RuntimeClient::new(Client::new(Socket::new(conns.runtime)));
                self.serve(&client, &mut trunk, shutdown).await
            }
            Err(source) => Err(Error::Ttrpc {
                context: "starting the Plugin service",
                source,
            }),
        };
        self.shared.status.set_connected(false);
        drop(trunk);
        if tokio::time::timeout(TEARDOWN_TIMEOUT, server.shutdown())
            .await
            .is_err()
        {
            warn!("ttrpc server did not stop within {TEARDOWN_TIMEOUT:?}");
        }
        result
    }

    async fn serve<F>(
        &self,
        client: &RuntimeClient,
        trunk: &mut Trunk,
        shutdown: &mut Pin<&mut F>,
    ) -> Result<End>
    where
        F: Future<Output = ()>,
    {
        let mut request = RegisterPluginRequest::new();
        request.plugin_name.clone_from(&self.shared.config.name);
        request.plugin_idx.clone_from(&self.shared.config.index);
        let ctx = ttrpc::context::with_timeout(REGISTRATION_TIMEOUT.as_nanos() as i64);
        tokio::select! {
            () = shutdown.as_mut() => return Ok(End::Shutdown),
            closed = trunk.closed() => return closed.map(|()| End::Closed).map_err(Error::from),
            reply = client.register_plugin(ctx, &request) => {
                reply.map_err(|source| Error::Ttrpc { context: "RegisterPlugin", source })?;
            }
        }
        self.shared.status.set_registered();
        info!(name = %self.shared.config.name, index = %self.shared.config.index, "registered with the NRI runtime");
        tokio::select! {
            () = shutdown.as_mut() => Ok(End::Shutdown),
            closed = trunk.closed() => closed.map(|()| End::Closed).map_err(Error::from),
        }
    }
}

impl Shared {
    fn injection(&self) -> Arc<InjectionConfig> {
        Arc::clone(
            &self
                .injection
                .read()
                .unwrap_or_else(PoisonError::into_inner),
        )
    }

    /// Changes the pin table and publishes the resulting events, in order, under its lock.
    fn update_pins(&self, change: impl FnOnce(&mut PinTable) -> Vec<PinningEvent>) {
        let mut table = self.pins.lock().unwrap_or_else(PoisonError::into_inner);
        for event in change(&mut table) {
            self.pinning.publish(event);
        }
        self.status.set_pinned(table.len());
    }

    fn configure(&self, req: &ConfigureRequest) -> Result<ConfigureResponse> {
        info!(
            runtime = %req.runtime_name,
            version = %req.runtime_version,
            registration_timeout_ms = req.registration_timeout,
            request_timeout_ms = req.request_timeout,
            "configured by the runtime"
        );
        if !req.config.trim().is_empty() {
            let origin = "the runtime's plugin configuration (ConfigureRequest.config)";
            let merged = self.config.merge_runtime(&req.config, origin)?;
            *self
                .injection
                .write()
                .unwrap_or_else(PoisonError::into_inner) = Arc::new(merged);
        }
        let mut response = ConfigureResponse::new();
        response.events = EVENT_MASK;
        Ok(response)
    }

    fn synchronize(&self, req: SynchronizeRequest) -> Result<SynchronizeResponse> {
        let mut response = SynchronizeResponse::new();
        let (pods, containers) = {
            let mut pending = self
                .pending_sync
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            pending.0.extend(req.pods);
            pending.1.extend(req.containers);
            let items = pending.0.len() + pending.1.len();
            if items > MAX_SYNC_ITEMS {
                *pending = Default::default();
                return Err(Error::Protocol(format!(
                    "Synchronize sent {items} pods and containers, more than the {MAX_SYNC_ITEMS} accepted"
                )));
            }
            if req.more {
                // Partial request: echo `more` and carry no updates.
                response.more = true;
                return Ok(response);
            }
            std::mem::take(&mut *pending)
        };
        let pods: HashMap<&str, &PodSandbox> = pods.iter().map(|p| (p.id.as_str(), p)).collect();
        let config = self.injection();
        let mut pins = Vec::new();
        for container in containers.iter().filter(|c| policy::is_live(c)) {
            let Some(pod) = pods.get(container.pod_sandbox_id.as_str()) else {
                continue;
            };
            match policy::decide(pod, container, &config, self.inventory.as_ref()) {
                Ok(Decision::Inject { gpus, .. }) => pins.push(pin(pod, container, &gpus)),
                Ok(Decision::Untouched) => {}
                Err(err) => {
                    warn!(container = %container.name, %err, "cannot tell the GPUs of an existing container")
                }
            }
        }
        info!(
            pods = pods.len(),
            containers = containers.len(),
            gpu_containers = pins.len(),
            "synchronized"
        );
        self.update_pins(|table| table.resync(pins));
        self.status.set_synchronized();
        Ok(response)
    }

    fn create_container(&self, req: &CreateContainerRequest) -> Result<CreateContainerResponse> {
        let started = Instant::now();
        let (pod, container) = (&*req.pod, &*req.container);
        let config = self.injection();
        let mut response = CreateContainerResponse::new();
        let decision = policy::decide(pod, container, &config, self.inventory.as_ref());
        match decision {
            Ok(Decision::Untouched) => self.status.untouched(started.elapsed()),
            Ok(Decision::Inject { adjustment, gpus }) => {
                response.adjust = Some(adjustment).into();
                self.update_pins(|table| {
                    table.pin(pin(pod, container, &gpus)).into_iter().collect()
                });
                self.status.outcome(Outcome::Injected, started.elapsed());
                info!(pod = %pod.name, container = %container.name, gpus = gpus.len(), "injected the mock");
            }
            Err(err) if config.fail_open => {
                self.status.outcome(Outcome::FailOpen, started.elapsed());
                warn!(pod = %pod.name, container = %container.name, %err, "fail_open: container created without the mock");
            }
            Err(err) => {
                self.status.outcome(Outcome::Refused, started.elapsed());
                warn!(pod = %pod.name, container = %container.name, %err, "refusing container");
                return Err(err.into());
            }
        }
        Ok(response)
    }

    fn unpin(&self, container: &Container) {
        self.update_pins(|table| table.unpin(&container.id).into_iter().collect());
    }

    fn unpin_pod(&self, pod: &PodSandbox) {
        self.update_pins(|table| table.unpin_pod(&pod.id));
    }

    fn state_change(&self, event: &StateChangeEvent) {
        match event.event.enum_value() {
            Ok(Event::STOP_CONTAINER | Event::REMOVE_CONTAINER) => self.unpin(&event.container),
            Ok(Event::REMOVE_POD_SANDBOX) => self.unpin_pod(&event.pod),
            other => debug!(event = ?other, "state change ignored"),
        }
    }
}

/// Takes ownership of descriptor `fd` after checking that it is an open Unix stream socket (the
/// runtime's end of the plugin connection), so that a wrong number never adopts another file.
pub fn inherited_socket(fd: RawFd) -> Result<OwnedFd> {
    let error = |source| Error::Inherited { fd, source };
    if fd < 0 {
        return Err(error(std::io::Error::from_raw_os_error(libc::EBADF)));
    }
    let sockopt = |name| {
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len point to valid storage of the sizes given.
        let rc = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        if rc == 0 {
            Ok(value)
        } else {
            Err(error(std::io::Error::last_os_error()))
        }
    };
    // ENOTSOCK for a descriptor that is not a socket, EBADF for one that is not open.
    let (domain, kind) = (sockopt(libc::SO_DOMAIN)?, sockopt(libc::SO_TYPE)?);
    if domain != libc::AF_UNIX || kind != libc::SOCK_STREAM {
        return Err(error(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a Unix stream socket (domain {domain}, type {kind})"),
        )));
    }
    // SAFETY: fd is open, and the runtime handed it to this process for the plugin alone.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn pin(pod: &PodSandbox, container: &Container, gpus: &[mockgpu_api::Gpu]) -> PinRecord {
    PinRecord {
        pod: PodRef {
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            uid: pod.uid.clone(),
        },
        pod_sandbox_id: container.pod_sandbox_id.clone(),
        container_name: container.name.clone(),
        container_id: container.id.clone(),
        gpus: gpus
            .iter()
            .map(|g| GpuRef {
                minor: g.minor,
                uuid: g.uuid.clone(),
            })
            .collect(),
    }
}

/// The ttrpc Plugin service: counts the event and calls [`Shared`]. Every subscribed event
/// (dedicated RPC and StateChange) is implemented: the generated defaults answer NOT_FOUND,
/// which would fail the runtime's operation.
struct Handlers(Arc<Shared>);

type RpcResult<T> = ttrpc::Result<T>;

#[async_trait]
impl api_ttrpc::Plugin for Handlers {
    #[instrument(skip_all)]
    async fn configure(
        &self,
        _: &TtrpcContext,
        req: ConfigureRequest,
    ) -> RpcResult<ConfigureResponse> {
        self.0.status.event(EventKind::Configure);
        Ok(self.0.configure(&req)?)
    }

    #[instrument(skip_all, fields(more = req.more))]
    async fn synchronize(
        &self,
        _: &TtrpcContext,
        req: SynchronizeRequest,
    ) -> RpcResult<SynchronizeResponse> {
        self.0.status.event(EventKind::Synchronize);
        Ok(self.0.synchronize(req)?)
    }

    async fn shutdown(&self, _: &TtrpcContext, _: Empty) -> RpcResult<Empty> {
        self.0.status.event(EventKind::Shutdown);
        info!("runtime requested shutdown");
        Ok(Empty::new())
    }

    #[instrument(skip_all, fields(container = %req.container.name))]
    async fn create_container(
        &self,
        _: &TtrpcContext,
        req: CreateContainerRequest,
    ) -> RpcResult<CreateContainerResponse> {
        self.0.status.event(EventKind::CreateContainer);
        Ok(self.0.create_container(&req)?)
    }

    async fn stop_container(
        &self,
        _: &TtrpcContext,
        req: StopContainerRequest,
    ) -> RpcResult<StopContainerResponse> {
        self.0.status.event(EventKind::StopContainer);
        self.0.unpin(&req.container);
        Ok(StopContainerResponse::new())
    }

    async fn remove_container(
        &self,
        _: &TtrpcContext,
        req: RemoveContainerRequest,
    ) -> RpcResult<RemoveContainerResponse> {
        self.0.status.event(EventKind::RemoveContainer);
        self.0.unpin(&req.container);
        Ok(RemoveContainerResponse::new())
    }

    async fn remove_pod_sandbox(
        &self,
        _: &TtrpcContext,
        req: RemovePodSandboxRequest,
    ) -> RpcResult<RemovePodSandboxResponse> {
        self.0.status.event(EventKind::RemovePodSandbox);
        self.0.unpin_pod(&req.pod);
        Ok(RemovePodSandboxResponse::new())
    }

    async fn state_change(&self, _: &TtrpcContext, req: StateChangeEvent) -> RpcResult<Empty> {
        self.0.status.event(EventKind::StateChange);
        self.0.state_change(&req);
        Ok(Empty::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unix_stream_sockets_are_inherited() {
        use std::os::fd::{AsRawFd, IntoRawFd};
        let err = |fd| inherited_socket(fd).unwrap_err().to_string();
        assert!(err(-1).contains("fd -1"), "{}", err(-1));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert!(
            err(file.as_raw_fd()).contains("non-socket"),
            "{}",
            err(file.as_raw_fd())
        );
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(err(udp.as_raw_fd()).contains("not a Unix stream socket"));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = inherited_socket(a.into_raw_fd()).unwrap();
        drop(fd);
    }

    #[test]
    fn a_synchronize_that_never_ends_is_bounded() {
        struct NoGpus;
        impl Inventory for NoGpus {
            fn snapshot(&self) -> Result<crate::GpuInventory, crate::NotReady> {
                Err(crate::NotReady("none".into()))
            }
        }
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let plugin = Plugin::new(Config::default(), Arc::new(NoGpus), Arc::new(tx)).unwrap();
        let part = |n: usize| {
            let mut req = SynchronizeRequest::new();
            req.containers = (0..n).map(|_| Container::new()).collect();
            req.more = true;
            req
        };
        let chunk = MAX_SYNC_ITEMS / 4;
        for _ in 0..4 {
            assert!(plugin.shared.synchronize(part(chunk)).unwrap().more);
        }
        let err = plugin.shared.synchronize(part(1)).unwrap_err().to_string();
        assert!(err.contains("more than the 65536 accepted"), "{err}");
        // The partial state was dropped: a fresh, complete Synchronize works again.
        let mut last = part(1);
        last.more = false;
        assert!(!plugin.shared.synchronize(last).unwrap().more);
        assert!(plugin.shared.pending_sync.lock().unwrap().1.is_empty());
    }

    #[test]
    fn event_mask_has_the_four_bits() {
        assert_eq!(EVENT_MASK, 0x8 | 0x200 | 0x400 | 0x4);
    }
}
