//! The kubelet device plugin (`serve --device-plugin`): advertises the mock GPUs as an extended
//! resource (`nvidia.com/gpu` by default), so that pods that ask for GPUs are scheduled onto
//! the node and get device nodes the NRI plugin recognises.
//!
//! The kubelet's Device Plugin API v1beta1 is gRPC over Unix sockets in the kubelet's
//! `device-plugins/` directory. The plugin serves the `DevicePlugin` service on its own socket
//! there, then calls `Register` on the kubelet's `kubelet.sock` with its socket's file name; the
//! kubelet dials back and keeps a `ListAndWatch` stream open, through which the plugin reports
//! its devices (one per GPU, ID = UUID, with the GPU's NUMA node) and their health whenever
//! they change. A restarted kubelet recreates `kubelet.sock` and deletes the plugins' sockets,
//! so the plugin watches both files and, when either changes, serves a new socket and
//! registers again.

mod conflict;
mod nodes;
mod preferred;
mod service;

use std::collections::BTreeSet;
use std::fs;
use std::future::Future;
use std::io;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use mockgpu_api::{Layout, NodeTopology};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};

pub use conflict::CHECKPOINT;
pub use nodes::NodeError;
pub use preferred::{PreferError, preferred};
use proto::device_plugin_server::DevicePluginServer;
use proto::registration_client::RegistrationClient;
use proto::{Device, RegisterRequest};

use crate::faults::{self, FaultReport};
use crate::sys::Sys;
use service::{Service, Shared, device_list, options, uuids};

/// The Device Plugin API's messages, clients and servers (from `proto/deviceplugin.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    tonic::include_proto!("v1beta1");
}

/// The API version sent in `Register`.
pub(crate) const API_VERSION: &str = "v1beta1";
/// The kubelet's registration socket, in the device plugin directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The device plugin directory, below the kubelet's root directory.
pub const PLUGIN_DIR: &str = "device-plugins";
/// Default resource name.
pub const DEFAULT_RESOURCE: &str = "nvidia.com/gpu";
/// Default kubelet root directory.
pub const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet";
/// A device's health as the kubelet spells it.
pub(crate) const HEALTHY: &str = "Healthy";
/// A device's health as the kubelet spells it.
pub(crate) const UNHEALTHY: &str = "Unhealthy";
/// The variable that names a container's GPUs.
pub(crate) const VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// How long a socket has to accept a connection.
const CONNECT: Duration = Duration::from_secs(2);

/// Errors of the device plugin.
#[derive(Debug, thiserror::Error)]
pub enum DevicePluginError {
    /// The resource name is not an extended resource name.
    #[error(
        "invalid resource name {0:?}: must be <domain>/<name> like nvidia.com/gpu (a lowercase DNS domain, a name of 1-63 letters, digits, '-', '_' or '.')"
    )]
    ResourceName(String),
    /// The kubelet directory is not an absolute path.
    #[error("kubelet directory {0:?} must be an absolute path")]
    KubeletDir(PathBuf),
    /// The kubelet's checkpoint cannot be read.
    #[error("cannot read the kubelet's checkpoint {path}: {reason}")]
    Checkpoint {
        /// The file (or the directory).
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The plugin's socket cannot be served.
    #[error("cannot serve the device plugin socket {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A device node cannot be created.
    #[error(transparent)]
    Nodes(#[from] NodeError),
}

/// Another live plugin that serves the resource on this node (e.g. the GPU Operator's).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "another device plugin serves {resource} on this node (socket {socket}, devices {})",
    .ids.join(", ")
)]
pub struct Conflict {
    /// The resource.
    pub resource: String,
    /// The other plugin's socket.
    pub socket: PathBuf,
    /// The devices it serves that are not this node's mock GPUs.
    pub ids: Vec<String>,
}

/// What the device plugin does on this node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Standing {
    /// Not settled yet: waiting for the first topology or for a predecessor to stop.
    #[default]
    Starting,
    /// It serves the resource.
    Serving,
    /// It stands down while another plugin serves the resource, and checks again every
    /// [`Config::recheck_interval`].
    StoodDown(Conflict),
}

