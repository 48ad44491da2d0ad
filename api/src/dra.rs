//! Dynamic Resource Allocation: the two drivers the agent's kubelet plugin serves, the devices a
//! node publishes in its ResourceSlices, and the `ComputeDomain` custom resource.
//!
//! Names, attribute names and attribute types follow NVIDIA's DRA driver (`gpu.nvidia.com` and
//! `compute-domain.nvidia.com`), so that DeviceClasses, ResourceClaims and CEL selectors written
//! for it select the mock GPUs unchanged. The agent publishes and prepares; the controller keeps
//! ComputeDomains (their ResourceClaimTemplate and status); both read the channel configuration
//! the controller writes into the template.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::nvml::{Architecture, Brand};
use crate::{Gpu, NodeTopology};

/// The GPU driver's name: the ResourceSlice's `spec.driver`, the attribute domain of its devices.
pub const GPU_DRIVER: &str = "gpu.nvidia.com";
/// The IMEX channel driver's name.
pub const CHANNEL_DRIVER: &str = "compute-domain.nvidia.com";
/// The DeviceClass of whole GPUs (NVIDIA's chart installs one of this name).
pub const GPU_CLASS: &str = "gpu.nvidia.com";
/// The DeviceClass of a ComputeDomain's channel (channel 0 of the node).
pub const CHANNEL_CLASS: &str = "compute-domain-default-channel.nvidia.com";
/// The CEL selector of [`GPU_CLASS`].
pub const GPU_CLASS_SELECTOR: &str =
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'";
/// The CEL selector of [`CHANNEL_CLASS`].
pub const CHANNEL_CLASS_SELECTOR: &str = "device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0";
/// IMEX channels of a node: `/dev/nvidia-caps-imex-channels/channel0` to `channel2047` (the
/// driver's `ImexChannelCount` parameter).
pub const CHANNEL_COUNT: u32 = 2048;
/// The API group of ComputeDomains and of the channel configuration.
pub const NVIDIA_API: &str = "resource.nvidia.com/v1beta1";
/// The kind of the opaque configuration the channel claim template carries.
pub const CHANNEL_CONFIG_KIND: &str = "ComputeDomainChannelConfig";
/// The finalizer NVIDIA's controller puts on ComputeDomains and their templates.
pub const FINALIZER: &str = "resource.nvidia.com/computeDomain";
/// Label of the objects made for a ComputeDomain: its UID.
pub const DOMAIN_LABEL: &str = "resource.nvidia.com/computeDomain";

/// The device name of a GPU in the slice: `gpu-<minor>`.
pub fn gpu_device_name(gpu: &Gpu) -> String {
    format!("gpu-{}", gpu.minor)
}

/// The device name of channel `id`.
pub fn channel_device_name(id: u32) -> String {
    format!("channel-{id}")
}

/// The name of a node's ResourceSlice of `driver` (one slice per node and driver).
pub fn slice_name(node: &str, driver: &str) -> String {
    format!("{node}-{driver}")
}

/// A version as DRA compares them (semantic versioning, three numbers, no leading zeros):
/// `580.65.06` → `580.65.6`, `9.0` → `9.0.0`. NVIDIA's driver writes its versions so.
pub fn semver(version: &str) -> String {
    let mut parts: Vec<String> = version
        .split('.')
        .map(|p| p.trim_start_matches('0'))
        .map(|p| if p.is_empty() { "0" } else { p }.to_string())
        .collect();
    while parts.len() < 3 {
        parts.push("0".into());
    }
    parts.join(".")
}

/// The architecture's name as NVIDIA's driver publishes it.
pub fn architecture_name(a: Architecture) -> &'static str {
    match a {
        Architecture::Turing => "Turing",
        Architecture::Ampere => "Ampere",
        Architecture::Ada => "Ada Lovelace",
        Architecture::Hopper => "Hopper",
        Architecture::Blackwell => "Blackwell",
    }
}

/// The brand's name as NVIDIA's driver publishes it.
pub fn brand_name(b: Brand) -> &'static str {
    match b {
        Brand::Tesla => "Tesla",
        Brand::Nvidia => "Nvidia",
    }
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn int(i: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i.into()),
        ..Default::default()
    }
}

