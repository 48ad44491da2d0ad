//! The Container Device Interface specs the DRA driver writes, one per prepared claim: the
//! runtime (containerd with CDI on) reads them when the kubelet names their devices in a
//! container's CRI config, and creates the device nodes they list in the container.
//!
//! A spec is JSON (`cdiVersion` 0.5.0, which the CDI libraries of containerd 1.7 and 2.x all
//! read) named `<vendor>-<class>_<claim UID>.json` in the transient spec directory
//! (`/var/run/cdi`), as NVIDIA's driver names its own. Each device node gives its type, major
//! and minor, so the runtime needs no such node on the host.

use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};

use mockgpu_api::DeviceNode;
use serde::Serialize;

/// The CDI spec version written.
const VERSION: &str = "0.5.0";
/// The class of the per-claim specs (`k8s.gpu.nvidia.com/claim`).
const CLASS: &str = "claim";

/// A CDI spec.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    cdi_version: &'static str,
    /// `<vendor>/claim`.
    pub kind: String,
    /// The devices.
    pub devices: Vec<Device>,
    /// Edits every device of the spec brings.
    #[serde(skip_serializing_if = "Edits::is_empty")]
    pub container_edits: Edits,
}

/// One CDI device.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    /// Unique within the spec's kind: `<claim UID>-<device>`.
    pub name: String,
    /// What the device brings.
    pub container_edits: Edits,
}

/// Changes to a container.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Edits {
    /// `KEY=value` entries.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Character devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<Node>,
}

impl Edits {
    fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty()
    }
}

/// A device node in CDI's words.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    major: u32,
    minor: u32,
    file_mode: u32,
}

impl From<&DeviceNode> for Node {
    fn from(n: &DeviceNode) -> Node {
        Node {
            path: n.path.clone(),
            kind: "c",
            major: n.major,
            minor: n.minor,
            file_mode: n.mode,
        }
    }
}

impl Spec {
    /// The spec of one claim of `vendor` (`k8s.gpu.nvidia.com`).
    pub fn new(vendor: &str, devices: Vec<Device>, common: Edits) -> Spec {
        Spec {
            cdi_version: VERSION,
            kind: format!("{vendor}/{CLASS}"),
            devices,
            container_edits: common,
        }
    }
}

/// The device of claim `uid` named `device` in the claim spec of `vendor`: its name in the spec
/// and its fully qualified CDI name (`k8s.gpu.nvidia.com/claim=<uid>-gpu-0`).
pub fn device_names(vendor: &str, uid: &str, device: &str) -> (String, String) {
    let name = format!("{uid}-{device}");
    let qualified = format!("{vendor}/{CLASS}={name}");
    (name, qualified)
}

/// The spec file of claim `uid` of `vendor` in `dir`.
pub fn spec_path(dir: &Path, vendor: &str, uid: &str) -> PathBuf {
    dir.join(format!("{vendor}-{CLASS}_{uid}.json"))
}

/// Writes `spec` to `path` whole: into a file the runtime does not read (no `.json` ending),
/// then renamed over the old one.
pub fn write(path: &Path, spec: &Spec) -> io::Result<()> {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = fs::File::create(&tmp)?;
    file.write_all(&serde_json::to_vec_pretty(spec).map_err(io::Error::other)?)?;
    file.sync_all()?;
    fs::rename(&tmp, path)
}

/// Removes the spec at `path`; one already gone is no error.
pub fn remove(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_is_the_json_cdi_reads() {
        let gpu = DeviceNode::gpu(3);
        let (name, qualified) = device_names("k8s.gpu.nvidia.com", "u-1", "gpu-3");
        assert_eq!(name, "u-1-gpu-3");
        assert_eq!(qualified, "k8s.gpu.nvidia.com/claim=u-1-gpu-3");
        let spec = Spec::new(
            "k8s.gpu.nvidia.com",
            vec![Device {
                name,
                container_edits: Edits {
                    device_nodes: vec![Node::from(&gpu)],
                    ..Default::default()
                },
            }],
            Edits {
                env: vec!["NVIDIA_VISIBLE_DEVICES=void".into()],
                ..Default::default()
            },
        );
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "cdiVersion": "0.5.0",
                "kind": "k8s.gpu.nvidia.com/claim",
                "devices": [{"name": "u-1-gpu-3", "containerEdits": {"deviceNodes": [
                    {"path": "/dev/nvidia3", "type": "c", "major": 195, "minor": 3, "fileMode": 438}
                ]}}],
                "containerEdits": {"env": ["NVIDIA_VISIBLE_DEVICES=void"]}
            })
        );
        // No common edits: no empty object.
        let bare = Spec::new("v.x", vec![], Edits::default());
        assert!(
            serde_json::to_value(&bare)
                .unwrap()
                .get("containerEdits")
                .is_none()
        );
    }

    #[test]
    fn specs_are_written_whole_and_removed_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = spec_path(dir.path(), "k8s.gpu.nvidia.com", "u-1");
        assert_eq!(
            path.file_name().unwrap(),
            "k8s.gpu.nvidia.com-claim_u-1.json"
        );
        let spec = Spec::new("k8s.gpu.nvidia.com", vec![], Edits::default());
        write(&path, &spec).unwrap();
        let read: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(read["kind"], "k8s.gpu.nvidia.com/claim");
        // Only the spec is left: the temporary file was renamed.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
        remove(&path).unwrap();
        assert!(!path.exists());
        remove(&path).unwrap();
    }
}
