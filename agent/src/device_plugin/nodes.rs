//! The character devices the device plugin hands to the kubelet, under the layout's `dev/`
//! (never in the host's `/dev`): `/dev/nvidia3` of a container is `<dir>/nvidia3` on the host.

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use mockgpu_api::{DeviceNode, NodeTopology};
use nix::sys::stat::{Mode, SFlag};

use crate::sys::Sys;

/// A device node could not be created.
#[derive(Debug, thiserror::Error)]
#[error("cannot create device node {path} ({major}:{minor}): {source}")]
pub struct NodeError {
    /// The node on the host.
    pub path: PathBuf,
    /// Its major.
    pub major: u32,
    /// Its minor.
    pub minor: u32,
    /// Why.
    pub source: io::Error,
}

/// The nodes a topology's containers may be given: every GPU, then the control nodes.
pub fn nodes(topo: &NodeTopology) -> Vec<DeviceNode> {
    let mut nodes: Vec<DeviceNode> = topo.gpus.iter().map(|g| DeviceNode::gpu(g.minor)).collect();
    nodes.extend(topo.devices.control_nodes());
    nodes
}

/// Where `node` (`/dev/...`) lies below `dir` on the host.
pub fn host_path(dir: &Path, node: &DeviceNode) -> PathBuf {
    dir.join(node.path.trim_start_matches("/dev/"))
}

/// Creates `nodes` below `dir`; a node already there with the right number and mode is kept,
/// anything else in its place is replaced.
pub fn sync<S: Sys>(sys: &S, dir: &Path, nodes: &[DeviceNode]) -> Result<(), NodeError> {
    for node in nodes {
        let path = host_path(dir, node);
        let dev = nix::sys::stat::makedev(node.major.into(), node.minor.into());
        let error = |source| NodeError {
            path: path.clone(),
            major: node.major,
            minor: node.minor,
            source,
        };
        if let Ok(meta) = fs::symlink_metadata(&path) {
            if meta.file_type().is_char_device()
                && meta.rdev() == dev
                && meta.mode() & 0o7777 == node.mode
            {
                continue;
            }
            fs::remove_file(&path).map_err(error)?;
        }
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(error)?;
        }
        sys.mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(node.mode),
            dev,
        )
        .map_err(|e| error(e.into()))?;
        // mknod(2) applies the umask.
        fs::set_permissions(&path, fs::Permissions::from_mode(node.mode)).map_err(error)?;
    }
    Ok(())
}

/// Removes the nodes of `nodes` below `dir` that are still what [`sync`] made (character devices
/// of their numbers); anything else in their place is left. Returns how many went.
pub(crate) fn remove(dir: &Path, nodes: &[DeviceNode]) -> usize {
    nodes
        .iter()
        .filter(|node| {
            let path = host_path(dir, node);
            let dev = nix::sys::stat::makedev(node.major.into(), node.minor.into());
            fs::symlink_metadata(&path)
                .is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == dev)
                && fs::remove_file(&path).is_ok()
        })
        .count()
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::*;
    use crate::sys::fake::{Call, Fake};

    fn numbers(uvm: u32) -> mockgpu_api::DeviceNumbers {
        mockgpu_api::DeviceNumbers {
            uvm,
            caps: uvm + 1,
            imex_channels: uvm + 2,
        }
    }

    fn gpu_and_control(uvm: u32) -> Vec<DeviceNode> {
        let mut nodes = vec![DeviceNode::gpu(3)];
        nodes.extend(numbers(uvm).control_nodes());
        nodes
    }

    #[test]
    fn nodes_are_made_below_the_directory_with_their_numbers() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Fake::new(true);
        sync(&sys, dir.path(), &gpu_and_control(386)).unwrap();
        let made: Vec<(PathBuf, SFlag, libc::dev_t)> = sys
            .calls()
            .into_iter()
            .map(|c| match c {
                Call::Mknod {
                    path, kind, dev, ..
                } => (path, kind, dev),
                other => panic!("unexpected call {other:?}"),
            })
            .collect();
        let dev = |major: u32, minor: u32| nix::sys::stat::makedev(major.into(), minor.into());
        assert_eq!(
            made,
            [
                (dir.path().join("nvidia3"), SFlag::S_IFCHR, dev(195, 3)),
                (dir.path().join("nvidiactl"), SFlag::S_IFCHR, dev(195, 255)),
                (dir.path().join("nvidia-uvm"), SFlag::S_IFCHR, dev(386, 0)),
                (
                    dir.path().join("nvidia-uvm-tools"),
                    SFlag::S_IFCHR,
                    dev(386, 1)
                ),
            ]
        );
        let mode = fs::metadata(dir.path().join("nvidia3")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o666);
    }

    #[test]
    fn what_is_in_a_nodes_place_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        // The fake leaves regular files: a second sync replaces each (a changed uvm major does
        // the same to real nodes).
        let sys = Fake::new(true);
        sync(&sys, dir.path(), &gpu_and_control(386)).unwrap();
        sync(&sys, dir.path(), &gpu_and_control(390)).unwrap();
        let uvm: Vec<libc::dev_t> = sys
            .calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Mknod { path, dev, .. } if path.ends_with("nvidia-uvm") => Some(dev),
                _ => None,
            })
            .collect();
        assert_eq!(
            uvm,
            [
                nix::sys::stat::makedev(386, 0),
                nix::sys::stat::makedev(390, 0)
            ]
        );
    }

    #[test]
    fn removal_leaves_what_is_not_our_device_node() {
        let dir = tempfile::tempdir().unwrap();
        // the fake makes regular files, which are not device nodes of ours
        sync(&Fake::new(true), dir.path(), &gpu_and_control(386)).unwrap();
        assert_eq!(remove(dir.path(), &gpu_and_control(386)), 0);
        assert!(dir.path().join("nvidia3").exists());
    }

    #[test]
    fn a_refused_mknod_names_the_node() {
        let dir = tempfile::tempdir().unwrap();
        let sys = Fake::new(false).fail(|c| matches!(c, Call::Mknod { .. }), Errno::EPERM);
        let e = sync(&sys, dir.path(), &[DeviceNode::gpu(0)]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "cannot create device node {}/nvidia0 (195:0): Operation not permitted (os error 1)",
                dir.path().display()
            )
        );
    }
}