fn version(v: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(semver(v)),
        ..Default::default()
    }
}

/// One GPU as a device of the `gpu.nvidia.com` slice: NVIDIA's attributes with their names and
/// types, and its memory as capacity (bytes, in binary units).
pub fn gpu_device(topo: &NodeTopology, gpu: &Gpu) -> Device {
    let p = &topo.profile;
    let n = &p.nvml;
    let bus = gpu.bus_id.to_string();
    let attributes = BTreeMap::from([
        ("type".to_string(), string("gpu")),
        ("uuid".into(), string(&gpu.uuid)),
        ("productName".into(), string(&p.model)),
        ("brand".into(), string(brand_name(n.brand))),
        (
            "architecture".into(),
            string(architecture_name(n.architecture)),
        ),
        (
            "cudaComputeCapability".into(),
            version(&format!(
                "{}.{}",
                n.compute_capability.0, n.compute_capability.1
            )),
        ),
        (
            "driverVersion".into(),
            version(&p.driver_version.to_string()),
        ),
        (
            "cudaDriverVersion".into(),
            version(&format!("{}.{}", n.cuda_version.0, n.cuda_version.1)),
        ),
        ("index".into(), int(gpu.index)),
        ("minor".into(), int(gpu.minor)),
        ("pcieBusID".into(), string(&bus)),
        ("resource.kubernetes.io/pciBusID".into(), string(&bus)),
        (
            "resource.kubernetes.io/pcieRoot".into(),
            string(gpu.bus_id.root_complex()),
        ),
        (
            "addressingMode".into(),
            string(if p.coherent_memory { "ATS" } else { "None" }),
        ),
    ]);
    let capacity = BTreeMap::from([(
        "memory".to_string(),
        DeviceCapacity {
            value: Quantity(format!("{}Mi", p.memory_mib)),
            ..Default::default()
        },
    )]);
    Device {
        name: gpu_device_name(gpu),
        attributes: Some(attributes),
        capacity: Some(capacity),
        ..Default::default()
    }
}

/// The node's channel device of the `compute-domain.nvidia.com` slice: channel 0, which a
/// ComputeDomain's claim gets (with `allocationMode: All`, every channel comes with it).
pub fn channel_device() -> Device {
    Device {
        name: channel_device_name(0),
        attributes: Some(BTreeMap::from([
            ("type".to_string(), string("channel")),
            ("id".into(), int(0)),
        ])),
        ..Default::default()
    }
}

/// How many channels a channel claim gets.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum AllocationMode {
    /// Channel 0 only.
    #[default]
    Single,
    /// Every channel of the node (`channel0` to `channel2047`).
    All,
}

impl AllocationMode {
    /// The channel ids a claim of this mode gets.
    pub fn channels(self) -> std::ops::Range<u32> {
        match self {
            AllocationMode::Single => 0..1,
            AllocationMode::All => 0..CHANNEL_COUNT,
        }
    }
}

/// A multi-node NVLink domain whose pods share IMEX channels (NVIDIA's `ComputeDomain`). The
/// controller makes the ResourceClaimTemplate it names and keeps its status.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "resource.nvidia.com",
    version = "v1beta1",
    kind = "ComputeDomain",
    plural = "computedomains",
    singular = "computedomain",
    namespaced,
    status = "ComputeDomainStatus",
    printcolumn = r#"{"name":"Nodes","type":"integer","jsonPath":".spec.numNodes"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::gpunode::kubernetes_formats)]
pub struct ComputeDomainSpec {
    /// Nodes the domain needs before it is `Ready` (0: ready with any).
    pub num_nodes: u32,
    /// The channel claims of the domain's pods.
    pub channel: ComputeDomainChannel,
}

/// The channel part of a ComputeDomain's spec.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainChannel {
    /// The ResourceClaimTemplate the controller makes, in the domain's namespace.
    pub resource_claim_template: TemplateName,
    /// `Single` (channel 0) or `All` (every channel).
    #[serde(default)]
    pub allocation_mode: AllocationMode,
}

