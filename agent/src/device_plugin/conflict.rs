//! Whether another device plugin already serves the resource on this node.
//!
//! The kubelet keeps no list of live plugins on disk, but two real signals together name one:
//! its checkpoint (`device-plugins/kubelet_internal_checkpoint`, JSON) records, per resource,
//! the device IDs that the resource's plugin last reported (`Data.RegisteredDevices`), and a
//! live plugin answers `ListAndWatch` on its socket in the same directory. A plugin is taken to
//! serve the resource when its socket answers with IDs that the checkpoint registers under the
//! resource and that are not this node's mock GPUs; a stale checkpoint (the plugin is gone) or
//! an unrelated plugin (other IDs) is no conflict. A live socket under this plugin's own file
//! name is the mockgpu agent this one replaces: no conflict, but [`predecessor_gone`] waits for
//! it.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::{self, Read as _};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use tokio_stream::StreamExt as _;

use super::proto::Empty;
use super::proto::device_plugin_client::DevicePluginClient;
use super::{Conflict, DevicePluginError, KUBELET_SOCKET};

/// The kubelet's device manager checkpoint, in the device plugin directory.
pub const CHECKPOINT: &str = "kubelet_internal_checkpoint";
/// Largest checkpoint read.
const MAX_CHECKPOINT_BYTES: u64 = 16 << 20;
/// How long a plugin socket has to answer.
const ANSWER: Duration = Duration::from_secs(2);

#[derive(Deserialize)]
struct Checkpoint {
    #[serde(rename = "Data")]
    data: CheckpointData,
}

#[derive(Deserialize)]
struct CheckpointData {
    #[serde(rename = "RegisteredDevices", default)]
    registered_devices: Option<HashMap<String, Vec<String>>>,
}

/// The device IDs the checkpoint registers under `resource` (none when there is no checkpoint).
pub(crate) fn registered_devices(
    dir: &Path,
    resource: &str,
) -> Result<Vec<String>, DevicePluginError> {
    let path = dir.join(CHECKPOINT);
    let error = |reason: String| DevicePluginError::Checkpoint {
        path: path.clone(),
        reason,
    };
    let mut text = String::new();
    match fs::File::open(&path) {
        Ok(file) => file
            .take(MAX_CHECKPOINT_BYTES)
            .read_to_string(&mut text)
            .map_err(|e| error(e.to_string()))?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(error(e.to_string())),
    };
    let checkpoint: Checkpoint = serde_json::from_str(&text).map_err(|e| error(e.to_string()))?;
    Ok(checkpoint
        .data
        .registered_devices
        .and_then(|mut r| r.remove(resource))
        .unwrap_or_default())
}

/// The device IDs a live plugin at `socket` lists; `None` when nothing answers there.
pub(crate) async fn live_devices(socket: &Path) -> Option<Vec<String>> {
    let ask = async {
        let channel = super::connect(socket).await.ok()?;
        let mut stream = DevicePluginClient::new(channel)
            .list_and_watch(Empty {})
            .await
            .ok()?
            .into_inner();
        let first = stream.next().await?.ok()?;
        Some(first.devices.into_iter().map(|d| d.id).collect())
    };
    tokio::time::timeout(ANSWER, ask).await.ok().flatten()
}

/// Waits until nothing answers on `socket`, this plugin's own (polling every `poll`): a rollout
/// starts the new agent before the old one stops, and the kubelet refuses a second
/// registration of one socket path while the first is connected. The old agent removes its
/// socket and device nodes when it stops, so the new one serves only after that. False when
/// `shutdown` came first.
pub(crate) async fn predecessor_gone(
    socket: &Path,
    poll: Duration,
    mut shutdown: std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> bool {
    if live_devices(socket).await.is_none() {
        return true;
    }
    tracing::info!(socket = %socket.display(), "another mockgpu agent serves the device plugin here (the one this agent replaces): waiting for it to stop");
    loop {
        if !pause(&mut shutdown, poll).await {
            return false;
        }
        if live_devices(socket).await.is_none() {
            break;
        }
    }
    // it removes its socket right after it stops answering, and the kubelet forgets a plugin
    // when its socket goes; one that was killed leaves the file, which serving replaces
    for _ in 0..3 {
        if !socket.exists() {
            break;
        }
        if !pause(&mut shutdown, poll).await {
            return false;
        }
    }
    tracing::info!("the previous agent's device plugin stopped: serving it here");
    true
}

/// Sleeps `poll`; false when `shutdown` comes first.
pub(super) async fn pause(
    shutdown: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
    poll: Duration,
) -> bool {
    tokio::select! {
        () = shutdown.as_mut() => false,
        () = tokio::time::sleep(poll) => true,
    }
}

/// The live plugin other than mockgpu's that serves `resource` in `dir`, if any; `endpoint` is
/// this plugin's socket file name and `own` its device IDs.
pub async fn check(
    dir: &Path,
    resource: &str,
    endpoint: &str,
    own: &BTreeSet<String>,
) -> Result<Option<Conflict>, DevicePluginError> {
    let foreign: BTreeSet<String> = registered_devices(dir, resource)?
        .into_iter()
        .filter(|id| !own.contains(id))
        .collect();
    if foreign.is_empty() {
        return Ok(None);
    }
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(DevicePluginError::Checkpoint {
                path: dir.to_path_buf(),
                reason: e.to_string(),
            });
        }
    };
    let mut sockets: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_socket()))
        .filter(|e| e.file_name() != KUBELET_SOCKET && e.file_name() != endpoint)
        .map(|e| e.path())
        .collect();
    sockets.sort();
    for socket in sockets {
        let Some(ids) = live_devices(&socket).await else {
            continue;
        };
        let theirs: Vec<String> = ids.into_iter().filter(|id| foreign.contains(id)).collect();
        if !theirs.is_empty() {
            return Ok(Some(Conflict {
                resource: resource.to_string(),
                socket,
                ids: theirs,
            }));
        }
    }
    tracing::info!(
        resource,
        devices = foreign.len(),
        "the kubelet's checkpoint lists devices of another plugin for the resource, but no live plugin serves them"
    );
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_devices_come_from_the_kubelets_checkpoint() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(
            registered_devices(dir.path(), "nvidia.com/gpu").unwrap(),
            Vec::<String>::new()
        );
        fs::write(
            dir.path().join(CHECKPOINT),
            r#"{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["GPU-a","GPU-b"],"x.io/y":["1"]}},"Checksum":3952659280}"#,
        )
        .unwrap();
        assert_eq!(
            registered_devices(dir.path(), "nvidia.com/gpu").unwrap(),
            ["GPU-a", "GPU-b"]
        );
        assert!(
            registered_devices(dir.path(), "example.com/gpu")
                .unwrap()
                .is_empty()
        );
        fs::write(dir.path().join(CHECKPOINT), "{\"Data\":").unwrap();
        let e = registered_devices(dir.path(), "nvidia.com/gpu").unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "cannot read the kubelet's checkpoint {}: EOF",
                dir.path().join(CHECKPOINT).display()
            )),
            "{e}"
        );
    }
}
