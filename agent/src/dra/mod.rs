//! The DRA driver (`serve --dra-gpus`, `--dra-compute-domains`): a kubelet plugin over the
//! kubelet's Dynamic Resource Allocation API, as the device plugin is one over the Device Plugin
//! API. It serves NVIDIA's two drivers under their names, so DeviceClasses and claims written
//! for NVIDIA's DRA driver work unchanged:
//!
//! - `gpu.nvidia.com`: a device per GPU (`gpu-<minor>`, NVIDIA's attributes). Preparing a claim
//!   writes a CDI spec with the GPUs' device nodes and the control nodes; the runtime creates
//!   them in the container, and the NRI plugin, seeing `/dev/nvidia<N>`, injects the mock as for
//!   a device plugin's GPUs. Exclusive with the device plugin, as NVIDIA's are.
//! - `compute-domain.nvidia.com`: the node's IMEX channel 0; a ComputeDomain's channel claim gets
//!   `/dev/nvidia-caps-imex-channels/channel<N>` (channel 0, or all 2048 with
//!   `allocationMode: All`) on the mock's IMEX major.
//!
//! For each driver the plugin serves `Registration` on
//! `<kubelet>/plugins_registry/<driver>-reg.sock` (the kubelet's plugin watcher finds it there)
//! and `DRAPlugin` on `<kubelet>/plugins/<driver>/dra.sock`, publishes the node's ResourceSlice
//! ([`slices`]), and lists the claims it prepared in the GpuNode.

mod authority;
mod cdi;
mod claims;
mod service;
mod slices;

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::Api;
use mockgpu_api::NodeTopology;
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::service::Routes;
use tonic::transport::Server;

pub use claims::{Driver, PrepareError, Prepared};
use proto::dra::dra_plugin_server::DraPluginServer;
use proto::registration::registration_server::RegistrationServer;
use service::{Plugin, Registrar};

use crate::faults::FaultReport;
use crate::report::Credentials;

/// The kubelet APIs' messages, clients and servers (from `proto/dra.proto` and
/// `proto/pluginregistration.proto`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    /// The DRA plugin API (`k8s.io.kubelet.pkg.apis.dra.v1`).
    pub mod dra {
        tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
    }
    /// Plugin registration (`pluginregistration`).
    pub mod registration {
        tonic::include_proto!("pluginregistration");
    }
}

/// Default directory of the CDI specs (the runtime's transient spec directory).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// How often the sockets are checked for having been removed.
const CHECK: Duration = Duration::from_secs(2);

/// Errors of the DRA driver.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// A socket cannot be served.
    #[error("cannot serve the DRA socket {path}: {source}")]
    Socket {
        /// The socket.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A directory is not absolute.
    #[error("{what} {path:?} must be an absolute path")]
    Relative {
        /// Which.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
}

/// Settings of the DRA driver.
#[derive(Debug, Clone)]
pub struct Config {
    /// The drivers served.
    pub drivers: Vec<Driver>,
    /// The kubelet's root directory (`/var/lib/kubelet`).
    pub kubelet_dir: PathBuf,
    /// Where the CDI specs go (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
}

impl Config {
    /// The settings for `drivers`, with the kubelet at `kubelet_dir` and the CDI specs in
    /// `cdi_dir`.
    pub fn new(
        drivers: Vec<Driver>,
        kubelet_dir: &Path,
        cdi_dir: &Path,
    ) -> Result<Config, DraError> {
        for (what, path) in [
            ("kubelet directory", kubelet_dir),
            ("CDI directory", cdi_dir),
        ] {
            if !path.is_absolute() {
                return Err(DraError::Relative {
                    what,
                    path: path.to_path_buf(),
                });
            }
        }
        Ok(Config {
            drivers,
            kubelet_dir: kubelet_dir.to_path_buf(),
            cdi_dir: cdi_dir.to_path_buf(),
        })
    }

    /// The registration socket of `driver` (`plugins_registry/gpu.nvidia.com-reg.sock`).
    pub fn registration_socket(&self, driver: Driver) -> PathBuf {
        self.kubelet_dir
            .join("plugins_registry")
            .join(format!("{}-reg.sock", driver.name()))
    }

    /// The `DRAPlugin` socket of `driver` (`plugins/gpu.nvidia.com/dra.sock`).
    pub fn plugin_socket(&self, driver: Driver) -> PathBuf {
        self.kubelet_dir
            .join("plugins")
            .join(driver.name())
            .join("dra.sock")
    }

    /// The checkpoint of the prepared claims (`plugins/mockgpu.io/dra-claims.json`).
    pub fn checkpoint(&self) -> PathBuf {
        self.kubelet_dir
            .join("plugins")
            .join("mockgpu.io")
            .join("dra-claims.json")
    }
}

/// Where a claim is read.
pub trait ClaimSource: Send + Sync + 'static {
    /// The ResourceClaim `namespace/name`.
    fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<ResourceClaim, String>> + Send;
}

/// Claims read from the API server.
pub struct ApiClaims(pub kube::Client);

impl ClaimSource for ApiClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Binds a fresh socket at `path` (removing a stale one).
fn bind(path: &Path) -> Result<UnixListener, DraError> {
    let error = |source| DraError::Socket {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(error(e)),
        _ => {}
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(error)?;
    }
    UnixListener::bind(path).map_err(error)
}