/// A ResourceClaimTemplate's name.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
pub struct TemplateName {
    /// The name.
    pub name: String,
}

/// A ComputeDomain's status: the nodes whose pods hold its channels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainStatus {
    /// `Ready` once at least `numNodes` nodes are in and all are ready, else `NotReady`.
    pub status: String,
    /// The nodes.
    #[serde(default)]
    pub nodes: Vec<ComputeDomainNode>,
}

/// One node of a ComputeDomain.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNode {
    /// The node.
    pub name: String,
    /// Its internal address.
    pub ip_address: String,
    /// `<fabric cluster UUID>.<clique id>`, empty off a fabric.
    #[serde(rename = "cliqueID")]
    pub clique_id: String,
    /// The node's index in the domain.
    pub index: i32,
    /// `Ready` or `NotReady`.
    pub status: String,
}

/// `Ready`, as ComputeDomains spell it.
pub const READY: &str = "Ready";
/// `NotReady`.
pub const NOT_READY: &str = "NotReady";

/// The opaque configuration of a channel request: which domain, and how many channels.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ChannelConfig {
    /// `resource.nvidia.com/v1beta1`.
    pub api_version: String,
    /// `ComputeDomainChannelConfig`.
    pub kind: String,
    /// The ComputeDomain's UID.
    #[serde(rename = "domainID")]
    pub domain_id: String,
    /// How many channels.
    #[serde(default)]
    pub allocation_mode: AllocationMode,
}

impl ChannelConfig {
    /// The configuration of `domain_id`'s channels.
    pub fn new(domain_id: &str, allocation_mode: AllocationMode) -> ChannelConfig {
        ChannelConfig {
            api_version: NVIDIA_API.into(),
            kind: CHANNEL_CONFIG_KIND.into(),
            domain_id: domain_id.into(),
            allocation_mode,
        }
    }

    /// Reads the configuration from an opaque configuration's parameters; `None` when they are
    /// of another kind.
    pub fn from_parameters(parameters: &serde_json::Value) -> Option<ChannelConfig> {
        let config: ChannelConfig = serde_json::from_value(parameters.clone()).ok()?;
        (config.kind == CHANNEL_CONFIG_KIND).then_some(config)
    }
}

