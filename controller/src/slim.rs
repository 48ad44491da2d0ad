//! What the controller keeps of the GpuNodes and pods it watches: only the fields the decision
//! (`plan`) reads. serde skips everything else while decoding, so the GPUs' details, most of a
//! pod, the managed fields and the annotations of thousands of objects are never allocated: a
//! full resync of a large cluster costs a fraction of the full objects' CPU and memory. They are
//! cached in kube-runtime's stores; pods are also indexed by the node they are bound to
//! ([`PodsByNode`]), so that a reconcile looks up only its node's. (Nodes are watched as
//! metadata, trimmed by `labels::trim`.)

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use mockgpu_api::gpunode::condition;
use mockgpu_api::{GpuNode, Mode};
use serde::de::{IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

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
}

/// The part of `GpuNodeStatus` the decision reads.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SlimStatus {
    /// When the agent last reported.
    #[serde(default)]
    pub last_heartbeat: Option<Time>,
    /// When the agent first reported the current topology.
    #[serde(default)]
    pub topology_since: Option<Time>,
    /// GPUs held by containers.
    #[serde(default)]
    pub held_gpus: u32,
    /// The containers holding GPUs.
    #[serde(default)]
    pub pinning: Vec<SlimPinning>,
    /// The controller's conditions (`Stale`, `Drifted`, `InjectionMissing`); the agent's are not
    /// kept.
    #[serde(default, deserialize_with = "our_conditions")]
    pub conditions: Vec<Condition>,
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
pub const OUR_CONDITIONS: [&str; 3] = [
    condition::STALE,
    condition::DRIFTED,
    condition::INJECTION_MISSING,
];

/// A pod as the controller watches it: its metadata (name, namespace, UID, resource version,
/// deletion time), the node it is bound to, and what `Drifted`, the Slurm node's name and
/// `InjectionMissing` read. The rest (the managed fields, most of the spec and status) is skipped
/// while decoding. Boxed strings and slices here and below: no spare capacity in thousands.
#[derive(Clone, Debug, Deserialize)]
#[serde(from = "RawPod")]
pub struct SlimPod {
    /// Name, namespace, UID, resource version and deletion time only.
    pub metadata: ObjectMeta,
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
        keys.push(k);
    }
}

/// The metadata fields kept of every cached object.
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
            ..ObjectMeta::default()
        }
    }
}

fn slim_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    Meta::deserialize(d).map(ObjectMeta::from)
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

fn our_conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Condition>, D::Error> {
    let mut all = Option::<Vec<Condition>>::deserialize(d)?.unwrap_or_default();
    all.retain(|c| OUR_CONDITIONS.contains(&c.type_.as_str()));
    Ok(all)
}

/// A pod as decoded before [`SlimPod`] keeps its part.
#[derive(Deserialize)]
struct RawPod {
    #[serde(deserialize_with = "slim_meta")]
    metadata: ObjectMeta,
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
        let m = raw.metadata;
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
            node: spec.node_name,
            host_network: spec.host_network.unwrap_or(false),
            hostname: spec.hostname.map(String::into_boxed_str),
            started,
            containers,
        }
    }
}

/// `Resource` for `$slim`, a slim form of `$full`: the same kind, group, version and plural.
macro_rules! resource_of {
    ($slim:ty, $full:ty) => {
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
        }
    };
}

resource_of!(SlimGpuNode, GpuNode);
resource_of!(SlimPod, Pod);

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::jiff::Timestamp;
    use mockgpu_api::{GpuNodeGpu, GpuNodeSpec, GpuNodeStatus, Pinning};
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
        // the agent's Ready is not kept
        assert_eq!(st.conditions, [cond(condition::STALE)]);
        // no GPUs, no status
        let empty: SlimGpuNode = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"mode": "real", "profile": "real", "gpuCount": 0, "gpus": []},
        }))
        .unwrap();
        assert_eq!((empty.spec.model, empty.status), (None, None));
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
        assert!(!SlimPod::metadata_api());
        assert!(!SlimGpuNode::metadata_api());
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
        assert_eq!((&m.labels, &m.managed_fields), (&None, &None));
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
