//! What the controller keeps of the objects it watches: only the fields the decision (`plan`)
//! reads. serde skips everything else while decoding, so the GPUs' details, the managed fields
//! and the annotations of thousands of objects are never allocated: a full resync of a large
//! cluster costs a fraction of the full objects' CPU and memory.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use kube::Resource;
use kube::runtime::watcher;
use mockgpu_api::gpunode::condition;
use mockgpu_api::{GpuNode, Mode};
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
    /// The controller's conditions (`Stale`, `Drifted`, `InjectionMissing`), reduced to what
    /// telling a change needs; the agent's are not kept.
    #[serde(default, deserialize_with = "our_conditions")]
    pub conditions: Vec<SeenCondition>,
}

/// A condition of ours as the cache keeps it: its type and status, when the status last
/// changed, and a digest of everything a change is told by (status, reason, message, observed
/// generation). Compared with the condition the decision would write, it says whether that write
/// would change anything; the strings themselves are never needed again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeenCondition {
    /// One of [`OUR_CONDITIONS`].
    pub type_: &'static str,
    /// `True`, `False` or `Unknown` (`None`: anything else).
    pub status: Option<&'static str>,
    /// When the status last changed.
    pub last_transition_time: Time,
    /// [`SeenCondition::digest`] of the condition.
    pub digest: u64,
}

impl SeenCondition {
    /// `c` as the cache keeps it, if it is one of ours.
    pub fn of(c: &Condition) -> Option<Self> {
        let type_ = OUR_CONDITIONS.into_iter().find(|t| *t == c.type_)?;
        Some(Self {
            type_,
            status: ["True", "False", "Unknown"]
                .into_iter()
                .find(|s| *s == c.status),
            last_transition_time: c.last_transition_time.clone(),
            digest: Self::digest(c),
        })
    }

