//! What the controller keeps of the GpuNodes and pods it watches: only the fields the decision
//! (`plan`) reads. serde skips everything else while decoding, so the GPUs' details, most of a
//! pod, the managed fields and the annotations of thousands of objects are never allocated: a
//! full resync of a large cluster costs a fraction of the full objects' CPU and memory. They are
//! cached in kube-runtime's stores; pods are also indexed by the node they are bound to
//! ([`PodsByNode`]), so that a reconcile looks up only its node's. Nodes are watched as metadata
//! ([`SlimNode`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::core::{Expression, Selector};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use mockgpu_api::gpunode::{Fabric, condition};
use mockgpu_api::{GpuNode, GpuNodeFault, Mode};
use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::labels::NodeLabels;

/// A GpuNode as the controller caches it.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct SlimGpuNode {
    /// Name, UID, resource version (the cache drops it once the watch has read it), generation,
    /// creation and deletion times only.
    #[serde(deserialize_with = "slim_meta")]
    pub metadata: ObjectMeta,
    /// What the node's GPUs are.
    pub spec: SlimSpec,
    /// What the agent and the controller reported.
    #[serde(default)]
    pub status: Option<SlimStatus>,
}

/// The part of `GpuNodeSpec` the decision reads.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SlimSpec {
    /// `mock` or `real`.
    pub mode: Mode,
    /// The profile's name.
    pub profile: String,
    /// The number of GPUs.
    pub gpu_count: u32,
    /// The first GPU's model (`None`: no GPUs).
    #[serde(default, rename = "gpus", deserialize_with = "first_model")]
    pub model: Option<String>,
    /// The clique of the GPUs' NVLink fabric, `<cluster UUID>.<clique id>` (`None`: not on one),
    /// as ComputeDomains list it.
    #[serde(default, rename = "fabric", deserialize_with = "clique")]
    pub clique: Option<Box<str>>,
}

/// The part of `GpuNodeStatus` the decision and the ComputeDomains read.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(from = "RawStatus")]
pub struct SlimStatus {
    /// When the agent last reported.
    pub last_heartbeat: Option<Time>,
    /// When the agent first reported the current topology.
    pub topology_since: Option<Time>,
    /// GPUs held by containers.
    pub held_gpus: u32,
    /// The containers holding GPUs.
    pub pinning: Vec<SlimPinning>,
    /// The faults on the node's GPUs (few: kept whole).
    pub faults: Vec<GpuNodeFault>,
    /// The ComputeDomains (UIDs) whose channels the claims prepared on the node hold, sorted,
    /// each once; the claims themselves are not kept.
    pub domains: Box<[String]>,
    /// The agent's `Ready` condition is `True`.
    pub ready: bool,
    /// The controller's conditions (`Stale`, `Drifted`, `InjectionMissing`, `GPUProblem`); the
    /// agent's are not kept.
    pub conditions: Vec<Condition>,
}

/// `GpuNodeStatus` as decoded before [`SlimStatus`] keeps its part.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawStatus {
    #[serde(default)]
    last_heartbeat: Option<Time>,
    #[serde(default)]
    topology_since: Option<Time>,
    #[serde(default)]
    held_gpus: u32,
    #[serde(default)]
    pinning: Vec<SlimPinning>,
    #[serde(default)]
    faults: Vec<GpuNodeFault>,
    #[serde(default)]
    claims: Option<Vec<ClaimDomain>>,
    #[serde(default)]
    conditions: Option<Vec<Condition>>,
}

/// A prepared claim: only its ComputeDomain (the rest is skipped while decoding).
#[derive(Deserialize)]
struct ClaimDomain {
    #[serde(default)]
    domain: Option<String>,
}

impl From<RawStatus> for SlimStatus {
    fn from(raw: RawStatus) -> Self {
        let mut conditions = raw.conditions.unwrap_or_default();
        let ready = conditions
            .iter()
            .any(|c| c.type_ == condition::READY && c.status == "True");
        conditions.retain(|c| OUR_CONDITIONS.contains(&c.type_.as_str()));
        let claims = raw.claims.into_iter().flatten();
        let mut domains: Vec<String> = claims.filter_map(|c| c.domain).collect();
        domains.sort_unstable();
        domains.dedup();
        SlimStatus {
            last_heartbeat: raw.last_heartbeat,
            topology_since: raw.topology_since,
            held_gpus: raw.held_gpus,
            pinning: raw.pinning,
            faults: raw.faults,
            domains: domains.into_boxed_slice(),
            ready,
            conditions,
        }
    }
}

