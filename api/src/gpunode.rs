//! `GpuNode` (`mockgpu.io/v1alpha1`, cluster-scoped): one per node, named after it. The agent
//! writes the spec (what the node's GPUs are) and its part of the status (pinning, heartbeat,
//! `Ready`, `DevicePluginConflict`); the controller adds the `Stale`, `Drifted` and
//! `InjectionMissing` conditions.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::topology::fnv1a128;
use crate::{Gpu, NodeTopology};

/// The agent's field manager for server-side apply.
pub const AGENT_MANAGER: &str = "mockgpu-agent";
/// The controller's field manager for server-side apply.
pub const CONTROLLER_MANAGER: &str = "mockgpu-controller";

/// Condition types of a GpuNode.
pub mod condition {
    /// The agent serves the node's GPUs (mock mode: the tree is mounted; real mode: reported).
    pub const READY: &str = "Ready";
    /// The agent's heartbeat stopped (set by the controller).
    pub const STALE: &str = "Stale";
    /// The topology changed while slurmd pods run on the node (set by the controller).
    pub const DRIFTED: &str = "Drifted";
    /// A GPU-holding container on the node is absent from the pinning (set by the controller).
    pub const INJECTION_MISSING: &str = "InjectionMissing";
    /// Another device plugin (the GPU Operator's) serves the GPU resource on the node, so the
    /// agent's own stands down (set by the agent while its device plugin is on).
    pub const DEVICE_PLUGIN_CONFLICT: &str = "DevicePluginConflict";
    /// The node's GPU faults (set by the controller from the agent's report; also the default
    /// type of the Node condition that mirrors it).
    pub const GPU_PROBLEM: &str = "GPUProblem";
}

/// What the node's GPUs are.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "mockgpu.io",
    version = "v1alpha1",
    kind = "GpuNode",
    plural = "gpunodes",
    singular = "gpunode",
    status = "GpuNodeStatus",
    printcolumn = r#"{"name":"Mode","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"Profile","type":"string","jsonPath":".spec.profile"}"#,
    printcolumn = r#"{"name":"GPUs","type":"integer","jsonPath":".spec.gpuCount"}"#,
    printcolumn = r#"{"name":"Held","type":"integer","jsonPath":".status.heldGpus"}"#,
    printcolumn = r#"{"name":"Unhealthy","type":"integer","jsonPath":".status.unhealthyGpus"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct GpuNodeSpec {
    /// The Kubernetes node (also the object's name).
    pub node_name: String,
    /// `mock` (served by mockgpu) or `real` (an NVIDIA driver is loaded; reported only).
    pub mode: Mode,
    /// The profile's name (`real` in real mode).
    pub profile: String,
    /// Hash of everything Slurm sees of the GPUs (see [`topology_hash`]).
    pub topology_hash: String,
    /// The number of GPUs (the length of `gpus`).
    pub gpu_count: u32,
    /// The GPUs, ordered by minor.
    pub gpus: Vec<GpuNodeGpu>,
    /// The GPUs' NVLink fabric, when they are part of one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fabric: Option<Fabric>,
}

/// Whether mockgpu mocks the node's GPUs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// The GPUs are mockgpu's.
    Mock,
    /// A real NVIDIA driver is loaded: nothing is mocked.
    Real,
}

/// One GPU of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct GpuNodeGpu {
    /// Position in minor order (0-based).
    pub index: u32,
    /// Device minor (`/dev/nvidia<minor>`).
    pub minor: u32,
    /// `GPU-…` identity.
    pub uuid: String,
    /// PCI address (`0000:41:00.0`).
    pub bus_id: String,
    /// Model (`NVIDIA GB300`).
    pub model: String,
    /// Memory in MiB, when known (a real driver's files do not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// NUMA node, or -1.
    pub numa_node: i32,
    /// The GPU's local CPUs (`0-71`).
    pub local_cpulist: String,
    /// The host socket those CPUs belong to.
    pub socket: u32,
}

impl GpuNodeGpu {
    /// The report of `gpu`.
    pub fn new(gpu: &Gpu, model: &str, memory_mib: Option<u64>) -> Self {
        Self {
            index: gpu.index,
            minor: gpu.minor,
            uuid: gpu.uuid.clone(),
            bus_id: gpu.bus_id.to_string(),
            model: model.to_string(),
            memory_mib,
            numa_node: gpu.numa_node,
            local_cpulist: gpu.cpus.to_list(),
            socket: gpu.socket,
        }
    }
}

