//! The node labels we set, as a Node's metadata tells them and who owns them (server-side
//! apply's managed fields). What to apply is `plan`'s decision, the apply `write`'s.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ManagedFieldsEntry, ObjectMeta};
use mockgpu_api::gpunode::CONTROLLER_MANAGER;
use serde_json::Map;

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

/// The index of `key` in [`KEYS`].
fn known(key: &str) -> Option<usize> {
    KEYS.iter().position(|k| *k == key)
}

/// What labelling decides on of a Node: the current values of the labels we may set ([`KEYS`]),
/// the label keys our field manager owns through server-side apply, and which of [`KEYS`] another
/// manager owns (its managed fields, reduced to their label keys). Compact: thousands are cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeLabels {
    /// The values of [`KEYS`] (by index), where set.
    values: [Option<Box<str>>; KEYS.len()],
    /// The [`KEYS`] our applies own (a bit by index).
    ours: u8,
    /// Other label keys our applies own (an older release's), sorted.
    ours_unknown: Vec<Box<str>>,
    /// The [`KEYS`] another manager owns (a bit by index).
    others: u8,
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
    pub(crate) fn observe_label(&mut self, key: &str, value: &str) {
        if let Some(i) = known(key) {
            self.values[i] = Some(value.into());
        }
    }

    /// Takes note of a managed-fields entry of `manager` and `operation` owning label `key`:
    /// ours through `Apply`, or another manager's (our own `Update`s are neither).
    pub(crate) fn observe_owner(
        &mut self,
        manager: Option<&str>,
        operation: Option<&str>,
        key: &str,
    ) {
        if manager == Some(CONTROLLER_MANAGER) {
            if operation != Some("Apply") {
                return;
            }
            match known(key) {
                Some(i) => self.ours |= 1 << i,
                None => {
                    if let Err(at) = self.ours_unknown.binary_search_by(|k| (**k).cmp(key)) {
                        self.ours_unknown.insert(at, key.into());
                    }
                }
            }
        } else if let Some(i) = known(key) {
            self.others |= 1 << i;
        }
    }

    /// Whether label `key`, one of [`KEYS`], is set to `value`.
    pub fn has(&self, key: &str, value: &str) -> bool {
        known(key).is_some_and(|i| self.values[i].as_deref() == Some(value))
    }

    /// Whether label `key` is set (if it is one of [`KEYS`]).
    #[cfg(test)]
    pub fn is_set(&self, key: &str) -> bool {
        known(key).is_some_and(|i| self.values[i].is_some())
    }

    /// The label keys our field manager owns through apply, sorted.
    pub fn ours(&self) -> impl Iterator<Item = &str> {
        let known = (0..KEYS.len()).filter(|i| self.ours & 1 << i != 0);
        let mut all: Vec<&str> = known.map(|i| KEYS[i]).collect();
        all.extend(self.ours_unknown.iter().map(|k| &**k));
        all.sort_unstable();
        all.into_iter()
    }

    /// Whether a field manager other than ours owns label `key` (one of [`KEYS`]).
    pub fn owned_by_another(&self, key: &str) -> bool {
        known(key).is_some_and(|i| self.others & 1 << i != 0)
    }

    /// Whether our field manager owns exactly the label keys `keys`.
    pub fn ours_are<'a>(&self, keys: impl Iterator<Item = &'a String>) -> bool {
        self.ours().eq(keys.map(String::as_str))
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

#[cfg(test)]
pub(crate) mod tests {
    use kube::runtime::reflector::{self, ObjectRef};
    use kube::runtime::watcher;
    use mockgpu_api::gpunode::AGENT_MANAGER;
    use serde_json::json;

    use super::*;
    use crate::slim::SlimNode;

    /// A Node's metadata as the API server sends it (the kubelet's labels, ours, and the managed
    /// fields of both, with fields that are not labels), as the watch decodes it.
    pub(crate) fn node_json(owners: &[(&str, &str, &[&str])], labels: &[(&str, &str)]) -> SlimNode {
        serde_json::from_value(node_value(owners, labels)).unwrap()
    }

    /// [`node_json`]'s Node, as the API server sends it.
    pub(crate) fn node_value(
        owners: &[(&str, &str, &[&str])],
        labels: &[(&str, &str)],
    ) -> serde_json::Value {
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
        json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": "node-a", "uid": "nu", "resourceVersion": "7",
                "labels": labels, "annotations": {"x": "y"}, "managedFields": managed,
            },
        })
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
        let (cache, mut writer) = reflector::store::<SlimNode>();
        let get = |name: &str| cache.get(&ObjectRef::new(name));
        let profile = |name: &str| get(name).map(|c| c.labels.has(PROFILE, "b"));
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
            .filter(|c| c.labels.has(PROFILE, "b"))
            .map(|c| c.metadata.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["z"]);
    }

    /// The watch keeps of a Node its identity, our labels and who owns them.
    #[test]
    fn a_node_keeps_our_labels_and_who_owns_them() {
        let owners: &[(&str, &str, &[&str])] = &[
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
        ];
        let labels_of = &[
            ("kubernetes.io/hostname", "node-a"),
            (PROFILE, "gb300"),
            (GPU_COUNT, "4"),
        ];
        let n = node_json(owners, labels_of);
        // of the metadata only the name, UID and resource version
        let identity = ObjectMeta {
            name: Some("node-a".into()),
            uid: Some("nu".into()),
            resource_version: Some("7".into()),
            ..ObjectMeta::default()
        };
        assert_eq!(n.metadata, identity);
        let labels = n.labels;
        // as read from the whole metadata (the cleanup's)
        let whole: ObjectMeta =
            serde_json::from_value(node_value(owners, labels_of)["metadata"].take()).unwrap();
        assert_eq!(labels, NodeLabels::of(&whole));
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
