//! The two gRPC services of each driver: `Registration` on its socket in the kubelet's
//! `plugins_registry/` (the kubelet's plugin watcher asks it what the plugin is and where), and
//! `DRAPlugin` on the socket it names (the kubelet prepares and unprepares claims there).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use mockgpu_api::NodeTopology;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::claims::{Driver, PrepareError, Prepared, plan};
use super::proto::dra::dra_plugin_server::DraPlugin;
use super::proto::dra::{
    Claim, Device, NodePrepareResourceResponse, NodePrepareResourcesRequest,
    NodePrepareResourcesResponse, NodeUnprepareResourceResponse, NodeUnprepareResourcesRequest,
    NodeUnprepareResourcesResponse,
};
use super::proto::registration::registration_server::Registration;
use super::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use super::{ClaimSource, cdi};

/// The plugin type of a DRA driver.
const PLUGIN_TYPE: &str = "DRAPlugin";
/// The service version served.
const SERVICE_VERSION: &str = "v1.DRAPlugin";

/// What the kubelet's plugin watcher is told.
pub(super) struct Registrar {
    pub driver: Driver,
    /// The `DRAPlugin` socket.
    pub endpoint: PathBuf,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        Ok(Response::new(PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: self.driver.name().into(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec![SERVICE_VERSION.into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = self.driver.name(), "registered with the kubelet");
        } else {
            tracing::error!(driver = self.driver.name(), error = %status.error, "the kubelet refused the registration");
        }
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

/// What a driver's `DRAPlugin` service works with.
pub(super) struct Plugin<C> {
    pub driver: Driver,
    pub source: Arc<C>,
    pub topology: watch::Receiver<Option<NodeTopology>>,
    pub prepared: Arc<Prepared>,
    pub cdi_dir: PathBuf,
}

impl<C: ClaimSource> Plugin<C> {
    /// Prepares one claim: reads it, plans it, writes its CDI spec and records it.
    async fn prepare(&self, claim: &Claim) -> Result<Vec<Device>, PrepareError> {
        let name = format!("{}/{}", claim.namespace, claim.name);
        let topo = self
            .topology
            .borrow()
            .clone()
            .ok_or(PrepareError::NotReady)?;
        let object = self
            .source
            .get(&claim.namespace, &claim.name)
            .await
            .map_err(|reason| PrepareError::Read {
                claim: name.clone(),
                reason,
            })?;
        let found = object.metadata.uid.clone().unwrap_or_default();
        if found != claim.uid {
            return Err(PrepareError::Uid {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                found,
                wanted: claim.uid.clone(),
            });
        }
        let plan = plan(self.driver, &topo, &object, &self.prepared.list())?;
        let path = cdi::spec_path(&self.cdi_dir, self.driver.cdi_vendor(), &claim.uid);
        let error = |e: std::io::Error, path: &std::path::Path| PrepareError::Write {
            path: path.to_path_buf(),
            reason: e.to_string(),
        };
        cdi::write(&path, &plan.spec).map_err(|e| error(e, &path))?;
        self.prepared
            .insert(plan.record.clone())
            .map_err(|e| error(e, &path))?;
        tracing::info!(driver = self.driver.name(), claim = %name, devices = ?plan.record.devices, gpus = ?plan.record.gpus, channels = ?plan.record.channels, "claim prepared");
        Ok(plan.devices)
    }

    /// Unprepares one claim: removes its CDI spec and its record.
    fn unprepare(&self, claim: &Claim) -> Result<(), String> {
        let path = cdi::spec_path(&self.cdi_dir, self.driver.cdi_vendor(), &claim.uid);
        cdi::remove(&path).map_err(|e| format!("cannot remove {}: {e}", path.display()))?;
        let known = self
            .prepared
            .remove(self.driver, &claim.uid)
            .map_err(|e| format!("cannot write the checkpoint: {e}"))?;
        tracing::info!(driver = self.driver.name(), claim = %format!("{}/{}", claim.namespace, claim.name), known, "claim unprepared");
        Ok(())
    }
}

#[tonic::async_trait]
impl<C: ClaimSource> DraPlugin for Plugin<C> {
    async fn node_prepare_resources(
        &self,
        request: Request<NodePrepareResourcesRequest>,
    ) -> Result<Response<NodePrepareResourcesResponse>, Status> {
        let mut claims = HashMap::new();
        for claim in request.into_inner().claims {
            let answer = match self.prepare(&claim).await {
                Ok(devices) => NodePrepareResourceResponse {
                    devices,
                    error: String::new(),
                },
                Err(e) => {
                    tracing::warn!(driver = self.driver.name(), error = %e, "claim not prepared");
                    NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e.to_string(),
                    }
                }
            };
            claims.insert(claim.uid, answer);
        }
        Ok(Response::new(NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<NodeUnprepareResourcesRequest>,
    ) -> Result<Response<NodeUnprepareResourcesResponse>, Status> {
        let claims = request
            .into_inner()
            .claims
            .into_iter()
            .map(|claim| {
                let error = self.unprepare(&claim).err().unwrap_or_default();
                (claim.uid, NodeUnprepareResourceResponse { error })
            })
            .collect();
        Ok(Response::new(NodeUnprepareResourcesResponse { claims }))
    }
}
