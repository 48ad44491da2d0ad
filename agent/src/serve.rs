//! `mockgpu-agent serve`: the DaemonSet process. Loads the profile ([`crate::profile`]), sets
//! the node up ([`crate::node`]), mounts the driver tree over FUSE, follows profile changes, runs
//! the NRI plugin and the kubelet device plugin in-process and answers health checks.

use std::fs;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, mpsc};
use std::time::{Duration, Instant};

use mockgpu_api::{DriverGpu, HostTopology, Layout, NodeTopology};
use mockgpu_health::{HealthServer, Probe, Registry};
use mockgpu_nri::{GpuInventory, Inventory, NotReady, PinningEvent, Plugin};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::{counter::ConstCounter, gauge::ConstGauge};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::CancellationToken;

use crate::faults::{self, Checked, ClusterFaults, FaultReport, Sourced, Verdicts};
use crate::fuse::{Mounted, TreeHandle};
use crate::node::{self, SetupError};
use crate::profile::{self, LoadError, ProfileSource};
use crate::tree::Tree;
use crate::{device_plugin, dra, real, report};

/// Errors of `serve`.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The profile could not be loaded, or its tree not built on this host.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The node could not be set up for serving.
    #[error(transparent)]
    Setup(#[from] SetupError),
    /// FUSE could not mount.
    #[error("cannot mount the driver tree at {path}: {source}")]
    Fuse {
        /// The mount point.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The health endpoint failed.
    #[error(transparent)]
    Health(#[from] mockgpu_health::HealthError),
    /// The NRI plugin failed.
    #[error(transparent)]
    Nri(#[from] mockgpu_nri::Error),
    /// The device plugin failed (its kubelet checkpoint unreadable, device nodes not made).
    #[error(transparent)]
    DevicePlugin(#[from] device_plugin::DevicePluginError),
    /// The DRA driver failed.
    #[error(transparent)]
    Dra(#[from] dra::DraError),
    /// A thread of the agent could not be started.
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        /// The thread's name.
        name: &'static str,
        /// Why.
        source: io::Error,
    },
    /// The keeper closed the connection (it died): the mount is dead until a new keeper mounts.
    #[error("the keeper at {socket} closed the FUSE connection; restart the agent to mount afresh")]
    KeeperLost {
        /// The keeper's socket.
        socket: PathBuf,
    },
}

/// Settings of `serve`.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// The profile.
    pub profile: ProfileSource,
    /// Node name (part of the GPUs' identity).
    pub node_name: String,
    /// sysfs of the host (`/sys`).
    pub sysfs: PathBuf,
    /// procfs of the host (`/proc`): its `devices` and a real driver.
    pub procfs: PathBuf,
    /// Where the tree, the shim and `ld.so.preload` go, and where containers see them.
    pub layout: Layout,
    /// Health endpoint address.
    pub listen: SocketAddr,
    /// How often the profile file is checked for changes.
    pub reload_interval: Duration,
    /// The in-process NRI plugin's settings, when enabled.
    pub nri: Option<mockgpu_nri::Config>,
    /// The kubelet device plugin's settings, when enabled.
    pub device_plugin: Option<device_plugin::Config>,
    /// The DRA driver's settings, when enabled (it needs `report`'s API server).
    pub dra: Option<dra::Config>,
    /// The GpuNode reporter's settings, when an API server is configured.
    pub report: Option<report::Config>,
    /// Serve through the keeper (started when none runs, with this data path), which holds the
    /// mount while agents restart; root only (otherwise, and with `None`, the agent mounts
    /// itself).
    pub keeper: Option<crate::keeper::DataPath>,
}

/// The agent's live state, shared by the reload loop, the NRI plugin and the health endpoint.
#[derive(Default)]
pub(crate) struct AgentState {
    topology: RwLock<Option<NodeTopology>>,
    mounted: std::sync::atomic::AtomicBool,
    reloads: AtomicU64,
    reload_errors: AtomicU64,
    real_gpus: AtomicU64,
    mount_ms: AtomicU64,
    handle: RwLock<Option<TreeHandle>>,
    /// Every topology put in place, for the device plugin.
    published: tokio::sync::watch::Sender<Option<NodeTopology>>,
    /// The faults applied, for the device plugin and the reporter.
    faults: watch::Sender<FaultReport>,
    /// Fault entries refused (invalid, or naming what the node lacks), counted at each change.
    fault_errors: AtomicU64,
    /// The GpuFault objects, as the watcher keeps them (empty without one).
    cluster: watch::Sender<ClusterFaults>,
    /// What the agent made of this node's GpuFault objects, for their status.
    verdicts: watch::Sender<Verdicts>,
}

impl AgentState {
    fn gpu_count(&self) -> usize {
        self.topology
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |t| t.gpus.len())
    }
}

impl Inventory for AgentState {
    fn snapshot(&self) -> Result<GpuInventory, NotReady> {
        if !self.mounted.load(Ordering::Acquire) {
            return Err(NotReady(
                "the agent has not mounted the driver tree yet".into(),
            ));
        }
        let topo = self.topology.read().unwrap_or_else(|e| e.into_inner());
        let topo = topo
            .as_ref()
            .ok_or_else(|| NotReady("no topology loaded".into()))?;
        Ok(GpuInventory {
            gpus: topo.gpus.clone(),
            devices: topo.devices,
        })
    }
}

impl Probe for AgentState {
    fn ready(&self) -> Result<(), String> {
        if self.real_gpus.load(Ordering::Relaxed) > 0 || self.mounted.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("driver tree not mounted".into())
        }
    }
}

/// The agent's `mockgpu_*` metrics, read from its state at each scrape.
struct AgentMetrics(Arc<AgentState>);

impl std::fmt::Debug for AgentMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AgentMetrics")
    }
}

