//! The node labels we set, as a Node's metadata tells them and who owns them (server-side
//! apply's managed fields). What to apply is `plan`'s decision, the apply `write`'s.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry, ObjectMeta};
use kube::core::PartialObjectMeta;
use mockgpu_api::gpunode::CONTROLLER_MANAGER;
use serde_json::{Map, Value};

/// A Node as the controller watches it: its metadata only (`PartialObjectMetadata`), [`trim`]med
/// to what [`NodeLabels::of`] reads.
pub type NodeMeta = PartialObjectMeta<Node>;

/// The node's mockgpu profile (`real` on a node with a real driver).
pub const PROFILE: &str = "mockgpu.io/profile";
/// `true` on a node with GPUs.
pub const GPU_PRESENT: &str = "nvidia.com/gpu.present";
/// The number of GPUs.
pub const GPU_COUNT: &str = "nvidia.com/gpu.count";
/// The GPUs' model, spaces as dashes (`NVIDIA-GB300`).
pub const GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// An NVIDIA PCI device is present: the nodeSelector of Slinky's GPU NodeSets. Owned by
/// node-feature-discovery where it runs.
pub const PCI_NVIDIA: &str = "feature.node.kubernetes.io/pci-10de.present";

/// The labels we may set.
pub const KEYS: [&str; 5] = [PROFILE, GPU_PRESENT, GPU_COUNT, GPU_PRODUCT, PCI_NVIDIA];

/// `key` as one of [`KEYS`].
fn known(key: &str) -> Option<&'static str> {
    KEYS.into_iter().find(|k| *k == key)
}

/// What labelling decides on of a Node: the current values of the labels we may set ([`KEYS`]),
/// the label keys our field manager owns through server-side apply, and which of [`KEYS`] another
/// manager owns (its managed fields, reduced to their label keys).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLabels {
    /// The values of [`KEYS`], where set.
    values: BTreeMap<&'static str, String>,
    /// The label keys our applies own (with an older release's).
    ours: BTreeSet<String>,
    /// [`KEYS`] another manager owns.
    others: BTreeSet<&'static str>,
}

impl NodeLabels {
    /// What labelling decides on of the Node with metadata `m`.
    pub fn of(m: &ObjectMeta) -> Self {
        let mut n = Self::default();
        for (k, v) in m.labels.iter().flatten() {
            n.observe_label(k, v);
        }
        for e in m.managed_fields.iter().flatten() {
            for key in label_keys(e) {
                n.observe_owner(e.manager.as_deref(), e.operation.as_deref(), key);
            }
        }
        n
    }

    /// Takes note of label `key`'s value (kept if it is one of [`KEYS`]).
    fn observe_label(&mut self, key: &str, value: &str) {
        if let Some(k) = known(key) {
            self.values.insert(k, value.to_string());
        }
    }

    /// Takes note of a managed-fields entry of `manager` and `operation` owning label `key`:
    /// ours through `Apply`, or another manager's (our own `Update`s are neither).
    fn observe_owner(&mut self, manager: Option<&str>, operation: Option<&str>, key: &str) {
        if manager == Some(CONTROLLER_MANAGER) {
            if operation == Some("Apply") {
                self.ours.insert(key.to_string());
            }
        } else if let Some(k) = known(key) {
            self.others.insert(k);
        }
    }

    /// Whether label `key`, one of [`KEYS`], is set to `value`.
    pub fn has(&self, key: &str, value: &str) -> bool {
        self.values.get(key).is_some_and(|v| v == value)
    }

    /// Whether label `key` is set (if it is one of [`KEYS`]).
    #[cfg(test)]
    pub fn is_set(&self, key: &str) -> bool {
        self.values.contains_key(key)
    }

    /// The label keys our field manager owns through apply, sorted.
    pub fn ours(&self) -> impl Iterator<Item = &str> {
        self.ours.iter().map(String::as_str)
    }

    /// Whether a field manager other than ours owns label `key` (one of [`KEYS`]).
    pub fn owned_by_another(&self, key: &str) -> bool {
        self.others.contains(key)
    }

    /// Whether our field manager owns exactly the label keys `keys`.
    pub fn ours_are<'a>(&self, keys: impl Iterator<Item = &'a String>) -> bool {
        self.ours.iter().eq(keys)
    }
}

/// The label keys among the fields of managed-fields entry `e`.
fn label_keys(e: &ManagedFieldsEntry) -> impl Iterator<Item = &str> {
    e.fields_v1
        .as_ref()
        .and_then(|f| f.0.get("f:metadata")?.get("f:labels")?.as_object())
        .into_iter()
        .flat_map(Map::keys)
        .filter_map(|k| k.strip_prefix("f:"))
}

/// Trims a watched Node's metadata to its name, UID, resource version, and what
/// [`NodeLabels::of`] reads: the labels of [`KEYS`], and of the managed-fields entries their
/// manager, operation and label keys (all of ours, [`KEYS`] of others'; entries without any are
/// dropped).
pub fn trim(m: &mut ObjectMeta) {
    *m = ObjectMeta {
        name: m.name.take(),
        uid: m.uid.take(),
        resource_version: m.resource_version.take(),
        labels: m.labels.take().map(|mut l| {
            l.retain(|k, _| known(k).is_some());
            l
        }),
        managed_fields: m.managed_fields.take().map(|entries| {
            entries
                .into_iter()
                .filter_map(|e| {
                    let ours = e.manager.as_deref() == Some(CONTROLLER_MANAGER);
                    let keys: Map<String, Value> = label_keys(&e)
                        .filter(|k| ours || known(k).is_some())
                        .map(|k| (format!("f:{k}"), Value::Object(Map::new())))
                        .collect();
                    (!keys.is_empty()).then(|| ManagedFieldsEntry {
                        manager: e.manager,
                        operation: e.operation,
                        fields_v1: Some(FieldsV1(
                            serde_json::json!({"f:metadata": {"f:labels": keys}}),
                        )),
                        ..ManagedFieldsEntry::default()
                    })
                })
                .collect()
        }),
        ..ObjectMeta::default()
    };
}

