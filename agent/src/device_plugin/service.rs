//! The `DevicePlugin` gRPC service the kubelet calls on the plugin's socket: the device list
//! (`ListAndWatch`), preferred allocations and `Allocate`.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use mockgpu_api::NodeTopology;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use super::proto::device_plugin_server::DevicePlugin;
use super::proto::{
    AllocateRequest, AllocateResponse, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, Device, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo,
};
use super::{Config, HEALTHY, Metrics, UNHEALTHY, VISIBLE_DEVICES, nodes, preferred};

/// The UUIDs of a topology's GPUs.
pub(super) fn uuids(topo: &NodeTopology) -> BTreeSet<String> {
    topo.gpus.iter().map(|g| g.uuid.clone()).collect()
}

/// The device list of `topo`: its GPUs in minor order, healthy unless the profile marks them
/// failed or their faults leave them unhealthy (`unhealthy`, GPU indices), then the GPUs
/// advertised before (`seen`) that are gone, unhealthy.
pub(super) fn device_list(
    topo: &NodeTopology,
    seen: &BTreeSet<String>,
    unhealthy: &BTreeSet<u32>,
) -> Vec<Device> {
    let mut devices: Vec<Device> = topo
        .gpus
        .iter()
        .map(|g| Device {
            id: g.uuid.clone(),
            health:
                if topo.profile.failed_gpus.contains(&g.index) || unhealthy.contains(&g.index) {
                    UNHEALTHY
                } else {
                    HEALTHY
                }
                .into(),
            topology: (g.numa_node >= 0).then(|| TopologyInfo {
                nodes: vec![NumaNode {
                    id: i64::from(g.numa_node),
                }],
            }),
        })
        .collect();
    let current = uuids(topo);
    devices.extend(seen.difference(&current).map(|id| Device {
        id: id.clone(),
        health: UNHEALTHY.into(),
        topology: None,
    }));
    devices
}

/// An `Allocate` container request that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum AllocateError {
    /// More devices than the node has GPUs.
    #[error("allocation of {} devices ({}) is larger than the node's {gpus} GPUs", .ids.len(), .ids.join(", "))]
    TooMany {
        /// The IDs asked for.
        ids: Vec<String>,
        /// The node's GPUs.
        gpus: usize,
    },
    /// IDs that are none of this node's GPUs.
    #[error("unknown device IDs: {}", .0.join(", "))]
    Unknown(Vec<String>),
    /// An ID asked for twice.
    #[error("device ID {0} is requested twice")]
    Twice(String),
}

/// What a container that was allocated `ids` gets: for each GPU `/dev/nvidia<minor>` (the host's
/// node below `dev_dir`), then `nvidiactl` and the unified-memory nodes, all `rw`, and
/// `NVIDIA_VISIBLE_DEVICES` naming the GPUs; GPUs in minor order.
pub(super) fn allocate(
    topo: &NodeTopology,
    dev_dir: &Path,
    ids: &[String],
) -> Result<ContainerAllocateResponse, AllocateError> {
    if ids.len() > topo.gpus.len() {
        return Err(AllocateError::TooMany {
            ids: ids.to_vec(),
            gpus: topo.gpus.len(),
        });
    }
    let unknown: Vec<String> = ids
        .iter()
        .filter(|id| !topo.gpus.iter().any(|g| &g.uuid == *id))
        .cloned()
        .collect();
    if !unknown.is_empty() {
        return Err(AllocateError::Unknown(unknown));
    }
    if let Some((_, id)) = ids
        .iter()
        .enumerate()
        .find(|(i, id)| ids[..*i].contains(id))
    {
        return Err(AllocateError::Twice(id.clone()));
    }
    let mut gpus: Vec<&mockgpu_api::Gpu> =
        topo.gpus.iter().filter(|g| ids.contains(&g.uuid)).collect();
    gpus.sort_by_key(|g| g.minor);
    let spec = |node: &mockgpu_api::DeviceNode| DeviceSpec {
        container_path: node.path.clone(),
        host_path: nodes::host_path(dev_dir, node).display().to_string(),
        permissions: "rw".into(),
    };
    let mut devices: Vec<DeviceSpec> = gpus
        .iter()
        .map(|g| spec(&mockgpu_api::DeviceNode::gpu(g.minor)))
        .collect();
    devices.extend(topo.devices.control_nodes().iter().map(spec));
    let visible: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    Ok(ContainerAllocateResponse {
        envs: HashMap::from([(VISIBLE_DEVICES.to_string(), visible.join(","))]),
        devices,
    })
}

/// What the gRPC service reads, shared by every socket the plugin serves.
pub(super) struct Shared {
    pub(super) config: Config,
    pub(super) topology: watch::Receiver<Option<NodeTopology>>,
    pub(super) devices: watch::Receiver<Vec<Device>>,
    pub(super) metrics: Metrics,
}

impl Shared {
    fn topology(&self) -> Result<NodeTopology, Status> {
        self.topology
            .borrow()
            .clone()
            .ok_or_else(|| Status::unavailable("no GPUs loaded yet"))
    }
}

/// The `DevicePlugin` service of one served socket: its `ListAndWatch` streams end when the
/// socket is replaced (`stop`).
pub(super) struct Service {
    pub(super) shared: Arc<Shared>,
    pub(super) stop: watch::Receiver<bool>,
}

pub(super) fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream =
        Pin<Box<dyn Stream<Item = Result<ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut stop = self.stop.clone();
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let stream = WatchStream::new(self.shared.devices.clone())
            .map(|devices| Ok(ListAndWatchResponse { devices }))
            .take_until(stopped);
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let topo = self.shared.topology()?;
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|r| {
                preferred(
                    &topo.gpus,
                    &r.available_device_i_ds,
                    &r.must_include_device_i_ds,
                    i64::from(r.allocation_size),
                )
                .map(|device_i_ds| ContainerPreferredAllocationResponse { device_i_ds })
                .map_err(|e| Status::invalid_argument(e.to_string()))
            })
            .collect::<Result<_, _>>()?;
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let topo = self.shared.topology()?;
        let requests = request.into_inner().container_requests;
        let container_responses = requests
            .iter()
            .map(|r| allocate(&topo, &self.shared.config.dev_dir, &r.devices_ids))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| {
                tracing::warn!(error = %e, "allocation refused");
                Status::invalid_argument(e.to_string())
            })?;
        for r in &requests {
            let minors: Vec<u32> = topo
                .gpus
                .iter()
                .filter(|g| r.devices_ids.contains(&g.uuid))
                .map(|g| g.minor)
                .collect();
            self.shared.metrics.allocations.inc();
            self.shared
                .metrics
                .allocated_gpus
                .inc_by(r.devices_ids.len() as u64);
            tracing::info!(resource = %self.shared.config.resource_name, uuids = ?r.devices_ids, ?minors, "GPUs allocated to a container");
        }
        Ok(Response::new(AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        Ok(Response::new(PreStartContainerResponse {}))
    }
}
