//! `mockgpu-agent serve`: the DaemonSet process. Mounts the driver tree over FUSE, installs the
//! shim, follows profile changes, runs the NRI plugin in-process and answers health checks.

use std::fmt::Write as _;
use std::fs;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use mockgpu_api::{NodeTopology, Profile, ProfileError, TopologyError};
use mockgpu_nri::health::{HealthServer, Probe};
use mockgpu_nri::{GpuInventory, Inventory, NotReady, PinningEvent, Plugin};

use crate::fs::{Mounted, TreeHandle};
use crate::host::{HostError, SysfsHost};
use crate::tree::Tree;
use crate::{mounts, real, render, shim};

/// Where the profile comes from.
#[derive(Debug, Clone)]
pub enum ProfileSource {
    /// A built-in profile by name.
    Builtin(String),
    /// A YAML file, re-read when it changes (a ConfigMap's symlink swap included).
    File(PathBuf),
}

/// Errors of `serve` and of loading what it serves.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The profile file could not be read.
    #[error("cannot read profile file {path}: {source}")]
    ReadProfile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The profile is invalid.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The GPUs do not fit this host.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The host could not be read.
    #[error(transparent)]
    Host(#[from] HostError),
    /// A mount chore failed.
    #[error(transparent)]
    Mount(#[from] mounts::MountError),
    /// A file of the installation could not be written.
    #[error("cannot install {path}: {source}")]
    Install {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
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
    Health(#[from] mockgpu_nri::health::HealthError),
    /// The NRI plugin failed.
    #[error(transparent)]
    Nri(#[from] mockgpu_nri::Error),
}

impl ProfileSource {
    /// Loads and validates the profile; also returns the raw bytes it came from.
    pub fn load(&self) -> Result<(Profile, Vec<u8>), ServeError> {
        match self {
            ProfileSource::Builtin(name) => Ok((Profile::builtin(name)?, name.as_bytes().to_vec())),
            ProfileSource::File(path) => {
                let raw = fs::read(path).map_err(|source| ServeError::ReadProfile {
                    path: path.clone(),
                    source,
                })?;
                Ok((parse_profile_file(path, &raw)?, raw))
            }
        }
    }
}

fn parse_profile_file(path: &Path, raw: &[u8]) -> Result<Profile, ProfileError> {
    Profile::from_yaml(&String::from_utf8_lossy(raw), &path.display().to_string())
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
    /// procfs of the host (`/proc`), checked for a real driver.
    pub procfs: PathBuf,
    /// FUSE mount point; its parent becomes a shared mount holding `lib/` and `ld.so.preload`.
    pub mountpoint: PathBuf,
    /// Where containers see the mount point's parent (`/run/mockgpu`).
    pub container_dir: PathBuf,
    /// Health endpoint address.
    pub listen: SocketAddr,
    /// How often the profile file is checked for changes.
    pub reload_interval: Duration,
    /// The in-process NRI plugin's settings, when enabled.
    pub nri: Option<mockgpu_nri::Config>,
}

/// The agent's live state, shared by the reload loop, the NRI plugin and the health endpoint.
#[derive(Default)]
pub struct AgentState {
    topology: RwLock<Option<NodeTopology>>,
    mounted: std::sync::atomic::AtomicBool,
    reloads: AtomicU64,
    reload_errors: AtomicU64,
    pinned: AtomicU64,
    real_gpus: AtomicU64,
    mount_ms: AtomicU64,
    handle: RwLock<Option<TreeHandle>>,
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
            gpus: topo
                .gpus
                .iter()
                .map(|g| mockgpu_nri::Gpu {
                    index: g.index,
                    minor: g.minor,
                    uuid: g.uuid.clone(),
                    bus_id: g.bus_id.to_string(),
                })
                .collect(),
            uvm_major: render::UVM_MAJOR,
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

    fn metrics(&self, out: &mut String) {
        let reads = self
            .handle
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, TreeHandle::reads);
        let relaxed = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let metrics = [
            (
                "mockgpu_gpus",
                "gauge",
                "Mock GPUs served",
                self.gpu_count() as u64,
            ),
            (
                "mockgpu_real_gpus",
                "gauge",
                "Real GPUs found (report-only mode)",
                relaxed(&self.real_gpus),
            ),
            (
                "mockgpu_mounted",
                "gauge",
                "Whether the FUSE tree is mounted",
                u64::from(self.mounted.load(Ordering::Relaxed)),
            ),
            (
                "mockgpu_pinned_containers",
                "gauge",
                "Containers holding GPUs",
                relaxed(&self.pinned),
            ),
            (
                "mockgpu_mount_duration_milliseconds",
                "gauge",
                "Time from start to mounted",
                relaxed(&self.mount_ms),
            ),
            (
                "mockgpu_profile_reloads_total",
                "counter",
                "Profile changes applied",
                relaxed(&self.reloads),
            ),
            (
                "mockgpu_profile_reload_errors_total",
                "counter",
                "Profile changes rejected",
                relaxed(&self.reload_errors),
            ),
            (
                "mockgpu_fuse_reads_total",
                "counter",
                "Reads that reached the agent (kernel cache misses)",
                reads,
            ),
        ];
        for (name, kind, help, value) in metrics {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
            );
        }
    }
}

/// Probes the host below `sysfs`, places `profile`'s GPUs onto it for `node_name` and renders
/// their driver tree.
pub fn build(
    profile: &Profile,
    node_name: &str,
    sysfs: &Path,
) -> Result<(NodeTopology, Tree), ServeError> {
    let host = SysfsHost::new(sysfs).probe()?;
    let topo = NodeTopology::build(profile, node_name, &host)?;
    let tree = render::driver_tree(&topo, &host);
    Ok((topo, tree))
}

/// Writes `<dir>/lib/libmockfs.so` and `<dir>/ld.so.preload` naming the library where
/// containers see it.
fn install_shim(dir: &Path, container_dir: &Path) -> Result<(), ServeError> {
    let lib_dir = dir.join("lib");
    shim::install(&lib_dir).map_err(|source| ServeError::Install {
        path: lib_dir.join(shim::FILE_NAME),
        source,
    })?;
    let preload = dir.join("ld.so.preload");
    let content = format!(
        "{}\n",
        container_dir.join("lib").join(shim::FILE_NAME).display()
    );
    fs::write(&preload, content).map_err(|source| ServeError::Install {
        path: preload,
        source,
    })
}

/// Runs until `shutdown` completes, then unmounts.
pub async fn run(cfg: ServeConfig, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    let started = Instant::now();
    let state = Arc::new(AgentState::default());
    let real_gpus = real::detect(&cfg.procfs, &cfg.sysfs);
    let mut probes: Vec<Arc<dyn Probe>> = vec![state.clone()];
    let mut plugin = None;
    let mut pinning_rx = None;
    if let (Some(nri), None) = (cfg.nri.clone(), &real_gpus) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<PinningEvent>();
        let p = Plugin::new(nri, state.clone(), Arc::new(tx))?;
        probes.push(Arc::new(p.status()));
        plugin = Some(p);
        pinning_rx = Some(rx);
    }
    let health = HealthServer::bind(cfg.listen).await?;
    if let Ok(addr) = health.local_addr() {
        tracing::info!(%addr, "health endpoint listening");
    }
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let health_task = tokio::spawn(health.serve(probes, stopped(stop_rx.clone())));

    if let Some(gpus) = real_gpus {
        state.real_gpus.store(gpus.len() as u64, Ordering::Relaxed);
        for g in &gpus {
            tracing::info!(bus_id = %g.bus_id, model = %g.model, uuid = %g.uuid, minor = ?g.minor, cpus = ?g.local_cpulist, "real GPU");
        }
        tracing::info!(
            count = gpus.len(),
            "real NVIDIA driver found: mocking nothing, reporting only"
        );
        shutdown.await;
        let _ = stop_tx.send(true);
        let _ = health_task.await;
        return Ok(());
    }

    let (profile, mut raw) = cfg.profile.load()?;
    let (topo, tree) = build(&profile, &cfg.node_name, &cfg.sysfs)?;
    let dir = cfg
        .mountpoint
        .parent()
        .unwrap_or(Path::new("/"))
        .to_path_buf();
    if nix::unistd::geteuid().is_root() {
        mounts::make_shared(&dir)?;
    } else {
        tracing::warn!(dir = %dir.display(), "not root: cannot make the directory a shared mount; containers will not see agent restarts");
    }
    if mounts::detach_stale(&cfg.mountpoint)? {
        tracing::warn!(mountpoint = %cfg.mountpoint.display(), "detached a stale mount left by a previous agent");
    }
    fs::create_dir_all(&cfg.mountpoint).map_err(|source| ServeError::Install {
        path: cfg.mountpoint.clone(),
        source,
    })?;
    install_shim(&dir, &cfg.container_dir)?;
    let mounted: Mounted =
        crate::fs::mount(&tree, &cfg.mountpoint, Some(&cfg.sysfs)).map_err(|source| {
            ServeError::Fuse {
                path: cfg.mountpoint.clone(),
                source,
            }
        })?;
    let warmed = mounted.handle.warm(&tree);
    let mount_ms = started.elapsed().as_millis() as u64;
    state.mount_ms.store(mount_ms, Ordering::Relaxed);
    *state.handle.write().unwrap_or_else(|e| e.into_inner()) = Some(mounted.handle.clone());
    tracing::info!(
        profile = %profile.name, node = %topo.node_name, gpus = topo.gpus.len(),
        mountpoint = %cfg.mountpoint.display(), mount_ms, warmed, "driver tree mounted and cached"
    );
    *state.topology.write().unwrap_or_else(|e| e.into_inner()) = Some(topo);
    state.mounted.store(true, Ordering::Release);

    if let Some(mut rx) = pinning_rx {
        let st = state.clone();
        tokio::spawn(async move {
            while let Some(event) = rx.recv().await {
                log_pinning(&st, &event);
            }
        });
    }
    let nri_task = plugin.map(|plugin| {
        let rx = stop_rx.clone();
        tokio::spawn(async move { plugin.run(stopped(rx)).await })
    });

    let reload = {
        let state = state.clone();
        let cfg = cfg.clone();
        let handle = mounted.handle.clone();
        let mut rx = stop_rx.clone();
        async move {
            let ProfileSource::File(path) = &cfg.profile else {
                return;
            };
            loop {
                tokio::select! {
                    _ = rx.wait_for(|s| *s) => return,
                    () = tokio::time::sleep(cfg.reload_interval) => {}
                }
                match fs::read(path) {
                    Ok(now) if now != raw => {
                        let parsed = parse_profile_file(path, &now);
                        raw = now;
                        match parsed
                            .map_err(ServeError::from)
                            .and_then(|p| build(&p, &cfg.node_name, &cfg.sysfs))
                        {
                            Ok((topo, tree)) => {
                                let changed = handle.replace(&tree);
                                let handle = handle.clone();
                                let _ =
                                    tokio::task::spawn_blocking(move || handle.warm(&tree)).await;
                                state.reloads.fetch_add(1, Ordering::Relaxed);
                                tracing::info!(profile = %topo.profile.name, gpus = topo.gpus.len(), changed, "profile changed: tree updated");
                                *state.topology.write().unwrap_or_else(|e| e.into_inner()) =
                                    Some(topo);
                            }
                            Err(e) => {
                                state.reload_errors.fetch_add(1, Ordering::Relaxed);
                                tracing::error!(error = %e, "profile change rejected; still serving the previous tree");
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(path = %path.display(), error = %e, "cannot read profile file")
                    }
                }
            }
        }
    };
    let reload_task = tokio::spawn(reload);

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    let _ = reload_task.await;
    if let Some(t) = nri_task {
        if let Ok(Err(e)) = t.await {
            tracing::warn!(error = %e, "NRI plugin ended with an error");
        }
    }
    state.mounted.store(false, Ordering::Release);
    mounted.unmount().map_err(|source| ServeError::Fuse {
        path: cfg.mountpoint.clone(),
        source,
    })?;
    let _ = health_task.await;
    tracing::info!("driver tree unmounted");
    Ok(())
}

/// Logs a pinning event and keeps the pinned-container gauge.
fn log_pinning(state: &AgentState, event: &PinningEvent) {
    match event {
        PinningEvent::Pinned {
            pod,
            container_name,
            gpus,
            ..
        } => {
            state.pinned.fetch_add(1, Ordering::Relaxed);
            let minors: Vec<u32> = gpus.iter().map(|g| g.minor).collect();
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %container_name, ?minors, "container pinned to GPUs");
        }
        PinningEvent::Unpinned {
            pod,
            container_name,
            ..
        } => {
            let _ = state
                .pinned
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
            tracing::info!(pod = %format!("{}/{}", pod.namespace, pod.name), container = %container_name, "container unpinned");
        }
    }
}