/// A container holding GPUs, as far as the decision looks at it.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SlimPinning {
    /// The pod's UID.
    pub pod_uid: String,
    /// The container's name.
    pub container: String,
}

/// The condition types the controller sets (the only ones it reads back).
pub const OUR_CONDITIONS: [&str; 4] = [
    condition::STALE,
    condition::DRIFTED,
    condition::INJECTION_MISSING,
    condition::GPU_PROBLEM,
];

/// A Node as the controller watches it: its metadata only (requested as `PartialObjectMetadata`),
/// decoded straight into its name and UID and what labelling decides on; the other labels, the
/// annotations and the managed fields' other fields are skipped.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "RawNode")]
pub struct SlimNode {
    /// Name, UID and resource version (the cache drops it once the watch has read it) only.
    pub metadata: ObjectMeta,
    /// Our labels' values and who owns them.
    pub labels: NodeLabels,
}

/// A pod as the controller watches it: its metadata (name, namespace, UID, resource version,
/// labels, deletion time), the node it is bound to, and what `Drifted`, the Slurm node's name and
/// `InjectionMissing` read. The rest (the managed fields, most of the spec and status) is skipped
/// while decoding. Boxed strings and slices here and below: no spare capacity in thousands.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "RawPod")]
pub struct SlimPod {
    /// Name, namespace, UID, resource version, labels and deletion time only (the cache drops the
    /// resource version once the watch has read it, and the labels once they told
    /// [`slurmd`](Self::slurmd)).
    pub metadata: ObjectMeta,
    /// A slurmd pod (false until the watch tells it).
    pub slurmd: bool,
    /// `spec.nodeName` (`None`: not scheduled yet).
    pub node: Option<String>,
    /// On the host network.
    pub host_network: bool,
    /// `spec.hostname`.
    pub hostname: Option<Box<str>>,
    /// When its containers started: the earliest running container's start, else the pod's.
    pub started: Option<Timestamp>,
    /// The containers (of `spec.containers`) that ask for extended resources.
    pub containers: Box<[SlimContainer]>,
}

impl SlimPod {
    /// Namespace.
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// Name.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// UID.
    pub fn uid(&self) -> &str {
        self.metadata.uid.as_deref().unwrap_or_default()
    }

    /// Being deleted (it has a deletion time).
    pub fn deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }
}

/// Label selector `s` as the API server reads one: comma-separated requirements that must all
/// hold, each `k=v` (or `k==v`), `k!=v`, `k in (v, w)`, `k notin (v, w)`, `k` (set) or `!k`
/// (not set); an empty one selects everything.
pub fn label_selector(s: &str) -> Result<Selector, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                terms.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&s[start..]);
    let mut selector = Selector::default();
    if s.trim().is_empty() {
        return Ok(selector);
    }
    for t in terms {
        let e = requirement(t.trim()).ok_or_else(|| format!("not a label selector: {s:?}"))?;
        selector.extend(e);
    }
    Ok(selector)
}

/// One requirement of a label selector.
fn requirement(t: &str) -> Option<Expression> {
    let token = |w: &str| {
        let w = w.trim();
        (!w.contains(|c: char| c.is_whitespace() || "=!(),<>".contains(c))).then(|| w.to_string())
    };
    let key = |w: &str| token(w).filter(|k| !k.is_empty());
    if let Some(k) = t.strip_prefix('!') {
        return Some(Expression::DoesNotExist(key(k)?));
    }
    if let Some((k, v)) = t.split_once("!=") {
        return Some(Expression::NotEqual(key(k)?, token(v)?));
    }
    if let Some((k, v)) = t.split_once('=') {
        let v = v.strip_prefix('=').unwrap_or(v);
        return Some(Expression::Equal(key(k)?, token(v)?));
    }
    let Some((k, rest)) = t.split_once(char::is_whitespace) else {
        return Some(Expression::Exists(key(t)?));
    };
    let (op, set) = rest.split_once('(')?;
    let values = set.strip_suffix(')')?.split(',').map(token);
    let values = values.collect::<Option<BTreeSet<_>>>()?;
    match op.trim() {
        "in" => Some(Expression::In(key(k)?, values)),
        "notin" => Some(Expression::NotIn(key(k)?, values)),
        _ => None,
    }
}