/// A socket file's device and inode: whose it is.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Serves the plugins of `config.drivers` until `stop` completes; serves their sockets again
/// when one is removed. The sockets still its own are removed at the end, so the kubelet sees
/// the plugins go; those a successor serves by then (a rollout's surge agent binds the same
/// paths) are left to it.
pub async fn serve_plugins<C: ClaimSource>(
    config: &Config,
    source: C,
    topology: watch::Receiver<Option<NodeTopology>>,
    prepared: Arc<Prepared>,
    stop: impl Future<Output = ()>,
) -> Result<(), DraError> {
    tokio::pin!(stop);
    let source = Arc::new(source);
    loop {
        let (end, ended) = watch::channel(false);
        let mut own = Vec::new();
        for driver in &config.drivers {
            let endpoint = config.plugin_socket(*driver);
            // the plugin's socket first: the kubelet dials it once it sees the registration
            let plugin = DraPluginServer::new(Plugin {
                driver: *driver,
                source: source.clone(),
                topology: topology.clone(),
                prepared: prepared.clone(),
                cdi_dir: config.cdi_dir.clone(),
            });
            spawn_server(bind(&endpoint)?, Routes::new(plugin), ended.clone());
            own.push((endpoint.clone(), identity(&endpoint)));
            let registrar = RegistrationServer::new(Registrar {
                driver: *driver,
                endpoint,
            });
            let registration = config.registration_socket(*driver);
            spawn_registration(bind(&registration)?, Routes::new(registrar), ended.clone());
            own.push((registration.clone(), identity(&registration)));
            tracing::info!(driver = driver.name(), socket = %registration.display(), "DRA plugin serving");
        }
        let gone = loop {
            tokio::select! {
                _ = &mut stop => break None,
                _ = tokio::time::sleep(CHECK) => {}
            }
            if let Some((gone, _)) = own.iter().find(|(s, _)| !s.exists()) {
                break Some(gone.clone());
            }
        };
        let _ = end.send(true);
        match gone {
            Some(socket) => {
                tracing::info!(socket = %socket.display(), "a DRA socket was removed: serving them again");
            }
            None => {
                for (socket, id) in &own {
                    if identity(socket) == *id {
                        let _ = std::fs::remove_file(socket);
                    }
                }
                return Ok(());
            }
        }
    }
}

/// Serves `routes` on `listener` until `ended` turns true.
fn spawn_server(listener: UnixListener, routes: Routes, mut ended: watch::Receiver<bool>) {
    tokio::spawn(async move {
        let result = Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                let _ = ended.wait_for(|e| *e).await;
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "DRA plugin server ended");
        }
    });
}

/// Serves `routes` to the connections of the registration socket `listener`, each through
/// [`authority::relay`] (the kubelet's plugin watcher sends an `:authority` tonic refuses), until
/// `ended` turns true.
fn spawn_registration(listener: UnixListener, routes: Routes, mut ended: watch::Receiver<bool>) {
    let (conns, incoming) = tokio::sync::mpsc::channel::<tokio::io::DuplexStream>(4);
    let mut stop = ended.clone();
    tokio::spawn(async move {
        loop {
            let client = tokio::select! {
                _ = stop.wait_for(|e| *e) => return,
                accepted = listener.accept() => match accepted {
                    Ok((client, _)) => client,
                    Err(e) => {
                        tracing::warn!(error = %e, "the DRA registration socket fails");
                        return;
                    }
                },
            };
            let (ours, theirs) = tokio::io::duplex(64 * 1024);
            if conns.send(theirs).await.is_err() {
                return;
            }
            tokio::spawn(authority::relay(client, ours));
        }
    });
    let incoming =
        tokio_stream::wrappers::ReceiverStream::new(incoming).map(Ok::<_, std::io::Error>);
    tokio::spawn(async move {
        let result = Server::builder()
            .add_routes(routes)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = ended.wait_for(|e| *e).await;
            })
            .await;
        if let Err(e) = result {
            tracing::warn!(error = %e, "DRA registration server ended");
        }
    });
}

/// Runs the DRA driver with the API server of `credentials` until `stop` completes: publishes
/// the node's slices and serves the plugins.
pub async fn run(
    config: Config,
    credentials: Credentials,
    node: String,
    topology: watch::Receiver<Option<NodeTopology>>,
    faults: watch::Receiver<FaultReport>,
    prepared: Arc<Prepared>,
    stop: impl Future<Output = ()>,
) -> Result<(), DraError> {
    tokio::pin!(stop);
    let retry = Duration::from_secs(10);
    let Some(client) = credentials
        .client_until("the DRA driver", retry, stop.as_mut())
        .await
    else {
        return Ok(());
    };
    let (end, ended) = watch::channel(false);
    let mut ended_slices = ended.clone();
    let publisher = tokio::spawn(slices::publish(
        client.clone(),
        node,
        config.drivers.clone(),
        topology.clone(),
        faults,
        async move {
            let _ = ended_slices.wait_for(|e| *e).await;
        },
    ));
    let result = serve_plugins(&config, ApiClaims(client), topology, prepared, stop).await;
    let _ = end.send(true);
    let _ = publisher.await;
    drop(ended);
    result
}