/// An NVLink fabric (for IMEX).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Fabric {
    /// The fabric's cluster UUID.
    pub cluster_uuid: String,
    /// The clique within it.
    pub clique_id: String,
}

impl Fabric {
    /// `<cluster UUID>.<clique id>`, as ComputeDomains list a node's clique.
    pub fn clique(&self) -> String {
        format!("{}.{}", self.cluster_uuid, self.clique_id)
    }
}

/// What the node's GPUs are doing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct GpuNodeStatus {
    /// The reporting agent's version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// The reporting agent process (random at each start). A stopping agent sends its last
    /// report only while this is still its own: in a rollout its successor reports by then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_instance: Option<String>,
    /// When the agent last reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Time>,
    /// When the agent first reported the current `spec.topologyHash` (a slurmd started before
    /// then registered other GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_since: Option<Time>,
    /// GPUs held by containers (distinct UUIDs in `pinning`).
    #[serde(default)]
    pub held_gpus: u32,
    /// The containers holding GPUs.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub pinning: Vec<Pinning>,
    /// The faults on the node's GPUs, as the agent applies them.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub faults: Vec<GpuNodeFault>,
    /// GPUs the faults leave unhealthy ([`crate::GpuState::healthy`]).
    #[serde(default)]
    pub unhealthy_gpus: u32,
    /// The ResourceClaims the agent's DRA driver prepared on the node.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "atomic"))]
    pub claims: Vec<PreparedClaim>,
    /// `Ready` (agent), `Stale`, `Drifted`, `InjectionMissing` (controller).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A fault the agent applies to one of the node's GPUs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = kubernetes_formats)]
pub struct GpuNodeFault {
    /// Where it comes from: `GpuFault/<name>` or `local/<name>` (`mockgpu-agent fault`).
    pub source: String,
    /// The GPU's index.
    pub gpu: u32,
    /// The GPU's UUID.
    pub uuid: String,
    /// What is broken.
    pub kind: crate::FaultKind,
    /// The Xid code, for an Xid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xid: Option<u32>,
    /// In words ([`crate::Fault::describe`]).
    pub message: String,
}

/// A ResourceClaim prepared on the node by the agent's DRA driver.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreparedClaim {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
    /// The driver (`gpu.nvidia.com` or `compute-domain.nvidia.com`).
    pub driver: String,
    /// The devices of the driver's pool that the claim holds (`gpu-0`, `channel-0`).
    pub devices: Vec<String>,
    /// The UUIDs of the GPUs it holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<String>,
    /// The ComputeDomain (UID) whose channels it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// The IMEX channels it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<u32>,
}

/// A container holding GPUs.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pinning {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's UID.
    pub pod_uid: String,
    /// The container's name.
    pub container: String,
    /// UUIDs of the GPUs it holds.
    pub gpus: Vec<String>,
    /// Since when.
    pub since: Time,
}

/// The API server knows the integer formats `int32` and `int64` (others draw a warning on every
/// apply): schemars' `uint32` and `uint64` become `int64`, their `minimum: 0` stays.
pub(crate) fn kubernetes_formats(schema: &mut schemars::Schema) {
    if matches!(
        schema.get("format").and_then(|f| f.as_str()),
        Some("uint32" | "uint64")
    ) {
        schema.insert("format".into(), "int64".into());
    }
    schemars::transform::transform_subschemas(&mut kubernetes_formats, schema);
}

/// A hash of what Slurm and schedulers see of the GPUs: their count, order, identity, bus ids,
/// model, memory and CPU affinity. A change means a running slurmd's registration is stale.
pub fn topology_hash(gpus: &[GpuNodeGpu]) -> String {
    let mut key = String::new();
    for g in gpus {
        key.push_str(&format!(
            "{}|{}|{}|{}|{}|{:?}|{}|{}|{};",
            g.index,
            g.minor,
            g.uuid,
            g.bus_id,
            g.model,
            g.memory_mib,
            g.numa_node,
            g.local_cpulist,
            g.socket
        ));
    }
    format!("{:032x}", fnv1a128(key.as_bytes()))
}

impl GpuNodeSpec {
    /// The spec of a node with `gpus` (ordered by minor).
    pub fn new(node_name: &str, mode: Mode, profile: &str, gpus: Vec<GpuNodeGpu>) -> Self {
        Self {
            node_name: node_name.to_string(),
            mode,
            profile: profile.to_string(),
            topology_hash: topology_hash(&gpus),
            gpu_count: u32::try_from(gpus.len()).unwrap_or(u32::MAX),
            gpus,
            fabric: None,
        }
    }

