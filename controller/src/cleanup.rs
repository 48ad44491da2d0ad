//! `mockgpu-controller cleanup`: what the chart's post-delete hook runs on `helm uninstall`, when
//! the controller that would remove its labels is gone with the release. Deletes every GpuNode
//! and removes the labels our field manager owns from every node; a node we never labelled is not
//! written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use mockgpu_api::GpuNode;
use tracing::info;

use crate::labels::NodeLabels;
use crate::plan::labels_to_apply;
use crate::write::apply_node_labels;

/// What a cleanup did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Cleaned {
    /// GpuNodes deleted.
    pub gpunodes: usize,
    /// Nodes whose labels were removed.
    pub nodes: usize,
}

/// Deletes every GpuNode, then removes our labels from every node.
pub async fn cleanup(client: Client) -> Result<Cleaned, kube::Error> {
    let mut done = Cleaned::default();
    let gpunodes: Api<GpuNode> = Api::all(client.clone());
    for g in gpunodes.list_metadata(&ListParams::default()).await? {
        match gpunodes
            .delete(&g.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => done.gpunodes += 1,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    // metadata only
    let nodes: Api<Node> = Api::all(client);
    for node in nodes.list_metadata(&ListParams::default()).await? {
        if labels_to_apply(None, &NodeLabels::of(&node.metadata)).is_none() {
            continue;
        }
        let name = node.name_any();
        apply_node_labels(&nodes, &name, &BTreeMap::new()).await?;
        info!(node = %name, "mockgpu labels removed");
        done.nodes += 1;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::labels::PROFILE;
    use crate::mock_api::{Sent, api_server, requests, status};
    use mockgpu_api::gpunode::CONTROLLER_MANAGER;

    const GPUNODES: &str = "/apis/mockgpu.io/v1alpha1/gpunodes";

    /// A metadata list of `items`.
    fn list(items: Vec<Value>) -> Value {
        json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
            "metadata": {"resourceVersion": "9"}, "items": items,
        })
    }

    /// Node `name`'s metadata, with the label keys `ours` applied by our field manager.
    fn node(name: &str, ours: &[&str]) -> Value {
        let labels: serde_json::Map<_, _> =
            ours.iter().map(|k| (format!("f:{k}"), json!({}))).collect();
        json!({
            "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
            "metadata": {
                "name": name, "labels": {PROFILE: "gb300", "kubernetes.io/hostname": name},
                "managedFields": [{
                    "manager": CONTROLLER_MANAGER, "operation": "Apply", "apiVersion": "v1",
                    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:labels": labels}},
                }],
            },
        })
    }

    fn answer(s: &Sent) -> (u16, Value) {
        let gpunode = |name: &str| json!({"metadata": {"name": name}});
        match (&*s.method, &*s.uri) {
            ("GET", u) if u.starts_with(GPUNODES) => {
                (200, list(vec![gpunode("node-a"), gpunode("node-b")]))
            }
            ("DELETE", u) if u.contains("/node-b") => status(404, "NotFound"),
            ("DELETE", _) => (
                200,
                json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}),
            ),
            ("GET", _) => (
                200,
                list(vec![node("node-a", &[PROFILE]), node("node-c", &[])]),
            ),
            ("PATCH", _) => (200, node("node-a", &[])),
            _ => status(500, "Unexpected"),
        }
    }

    /// Every GpuNode is deleted (one already gone is not counted), and our labels are removed
    /// from the nodes that carry them only.
    #[tokio::test]
    async fn deletes_the_gpunodes_and_removes_our_labels() {
        let (client, server) = api_server(answer);
        let done = cleanup(client).await.unwrap();
        assert_eq!(
            done,
            Cleaned {
                gpunodes: 1,
                nodes: 1
            }
        );
        let sent = server.sent().await;
        let (list_g, del_a, del_b) = (
            format!("{GPUNODES}?"),
            format!("{GPUNODES}/node-a?"),
            format!("{GPUNODES}/node-b?"),
        );
        let apply = format!("/api/v1/nodes/node-a?&force=true&fieldManager={CONTROLLER_MANAGER}");
        assert_eq!(
            requests(&sent),
            [
                ("GET", &*list_g),
                ("DELETE", &*del_a),
                ("DELETE", &*del_b),
                ("GET", "/api/v1/nodes?"),
                ("PATCH", &*apply),
            ]
        );
        assert_eq!(sent[4].content_type, "application/apply-patch+yaml");
        let want = json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a", "labels": {}},
        });
        assert_eq!(sent[4].body, want);
    }

    /// Any other error deleting a GpuNode fails the cleanup.
    #[tokio::test]
    async fn a_failed_deletion_is_an_error() {
        let (client, server) = api_server(|s: &Sent| match &*s.method {
            "DELETE" => status(403, "Forbidden"),
            _ => answer(s),
        });
        let r = cleanup(client).await;
        assert!(
            matches!(&r, Err(kube::Error::Api(s)) if s.code == 403),
            "{r:?}"
        );
        assert_eq!(server.sent().await.len(), 2);
    }
}
