//! The node's GPUs as the plugin needs them: the seam to the agent.
//!
//! The agent implements [`Inventory`] from its topology; the standalone binary uses
//! [`DriverTreeInventory`], which reads a driver tree with [`read_gpus`], the same reader the
//! agent's real-GPU mode uses on the real driver's files.

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use mockgpu_api::{CpuSet, DeviceNumbers, Gpu, Information, ProcDevices};

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

/// Whether the real NVIDIA driver below `proc_root` (`/proc`) lists any GPU.
pub fn real_driver_loaded(proc_root: &Path) -> bool {
    fs::read_dir(proc_root.join("driver/nvidia/gpus")).is_ok_and(|mut d| d.next().is_some())
}

/// A driver tree that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum TreeError {
    /// A file or directory could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file does not say what the driver writes.
    #[error("{path}: {reason}")]
    Content {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

impl TreeError {
    /// Whether the tree has no GPU directory at all (no driver loaded).
    pub fn is_not_found(&self) -> bool {
        matches!(self, TreeError::Read { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// One GPU found in a driver tree: its identity and placement, and its `information` file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverGpu {
    /// The GPU (index in minor order).
    pub gpu: Gpu,
    /// What its `information` file says.
    pub information: Information,
}

/// Reads the GPUs of a driver tree: `<proc>/driver/nvidia/gpus/*/information` and each GPU's
/// `<sys>/bus/pci/devices/<bdf>/{numa_node,local_cpulist}`; the socket is the package of the
/// GPU's first local CPU where `<sys>/devices/system/cpu` tells, else 0. Ordered by minor.
pub fn read_gpus(proc_root: &Path, sys_root: &Path) -> Result<Vec<DriverGpu>, TreeError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TreeError::Read { path, source }
    };
    let dir = proc_root.join("driver/nvidia/gpus");
    let mut found = Vec::new();
    for entry in fs::read_dir(&dir).map_err(read_err(&dir))? {
        let path = entry.map_err(read_err(&dir))?.path().join("information");
        let text = fs::read_to_string(&path).map_err(read_err(&path))?;
        let information = Information::parse(&text).map_err(|e| TreeError::Content {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let device = sys_root.join(format!("bus/pci/devices/{}", information.bus_location));
        let attr = |name: &str| fs::read_to_string(device.join(name)).ok();
        let cpus = attr("local_cpulist")
            .and_then(|l| CpuSet::parse_list(&l).ok())
            .unwrap_or_default();
        let socket = cpus
            .iter()
            .next()
            .and_then(|cpu| {
                let rel = format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id");
                fs::read_to_string(sys_root.join(rel))
                    .ok()?
                    .trim()
                    .parse()
                    .ok()
            })
            .unwrap_or(0);
        found.push(DriverGpu {
            gpu: Gpu {
                index: 0,
                minor: information.device_minor,
                uuid: information.uuid.clone(),
                bus_id: information.bus_location,
                irq: information.irq.unwrap_or(0),
                socket,
                numa_node: attr("numa_node")
                    .and_then(|n| n.trim().parse().ok())
                    .unwrap_or(-1),
                cpus,
            },
            information,
        });
    }
    found.sort_by_key(|g| g.gpu.minor);
    for (index, g) in (0..).zip(found.iter_mut()) {
        g.gpu.index = index;
    }
    Ok(found)
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
        real_driver_loaded(&self.procfs)
    }

    fn snapshot(&self) -> Result<GpuInventory, NotReady> {
        let not_ready = |e: &dyn std::fmt::Display| NotReady(e.to_string());
        let gpus = read_gpus(&self.root.join("proc"), &self.root.join("sys"))
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
            read_gpus(&tmp.path().join("proc"), tmp.path())
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