impl Collector for AgentMetrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let state = &self.0;
        let relaxed = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let gauges = [
            ("mockgpu_gpus", "Mock GPUs served", state.gpu_count() as u64),
            (
                "mockgpu_real_gpus",
                "Real GPUs found (report-only mode)",
                relaxed(&state.real_gpus),
            ),
            (
                "mockgpu_mounted",
                "Whether the FUSE tree is mounted",
                u64::from(state.mounted.load(Ordering::Relaxed)),
            ),
            (
                "mockgpu_mount_duration_milliseconds",
                "Time from start to mounted",
                relaxed(&state.mount_ms),
            ),
            (
                "mockgpu_faults",
                "GPU faults applied (local and GpuFault objects)",
                state.faults.borrow().faults.len() as u64,
            ),
            (
                "mockgpu_unhealthy_gpus",
                "GPUs the faults leave unhealthy",
                u64::from(state.faults.borrow().unhealthy_gpus()),
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(value);
            gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)?;
        }
        let reads = state
            .handle
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, TreeHandle::reads);
        let counters = [
            (
                "mockgpu_profile_reloads",
                "Profile changes applied",
                relaxed(&state.reloads),
            ),
            (
                "mockgpu_profile_reload_errors",
                "Profile changes rejected",
                relaxed(&state.reload_errors),
            ),
            (
                "mockgpu_fault_errors",
                "GPU fault entries refused (invalid, or naming what the node lacks)",
                relaxed(&state.fault_errors),
            ),
            (
                "mockgpu_fuse_reads",
                "Reads that reached the agent (kernel cache misses)",
                reads,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            counter.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                counter.metric_type(),
            )?)?;
        }
        Ok(())
    }
}

/// Everything from loading the profile to a mounted, warmed tree: blocking work, run off the
/// async runtime.
fn prepare(
    cfg: &ServeConfig,
    state: &AgentState,
) -> Result<(NodeTopology, Follower, Mounted), ServeError> {
    let (profile, raw) = cfg.profile.load()?;
    let placed = profile::place(&profile, &cfg.node_name, &cfg.sysfs, &cfg.procfs)?;
    let mut follower = Follower::new(cfg, raw, placed);
    follower.read_local();
    let tree = follower.render(state);
    let topo = follower.placed.0.clone();
    let relay = node::set_up(&cfg.layout, cfg.keeper)?;
    let mountpoint = cfg.layout.mount_point();
    let mounted = match relay {
        Some(conn) => crate::fuse::serve_through_keeper(&tree, conn, &mountpoint, Some(&cfg.sysfs)),
        None => crate::fuse::mount(&tree, &mountpoint, Some(&cfg.sysfs)),
    }
    .map_err(|source| ServeError::Fuse {
        path: mountpoint.clone(),
        source,
    })?;
    if mounted.through_keeper() {
        take_over_caches(&mounted, &tree, &cfg.layout.served_paths());
    }
    let warmed = mounted.handle.warm(&tree, Path::new(crate::SELF_EXE));
    tracing::info!(
        profile = %profile.name, node = %topo.node_name, gpus = topo.gpus.len(),
        mountpoint = %mountpoint.display(), warmed, "driver tree mounted and cached"
    );
    Ok((topo, follower, mounted))
}