/// A container asking for extended resources.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlimContainer {
    /// Its name.
    pub name: Box<str>,
    /// The extended resources (names with a domain, such as `nvidia.com/gpu`) its limits or
    /// requests ask a non-zero amount of.
    pub resources: Box<[Box<str>]>,
    /// When it started running (`None`: not running).
    pub running_since: Option<Timestamp>,
}

/// The pods of one watch, by the node they are bound to: kube-runtime's store, and an index of
/// its keys by node kept from the same watch events (applied after the store). A pod is indexed
/// once it is bound (an unscheduled one is of no node's concern) and under that node for good:
/// the API server never changes a bound pod's `spec.nodeName`. Keys the store no longer holds
/// are skipped on lookup; the index is rebuilt from the store at the end of every list. Clones
/// share it.
#[derive(Clone)]
pub struct PodsByNode {
    store: Store<SlimPod>,
    index: Arc<RwLock<HashMap<String, Vec<ObjectRef<SlimPod>>>>>,
}

impl PodsByNode {
    /// An index of the pods in `store`.
    pub fn new(store: Store<SlimPod>) -> Self {
        Self {
            store,
            index: Arc::default(),
        }
    }

    /// Takes in a watch event, once the store has.
    pub fn apply(&self, e: &watcher::Event<SlimPod>) {
        // a poisoned lock's index is still whole: every change is one map operation
        let mut index = self.index.write().unwrap_or_else(|p| p.into_inner());
        match e {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) => insert(&mut index, p),
            watcher::Event::Delete(p) => {
                let Some(node) = &p.node else { return };
                if let Some(keys) = index.get_mut(node) {
                    keys.retain(|k| *k != key(p));
                    if keys.is_empty() {
                        index.remove(node);
                    }
                }
            }
            watcher::Event::Init => {}
            watcher::Event::InitDone => {
                index.clear();
                for p in self.store.state() {
                    insert(&mut index, &p);
                }
            }
        }
    }

    /// The cached pods bound to `node` (a key's pod is looked up by name: one recreated under it
    /// on another node is not this node's).
    pub fn on_node(&self, node: &str) -> Vec<Arc<SlimPod>> {
        let index = self.index.read().unwrap_or_else(|p| p.into_inner());
        index
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|k| self.store.get(k))
            .filter(|p| p.node.as_deref() == Some(node))
            .collect()
    }
}

/// The store's key of `p`.
fn key(p: &SlimPod) -> ObjectRef<SlimPod> {
    ObjectRef::new(p.name()).within(p.namespace())
}

fn insert(index: &mut HashMap<String, Vec<ObjectRef<SlimPod>>>, p: &SlimPod) {
    let Some(node) = &p.node else { return };
    let keys = index.entry(node.clone()).or_default();
    let k = key(p);
    if !keys.contains(&k) {
        // a node has a pod or two here: no spare capacity (a first push would make room for 4)
        keys.reserve_exact(1);
        keys.push(k);
    }
}

/// The metadata fields kept of a watched GpuNode or pod (labels: of a pod only).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    generation: Option<i64>,
    creation_timestamp: Option<Time>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
}

impl From<Meta> for ObjectMeta {
    fn from(m: Meta) -> Self {
        ObjectMeta {
            name: m.name,
            namespace: m.namespace,
            uid: m.uid,
            resource_version: m.resource_version,
            generation: m.generation,
            creation_timestamp: m.creation_timestamp,
            deletion_timestamp: m.deletion_timestamp,
            labels: m.labels,
            ..ObjectMeta::default()
        }
    }
}

/// A GpuNode's metadata (without labels).
fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    let m = Meta::deserialize(d)?;
    Ok(ObjectMeta {
        labels: None,
        ..m.into()
    })
}

/// `spec.fabric`: its clique.
fn clique<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Box<str>>, D::Error> {
    let fabric = Option::<Fabric>::deserialize(d)?;
    Ok(fabric.map(|f| f.clique().into_boxed_str()))
}

/// `spec.gpus`: the first element's `model`; the rest is skipped.
fn first_model<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    #[derive(Deserialize)]
    struct ModelOnly {
        model: String,
    }
    struct First;
    impl<'de> Visitor<'de> for First {
        type Value = Option<String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of GPUs")
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
            let first = seq.next_element::<ModelOnly>()?.map(|g| g.model);
            while seq.next_element::<IgnoredAny>()?.is_some() {}
            Ok(first)
        }
    }
    d.deserialize_any(First)
}

