//! `mockgpu-controller cleanup`: what the chart's post-delete hook runs on `helm uninstall`, when
//! the controller that would remove its labels is gone with the release. Deletes every GpuNode
//! and removes the labels our field manager owns from every node; a node we never labelled is not
//! written.

use std::collections::BTreeMap;

use kube::api::{Api, DeleteParams, ListParams};
use kube::{Client, ResourceExt};
use mockgpu_api::GpuNode;
use tracing::info;

use crate::labels;
use crate::slim::SlimNode;

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
    // metadata only, and of that our labels and who owns them
    let nodes: Api<SlimNode> = Api::all(client);
    for node in nodes.list(&ListParams::default()).await? {
        if labels::to_apply(None, &node.labels).is_none() {
            continue;
        }
        let name = node.name_any();
        labels::apply(&nodes, &name, &BTreeMap::new()).await?;
        info!(node = %name, "mockgpu labels removed");
        done.nodes += 1;
    }
    Ok(done)
}