/// On a keeper's connection, an earlier agent may have served another tree, which the kernel
/// still caches (for a day): drops what `record` lists, then leaves word of `tree` there for
/// the next agent.
fn take_over_caches(mounted: &Mounted, tree: &Tree, record: &Path) {
    match crate::fuse::recorded_paths(record) {
        Ok(old) => {
            let forgotten = mounted.handle.forget(&old);
            tracing::info!(
                forgotten,
                "the kernel's caches of the tree served before dropped"
            );
        }
        Err(e) => {
            tracing::warn!(file = %record.display(), error = %e, "cannot read the paths served before; the kernel may keep some of them")
        }
    }
    record_served(tree, record);
}

/// Runs until `shutdown` completes, then unmounts. File, mount and FUSE work runs on other
/// threads than the async runtime's, so that NRI requests and health checks are answered while
/// the tree is built, mounted or reloaded.
pub async fn run(cfg: ServeConfig, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let mut agent = Agent::new(cfg);
    let real_gpus = real::detect(&agent.cfg.procfs, &agent.cfg.sysfs);
    let observed = agent.observe(real_gpus.is_none())?;
    agent
        .start_health(observed.probes, observed.registry)
        .await?;
    if let Some(gpus) = real_gpus {
        return agent.run_real_mode(gpus, shutdown).await;
    }
    let reporter = agent.start_tasks(observed.nri, observed.device_plugin_metrics);
    let (mounted, follower) = agent.mount_and_publish().await?;
    let reloader = agent.start_reload(&mounted, follower)?;
    let end = agent.wait_for_end(shutdown, &mounted).await;
    agent.shut_down(end, reporter, reloader, mounted).await
}

/// What the steps of [`run`] share.
struct Agent {
    cfg: ServeConfig,
    started: Instant,
    state: Arc<AgentState>,
    /// Cancelled to stop every task.
    stop: CancellationToken,
    /// The tasks waited for when stopping.
    tasks: JoinSet<Ended>,
    /// Cancelled when the device plugin's or the DRA driver's task ends (never without one).
    kubelet_plugin_ended: CancellationToken,
}

/// How a task of [`Agent::tasks`] ended.
enum Ended {
    Health,
    GpuFaults,
    Nri(Result<(), mockgpu_nri::Error>),
    DevicePlugin(Result<(), device_plugin::DevicePluginError>),
    Dra(Result<(), dra::DraError>),
}

/// Why the agent stops.
enum End {
    Shutdown,
    KubeletPluginEnded,
    KeeperLost,
}

/// What the health endpoint answers from, and the NRI plugin made for it.
struct Observed {
    probes: Vec<Arc<dyn Probe>>,
    registry: Registry,
    /// The NRI plugin and the receiver of its pinning events.
    nri: Option<(Plugin, UnboundedReceiver<PinningEvent>)>,
    device_plugin_metrics: device_plugin::Metrics,
}

