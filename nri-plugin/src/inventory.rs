//! The node's GPUs as the plugin needs them: the seam to the agent.
//!
//! The agent implements [`Inventory`] from its topology; the standalone binary uses
//! [`DriverTreeInventory`], which reads the served driver tree.

use std::{
    fs,
    path::{Path, PathBuf},
};

/// One GPU of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// Index as `nvidia-smi` and `NVIDIA_VISIBLE_DEVICES` count (order of device minors).
    pub index: u32,
    /// Device minor: `/dev/nvidia<minor>`, char 195:minor.
    pub minor: u32,
    /// `GPU-xxxxxxxx-…` identity.
    pub uuid: String,
    /// PCI bus id, `dddd:bb:ss.f`.
    pub bus_id: String,
}

/// A consistent view of the node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInventory {
    /// The GPUs, in any order.
    pub gpus: Vec<Gpu>,
    /// Major number of `/dev/nvidia-uvm` (minor 0) and `/dev/nvidia-uvm-tools` (minor 1).
    pub uvm_major: u32,
}

/// The driver tree cannot be served yet; the text says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

/// Source of the node's GPUs, consulted on every container creation (keep it cheap).
pub trait Inventory: Send + Sync {
    /// The current GPUs, or why there are none to offer yet.
    fn snapshot(&self) -> Result<GpuInventory, NotReady>;
}

/// Major number used when the tree does not list `nvidia-uvm` in `proc/devices`.
pub const DEFAULT_UVM_MAJOR: u32 = 510;

/// Reads `<root>/proc/driver/nvidia/gpus/*/information` (and `<root>/proc/devices` for the
/// uvm major) of a driver tree such as the agent's FUSE mount `/run/mockgpu/fs`.
#[derive(Debug, Clone)]
pub struct DriverTreeInventory {
    root: PathBuf,
}

impl DriverTreeInventory {
    /// An inventory over the tree rooted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }
}

impl Inventory for DriverTreeInventory {
    fn snapshot(&self) -> Result<GpuInventory, NotReady> {
        let dir = self.root.join("proc/driver/nvidia/gpus");
        let entries = fs::read_dir(&dir)
            .map_err(|err| NotReady(format!("cannot list {}: {err}", dir.display())))?;
        let mut gpus = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(|err| NotReady(format!("cannot list {}: {err}", dir.display())))?;
            gpus.push(read_information(&entry.path().join("information"))?);
        }
        if gpus.is_empty() {
            return Err(NotReady(format!("no GPUs under {}", dir.display())));
        }
        gpus.sort_by_key(|gpu| gpu.minor);
        for (index, gpu) in (0..).zip(gpus.iter_mut()) {
            gpu.index = index;
        }
        let uvm_major = fs::read_to_string(self.root.join("proc/devices"))
            .ok()
            .and_then(|text| {
                text.lines().find_map(
                    |line| match line.split_whitespace().collect::<Vec<_>>()[..] {
                        [major, "nvidia-uvm"] => major.parse().ok(),
                        _ => None,
                    },
                )
            })
            .unwrap_or(DEFAULT_UVM_MAJOR);
        Ok(GpuInventory { gpus, uvm_major })
    }
}

/// Parses one `information` file (`Device Minor:`, `GPU UUID:`, `Bus Location:` lines).
fn read_information(path: &Path) -> Result<Gpu, NotReady> {
    let text = fs::read_to_string(path)
        .map_err(|err| NotReady(format!("cannot read {}: {err}", path.display())))?;
    let field = |key: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(key))
            .map(|value| value.trim().to_owned())
            .ok_or_else(|| NotReady(format!("{} has no `{key}` line", path.display())))
    };
    let minor = field("Device Minor:")?;
    Ok(Gpu {
        index: 0,
        minor: minor
            .parse()
            .map_err(|_| NotReady(format!("{}: bad Device Minor {minor:?}", path.display())))?,
        uuid: field("GPU UUID:")?,
        bus_id: field("Bus Location:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_gpu(root: &Path, bus: &str, minor: u32) {
        let dir = root.join("proc/driver/nvidia/gpus").join(bus);
        fs::create_dir_all(&dir).unwrap();
        let text = format!(
            "Model: \t\t NVIDIA GB300\nIRQ:   \t\t 0\nGPU UUID: \t GPU-{minor:08x}-0000-0000-0000-000000000000\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
        );
        fs::write(dir.join("information"), text).unwrap();
    }

    #[test]
    fn reads_gpus_in_minor_order() {
        let tmp = tempfile::tempdir().unwrap();
        write_gpu(tmp.path(), "0000:01:00.0", 1);
        write_gpu(tmp.path(), "0000:02:00.0", 0);
        fs::write(
            tmp.path().join("proc/devices"),
            "Character devices:\n195 nvidia\n507 nvidia-uvm\n",
        )
        .unwrap();
        let inv = DriverTreeInventory::new(tmp.path()).snapshot().unwrap();
        assert_eq!(inv.uvm_major, 507);
        assert_eq!(
            inv.gpus[0],
            Gpu {
                index: 0,
                minor: 0,
                uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
                bus_id: "0000:02:00.0".into()
            }
        );
        assert_eq!((inv.gpus[1].index, inv.gpus[1].minor), (1, 1));
    }

    #[test]
    fn missing_or_empty_tree_is_not_ready() {
        let tmp = tempfile::tempdir().unwrap();
        let err = DriverTreeInventory::new(tmp.path()).snapshot().unwrap_err();
        assert!(err.0.contains("cannot list"), "{err}");
        fs::create_dir_all(tmp.path().join("proc/driver/nvidia/gpus")).unwrap();
        let err = DriverTreeInventory::new(tmp.path()).snapshot().unwrap_err();
        assert!(err.0.starts_with("no GPUs"), "{err}");
        assert_eq!(DEFAULT_UVM_MAJOR, 510);
    }
}