/// Settings of the device plugin.
#[derive(Debug, Clone)]
pub struct Config {
    /// The extended resource (`nvidia.com/gpu`).
    pub resource_name: String,
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// Where the device nodes are created on the host (the layout's `dev/`).
    pub dev_dir: PathBuf,
    /// How often the kubelet's and the plugin's sockets are checked for a kubelet restart.
    pub poll_interval: Duration,
    /// How often a plugin that stood down checks whether the other plugin is gone.
    pub recheck_interval: Duration,
}

impl Config {
    /// The settings for `resource_name` and the kubelet at `kubelet_dir`, with the device nodes
    /// in `layout`'s `dev/`.
    pub fn new(
        resource_name: &str,
        kubelet_dir: &Path,
        layout: &Layout,
    ) -> Result<Config, DevicePluginError> {
        if !valid_resource_name(resource_name) {
            return Err(DevicePluginError::ResourceName(resource_name.to_string()));
        }
        if !kubelet_dir.is_absolute() {
            return Err(DevicePluginError::KubeletDir(kubelet_dir.to_path_buf()));
        }
        Ok(Config {
            resource_name: resource_name.to_string(),
            kubelet_dir: kubelet_dir.to_path_buf(),
            dev_dir: layout.dev_dir(),
            poll_interval: Duration::from_secs(1),
            recheck_interval: Duration::from_secs(30),
        })
    }

    /// The device plugin directory (`/var/lib/kubelet/device-plugins`).
    pub fn plugin_dir(&self) -> PathBuf {
        self.kubelet_dir.join(PLUGIN_DIR)
    }

    /// The plugin's socket file name (`mockgpu-nvidia.com_gpu.sock`).
    pub fn endpoint(&self) -> String {
        format!("mockgpu-{}.sock", self.resource_name.replace('/', "_"))
    }
}

/// `<domain>/<name>`: a lowercase DNS domain and a qualified name, as the kubelet requires of
/// extended resources.
fn valid_resource_name(name: &str) -> bool {
    let Some((domain, name)) = name.split_once('/') else {
        return false;
    };
    let alnum_ends = |s: &str| {
        s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    };
    let domain_ok = domain.len() <= 253
        && domain.contains('.')
        && domain.split('.').all(|label| {
            label.len() <= 63
                && alnum_ends(label)
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    let name_ok = name.len() <= 63
        && alnum_ends(name)
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    domain_ok && name_ok && domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io")
}

/// The device plugin's metrics, named `mockgpu_device_plugin_*`.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    registrations: Counter,
    allocations: Counter,
    allocated_gpus: Counter,
    healthy_gpus: Gauge,
    stood_down: Gauge,
}

impl Metrics {
    /// Registers the metrics in `registry` (once per registry).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("mockgpu_device_plugin");
        r.register(
            "registrations",
            "Registrations with the kubelet",
            self.registrations.clone(),
        );
        r.register(
            "allocations",
            "Containers given GPUs",
            self.allocations.clone(),
        );
        r.register(
            "allocated_gpus",
            "GPUs given to containers",
            self.allocated_gpus.clone(),
        );
        r.register(
            "healthy_gpus",
            "GPUs advertised as healthy",
            self.healthy_gpus.clone(),
        );
        r.register(
            "stood_down",
            "1 while another device plugin serves the resource on this node and this one stands down",
            self.stood_down.clone(),
        );
    }
}

/// Dials the gRPC server on the Unix socket `socket`.
async fn connect(socket: &Path) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(format!("unix://{}", socket.display()))?
        .connect_timeout(CONNECT)
        .connect()
        .await
}

/// A file's device, inode and change time: a file made anew may get a deleted one's inode
/// number (ext4 reuses them), and its change time too only within one tick of the kernel's
/// file-time clock (a few milliseconds).
type FileId = (u64, u64, i64, i64);