/// A `PartialObjectMetadata` of a Node, as decoded before [`SlimNode`] keeps its part.
#[derive(Deserialize)]
struct RawNode {
    metadata: RawNodeMeta,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawNodeMeta {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    #[serde(default)]
    labels: Option<BTreeMap<String, String>>,
    #[serde(default)]
    managed_fields: Option<Vec<RawOwner>>,
}

/// A managed-fields entry: its manager and operation, and the label keys among its fields.
#[derive(Deserialize)]
struct RawOwner {
    manager: Option<String>,
    operation: Option<String>,
    #[serde(rename = "fieldsV1")]
    fields: Option<RawFields>,
}

#[derive(Deserialize)]
struct RawFields {
    #[serde(rename = "f:metadata")]
    metadata: Option<RawMetaFields>,
}

#[derive(Deserialize)]
struct RawMetaFields {
    #[serde(rename = "f:labels")]
    labels: Option<BTreeMap<String, IgnoredAny>>,
}

impl From<RawNode> for SlimNode {
    fn from(raw: RawNode) -> Self {
        let m = raw.metadata;
        let mut labels = NodeLabels::default();
        for (k, v) in m.labels.iter().flatten() {
            labels.observe_label(k, v);
        }
        for o in m.managed_fields.iter().flatten() {
            let keys = o
                .fields
                .as_ref()
                .and_then(|f| f.metadata.as_ref()?.labels.as_ref())
                .into_iter()
                .flat_map(BTreeMap::keys)
                .filter_map(|k| k.strip_prefix("f:"));
            for key in keys {
                labels.observe_owner(o.manager.as_deref(), o.operation.as_deref(), key);
            }
        }
        SlimNode {
            metadata: ObjectMeta {
                name: m.name,
                uid: m.uid,
                resource_version: m.resource_version,
                ..ObjectMeta::default()
            },
            labels,
        }
    }
}

/// A pod as decoded before [`SlimPod`] keeps its part.
#[derive(Deserialize)]
struct RawPod {
    metadata: Meta,
    #[serde(default)]
    spec: Option<RawPodSpec>,
    #[serde(default)]
    status: Option<RawPodStatus>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPodSpec {
    node_name: Option<String>,
    host_network: Option<bool>,
    hostname: Option<String>,
    #[serde(default)]
    containers: Vec<RawContainer>,
}

#[derive(Deserialize)]
struct RawContainer {
    name: String,
    #[serde(default)]
    resources: Option<RawResources>,
}

#[derive(Deserialize)]
struct RawResources {
    #[serde(default)]
    limits: Option<BTreeMap<String, Quantity>>,
    #[serde(default)]
    requests: Option<BTreeMap<String, Quantity>>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawPodStatus {
    start_time: Option<Time>,
    #[serde(default)]
    container_statuses: Option<Vec<RawContainerStatus>>,
}

#[derive(Deserialize)]
struct RawContainerStatus {
    name: String,
    #[serde(default)]
    state: Option<RawContainerState>,
}

#[derive(Deserialize)]
struct RawContainerState {
    #[serde(default)]
    running: Option<RawRunning>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRunning {
    started_at: Option<Time>,
}

impl RawContainerStatus {
    fn running_since(&self) -> Option<Timestamp> {
        Some(
            self.state
                .as_ref()?
                .running
                .as_ref()?
                .started_at
                .as_ref()?
                .0,
        )
    }
}

impl From<RawPod> for SlimPod {
    fn from(raw: RawPod) -> Self {
        let m = raw.metadata.into();
        let spec = raw.spec.unwrap_or_default();
        let status = raw.status.unwrap_or_default();
        let statuses = status.container_statuses.unwrap_or_default();
        let started = statuses
            .iter()
            .filter_map(RawContainerStatus::running_since)
            .min()
            .or(status.start_time.map(|t| t.0));
        let containers = spec
            .containers
            .into_iter()
            .filter_map(|c| {
                let r = c.resources?;
                let mut resources: Vec<Box<str>> = [r.limits, r.requests]
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|(name, q)| name.contains('/') && q.0 != "0")
                    .map(|(name, _)| name.into())
                    .collect();
                resources.sort_unstable();
                resources.dedup();
                (!resources.is_empty()).then(|| SlimContainer {
                    running_since: statuses
                        .iter()
                        .find(|s| s.name == c.name)
                        .and_then(RawContainerStatus::running_since),
                    name: c.name.into(),
                    resources: resources.into(),
                })
            })
            .collect::<Vec<_>>()
            .into();
        SlimPod {
            metadata: m,
            slurmd: false,
            node: spec.node_name,
            host_network: spec.host_network.unwrap_or(false),
            hostname: spec.hostname.map(String::into_boxed_str),
            started,
            containers,
        }
    }
}

/// `Resource` for `$slim`, a slim form of `$full`: the same kind, group, version and plural;
/// requested as metadata only if `$metadata`.
macro_rules! resource_of {
    ($slim:ty, $full:ty, $metadata:literal) => {
        impl Resource for $slim {
            type DynamicType = ();
            type Scope = <$full as Resource>::Scope;

            fn kind(dt: &()) -> Cow<'_, str> {
                <$full>::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                <$full>::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                <$full>::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                <$full>::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
            fn metadata_api() -> bool {
                $metadata
            }
        }
    };
}

resource_of!(SlimGpuNode, GpuNode, false);
resource_of!(SlimNode, Node, true);
resource_of!(SlimPod, Pod, false);

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::jiff::Timestamp;
    use mockgpu_api::{GpuNodeGpu, GpuNodeSpec, GpuNodeStatus, Pinning, PreparedClaim};
    use serde_json::json;

