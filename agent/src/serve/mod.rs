//! `mockgpu-agent serve`: the DaemonSet process. Loads the profile ([`crate::profile`]), sets
//! the node up ([`crate::node`]), mounts the driver tree over FUSE, follows profile changes, runs
//! the NRI plugin and the kubelet device plugin in-process and answers health checks.

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use mockgpu_api::{DriverGpu, NodeTopology};
use mockgpu_health::{HealthServer, Probe, Registry};
use mockgpu_nri::{PinningEvent, Plugin};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::faults::FaultReport;
use crate::fuse::Mounted;
use crate::node::{self, SetupError};
use crate::profile::{self, LoadError};
use crate::tree::Tree;
use crate::{device_plugin, dra, real, report};
use follow::{Follower, reload_loop};
use metrics::AgentMetrics;

mod follow;
mod metrics;
mod state;

pub use state::ServeConfig;
use state::{AgentState, record_served};

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
    let topo = follower.topology().clone();
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
            self.spawn_kubelet_plugin(|topology, faults, stop| async move {
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
            self.spawn_kubelet_plugin(|topology, faults, stop| async move {
                let (credentials, node) = (r.credentials, r.node_name);
                let run = dra::run(config, credentials, node, topology, faults, prepared, stop);
                Ended::Dra(run.await)
            });
        }
        reporter
    }

    /// Spawns a kubelet plugin's task (the device plugin, the DRA driver) on what both follow:
    /// the topologies published, the faults and the stop. The task's end, by a panic too,
    /// cancels `kubelet_plugin_ended`.
    fn spawn_kubelet_plugin<F>(
        &mut self,
        task: impl FnOnce(
            watch::Receiver<Option<NodeTopology>>,
            watch::Receiver<FaultReport>,
            WaitForCancellationFutureOwned,
        ) -> F,
    ) where
        F: Future<Output = Ended> + Send + 'static,
    {
        let topology = self.state.published.subscribe();
        let faults = self.state.faults.subscribe();
        let run = task(topology, faults, self.stop.clone().cancelled_owned());
        let ended = self.kubelet_plugin_ended.clone().drop_guard();
        self.tasks.spawn(async move {
            let _ended = ended;
            run.await
        });
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