/// A file's identity, to notice it being recreated.
fn identity(path: &Path) -> Option<FileId> {
    fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// One served socket: its identity and what stops it.
struct Session {
    identity: Option<FileId>,
    stop: watch::Sender<bool>,
}

/// Serves the `DevicePlugin` service on a fresh socket at `socket`.
fn serve_socket(socket: &Path, shared: &Arc<Shared>) -> Result<Session, DevicePluginError> {
    let error = |source| DevicePluginError::Socket {
        path: socket.to_path_buf(),
        source,
    };
    match fs::remove_file(socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(error(e)),
        _ => {}
    }
    if let Some(dir) = socket.parent() {
        fs::create_dir_all(dir).map_err(error)?;
    }
    let listener = UnixListener::bind(socket).map_err(error)?;
    let (stop, stopped) = watch::channel(false);
    let service = Service {
        shared: shared.clone(),
        stop: stopped.clone(),
    };
    let path = socket.to_path_buf();
    tokio::spawn(async move {
        let mut stopped = stopped;
        let result = Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = stopped.wait_for(|s| *s).await;
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(socket = %path.display(), error = %e, "device plugin server ended");
        }
    });
    Ok(Session {
        identity: identity(socket),
        stop,
    })
}

/// Calls the kubelet's `Register` for this plugin.
async fn register(config: &Config) -> Result<(), String> {
    let channel = connect(&config.plugin_dir().join(KUBELET_SOCKET))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    RegistrationClient::new(channel)
        .register(RegisterRequest {
            version: API_VERSION.into(),
            endpoint: config.endpoint(),
            resource_name: config.resource_name.clone(),
            options: Some(options()),
        })
        .await
        .map_err(|s| format!("registration refused: {}", s.message()))?;
    Ok(())
}

/// Creates the device nodes of `topo` off the async runtime.
async fn sync_nodes<S: Sys + Send + Sync + 'static>(
    sys: &Arc<S>,
    dir: &Path,
    topo: &NodeTopology,
) -> Result<(), NodeError> {
    let (sys, dir, wanted) = (sys.clone(), dir.to_path_buf(), nodes::nodes(topo));
    tokio::task::spawn_blocking(move || nodes::sync(&*sys, &dir, &wanted))
        .await
        .expect("creating device nodes does not panic")
}

/// Follows topology changes (profile reloads) and fault changes: recreates the device nodes
/// (for a new topology) and publishes the new device list, which every open `ListAndWatch`
/// stream sends on.
async fn follow<S: Sys + Send + Sync + 'static>(
    mut topology: watch::Receiver<Option<NodeTopology>>,
    mut faults: watch::Receiver<FaultReport>,
    devices: watch::Sender<Vec<Device>>,
    mut seen: BTreeSet<String>,
    sys: Arc<S>,
    dir: PathBuf,
    metrics: Metrics,
) {
    let mut faults_open = true;
    loop {
        let new_topology = tokio::select! {
            changed = topology.changed() => {
                if changed.is_err() {
                    return;
                }
                true
            }
            changed = faults.changed(), if faults_open => {
                faults_open = changed.is_ok();
                false
            }
        };
        let Some(topo) = topology.borrow_and_update().clone() else {
            continue;
        };
        if new_topology && let Err(e) = sync_nodes(&sys, &dir, &topo).await {
            tracing::error!(error = %e, "device nodes not updated");
        }
        seen.extend(uuids(&topo));
        let unhealthy = faults::unhealthy(&faults.borrow_and_update().faults, &topo);
        let list = device_list(&topo, &seen, &unhealthy);
        publish_health(&metrics, &list);
        devices.send_if_modified(|current| {
            let changed = *current != list;
            if changed {
                *current = list;
            }
            changed
        });
    }
}

fn publish_health(metrics: &Metrics, list: &[Device]) {
    let healthy = list.iter().filter(|d| d.health == HEALTHY).count();
    metrics.healthy_gpus.set(healthy as i64);
    tracing::info!(
        healthy,
        unhealthy = list.len() - healthy,
        "device list published"
    );
}