    /// The spec of a mock node.
    pub fn mock(topo: &NodeTopology) -> Self {
        let p = &topo.profile;
        let gpus = topo
            .gpus
            .iter()
            .map(|g| GpuNodeGpu::new(g, &p.model, Some(p.memory_mib)))
            .collect();
        let mut spec = Self::new(&topo.node_name, Mode::Mock, &p.name, gpus);
        spec.fabric = p.nvml.fabric.as_ref().map(|f| Fabric {
            cluster_uuid: f.cluster_uuid.clone(),
            clique_id: f.clique_id.to_string(),
        });
        spec
    }
}

#[cfg(test)]
mod tests {
    use kube::CustomResourceExt;

    use super::*;
    use crate::Profile;
    use crate::topology::tests::host;

    fn mock(profile: &str) -> GpuNodeSpec {
        let p = Profile::builtin(profile).unwrap();
        GpuNodeSpec::mock(
            &NodeTopology::build(&p, "node-a", &host(&[(0, 0..72)], &[(0, 0..72)])).unwrap(),
        )
    }

    #[test]
    fn a_mock_spec_names_the_profiles_fabric() {
        let f = mock("gb300").fabric.expect("gb300 is on an NVLink fabric");
        assert_eq!(
            (f.cluster_uuid.as_str(), f.clique_id.as_str()),
            ("6f3e2b1a-8c4d-4e5f-9a0b-1c2d3e4f5a6b", "32766")
        );
        assert_eq!(mock("h100").fabric, None);
    }

    #[test]
    fn a_mock_spec_lists_the_profiles_gpus() {
        let s = mock("gb300");
        assert_eq!(
            (s.mode, s.profile.as_str(), s.gpu_count),
            (Mode::Mock, "gb300", 4)
        );
        assert_eq!(s.gpus.len(), 4);
        assert_eq!(s.gpus[3].minor, 3);
        assert_eq!(s.gpus[0].model, "NVIDIA GB300");
        assert_eq!(s.gpus[0].local_cpulist, "0-71");
        assert!(s.gpus[0].uuid.starts_with("GPU-"));
    }

    #[test]
    fn the_topology_hash_follows_what_slurm_sees() {
        let a = mock("gb300");
        assert_eq!(a.topology_hash, mock("gb300").topology_hash);
        assert_ne!(a.topology_hash, mock("h100").topology_hash);
        let mut gpus = a.gpus.clone();
        gpus[1].local_cpulist = "0-35".into();
        assert_ne!(topology_hash(&gpus), a.topology_hash);
        gpus.pop();
        assert_ne!(topology_hash(&gpus), a.topology_hash);
    }

    #[test]
    fn the_crd_is_cluster_scoped_with_a_status_subresource_and_columns() {
        let crd = serde_json::to_value(GpuNode::crd()).unwrap();
        assert_eq!(crd["metadata"]["name"], "gpunodes.mockgpu.io");
        assert_eq!(crd["spec"]["scope"], "Cluster");
        let v = &crd["spec"]["versions"][0];
        assert_eq!(v["name"], "v1alpha1");
        assert!(v["subresources"]["status"].is_object());
        let cols: Vec<_> = v["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_uppercase())
            .collect();
        assert_eq!(
            cols,
            [
                "MODE",
                "PROFILE",
                "GPUS",
                "HELD",
                "UNHEALTHY",
                "READY",
                "AGE"
            ]
        );
        let status = &v["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
        assert_eq!(
            status["conditions"]["x-kubernetes-list-map-keys"][0],
            "type"
        );
    }

    #[test]
    fn a_fabric_names_its_clique() {
        let f = Fabric {
            cluster_uuid: "6f3e2b1a-8c4d-4e5f-9a0b-1c2d3e4f5a6b".into(),
            clique_id: "32766".into(),
        };
        assert_eq!(f.clique(), "6f3e2b1a-8c4d-4e5f-9a0b-1c2d3e4f5a6b.32766");
    }

    #[test]
    fn a_gpunode_round_trips_through_json() {
        let mut n = GpuNode::new("node-a", mock("b200"));
        n.status = Some(GpuNodeStatus {
            held_gpus: 1,
            ..Default::default()
        });
        let back: GpuNode = serde_json::from_value(serde_json::to_value(&n).unwrap()).unwrap();
        assert_eq!(back.spec, n.spec);
        assert_eq!(back.status, n.status);
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["spec"]["mode"], "mock");
        assert_eq!(v["spec"]["gpus"][0]["busId"], n.spec.gpus[0].bus_id);
    }
}
