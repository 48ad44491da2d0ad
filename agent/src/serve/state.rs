//! What the parts of `serve` share: its settings, the agent's live state, and the record of
//! the paths served.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mockgpu_api::{Layout, NodeTopology};
use mockgpu_health::Probe;
use mockgpu_nri::{GpuInventory, Inventory, NotReady};
use tokio::sync::watch;

use crate::faults::{ClusterFaults, FaultReport, Verdicts};
use crate::fuse::TreeHandle;
use crate::profile::ProfileSource;
use crate::tree::Tree;
use crate::{device_plugin, dra, report};

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
    pub(super) topology: RwLock<Option<NodeTopology>>,
    pub(super) mounted: std::sync::atomic::AtomicBool,
    pub(super) reloads: AtomicU64,
    pub(super) reload_errors: AtomicU64,
    pub(super) real_gpus: AtomicU64,
    pub(super) mount_ms: AtomicU64,
    pub(super) handle: RwLock<Option<TreeHandle>>,
    /// Every topology put in place, for the device plugin.
    pub(super) published: tokio::sync::watch::Sender<Option<NodeTopology>>,
    /// The faults applied, for the device plugin and the reporter.
    pub(super) faults: watch::Sender<FaultReport>,
    /// Fault entries refused (invalid, or naming what the node lacks), counted at each change.
    pub(super) fault_errors: AtomicU64,
    /// The GpuFault objects, as the watcher keeps them (empty without one).
    pub(super) cluster: watch::Sender<ClusterFaults>,
    /// What the agent made of this node's GpuFault objects, for their status.
    pub(super) verdicts: watch::Sender<Verdicts>,
}

impl AgentState {
    pub(super) fn gpu_count(&self) -> usize {
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

/// Leaves the paths of `tree` in `record` for the next agent on the keeper's connection.
pub(super) fn record_served(tree: &Tree, record: &Path) {
    if let Err(e) = crate::fuse::record_paths(tree, record) {
        tracing::warn!(file = %record.display(), error = %e, "cannot record the paths served; the next agent may see stale ones");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