/// Runs the device plugin until `shutdown` completes: waits for the first topology, stands down
/// while another plugin serves the resource (telling `standing`), creates the device nodes, then
/// serves its socket and registers with the kubelet, again whenever the kubelet restarts.
pub async fn run<S: Sys + Send + Sync + 'static>(
    config: Config,
    sys: S,
    mut topology: watch::Receiver<Option<NodeTopology>>,
    mut faults: watch::Receiver<FaultReport>,
    metrics: Metrics,
    standing: watch::Sender<Standing>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DevicePluginError> {
    tokio::pin!(shutdown);
    let first = tokio::select! {
        _ = &mut shutdown => return Ok(()),
        t = topology.wait_for(Option::is_some) => match t {
            Ok(t) => t.clone(),
            Err(_) => return Ok(()),
        },
    };
    let Some(first) = first else {
        return Ok(());
    };
    let dir = config.plugin_dir();
    let socket = dir.join(config.endpoint());
    if !conflict::predecessor_gone(&socket, config.poll_interval, shutdown.as_mut()).await {
        return Ok(());
    }
    if !stand_down_while_served(
        &config,
        &uuids(&first),
        &metrics,
        &standing,
        shutdown.as_mut(),
    )
    .await?
    {
        return Ok(());
    }
    standing.send_replace(Standing::Serving);
    let sys = Arc::new(sys);
    sync_nodes(&sys, &config.dev_dir, &first).await?;
    let seen = uuids(&first);
    let unhealthy = faults::unhealthy(&faults.borrow_and_update().faults, &first);
    let list = device_list(&first, &seen, &unhealthy);
    publish_health(&metrics, &list);
    let (devices_tx, devices) = watch::channel(list);
    let follower = tokio::spawn(follow(
        topology.clone(),
        faults,
        devices_tx,
        seen,
        sys,
        config.dev_dir.clone(),
        metrics.clone(),
    ));
    let shared = Arc::new(Shared {
        config: config.clone(),
        topology,
        devices,
        metrics: metrics.clone(),
    });
    let result = loop {
        let session = match serve_socket(&socket, &shared) {
            Ok(s) => s,
            Err(e) => break Err(e),
        };
        let next = registered(&config, &session, &metrics, shutdown.as_mut()).await;
        if next == Next::Shutdown {
            // a successor makes them again; an uninstalled agent leaves none behind. Removed
            // while the socket still answers: a successor waits for it to stop answering
            let current = shared.topology.borrow().clone();
            if let Some(topo) = current {
                let removed = nodes::remove(&config.dev_dir, &nodes::nodes(&topo));
                tracing::info!(removed, dir = %config.dev_dir.display(), "device nodes removed");
            }
            let _ = session.stop.send(true);
            if identity(&socket) == session.identity {
                let _ = fs::remove_file(&socket);
            }
            break Ok(());
        }
        let _ = session.stop.send(true);
    };
    follower.abort();
    result
}

