//! The node labels that follow a GpuNode, and who owns them (server-side apply's managed fields).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mockgpu_api::gpunode::CONTROLLER_MANAGER;
use mockgpu_api::{GpuNode, Mode};

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

/// The labels a node with GpuNode `g` should carry from us. A real-mode node gets only the
/// profile: the NVIDIA GPU stack labels real GPUs itself.
pub fn wanted(g: &GpuNode, node: &ObjectMeta) -> BTreeMap<String, String> {
    let mut out = BTreeMap::from([(PROFILE.to_string(), label_value(&g.spec.profile))]);
    if g.spec.mode == Mode::Real {
        return out;
    }
    out.insert(GPU_COUNT.into(), g.spec.gpu_count.to_string());
    if let Some(gpu) = g.spec.gpus.first() {
        out.insert(GPU_PRESENT.into(), "true".into());
        out.insert(GPU_PRODUCT.into(), label_value(&gpu.model));
        if !owned_by_another(node, PCI_NVIDIA) {
            out.insert(PCI_NVIDIA.into(), "true".into());
        }
    }
    out
}

/// What to apply to a node: `None` leaves it alone (nothing to change, or no GpuNode and no label
/// of ours), `Some(set)` applies `set` (empty: removes ours) with our field manager.
pub fn to_apply(
    wanted: Option<BTreeMap<String, String>>,
    node: &ObjectMeta,
) -> Option<BTreeMap<String, String>> {
    let owned = owned_labels(node, CONTROLLER_MANAGER);
    let want = match wanted {
        Some(w) => w,
        None if owned.is_empty() => return None,
        None => BTreeMap::new(),
    };
    let current = node.labels.as_ref();
    let in_place = want
        .iter()
        .all(|(k, v)| current.and_then(|l| l.get(k)) == Some(v));
    let same_keys = owned.len() == want.len() && want.keys().all(|k| owned.contains(k));
    (!(in_place && same_keys)).then_some(want)
}

/// Applies `labels` to node `name` with our field manager (server-side apply, forced): the set
/// replaces what we owned, so an empty set removes our labels and nothing else.
pub async fn apply(
    nodes: &kube::Api<k8s_openapi::api::core::v1::Node>,
    name: &str,
    labels: &BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    let patch = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels},
    });
    let params = kube::api::PatchParams::apply(CONTROLLER_MANAGER).force();
    nodes
        .patch(name, &params, &kube::api::Patch::Apply(&patch))
        .await?;
    Ok(())
}

/// A label value from free text: characters other than letters, digits, `-`, `_`, `.` become
/// `-`, at most 63 characters, starting and ending with a letter or digit.
pub fn label_value(text: &str) -> String {
    let mapped: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// The label keys that `manager` owns through server-side apply.
fn owned_labels(node: &ObjectMeta, manager: &str) -> BTreeSet<String> {
    node.managed_fields
        .iter()
        .flatten()
        .filter(|m| {
            m.manager.as_deref() == Some(manager) && m.operation.as_deref() == Some("Apply")
        })
        .flat_map(|m| label_fields(m.fields_v1.as_ref().map(|f| &f.0)))
        .collect()
}

/// Whether a field manager other than ours owns label `key`.
fn owned_by_another(node: &ObjectMeta, key: &str) -> bool {
    node.managed_fields
        .iter()
        .flatten()
        .filter(|m| m.manager.as_deref() != Some(CONTROLLER_MANAGER))
        .any(|m| label_fields(m.fields_v1.as_ref().map(|f| &f.0)).any(|k| k == key))
}

/// The label keys in a managed-fields set (`{"f:metadata": {"f:labels": {"f:<key>": {}}}}`).
fn label_fields(fields: Option<&serde_json::Value>) -> impl Iterator<Item = String> + '_ {
    fields
        .and_then(|f| f.get("f:metadata")?.get("f:labels")?.as_object())
        .into_iter()
        .flat_map(|labels| labels.keys())
        .filter_map(|k| k.strip_prefix("f:").map(String::from))
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
    use serde_json::json;

    use super::*;

    /// A managed-fields entry of `manager` owning label `keys`.
    pub(crate) fn owner(manager: &str, operation: &str, keys: &[&str]) -> ManagedFieldsEntry {
        let labels: serde_json::Map<_, _> =
            keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:labels": labels}}))),
            ..Default::default()
        }
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("NVIDIA GB300"), "NVIDIA-GB300");
        assert_eq!(
            label_value("NVIDIA H100 80GB HBM3"),
            "NVIDIA-H100-80GB-HBM3"
        );
        assert_eq!(label_value(" (odd) "), "odd");
        assert_eq!(label_value(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn only_our_apply_entries_count_as_ours() {
        let node = ObjectMeta {
            managed_fields: Some(vec![
                owner(CONTROLLER_MANAGER, "Apply", &[PROFILE]),
                owner(CONTROLLER_MANAGER, "Update", &[GPU_COUNT]),
                owner("kubelet", "Update", &["kubernetes.io/hostname"]),
            ]),
            ..Default::default()
        };
        assert_eq!(
            owned_labels(&node, CONTROLLER_MANAGER),
            BTreeSet::from([PROFILE.to_string()])
        );
        assert!(owned_by_another(&node, "kubernetes.io/hostname"));
        assert!(!owned_by_another(&node, PROFILE));
    }
}
