//! The node's GPUs as the plugin needs them: the seam to the agent.
//!
//! The agent implements [`Inventory`] from its topology; the standalone binary uses
//! [`DriverTreeInventory`], which reads a driver tree with [`read_gpus`] over [`StdFiles`], the
//! same reader the agent's real-GPU mode uses on the real driver's files.

use std::{
    ffi::OsString,
    fs, io,
    path::{Path, PathBuf},
};

use mockgpu_api::driver::{DriverFiles, read_gpus, real_driver_loaded};
use mockgpu_api::{DeviceNumbers, Gpu, ProcDevices};

/// A consistent view of the node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuInventory {
    /// The GPUs, in any order.
    pub gpus: Vec<Gpu>,
    /// The majors of the driver's dynamic device nodes.
    pub devices: DeviceNumbers,
}

/// The driver tree cannot be served yet; the text says why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NotReady(pub String);

/// Source of the node's GPUs, consulted on every container creation (keep it cheap).
pub trait Inventory: Send + Sync {
    /// The current GPUs, or why there are none to offer yet.
    fn snapshot(&self) -> Result<GpuInventory, NotReady>;

    /// Whether a real NVIDIA driver serves this node: then nothing is mocked or injected.
    fn real_driver(&self) -> bool {
        false
    }
}

/// The file system, read through `std::fs`.
#[derive(Debug, Clone, Copy, Default)]
pub struct StdFiles;

impl DriverFiles for StdFiles {
    fn read(&self, path: &Path) -> io::Result<String> {
        fs::read_to_string(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        fs::read_dir(dir)?
            .map(|entry| entry.map(|e| e.file_name()))
            .collect()
    }
}

/// Reads a driver tree such as the agent's FUSE mount `/run/mockgpu/fs`: its GPUs and the
/// device majors its merged `proc/devices` publishes.
#[derive(Debug, Clone)]
pub struct DriverTreeInventory {
    root: PathBuf,
    procfs: PathBuf,
}

impl DriverTreeInventory {
    /// An inventory over the tree rooted at `root`, on a host whose procfs is `procfs`
    /// (checked for a real driver).
    pub fn new(root: impl Into<PathBuf>, procfs: impl Into<PathBuf>) -> Self {
        Self {
            root: root.into(),
            procfs: procfs.into(),
        }
    }
}

impl Inventory for DriverTreeInventory {
    fn real_driver(&self) -> bool {
        real_driver_loaded(&StdFiles, &self.procfs)
    }