/// Stands down while another plugin serves the resource: says so once in the log, in the
/// metrics and through `standing`, and checks again every [`Config::recheck_interval`]. True
/// once no other plugin serves it; false when `shutdown` came first.
async fn stand_down_while_served(
    config: &Config,
    own: &BTreeSet<String>,
    metrics: &Metrics,
    standing: &watch::Sender<Standing>,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Result<bool, DevicePluginError> {
    let dir = config.plugin_dir();
    loop {
        let Some(other) =
            conflict::check(&dir, &config.resource_name, &config.endpoint(), own).await?
        else {
            if metrics.stood_down.set(0) != 0 {
                tracing::info!(resource = %config.resource_name, "the other device plugin is gone: this agent's device plugin serves the resource now");
            }
            return Ok(true);
        };
        if metrics.stood_down.set(1) == 0 {
            tracing::warn!(
                recheck = ?config.recheck_interval,
                "{other}: this agent's device plugin stands down (the driver tree and injection go on); remove the other plugin, or turn this one off (agent.devicePlugin.enabled=false)"
            );
        }
        standing.send_replace(Standing::StoodDown(other));
        if !conflict::pause(&mut shutdown, config.recheck_interval).await {
            return Ok(false);
        }
    }
}

/// Why [`registered`] returned.
#[derive(Debug, PartialEq, Eq)]
enum Next {
    /// `shutdown` completed.
    Shutdown,
    /// The kubelet restarted: serve a new socket and register again.
    Restart,
}

/// Registers `session`'s socket with the kubelet (retrying until the kubelet answers), then
/// watches the plugin's and the kubelet's sockets until one of them changes or `shutdown`
/// completes.
async fn registered(
    config: &Config,
    session: &Session,
    metrics: &Metrics,
    mut shutdown: Pin<&mut impl Future<Output = ()>>,
) -> Next {
    let socket = config.plugin_dir().join(config.endpoint());
    let kubelet_socket = config.plugin_dir().join(KUBELET_SOCKET);
    let mut kubelet = None;
    let mut failures = 0u32;
    loop {
        if kubelet.is_none() {
            match register(config).await {
                Ok(()) => {
                    kubelet = identity(&kubelet_socket);
                    metrics.registrations.inc();
                    tracing::info!(resource = %config.resource_name, socket = %socket.display(), "registered with the kubelet");
                }
                Err(e) => {
                    if failures == 0 {
                        tracing::warn!(kubelet = %kubelet_socket.display(), error = %e, "cannot register with the kubelet yet; retrying");
                    }
                    failures += 1;
                }
            }
        }
        tokio::select! {
            _ = shutdown.as_mut() => return Next::Shutdown,
            _ = tokio::time::sleep(config.poll_interval) => {}
        }
        if identity(&socket) != session.identity {
            tracing::info!(socket = %socket.display(), "the plugin's socket was removed (the kubelet restarted?): serving it again");
            return Next::Restart;
        }
        if kubelet.is_some() && identity(&kubelet_socket) != kubelet {
            tracing::info!(kubelet = %kubelet_socket.display(), "the kubelet's socket was recreated: registering again");
            return Next::Restart;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::service::{AllocateError, allocate};
    use super::*;

    #[test]
    fn resource_names_are_extended_resource_names() {
        let layout = Layout::default();
        let config = Config::new("nvidia.com/gpu", Path::new("/var/lib/kubelet"), &layout).unwrap();
        assert_eq!(config.endpoint(), "mockgpu-nvidia.com_gpu.sock");
        assert_eq!(
            config.plugin_dir(),
            Path::new("/var/lib/kubelet/device-plugins")
        );
        assert_eq!(config.dev_dir, Path::new("/run/mockgpu/dev"));
        for good in ["example.com/gpu", "a-b.c/GPU_1.x"] {
            assert!(valid_resource_name(good), "{good}");
        }
        for bad in [
            "gpu",
            "nvidia/gpu",
            "Nvidia.com/gpu",
            "nvidia.com/",
            "nvidia.com/-gpu",
            "nvidia.com/g/pu",
            "kubernetes.io/gpu",
            "x.kubernetes.io/gpu",
        ] {
            assert!(!valid_resource_name(bad), "{bad}");
        }
        let e = Config::new("nvidia.com/gpu", Path::new("var/lib/kubelet"), &layout).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kubelet directory \"var/lib/kubelet\" must be an absolute path"
        );
        let e = Config::new("gpu", Path::new("/k"), &layout).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("invalid resource name \"gpu\": must be <domain>/<name>"),
            "{e}"
        );
    }

    #[test]
    fn allocating_the_same_gpu_twice_is_refused() {
        let profile = mockgpu_api::Profile::builtin("h100").unwrap();
        let host = mockgpu_api::HostTopology {
            cpus: mockgpu_api::CpuSet::from_ids(0..2),
            nr_cpu_ids: 2,
            ..Default::default()
        };
        let topo = NodeTopology::build(&profile, "n", &host).unwrap();
        let id = topo.gpus[0].uuid.clone();
        let e = allocate(&topo, Path::new("/d"), &[id.clone(), id.clone()]).unwrap_err();
        assert_eq!(e, AllocateError::Twice(id.clone()));
        assert_eq!(e.to_string(), format!("device ID {id} is requested twice"));
        // A GPU that disappears from the profile stays listed, unhealthy.
        let seen = BTreeSet::from([id.clone(), "GPU-gone".to_string()]);
        let list = device_list(&topo, &seen, &BTreeSet::new());
        let last = list.last().unwrap();
        assert_eq!(
            (last.id.as_str(), last.health.as_str()),
            ("GPU-gone", UNHEALTHY)
        );
        assert_eq!(list.len(), topo.gpus.len() + 1);
        // A GPU its faults leave unhealthy is listed unhealthy.
        let list = device_list(&topo, &BTreeSet::new(), &BTreeSet::from([1]));
        let health: Vec<&str> = list.iter().map(|d| d.health.as_str()).collect();
        assert_eq!(health[..3], [HEALTHY, UNHEALTHY, HEALTHY]);
    }
}