    use super::*;

    /// `g` as the controller caches it (through its JSON, as from the API server).
    pub(crate) fn slim(g: &GpuNode) -> SlimGpuNode {
        serde_json::from_value(serde_json::to_value(g).unwrap()).unwrap()
    }

    /// `p` as the controller watches it (through its JSON, as from the API server).
    pub(crate) fn slim_pod(p: &Pod) -> SlimPod {
        serde_json::from_value(serde_json::to_value(p).unwrap()).unwrap()
    }

    fn gpu(minor: u32, model: &str) -> GpuNodeGpu {
        GpuNodeGpu {
            index: minor,
            minor,
            uuid: format!("GPU-{minor}"),
            bus_id: format!("0000:0{minor}:00.0"),
            model: model.into(),
            memory_mib: Some(1),
            numa_node: 0,
            local_cpulist: "0-7".into(),
            socket: 0,
        }
    }

    fn cond(kind: &str) -> Condition {
        Condition {
            type_: kind.into(),
            status: "True".into(),
            reason: "R".into(),
            message: "m".into(),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
            observed_generation: Some(2),
        }
    }

    #[test]
    fn a_gpunode_keeps_what_the_decision_reads() {
        let mut g = GpuNode::new(
            "node-a",
            GpuNodeSpec::new(
                "node-a",
                Mode::Mock,
                "h100",
                vec![gpu(0, "NVIDIA H100"), gpu(1, "other")],
            ),
        );
        g.metadata.uid = Some("u".into());
        g.metadata.generation = Some(2);
        g.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        g.metadata.managed_fields = Some(vec![Default::default()]);
        g.spec.fabric = Some(Fabric {
            cluster_uuid: "c".into(),
            clique_id: "1".into(),
        });
        let claim = |domain: Option<&str>| PreparedClaim {
            namespace: "ns".into(),
            name: "claim".into(),
            uid: "cu".into(),
            driver: "compute-domain.nvidia.com".into(),
            devices: vec!["channel-0".into()],
            gpus: Vec::new(),
            domain: domain.map(str::to_string),
            channels: Some(1),
        };
        g.status = Some(GpuNodeStatus {
            held_gpus: 1,
            last_heartbeat: Some(Time(Timestamp::UNIX_EPOCH)),
            pinning: vec![Pinning {
                namespace: "ns".into(),
                pod: "p".into(),
                pod_uid: "pu".into(),
                container: "c".into(),
                gpus: vec!["GPU-0".into()],
                since: Time(Timestamp::UNIX_EPOCH),
            }],
            claims: vec![
                claim(Some("d2")),
                claim(None),
                claim(Some("d1")),
                claim(Some("d2")),
            ],
            conditions: vec![cond(condition::READY), cond(condition::STALE)],
            ..Default::default()
        });
        let s = slim(&g);
        assert_eq!(s.metadata.name.as_deref(), Some("node-a"));
        assert_eq!(s.metadata.uid.as_deref(), Some("u"));
        assert_eq!(s.metadata.generation, Some(2));
        assert_eq!((s.metadata.labels, s.metadata.managed_fields), (None, None));
        assert_eq!(
            s.spec,
            SlimSpec {
                mode: Mode::Mock,
                profile: "h100".into(),
                gpu_count: 2,
                model: Some("NVIDIA H100".into()),
                clique: Some("c.1".into()),
            }
        );
        let st = s.status.unwrap();
        assert_eq!(st.held_gpus, 1);
        assert_eq!(st.last_heartbeat, Some(Time(Timestamp::UNIX_EPOCH)));
        assert_eq!(
            st.pinning,
            [SlimPinning {
                pod_uid: "pu".into(),
                container: "c".into()
            }]
        );
        // the agent's Ready is kept as a flag only, the claims as their domains
        assert_eq!(st.conditions, [cond(condition::STALE)]);
        assert!(st.ready);
        assert_eq!(*st.domains, ["d1", "d2"]);
        // no GPUs, no status
        let empty: SlimGpuNode = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"mode": "real", "profile": "real", "gpuCount": 0, "gpus": []},
        }))
        .unwrap();
        assert_eq!((empty.spec.model, empty.status), (None, None));
        // an agent not (yet) Ready, conditions and claims null
        let unready: SlimGpuNode = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"mode": "mock", "profile": "gb300", "gpuCount": 0, "gpus": []},
            "status": {"claims": null, "conditions": [
                {"type": "Ready", "status": "False", "reason": "R", "message": "m",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}]},
        }))
        .unwrap();
        let st = unready.status.unwrap();
        assert!(!st.ready && st.domains.is_empty() && st.conditions.is_empty());
        let null: SlimGpuNode = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"mode": "mock", "profile": "gb300", "gpuCount": 0, "gpus": []},
            "status": {"conditions": null},
        }))
        .unwrap();
        assert!(!null.status.unwrap().ready);
    }

    /// The slim types are requested where the full ones are.
    #[test]
    fn the_slim_types_are_the_same_resources() {
        assert_eq!(
            SlimGpuNode::url_path(&(), None),
            GpuNode::url_path(&(), None)
        );
        assert_eq!(
            SlimPod::url_path(&(), Some("ns")),
            Pod::url_path(&(), Some("ns"))
        );
        assert_eq!(SlimNode::url_path(&(), None), Node::url_path(&(), None));
        assert!(!SlimPod::metadata_api());
        assert!(!SlimGpuNode::metadata_api());
        assert!(SlimNode::metadata_api());
    }

    /// A slurmd pod as the API server sends a Slinky NodeSet's: managed fields, an init
    /// container, a sidecar, volumes, probes, conditions; of its two containers the slurmd asks for
    /// GPUs (and CPUs and memory), the sidecar for none.
    fn slurmd_json() -> serde_json::Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "slurm-worker-gpu-0", "namespace": "slurm", "uid": "pu-1",
                "resourceVersion": "42", "generation": 1,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"app.kubernetes.io/name": "slurmd", "controller-revision-hash": "x"},
                "annotations": {"kubectl.kubernetes.io/default-container": "slurmd"},
                "ownerReferences": [{"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                    "name": "slurm-worker-gpu", "uid": "ns-1", "controller": true}],
                "managedFields": [{"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
                    "time": "2026-01-01T00:00:05Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}}}, "subresource": "status"}],
            },
            "spec": {
                "nodeName": "node-a", "hostname": "gpu-0", "subdomain": "slurm-worker",
                "serviceAccountName": "default",
                "initContainers": [{"name": "init", "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                "containers": [
                    {"name": "slurmd", "image": "ghcr.io/slinkyproject/slurmd:24.11",
                     "args": ["-Z"], "env": [{"name": "X", "value": "y"}],
                     "securityContext": {"privileged": true},
                     "readinessProbe": {"exec": {"command": ["true"]}},
                     "resources": {
                         "limits": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "8",
                                    "example.com/nic": "0"},
                         "requests": {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "8",
                                      "example.com/fpga": "1"}}},
                    {"name": "logs", "image": "busybox",
                     "resources": {"limits": {"cpu": "100m"}}},
                ],
                "volumes": [{"name": "etc", "configMap": {"name": "slurm-config"}}],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            },
            "status": {
                "phase": "Running", "hostIP": "10.0.0.1", "podIP": "10.1.0.5",
                "startTime": "2026-01-01T00:00:01Z",
                "conditions": [{"type": "Ready", "status": "True",
                    "lastTransitionTime": "2026-01-01T00:00:09Z"}],
                "initContainerStatuses": [{"name": "init", "ready": false, "restartCount": 0,
                    "image": "busybox", "imageID": "sha256:1",
                    "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
                "containerStatuses": [
                    {"name": "slurmd", "ready": true, "restartCount": 1, "image": "slurmd",
                     "imageID": "sha256:2", "containerID": "containerd://a",
                     "state": {"running": {"startedAt": "2026-01-01T00:00:08Z"}},
                     "lastState": {"terminated": {"exitCode": 1,
                         "startedAt": "2026-01-01T00:00:02Z"}}},
                    {"name": "logs", "ready": true, "restartCount": 0, "image": "busybox",
                     "imageID": "sha256:1",
                     "state": {"running": {"startedAt": "2026-01-01T00:00:06Z"}}},
                ],
            },
        })
    }

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn a_pod_keeps_what_the_decision_reads() {
        let p: SlimPod = serde_json::from_value(slurmd_json()).unwrap();
        assert_eq!(p.node.as_deref(), Some("node-a"));
        let m = &p.metadata;
        assert_eq!(
            (
                m.name.as_deref(),
                m.namespace.as_deref(),
                m.uid.as_deref(),
                m.resource_version.as_deref()
            ),
            (
                Some("slurm-worker-gpu-0"),
                Some("slurm"),
                Some("pu-1"),
                Some("42")
            )
        );
        // the labels are kept until the watch has told a slurmd pod by them
        let labels = m.labels.iter().flatten().map(|(k, _)| k.as_str());
        assert_eq!(
            labels.collect::<Vec<_>>(),
            ["app.kubernetes.io/name", "controller-revision-hash"]
        );
        assert_eq!((&m.managed_fields, p.slurmd), (&None, false));
        assert_eq!(
            (p.namespace(), p.name(), p.uid()),
            ("slurm", "slurm-worker-gpu-0", "pu-1")
        );
        assert_eq!(
            (
                p.deleting(),
                p.host_network,
                p.hostname.as_deref(),
                p.started
            ),
            (
                false,
                false,
                Some("gpu-0"),
                // the sidecar's start: the earliest running container's
                Some(at("2026-01-01T00:00:06Z"))
            )
        );
        assert_eq!(
            *p.containers,
            // not the init container, nor the sidecar; no CPUs, no memory, no zero amounts
            [SlimContainer {
                name: "slurmd".into(),
                resources: ["example.com/fpga".into(), "nvidia.com/gpu".into()].into(),
                running_since: Some(at("2026-01-01T00:00:08Z")),
            }]
        );
    }

    #[test]
    fn label_selectors_select_as_the_api_servers() {
        use kube::core::SelectorExt;
        let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let slurmd = labels(&[("app.kubernetes.io/name", "slurmd"), ("tier", "gpu")]);
        let other = labels(&[("app.kubernetes.io/name", "nginx")]);
        for (s, on_slurmd, on_other) in [
            ("app.kubernetes.io/name=slurmd", true, false),
            ("app.kubernetes.io/name==slurmd", true, false),
            ("app.kubernetes.io/name!=slurmd", false, true),
            (
                "app.kubernetes.io/name in (slurmd, nginx),tier",
                true,
                false,
            ),
            ("app.kubernetes.io/name notin (slurmd), !tier", false, true),
            ("tier in (gpu)", true, false),
            ("", true, true),
        ] {
            let sel = label_selector(s).unwrap();
            assert_eq!(
                (sel.matches(&slurmd), sel.matches(&other)),
                (on_slurmd, on_other),
                "{s}"
            );
        }
        for bad in ["a in b", "a>1", "=b", "a=b=c", "a,", "a in (b", "x y"] {
            assert!(label_selector(bad).is_err(), "{bad}");
        }
    }

    /// A pod not running yet: the pod's start, a container not running; a pod being deleted on
    /// the host network; a bare pod (no spec, no status).
    #[test]
    fn a_pod_before_and_after_it_runs() {
        let mut j = slurmd_json();
        j["status"] = json!({"phase": "Pending", "startTime": "2026-01-01T00:00:01Z",
            "containerStatuses": [{"name": "slurmd", "state": {"waiting": {"reason": "x"}}}]});
        j["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        j["spec"]["hostNetwork"] = json!(true);
        let p: SlimPod = serde_json::from_value(j).unwrap();
        assert_eq!(p.started, Some(at("2026-01-01T00:00:01Z")));
        assert_eq!(p.containers[0].running_since, None);
        assert!(p.deleting() && p.host_network);
        let bare: SlimPod =
            serde_json::from_value(json!({"metadata": {"name": "b", "namespace": "n"}})).unwrap();
        assert_eq!((bare.node, bare.started), (None, None));
        assert!(bare.containers.is_empty());
    }

    /// A pod of `uid` on `node` (`None`: unscheduled), named after its UID.
    fn pod_on(uid: &str, node: Option<&str>, hostname: &str) -> SlimPod {
        let mut j = json!({
            "metadata": {"name": uid, "namespace": "slurm", "uid": uid, "resourceVersion": "1"},
            "spec": {"hostname": hostname, "containers": []},
        });
        if let Some(n) = node {
            j["spec"]["nodeName"] = json!(n);
        }
        serde_json::from_value(j).unwrap()
    }

    /// The pod index follows the watch: applies (a pod bound later is found on its node then),
    /// updates, deletions, and a relist that replaces it at its end, dropping the pods it lacks.
    #[test]
    fn the_pod_cache_follows_the_watch() {
        use watcher::Event::*;
        let (store, mut writer) = kube::runtime::reflector::store();
        let index = PodsByNode::new(store);
        let mut apply = |e: &watcher::Event<SlimPod>| {
            writer.apply_watcher_event(e);
            index.apply(e);
        };
        // (uid, hostname) of the pods on `node`
        let on = |node: &str| -> Vec<(Box<str>, Option<Box<str>>)> {
            let mut v: Vec<_> = index
                .on_node(node)
                .iter()
                .map(|p| (p.uid().into(), p.hostname.clone()))
                .collect();
            v.sort();
            v
        };
        let ids = |v: &[(&str, &str)]| -> Vec<(Box<str>, Option<Box<str>>)> {
            v.iter()
                .map(|(u, h)| ((*u).into(), Some((*h).into())))
                .collect()
        };
        for e in [
            Init,
            InitApply(pod_on("a", Some("n1"), "h")),
            InitApply(pod_on("b", Some("n1"), "h")),
            InitApply(pod_on("c", Some("n2"), "h")),
            InitApply(pod_on("p", None, "h")),
            InitDone,
        ] {
            apply(&e);
        }
        assert_eq!(on("n1"), ids(&[("a", "h"), ("b", "h")]));
        assert_eq!(on("n2"), ids(&[("c", "h")]));
        // the unscheduled pod is bound: found on its node from then on
        apply(&Apply(pod_on("p", Some("n2"), "h")));
        assert_eq!(on("n2"), ids(&[("c", "h"), ("p", "h")]));
        // an update replaces the pod's entry
        apply(&Apply(pod_on("a", Some("n1"), "h2")));
        assert_eq!(on("n1"), ids(&[("a", "h2"), ("b", "h")]));
        apply(&Delete(pod_on("b", Some("n1"), "h")));
        apply(&Delete(pod_on("c", Some("n2"), "h")));
        assert_eq!(on("n1"), ids(&[("a", "h2")]));
        assert_eq!(on("n2"), ids(&[("p", "h")]));
        // deleting an unscheduled or unknown pod changes nothing
        apply(&Delete(pod_on("q", None, "h")));
        apply(&Delete(pod_on("r", Some("n1"), "h")));
        assert_eq!(on("n1"), ids(&[("a", "h2")]));
        // a relist: the old entries stay until it is done, then only the listed ones are left
        apply(&Init);
        apply(&InitApply(pod_on("d", Some("n1"), "h")));
        assert_eq!(on("n1"), ids(&[("a", "h2")]));
        apply(&InitDone);
        assert_eq!(on("n1"), ids(&[("d", "h")]));
        assert_eq!(on("n2"), []);
    }

    /// A pod recreated under its name on another node (its deletion not seen yet) is that node's
    /// only.
    #[test]
    fn a_pod_recreated_on_another_node_is_only_that_nodes() {
        let (store, mut writer) = kube::runtime::reflector::store();
        let index = PodsByNode::new(store);
        let mut moved = pod_on("a", Some("n2"), "h");
        moved.metadata.uid = Some("a2".into());
        for e in [
            watcher::Event::Init,
            watcher::Event::InitApply(pod_on("a", Some("n1"), "h")),
            watcher::Event::InitDone,
            watcher::Event::Apply(moved),
        ] {
            writer.apply_watcher_event(&e);
            index.apply(&e);
        }
        let uids = |node: &str| -> Vec<String> {
            index
                .on_node(node)
                .iter()
                .map(|p| p.uid().to_string())
                .collect()
        };
        assert_eq!((uids("n1"), uids("n2")), (vec![], vec!["a2".to_string()]));
    }
}