#[cfg(test)]
pub(crate) mod tests {
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher;
    use mockgpu_api::gpunode::AGENT_MANAGER;
    use serde_json::json;

    use super::*;

    /// A Node's metadata as the API server sends it (the kubelet's labels, ours, and the managed
    /// fields of both, with fields that are not labels), as the watch keeps it ([`trim`]med).
    pub(crate) fn node_json(owners: &[(&str, &str, &[&str])], labels: &[(&str, &str)]) -> NodeMeta {
        let managed: Vec<_> = owners
            .iter()
            .map(|(manager, operation, keys)| {
                let labels: Map<_, _> =
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
        let labels: Map<_, _> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v)))
            .collect();
        let mut n: NodeMeta = serde_json::from_value(json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "node-a", "uid": "nu", "resourceVersion": "7",
                "labels": labels, "annotations": {"x": "y"}, "managedFields": managed,
            },
        }))
        .unwrap();
        trim(&mut n.metadata);
        n
    }

    /// The Node cache (kube-runtime's store) follows the watch: applies, deletions, and a list
    /// that replaces it at its end.
    #[test]
    fn the_node_cache_follows_the_watch() {
        use watcher::Event::*;
        let n = |name: &str, profile: &str| {
            let mut n = node_json(&[], &[(PROFILE, profile)]);
            n.metadata.name = Some(name.into());
            n
        };
        let (cache, mut writer) = reflector::store::<NodeMeta>();
        let get = |name: &str| cache.get(&ObjectRef::new(name));
        let profile = |name: &str| get(name).map(|c| NodeLabels::of(&c.metadata).has(PROFILE, "b"));
        for e in [
            Init,
            InitApply(n("x", "a")),
            InitApply(n("y", "a")),
            InitDone,
        ] {
            writer.apply_watcher_event(&e);
        }
        assert_eq!(get("x").unwrap().metadata.uid.as_deref(), Some("nu"));
        writer.apply_watcher_event(&Apply(n("x", "b")));
        assert_eq!((profile("x"), profile("y")), (Some(true), Some(false)));
        writer.apply_watcher_event(&Delete(n("y", "a")));
        assert_eq!(profile("y"), None);
        // a new list: the old entries stay until it is done, then only the listed ones are left
        writer.apply_watcher_event(&Init);
        writer.apply_watcher_event(&InitApply(n("z", "b")));
        assert_eq!((profile("x"), profile("z")), (Some(true), None));
        writer.apply_watcher_event(&InitDone);
        assert_eq!((profile("x"), profile("z")), (None, Some(true)));
        let names: Vec<_> = cache
            .state()
            .iter()
            .filter(|c| NodeLabels::of(&c.metadata).has(PROFILE, "b"))
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["z"]);
    }

    /// The watch keeps of a Node its identity, our labels and who owns them.
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
        // of the labels only ours, of the managed fields only their label keys
        let kept: Vec<_> = n
            .metadata
            .labels
            .iter()
            .flatten()
            .map(|(k, _)| k.as_str())
            .collect();
        assert_eq!(
            (kept, &n.metadata.annotations),
            (vec![PROFILE, GPU_COUNT], &None)
        );
        let owners: Vec<_> = n.metadata.managed_fields.iter().flatten().collect();
        assert_eq!(owners.len(), 3, "{owners:?}");
        let labels = NodeLabels::of(&n.metadata);
        assert!(labels.has(PROFILE, "gb300") && labels.has(GPU_COUNT, "4"));
        assert!(!labels.is_set("kubernetes.io/hostname") && !labels.is_set(PCI_NVIDIA));
        assert_eq!(
            labels.ours().collect::<Vec<_>>(),
            [PROFILE, "old.mockgpu.io/x"]
        );
        assert!(labels.owned_by_another(PCI_NVIDIA));
        assert!(!labels.owned_by_another(PROFILE));
        assert!(!labels.owned_by_another(GPU_COUNT), "our own Update");
    }

    #[test]
    fn only_our_apply_entries_count_as_ours() {
        let mut n = NodeLabels::default();
        n.observe_owner(Some(CONTROLLER_MANAGER), Some("Apply"), PROFILE);
        n.observe_owner(Some(CONTROLLER_MANAGER), Some("Update"), GPU_COUNT);
        n.observe_owner(Some("kubelet"), Some("Update"), PCI_NVIDIA);
        n.observe_owner(None, None, GPU_PRODUCT);
        assert_eq!(n.ours().collect::<Vec<_>>(), [PROFILE]);
        assert!(n.owned_by_another(PCI_NVIDIA) && n.owned_by_another(GPU_PRODUCT));
        assert!(!n.owned_by_another(PROFILE) && !n.owned_by_another(GPU_COUNT));
        // label values: only ours are kept
        n.observe_label(PROFILE, "gb300");
        n.observe_label("kubernetes.io/hostname", "node-a");
        assert!(n.has(PROFILE, "gb300") && !n.has(PROFILE, "gb200"));
        assert!(!n.is_set("kubernetes.io/hostname") && !n.is_set(GPU_COUNT));
    }
}