/// `<fabric cluster UUID>.<clique id>` of a topology, as ComputeDomains list nodes; empty for a
/// profile off an NVLink fabric.
pub fn clique_id(topo: &NodeTopology) -> String {
    topo.profile
        .nvml
        .fabric
        .as_ref()
        .map(|f| format!("{}.{}", f.cluster_uuid, f.clique_id))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Profile;
    use crate::topology::tests::host;

    fn topo(profile: &str) -> NodeTopology {
        let p = Profile::builtin(profile).unwrap();
        NodeTopology::build(&p, "node-a", &host(&[(0, 0..8)], &[(0, 0..8)])).unwrap()
    }

    fn attr<'a>(d: &'a Device, name: &str) -> &'a DeviceAttribute {
        d.attributes.as_ref().unwrap().get(name).unwrap()
    }

    #[test]
    fn versions_are_semantic() {
        assert_eq!(semver("580.65.06"), "580.65.6");
        assert_eq!(semver("9.0"), "9.0.0");
        assert_eq!(semver("10.3"), "10.3.0");
        assert_eq!(semver("570.00.1"), "570.0.1");
    }

    #[test]
    fn a_gb300_gpu_has_nvidias_attributes_with_their_types() {
        let t = topo("gb300");
        let d = gpu_device(&t, &t.gpus[1]);
        assert_eq!(d.name, "gpu-1");
        let s = |n: &str| attr(&d, n).string.clone().unwrap_or_else(|| panic!("{n}"));
        let v = |n: &str| attr(&d, n).version.clone().unwrap_or_else(|| panic!("{n}"));
        assert_eq!(s("type"), "gpu");
        assert_eq!(s("productName"), "NVIDIA GB300");
        assert_eq!(s("brand"), "Nvidia");
        assert_eq!(s("architecture"), "Blackwell");
        assert_eq!(s("uuid"), t.gpus[1].uuid);
        assert_eq!(s("pcieBusID"), "0009:06:00.0");
        assert_eq!(s("resource.kubernetes.io/pcieRoot"), "pci0009:06");
        assert_eq!(s("addressingMode"), "ATS");
        assert_eq!(v("cudaComputeCapability"), "10.3.0");
        assert_eq!(v("driverVersion"), "580.173.2");
        assert_eq!(v("cudaDriverVersion"), "13.0.0");
        assert_eq!(attr(&d, "index").int, Some(1));
        assert_eq!(attr(&d, "minor").int, Some(1));
        let memory = &d.capacity.as_ref().unwrap()["memory"].value;
        assert_eq!(memory.0, "284208Mi");
        // Every attribute carries exactly one value.
        for (name, a) in d.attributes.as_ref().unwrap() {
            let set = [
                a.string.is_some(),
                a.int.is_some(),
                a.bool.is_some(),
                a.version.is_some(),
            ];
            assert_eq!(set.iter().filter(|s| **s).count(), 1, "{name}");
        }
    }

    #[test]
    fn an_older_gpu_names_its_own_architecture_and_brand() {
        let t = topo("t4");
        let d = gpu_device(&t, &t.gpus[0]);
        assert_eq!(attr(&d, "architecture").string.as_deref(), Some("Turing"));
        assert_eq!(
            attr(&d, "cudaComputeCapability").version.as_deref(),
            Some("7.5.0")
        );
        assert_eq!(attr(&d, "addressingMode").string.as_deref(), Some("None"));
        assert_eq!(clique_id(&t), "");
    }

    #[test]
    fn channels_and_their_configuration() {
        assert_eq!(AllocationMode::Single.channels().count(), 1);
        assert_eq!(AllocationMode::All.channels().count(), 2048);
        let c = channel_device();
        assert_eq!(c.name, "channel-0");
        assert_eq!(attr(&c, "type").string.as_deref(), Some("channel"));
        assert_eq!(attr(&c, "id").int, Some(0));
        let json = serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig", "domainID": "u-1", "allocationMode": "All"});
        let config = ChannelConfig::from_parameters(&json).unwrap();
        assert_eq!(config, ChannelConfig::new("u-1", AllocationMode::All));
        assert_eq!(serde_json::to_value(&config).unwrap(), json);
        // Without a mode: Single, as NVIDIA's default.
        let json = serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomainChannelConfig", "domainID": "u-1"});
        let config = ChannelConfig::from_parameters(&json).unwrap();
        assert_eq!(config.allocation_mode, AllocationMode::Single);
        let other = serde_json::json!({"apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig", "domainID": "x"});
        assert_eq!(ChannelConfig::from_parameters(&other), None);
    }

    #[test]
    fn the_fabric_names_the_clique() {
        assert_eq!(
            clique_id(&topo("gb300")),
            "6f3e2b1a-8c4d-4e5f-9a0b-1c2d3e4f5a6b.32766"
        );
    }

    #[test]
    fn the_compute_domain_crd_has_nvidias_names() {
        use kube::CustomResourceExt;
        let crd = ComputeDomain::crd();
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some("computedomains.resource.nvidia.com")
        );
        let yaml = serde_json::to_string(&crd).unwrap();
        for field in [
            "numNodes",
            "resourceClaimTemplate",
            "allocationMode",
            "cliqueID",
            "ipAddress",
        ] {
            assert!(yaml.contains(field), "{field}");
        }
        let cd: ComputeDomain = serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "slurm-compute-domain", "namespace": "slurm"},
            "spec": {"numNodes": 0, "channel": {"allocationMode": "All",
                "resourceClaimTemplate": {"name": "slurm-test-compute-domain"}}}
        }))
        .unwrap();
        assert_eq!(cd.spec.channel.allocation_mode, AllocationMode::All);
        assert_eq!(
            cd.spec.channel.resource_claim_template.name,
            "slurm-test-compute-domain"
        );
    }
}