    fn snapshot(&self) -> Result<GpuInventory, NotReady> {
        let not_ready = |e: &dyn std::fmt::Display| NotReady(e.to_string());
        let gpus = read_gpus(&StdFiles, &self.root.join("proc"), &self.root.join("sys"))
            .map_err(|e| not_ready(&e))?;
        if gpus.is_empty() {
            return Err(NotReady(format!(
                "no GPUs under {}",
                self.root.join("proc/driver/nvidia/gpus").display()
            )));
        }
        let path = self.root.join("proc/devices");
        let text = fs::read_to_string(&path)
            .map_err(|e| NotReady(format!("cannot read {}: {e}", path.display())))?;
        let devices = ProcDevices::parse(&text)
            .and_then(|d| DeviceNumbers::published(&d))
            .map_err(|e| NotReady(format!("{}: {e}", path.display())))?;
        Ok(GpuInventory {
            gpus: gpus.into_iter().map(|g| g.gpu).collect(),
            devices,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn write_gpu(root: &Path, bus: &str, minor: u32) {
        write(
            root,
            &format!("proc/driver/nvidia/gpus/{bus}/information"),
            &format!(
                "Model: \t\t NVIDIA GB300\nIRQ:   \t\t 7\nGPU UUID: \t GPU-{minor:08x}-0000-0000-0000-000000000000\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
            ),
        );
    }

    const DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n386 nvidia-uvm\n387 nvidia-caps\n388 nvidia-caps-imex-channels\n\nBlock devices:\n";

    #[test]
    fn reads_gpus_in_minor_order_with_the_published_majors() {
        let tmp = tempfile::tempdir().unwrap();
        write_gpu(tmp.path(), "0000:01:00.0", 1);
        write_gpu(tmp.path(), "0000:02:00.0", 0);
        write(
            tmp.path(),
            "sys/bus/pci/devices/0000:02:00.0/numa_node",
            "1\n",
        );
        write(
            tmp.path(),
            "sys/bus/pci/devices/0000:02:00.0/local_cpulist",
            "4-7\n",
        );
        write(
            tmp.path(),
            "sys/devices/system/cpu/cpu4/topology/physical_package_id",
            "1\n",
        );
        write(tmp.path(), "proc/devices", DEVICES);
        let inv = DriverTreeInventory::new(tmp.path(), "/nonexistent")
            .snapshot()
            .unwrap();
        assert_eq!(
            inv.devices,
            DeviceNumbers {
                uvm: 386,
                caps: 387,
                imex_channels: 388
            }
        );
        let g = &inv.gpus[0];
        assert_eq!((g.index, g.minor, g.irq), (0, 0, 7));
        assert_eq!(g.uuid, "GPU-00000000-0000-0000-0000-000000000000");
        assert_eq!(g.bus_id.to_string(), "0000:02:00.0");
        assert_eq!(
            (g.numa_node, g.socket, g.cpus.to_list()),
            (1, 1, "4-7".into())
        );
        let g = &inv.gpus[1];
        assert_eq!((g.index, g.minor, g.numa_node, g.socket), (1, 1, -1, 0));
        assert!(g.cpus.is_empty());
    }

    #[test]
    fn a_real_driver_is_noticed() {
        let tmp = tempfile::tempdir().unwrap();
        let inv = DriverTreeInventory::new(tmp.path(), tmp.path().join("proc"));
        assert!(!inv.real_driver());
        fs::create_dir_all(tmp.path().join("proc/driver/nvidia/gpus")).unwrap();
        assert!(!inv.real_driver(), "an empty gpus directory is no GPU");
        write_gpu(tmp.path(), "0000:01:00.0", 0);
        assert!(inv.real_driver());
    }

    #[test]
    fn a_tree_without_published_majors_is_not_ready() {
        let tmp = tempfile::tempdir().unwrap();
        write_gpu(tmp.path(), "0000:01:00.0", 0);
        write(tmp.path(), "proc/devices", "Character devices:\n  1 mem\n");
        let err = DriverTreeInventory::new(tmp.path(), "/nonexistent")
            .snapshot()
            .unwrap_err();
        assert!(
            err.0
                .ends_with("proc/devices: /proc/devices lists no nvidia-frontend major"),
            "{err}"
        );
    }

    #[test]
    fn missing_empty_or_broken_trees_are_not_ready() {
        let tmp = tempfile::tempdir().unwrap();
        let err = DriverTreeInventory::new(tmp.path(), "/nonexistent")
            .snapshot()
            .unwrap_err();
        assert!(err.0.starts_with("cannot read"), "{err}");
        assert!(
            read_gpus(&StdFiles, &tmp.path().join("proc"), tmp.path())
                .unwrap_err()
                .is_not_found()
        );
        fs::create_dir_all(tmp.path().join("proc/driver/nvidia/gpus")).unwrap();
        let err = DriverTreeInventory::new(tmp.path(), "/nonexistent")
            .snapshot()
            .unwrap_err();
        assert!(err.0.starts_with("no GPUs"), "{err}");
        write(
            tmp.path(),
            "proc/driver/nvidia/gpus/0000:01:00.0/information",
            "Model: x\n",
        );
        let err = DriverTreeInventory::new(tmp.path(), "/nonexistent")
            .snapshot()
            .unwrap_err();
        assert!(
            err.0.ends_with("information: no `Bus Location:` line"),
            "{err}"
        );
    }
}