    /// What a change of `c` is told by (all but its type and transition time), hashed. Digests
    /// are only compared within one process.
    pub fn digest(c: &Condition) -> u64 {
        let mut h = DefaultHasher::new();
        (&c.status, &c.reason, &c.message, c.observed_generation).hash(&mut h);
        h.finish()
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
pub const OUR_CONDITIONS: [&str; 3] = [
    condition::STALE,
    condition::DRIFTED,
    condition::INJECTION_MISSING,
];

/// A Node's metadata as the controller watches it (fetched as `PartialObjectMetadata`): name, UID
/// and resource version, and of its labels and managed fields only what labelling decides on.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(from = "RawNode")]
pub struct SlimNode {
    /// Name, UID and resource version only.
    pub metadata: ObjectMeta,
    /// Our labels' values and who owns them.
    pub labels: NodeLabels,
}

/// What the Node cache keeps of a Node.
#[derive(Clone, Debug, PartialEq)]
pub struct CachedNode {
    /// The Node's UID (for Events about it).
    pub uid: Option<String>,
    /// Our labels' values and who owns them.
    pub labels: NodeLabels,
}

/// The Node cache, by name: filled from the Node watch's events as kube-runtime's reflector fills
/// a store (a list replaces the whole cache at its end), but keeping only a [`CachedNode`] of
/// each, not an object with its metadata. Clones share it.
#[derive(Clone, Debug, Default)]
pub struct NodeCache(Arc<RwLock<Nodes>>);

#[derive(Debug, Default)]
struct Nodes {
    by_name: HashMap<String, Arc<CachedNode>>,
    /// A list in progress.
    listing: Option<HashMap<String, Arc<CachedNode>>>,
}

impl NodeCache {
    /// Applies a watch event of the Nodes.
    pub fn apply(&self, e: &watcher::Event<SlimNode>) {
        let entry = |n: &SlimNode| {
            let cached = CachedNode {
                uid: n.metadata.uid.clone(),
                labels: n.labels.clone(),
            };
            (
                n.metadata.name.clone().unwrap_or_default(),
                Arc::new(cached),
            )
        };
        let mut nodes = self.0.write().unwrap_or_else(|p| p.into_inner());
        match e {
            watcher::Event::Apply(n) => {
                let (name, node) = entry(n);
                nodes.by_name.insert(name, node);
            }
            watcher::Event::Delete(n) => {
                nodes
                    .by_name
                    .remove(n.metadata.name.as_deref().unwrap_or_default());
            }
            watcher::Event::Init => nodes.listing = Some(HashMap::new()),
            watcher::Event::InitApply(n) => {
                let (name, node) = entry(n);
                nodes.listing.get_or_insert_default().insert(name, node);
            }
            watcher::Event::InitDone => {
                nodes.by_name = nodes.listing.take().unwrap_or_default();
            }
        }
    }

    /// Node `name`, if cached.
    pub fn get(&self, name: &str) -> Option<Arc<CachedNode>> {
        let nodes = self.0.read().unwrap_or_else(|p| p.into_inner());
        nodes.by_name.get(name).cloned()
    }

    /// The names of the cached Nodes that `pick` picks.
    pub fn names(&self, mut pick: impl FnMut(&str, &CachedNode) -> bool) -> Vec<String> {
        let nodes = self.0.read().unwrap_or_else(|p| p.into_inner());
        nodes
            .by_name
            .iter()
            .filter(|(name, n)| pick(name, n))
            .map(|(name, _)| name.clone())
            .collect()
    }
}

/// The metadata fields kept of every cached object.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
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

fn our_conditions<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<SeenCondition>, D::Error> {
    let all = Option::<Vec<Condition>>::deserialize(d)?.unwrap_or_default();
    Ok(all.iter().filter_map(SeenCondition::of).collect())
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
                .flat_map(|l| l.keys())
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

/// `Resource` for `$slim`, a slim form of `$full`: the same kind, group, version and plural.
macro_rules! resource_of {
    ($slim:ty, $full:ty, metadata_api: $metadata_api:expr) => {
        impl Resource for $slim {
            type DynamicType = ();
            type Scope = <$full as Resource>::Scope;

            fn metadata_api() -> bool {
                $metadata_api
            }
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

resource_of!(SlimGpuNode, GpuNode, metadata_api: false);
// metadata only (`PartialObjectMetadata`): the API server sends no spec or status
resource_of!(SlimNode, Node, metadata_api: true);

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::jiff::Timestamp;
    use mockgpu_api::gpunode::AGENT_MANAGER;
    use mockgpu_api::{GpuNodeGpu, GpuNodeSpec, GpuNodeStatus, Pinning};
    use serde_json::json;

    use super::*;
    use crate::labels::{GPU_COUNT, PCI_NVIDIA, PROFILE};

    /// `g` as the controller caches it (through its JSON, as from the API server).
    pub(crate) fn slim(g: &GpuNode) -> SlimGpuNode {
        serde_json::from_value(serde_json::to_value(g).unwrap()).unwrap()
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
        assert_eq!(
            st.conditions,
            [SeenCondition {
                type_: condition::STALE,
                status: Some("True"),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                digest: SeenCondition::digest(&cond(condition::STALE)),
            }]
        );
        // no GPUs, no status
        let empty: SlimGpuNode = serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"mode": "real", "profile": "real", "gpuCount": 0, "gpus": []},
        }))
        .unwrap();
        assert_eq!((empty.spec.model, empty.status), (None, None));
    }

    /// The slim types are requested where the full ones are; Nodes as metadata only.
    #[test]
    fn the_slim_types_are_the_same_resources() {
        assert_eq!(
            SlimGpuNode::url_path(&(), None),
            GpuNode::url_path(&(), None)
        );
        assert_eq!(SlimNode::url_path(&(), None), Node::url_path(&(), None));
        assert_eq!(SlimNode::kind(&()), "Node");
        assert!(SlimNode::metadata_api() && !SlimGpuNode::metadata_api());
    }

    /// The digest tells every change but the transition time's; an odd status is kept as none.
    #[test]
    fn a_condition_digest_tells_what_changed() {
        let c = cond(condition::DRIFTED);
        let same = Condition {
            last_transition_time: Time(Timestamp::from_second(1).unwrap()),
            ..c.clone()
        };
        assert_eq!(SeenCondition::digest(&same), SeenCondition::digest(&c));
        let changes = [
            Condition {
                status: "False".into(),
                ..c.clone()
            },
            Condition {
                reason: "Other".into(),
                ..c.clone()
            },
            Condition {
                message: "m2".into(),
                ..c.clone()
            },
            Condition {
                observed_generation: Some(3),
                ..c.clone()
            },
        ];
        for changed in &changes {
            assert_ne!(
                SeenCondition::digest(changed),
                SeenCondition::digest(&c),
                "{changed:?}"
            );
        }
        let odd = Condition {
            status: "Maybe".into(),
            ..c.clone()
        };
        assert_eq!(SeenCondition::of(&odd).unwrap().status, None);
        assert_eq!(SeenCondition::of(&cond(condition::READY)), None);
    }

    /// A Node's metadata as the API server sends it: the kubelet's labels, ours, and the
    /// managed fields of both (with fields that are not labels).
    pub(crate) fn node_json(owners: &[(&str, &str, &[&str])], labels: &[(&str, &str)]) -> SlimNode {
        let managed: Vec<_> = owners
            .iter()
            .map(|(manager, operation, keys)| {
                let labels: serde_json::Map<_, _> =
                    keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
                json!({
                    "manager": manager, "operation": operation, "apiVersion": "v1",
                    "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:labels": labels, "f:annotations": {"f:x": {}}},
                        "f:status": {"f:conditions": {}},
                    },
                })
            })
            .collect();
        let labels: serde_json::Map<_, _> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "node-a", "uid": "nu", "resourceVersion": "7",
                "labels": labels, "annotations": {"x": "y"}, "managedFields": managed,
            },
        }))
        .unwrap()
    }

    /// The cache follows the watch: applies, deletions, and a list that replaces it at its end.
    #[test]
    fn the_node_cache_follows_the_watch() {
        use watcher::Event::*;
        let n = |name: &str, profile: &str| {
            let mut n = node_json(&[], &[(PROFILE, profile)]);
            n.metadata.name = Some(name.into());
            n
        };
        let cache = NodeCache::default();
        let profile = |name: &str| cache.get(name).map(|c| c.labels.has(PROFILE, "b"));
        for e in [
            Init,
            InitApply(n("x", "a")),
            InitApply(n("y", "a")),
            InitDone,
        ] {
            cache.apply(&e);
        }
        assert_eq!(cache.get("x").unwrap().uid.as_deref(), Some("nu"));
        cache.apply(&Apply(n("x", "b")));
        assert_eq!((profile("x"), profile("y")), (Some(true), Some(false)));
        cache.apply(&Delete(n("y", "a")));
        assert_eq!(profile("y"), None);
        // a new list: the old entries stay until it is done, then only the listed ones are left
        cache.apply(&Init);
        cache.apply(&InitApply(n("z", "b")));
        assert_eq!((profile("x"), profile("z")), (Some(true), None));
        cache.apply(&InitDone);
        assert_eq!((profile("x"), profile("z")), (None, Some(true)));
        assert_eq!(cache.names(|_, c| c.labels.has(PROFILE, "b")), ["z"]);
    }

    #[test]
    fn a_node_keeps_our_labels_and_who_owns_them() {
        let n = node_json(
            &[
                (
                    "kubelet",
                    "Update",
                    &["kubernetes.io/hostname", PCI_NVIDIA] as &[&str],
                ),
                (
                    "mockgpu-controller",
                    "Apply",
                    &[PROFILE, "old.mockgpu.io/x"],
                ),
                ("mockgpu-controller", "Update", &[GPU_COUNT]),
                (AGENT_MANAGER, "Apply", &[]),
            ],
            &[
                ("kubernetes.io/hostname", "node-a"),
                (PROFILE, "gb300"),
                (GPU_COUNT, "4"),
            ],
        );
        assert_eq!(
            (
                n.metadata.name.as_deref(),
                n.metadata.uid.as_deref(),
                n.metadata.resource_version.as_deref()
            ),
            (Some("node-a"), Some("nu"), Some("7"))
        );
        assert_eq!((n.metadata.labels, n.metadata.annotations), (None, None));
        assert!(n.labels.has(PROFILE, "gb300") && n.labels.has(GPU_COUNT, "4"));
        assert!(!n.labels.is_set("kubernetes.io/hostname") && !n.labels.is_set(PCI_NVIDIA));
        assert_eq!(
            n.labels.ours().collect::<Vec<_>>(),
            [PROFILE, "old.mockgpu.io/x"]
        );
        assert!(n.labels.owned_by_another(PCI_NVIDIA));
        assert!(!n.labels.owned_by_another(PROFILE));
        assert!(!n.labels.owned_by_another(GPU_COUNT), "our own Update");
    }
}