/// The reload thread and the sender whose drop stops it.
struct Reloader {
    stop: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Agent {
    fn new(cfg: ServeConfig) -> Self {
        Self {
            cfg,
            started: Instant::now(),
            state: Arc::new(AgentState::default()),
            stop: CancellationToken::new(),
            tasks: JoinSet::new(),
            kubelet_plugin_ended: CancellationToken::new(),
        }
    }

    /// The agent's probe and metrics, those of the NRI plugin (made here; only in `mock` mode)
    /// and of the device plugin.
    fn observe(&self, mock: bool) -> Result<Observed, ServeError> {
        let mut probes: Vec<Arc<dyn Probe>> = vec![self.state.clone()];
        let mut registry = Registry::default();
        registry.register_collector(Box::new(AgentMetrics(self.state.clone())));
        let mut nri = None;
        if let Some(config) = self.cfg.nri.clone().filter(|_| mock) {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PinningEvent>();
            let plugin = Plugin::new(config, self.state.clone(), Arc::new(tx))?;
            probes.push(Arc::new(plugin.status()));
            plugin.status().register(&mut registry);
            nri = Some((plugin, rx));
        }
        let device_plugin_metrics = device_plugin::Metrics::default();
        if self.cfg.device_plugin.is_some() {
            device_plugin_metrics.register(&mut registry);
        }
        Ok(Observed {
            probes,
            registry,
            nri,
            device_plugin_metrics,
        })
    }

    /// Binds the health endpoint and serves it until stopped.
    async fn start_health(
        &mut self,
        probes: Vec<Arc<dyn Probe>>,
        registry: Registry,
    ) -> Result<(), ServeError> {
        let health = HealthServer::bind(self.cfg.listen).await?;
        if let Ok(addr) = health.local_addr() {
            tracing::info!(%addr, "health endpoint listening");
        }
        let stop = self.stop.clone().cancelled_owned();
        self.tasks.spawn(async move {
            health.serve(probes, registry, stop).await;
            Ended::Health
        });
        Ok(())
    }

    /// On a node with a real driver: mocks nothing, reports the real GPUs until `shutdown`.
    async fn run_real_mode(
        mut self,
        gpus: Vec<DriverGpu>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        self.state
            .real_gpus
            .store(gpus.len() as u64, Ordering::Relaxed);
        let reporter = self.cfg.report.clone().map(|r| {
            let served = watch::channel(Some(report::RealGpus(gpus.clone()))).1;
            let stop = self.stop.clone().cancelled_owned();
            report::start(r, served, (None, None, None), None, stop)
        });
        for g in &gpus {
            tracing::info!(bus_id = %g.gpu.bus_id, model = %g.information.model, uuid = %g.gpu.uuid, minor = g.gpu.minor, cpus = %g.gpu.cpus.to_list(), "real GPU");
        }
        tracing::info!(
            count = gpus.len(),
            "real NVIDIA driver found: mocking nothing, reporting only"
        );
        if self.cfg.device_plugin.is_some() || self.cfg.dra.is_some() {
            tracing::warn!("device plugin and DRA driver not started: this node has real GPUs");
        }
        shutdown.await;
        self.stop.cancel();
        if let Some(r) = reporter {
            let _ = r.await;
        }
        self.join_tasks().await
    }

    /// Starts the reporter (returned, to be stopped first), the NRI plugin and the device
    /// plugin.
    fn start_tasks(
        &mut self,
        nri: Option<(Plugin, UnboundedReceiver<PinningEvent>)>,
        device_plugin_metrics: device_plugin::Metrics,
    ) -> Option<JoinHandle<()>> {
        // The reporter follows the published topology and the pinning events the log passes on
        // (the forwarder ends when the plugin drops its sender; it is not waited for).
        let (report_tx, report_rx) = tokio::sync::mpsc::unbounded_channel::<PinningEvent>();
        let plugin = nri.map(|(plugin, mut rx)| {
            tokio::spawn(async move {
                while let Some(event) = rx.recv().await {
                    log_pinning(&event);
                    let _ = report_tx.send(event);
                }
            });
            plugin
        });
        // The DRA driver's prepared claims (kept across restarts), for it and the reporter.
        let prepared = self
            .cfg
            .dra
            .as_ref()
            .map(|c| Arc::new(dra::Prepared::load(&c.checkpoint())));
        // The device plugin tells the reporter whether it serves or stands down for another
        // plugin.
        let (standing_tx, standing_rx) = watch::channel(device_plugin::Standing::default());
        let reporter = self.cfg.report.clone().map(|r| {
            let served = self.state.published.subscribe();
            let standing = self.cfg.device_plugin.is_some().then_some(standing_rx);
            let stop = self.stop.clone().cancelled_owned();
            let faults = Some(self.state.faults.subscribe());
            let claims = prepared.as_ref().map(|p| p.subscribe());
            report::start(r, served, (Some(report_rx), faults, claims), standing, stop)
        });
        // With an API server, the GpuFaults naming this node are applied with the local faults.
        if let Some(r) = self.cfg.report.clone() {
            let (cluster, verdicts) = (self.state.cluster.clone(), self.state.verdicts.subscribe());
            let stop = self.stop.clone().cancelled_owned();
            self.tasks.spawn(async move {
                crate::gpufaults::run(r.credentials, r.node_name, cluster, verdicts, stop).await;
                Ended::GpuFaults
            });
        }
        // The plugin connects at once: until the tree is mounted it refuses GPU containers with
        // a message (or lets them through without the mock, with fail_open).
        if let Some(plugin) = plugin {
            let stop = self.stop.clone().cancelled_owned();
            self.tasks
                .spawn(async move { Ended::Nri(plugin.run(stop).await) });
        }
        // The device plugin waits for the first topology, then registers with the kubelet.
        if let Some(config) = self.cfg.device_plugin.clone() {
            let topology = self.state.published.subscribe();
            let faults = self.state.faults.subscribe();
            let stop = self.stop.clone().cancelled_owned();
            // cancels `kubelet_plugin_ended` when the task ends, by a panic too
            let ended = self.kubelet_plugin_ended.clone().drop_guard();
            self.tasks.spawn(async move {
                let _ended = ended;
                let (sys, metrics) = (crate::sys::Linux, device_plugin_metrics);
                let run =
                    device_plugin::run(config, sys, topology, faults, metrics, standing_tx, stop);
                Ended::DevicePlugin(run.await)
            });
        }
        // The DRA driver publishes the slices at once and prepares claims once the tree is up.
        if let (Some(config), Some(r), Some(prepared)) =
            (self.cfg.dra.clone(), self.cfg.report.clone(), prepared)
        {
            let topology = self.state.published.subscribe();
            let faults = self.state.faults.subscribe();
            let stop = self.stop.clone().cancelled_owned();
            let ended = self.kubelet_plugin_ended.clone().drop_guard();
            self.tasks.spawn(async move {
                let _ended = ended;
                let run = dra::run(
                    config,
                    r.credentials,
                    r.node_name,
                    topology,
                    faults,
                    prepared,
                    stop,
                );
                Ended::Dra(run.await)
            });
        }
        reporter
    }

    /// Loads, builds and mounts the tree (off the runtime), then publishes its topology to the
    /// NRI plugin, the device plugin, the reporter and the health endpoint. Also returns what
    /// the reload loop follows from.
    async fn mount_and_publish(&self) -> Result<(Mounted, Follower), ServeError> {
        let (cfg, state) = (self.cfg.clone(), self.state.clone());
        let (topo, follower, mounted) = tokio::task::spawn_blocking(move || prepare(&cfg, &state))
            .await
            .expect("the preparation thread does not panic")?;
        let state = &self.state;
        let mount_ms = self.started.elapsed().as_millis() as u64;
        state.mount_ms.store(mount_ms, Ordering::Relaxed);
        *state.handle.write().unwrap_or_else(|e| e.into_inner()) = Some(mounted.handle.clone());
        state.published.send_replace(Some(topo.clone()));
        *state.topology.write().unwrap_or_else(|e| e.into_inner()) = Some(topo);
        state.mounted.store(true, Ordering::Release);
        tracing::info!(mount_ms, "ready");
        Ok((mounted, follower))
    }

    /// Starts the thread of [`reload_loop`], from what `follower` served first.
    fn start_reload(&self, mounted: &Mounted, follower: Follower) -> Result<Reloader, ServeError> {
        let (stop, stopped) = mpsc::channel::<()>();
        let (state, cfg, handle) = (self.state.clone(), self.cfg.clone(), mounted.handle.clone());
        let record = mounted.through_keeper().then(|| cfg.layout.served_paths());
        let thread = std::thread::Builder::new()
            .name("reload".into())
            .spawn(move || {
                reload_loop(&state, &cfg, &handle, record.as_deref(), follower, &stopped);
            })
            .map_err(|source| ServeError::Thread {
                name: "reload",
                source,
            })?;
        Ok(Reloader { stop, thread })
    }

    /// Waits for `shutdown`, the device plugin's end or the keeper's.
    async fn wait_for_end(&self, shutdown: impl Future<Output = ()>, mounted: &Mounted) -> End {
        // The keeper dying ends the connection and the agent with it: a successor mounts afresh.
        let keeper_gone = async {
            if !mounted.through_keeper() {
                return std::future::pending().await;
            }
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            while mounted.serving() {
                tick.tick().await;
            }
        };
        tokio::select! {
            () = shutdown => End::Shutdown,
            // A device plugin that fails (an unreadable kubelet checkpoint, device nodes it
            // cannot make) ends the agent; one that stands down for another plugin does not.
            () = self.kubelet_plugin_ended.cancelled() => End::KubeletPluginEnded,
            () = keeper_gone => End::KeeperLost,
        }
    }

    /// Stops in order: the reporter sends its last report; the reload thread is told to stop;
    /// the device plugin (which removes its device nodes while its socket still answers), the
    /// NRI plugin and the health endpoint end; the reload thread is joined and the tree
    /// unmounted (or left to the keeper). Then the keeper's loss, else the device plugin's
    /// error.
    async fn shut_down(
        mut self,
        end: End,
        reporter: Option<JoinHandle<()>>,
        reloader: Reloader,
        mounted: Mounted,
    ) -> Result<(), ServeError> {
        tracing::info!("shutting down");
        self.stop.cancel();
        if let Some(r) = reporter {
            let _ = r.await;
        }
        drop(reloader.stop);
        let device_plugin = self.join_tasks().await;
        self.state.mounted.store(false, Ordering::Release);
        let relayed = mounted.through_keeper();
        unmount(self.cfg.layout.mount_point(), reloader.thread, mounted).await?;
        if let End::KeeperLost = end {
            return Err(ServeError::KeeperLost {
                socket: self.cfg.layout.keeper_socket(),
            });
        }
        if relayed {
            tracing::info!("driver tree left to the keeper");
        } else {
            tracing::info!("driver tree unmounted");
        }
        device_plugin
    }

    /// Waits for every task (each ends once stopped); the device plugin's error, if it had one.
    async fn join_tasks(&mut self) -> Result<(), ServeError> {
        let mut device_plugin = Ok(());
        while let Some(ended) = self.tasks.join_next().await {
            match ended {
                Ok(Ended::Nri(Err(e))) => {
                    tracing::warn!(error = %e, "NRI plugin ended with an error");
                }
                Ok(Ended::DevicePlugin(Err(e))) => device_plugin = Err(e.into()),
                Ok(Ended::Dra(Err(e))) => device_plugin = Err(e.into()),
                _ => {}
            }
        }
        device_plugin
    }
}

/// Joins the reload thread, then unmounts the tree at `mountpoint` (off the runtime).
async fn unmount(
    mountpoint: PathBuf,
    reload: std::thread::JoinHandle<()>,
    mounted: Mounted,
) -> Result<(), ServeError> {
    tokio::task::spawn_blocking(move || {
        let _ = reload.join();
        mounted.unmount()
    })
    .await
    .expect("the unmount thread does not panic")
    .map_err(|source| ServeError::Fuse {
        path: mountpoint,
        source,
    })
}

/// Leaves the paths of `tree` in `record` for the next agent on the keeper's connection.
fn record_served(tree: &Tree, record: &Path) {
    if let Err(e) = crate::fuse::record_paths(tree, record) {
        tracing::warn!(file = %record.display(), error = %e, "cannot record the paths served; the next agent may see stale ones");
    }
}

/// Every `reload_interval` until `stop` is dropped: rebuilds the tree when the profile file or
/// the host's `/proc/devices` changed (a module loaded since may have taken a major the mock
/// chose), or the faults did (the local fault file, the GpuFault objects, one of them expiring),
/// and swaps it in place. A rejected profile keeps the previous one; a fault that does not fit
/// the node is logged and skipped. `record` as [`record_served`] (relayed connections only).
fn reload_loop(
    state: &AgentState,
    cfg: &ServeConfig,
    handle: &TreeHandle,
    record: Option<&Path>,
    mut follower: Follower,
    stop: &mpsc::Receiver<()>,
) {
    while let Err(mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(cfg.reload_interval) {
        let Some(profile_changed) = follower.poll_profile(state) else {
            continue;
        };
        follower.read_local();
        if !profile_changed && !follower.faults_changed(state) {
            continue;
        }
        let tree = follower.render(state);
        let changed = handle.replace(&tree);
        if let Some(record) = record {
            record_served(&tree, record);
        }
        handle.warm(&tree, Path::new(crate::SELF_EXE));
        let topo = follower.placed.0.clone();
        let mut current = state.topology.write().unwrap_or_else(|e| e.into_inner());
        if current.as_ref() != Some(&topo) {
            if current.as_ref().is_some_and(|t| t.devices != topo.devices) {
                tracing::warn!(devices = ?topo.devices, "the host's /proc/devices changed: device majors chosen anew");
            }
            tracing::info!(profile = %topo.profile.name, gpus = topo.gpus.len(), changed, "tree updated");
            state.published.send_replace(Some(topo.clone()));
            *current = Some(topo);
        } else {
            tracing::info!(changed, "tree updated for the faults");
        }
    }
}

/// What the reload loop follows: the profile and the host's device numbers, the local fault
/// file and the GpuFault objects, with what it served last.
pub(crate) struct Follower {
    profile: ProfileSource,
    node_name: String,
    sysfs: PathBuf,
    procfs: PathBuf,
    faults_file: PathBuf,
    /// The profile's bytes and `/proc/devices` last seen.
    raw: Vec<u8>,
    devices: Vec<u8>,
    /// The GPUs placed on the host by the last profile accepted.
    placed: (NodeTopology, HostTopology),
    /// The fault file's bytes last read (`None` before the first read), and its faults.
    local_raw: Option<Vec<u8>>,
    local: Vec<Sourced>,
    /// The last error reading the fault file (logged once).
    local_error: Option<String>,
    /// The faults last applied or refused, and the GpuFault objects expired then.
    candidates: Vec<Sourced>,
    expired: std::collections::BTreeMap<String, String>,
}

impl Follower {
    fn new(cfg: &ServeConfig, raw: Vec<u8>, placed: (NodeTopology, HostTopology)) -> Follower {
        Follower {
            profile: cfg.profile.clone(),
            node_name: cfg.node_name.clone(),
            sysfs: cfg.sysfs.clone(),
            procfs: cfg.procfs.clone(),
            faults_file: cfg.layout.faults_file(),
            devices: fs::read(cfg.procfs.join("devices")).unwrap_or_default(),
            raw,
            placed,
            local_raw: None,
            local: Vec::new(),
            local_error: None,
            candidates: Vec::new(),
            expired: std::collections::BTreeMap::new(),
        }
    }

    /// Reads the profile and `/proc/devices`; on a change, places the GPUs anew. Whether the
    /// placement changed; `None` when the profile cannot be read.
    fn poll_profile(&mut self, state: &AgentState) -> Option<bool> {
        let profile_now = match self.profile.read() {
            Ok(now) => now,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read profile file");
                return None;
            }
        };
        let devices_now = fs::read(self.procfs.join("devices")).unwrap_or_default();
        if profile_now == self.raw && devices_now == self.devices {
            return Some(false);
        }
        let placed = self
            .profile
            .parse(&profile_now)
            .and_then(|p| profile::place(&p, &self.node_name, &self.sysfs, &self.procfs));
        self.raw = profile_now;
        self.devices = devices_now;
        match placed {
            Ok(placed) => {
                self.placed = placed;
                state.reloads.fetch_add(1, Ordering::Relaxed);
                Some(true)
            }
            Err(e) => {
                state.reload_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(error = %e, "profile change rejected; still serving the previous tree");
                Some(false)
            }
        }
    }

    /// Reads the local fault file; when its bytes changed, takes its faults (an entry that is
    /// not a fault is logged and skipped; a file that is no fault file at all is logged, and
    /// the faults read before stay).
    fn read_local(&mut self) {
        let raw = match faults::read_raw(&self.faults_file) {
            Ok(raw) => raw,
            Err(e) => {
                let e = e.to_string();
                if self.local_error.as_ref() != Some(&e) {
                    tracing::warn!(error = %e, "cannot read the local faults; keeping those read before");
                    self.local_error = Some(e);
                }
                return;
            }
        };
        self.local_error = None;
        if self.local_raw.as_ref() == Some(&raw) {
            return;
        }
        match faults::parse_lenient(&raw) {
            Ok((local, errors)) => {
                for error in errors {
                    tracing::warn!(file = %self.faults_file.display(), %error, "local fault skipped");
                }
                self.local = local;
            }
            Err(e) => {
                tracing::warn!(file = %self.faults_file.display(), error = %e, "the fault file is invalid; keeping the faults read before");
            }
        }
        self.local_raw = Some(raw);
    }

    /// The local faults, then those of the GpuFault objects naming this node that have not
    /// expired, and the objects that have.
    fn gather(
        &self,
        state: &AgentState,
    ) -> (Vec<Sourced>, std::collections::BTreeMap<String, String>) {
        let now = k8s_openapi::jiff::Timestamp::now();
        let (cluster, expired) =
            faults::cluster_candidates(&state.cluster.borrow(), &self.node_name, now);
        let mut candidates = self.local.clone();
        candidates.extend(cluster);
        (candidates, expired)
    }

    /// Whether the faults differ from those last rendered.
    fn faults_changed(&self, state: &AgentState) -> bool {
        let (candidates, expired) = self.gather(state);
        candidates != self.candidates || expired != self.expired
    }

    /// Checks the faults against the GPUs placed, publishes them (and the GpuFault objects'
    /// verdicts) and renders the tree they leave.
    fn render(&mut self, state: &AgentState) -> crate::tree::Tree {
        let (candidates, expired) = self.gather(state);
        let (topo, host) = &self.placed;
        let checked = Checked::of(topo, &candidates);
        for (source, error) in &checked.refused {
            tracing::warn!(%source, %error, "GPU fault skipped: it does not fit this node");
        }
        state
            .fault_errors
            .fetch_add(checked.refused.len() as u64, Ordering::Relaxed);
        let applied = checked.faults();
        if !candidates.is_empty() || !self.candidates.is_empty() {
            tracing::info!(
                faults = applied.len(),
                refused = checked.refused.len(),
                "GPU faults applied"
            );
        }
        let tree = crate::render::driver_tree_with(topo, host, &applied);
        state.faults.send_if_modified(|current| {
            let report = checked.report(topo);
            let changed = *current != report;
            *current = report;
            changed
        });
        let verdicts = faults::verdicts(&state.cluster.borrow(), &checked, &expired);
        state.verdicts.send_if_modified(|current| {
            let changed = *current != verdicts;
            *current = verdicts;
            changed
        });
        self.candidates = candidates;
        self.expired = expired;
        tree
    }
}

/// Logs a pinning event (the pinned-container gauge, `mockgpu_nri_pinned_containers`, follows the
/// plugin's pin table).
fn log_pinning(event: &PinningEvent) {
    match event {
        PinningEvent::Pinned {
            pod,
            container_name,
            gpus,
            ..
        } => {
            let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %container_name, ?minors, "container pinned to GPUs");
        }
        PinningEvent::Unpinned {
            pod,
            container_name,
            ..
        } => {
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %container_name, "container unpinned");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_metrics_are_named_and_counted() {
        let state = Arc::new(AgentState::default());
        state.reloads.store(2, Ordering::Relaxed);
        state.reload_errors.store(1, Ordering::Relaxed);
        state.mount_ms.store(42, Ordering::Relaxed);
        state.mounted.store(true, Ordering::Release);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(AgentMetrics(state)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in [
            "# TYPE mockgpu_gpus gauge",
            "mockgpu_gpus 0",
            "mockgpu_real_gpus 0",
            "mockgpu_mounted 1",
            "mockgpu_mount_duration_milliseconds 42",
            "# TYPE mockgpu_profile_reloads counter",
            "mockgpu_profile_reloads_total 2",
            "mockgpu_profile_reload_errors_total 1",
            "mockgpu_fuse_reads_total 0",
        ] {
            assert!(out.lines().any(|l| l == line), "{line:?} missing in\n{out}");
        }
        assert!(out.ends_with("\n# EOF\n"), "{out}");
    }

    #[test]
    fn agent_is_ready_once_mounted_or_on_a_real_gpu_node() {
        let state = AgentState::default();
        assert_eq!(state.ready(), Err("driver tree not mounted".into()));
        state.mounted.store(true, Ordering::Release);
        assert_eq!(state.ready(), Ok(()));
        let real = AgentState::default();
        real.real_gpus.store(8, Ordering::Relaxed);
        assert_eq!(real.ready(), Ok(()));
    }
}
