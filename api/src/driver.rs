//! The GPUs of an NVIDIA driver tree, real or mocked: `<proc>/driver/nvidia/gpus/*/information`
//! and the PCI and CPU files of `<sys>` that place each GPU.
//!
//! The files are read through [`DriverFiles`], which the callers implement over the file
//! system; this crate only parses.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use crate::{CpuSet, Gpu, Information};

/// Read access to a driver tree's files.
pub trait DriverFiles {
    /// The text of the file at `path`.
    fn read(&self, path: &Path) -> io::Result<String>;
    /// The names of the entries of the directory `dir`, in any order.
    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>>;
}

/// Whether the real NVIDIA driver below `proc_root` (`/proc`) lists any GPU.
pub fn real_driver_loaded(files: &impl DriverFiles, proc_root: &Path) -> bool {
    files
        .list(&proc_root.join("driver/nvidia/gpus"))
        .is_ok_and(|names| !names.is_empty())
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
pub fn read_gpus(
    files: &impl DriverFiles,
    proc_root: &Path,
    sys_root: &Path,
) -> Result<Vec<DriverGpu>, TreeError> {
    let read_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TreeError::Read { path, source }
    };
    let dir = proc_root.join("driver/nvidia/gpus");
    let mut found = Vec::new();
    for name in files.list(&dir).map_err(read_err(&dir))? {
        let path = dir.join(name).join("information");
        let text = files.read(&path).map_err(read_err(&path))?;
        let information = Information::parse(&text).map_err(|e| TreeError::Content {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let device = sys_root.join(format!("bus/pci/devices/{}", information.bus_location));
        let attr = |name: &str| files.read(&device.join(name)).ok();
        let cpus = attr("local_cpulist")
            .and_then(|l| CpuSet::parse_list(&l).ok())
            .unwrap_or_default();
        let socket = cpus
            .iter()
            .next()
            .and_then(|cpu| {
                let rel = format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id");
                files.read(&sys_root.join(rel)).ok()?.trim().parse().ok()
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    /// A driver tree in memory: files by path; a directory lists the names below it.
    #[derive(Default)]
    struct Fake(BTreeMap<PathBuf, String>);

    impl Fake {
        fn file(mut self, path: &str, text: &str) -> Fake {
            self.0.insert(path.into(), text.into());
            self
        }

        fn gpu(self, bus: &str, minor: u32) -> Fake {
            self.file(
                &format!("/proc/driver/nvidia/gpus/{bus}/information"),
                &format!(
                    "Model: \t\t NVIDIA GB300\nIRQ:   \t\t 7\nGPU UUID: \t GPU-{minor:08x}-0000-0000-0000-000000000000\nBus Location: \t {bus}\nDevice Minor: \t {minor}\nGPU Excluded:\t No\n"
                ),
            )
        }
    }

    impl DriverFiles for Fake {
        fn read(&self, path: &Path) -> io::Result<String> {
            self.0
                .get(path)
                .cloned()
                .ok_or(io::ErrorKind::NotFound.into())
        }

        fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
            let mut names: Vec<OsString> = self
                .0
                .keys()
                .filter_map(|p| p.strip_prefix(dir).ok()?.iter().next())
                .map(OsString::from)
                .collect();
            names.dedup();
            if names.is_empty() {
                return Err(io::ErrorKind::NotFound.into());
            }
            Ok(names)
        }
    }

    fn read(files: &Fake) -> Result<Vec<DriverGpu>, TreeError> {
        read_gpus(files, Path::new("/proc"), Path::new("/sys"))
    }

    #[test]
    fn reads_gpus_in_minor_order_with_their_placement() {
        let files = Fake::default()
            .gpu("0000:01:00.0", 1)
            .gpu("0000:02:00.0", 0)
            .file("/sys/bus/pci/devices/0000:02:00.0/numa_node", "1\n")
            .file("/sys/bus/pci/devices/0000:02:00.0/local_cpulist", "4-7\n")
            .file(
                "/sys/devices/system/cpu/cpu4/topology/physical_package_id",
                "1\n",
            );
        let gpus = read(&files).unwrap();
        let placed: Vec<_> = gpus
            .iter()
            .map(|g| {
                let g = &g.gpu;
                (
                    g.index,
                    g.minor,
                    g.bus_id.to_string(),
                    g.numa_node,
                    g.socket,
                )
            })
            .collect();
        assert_eq!(
            placed,
            [
                (0, 0, "0000:02:00.0".to_string(), 1, 1),
                (1, 1, "0000:01:00.0".to_string(), -1, 0)
            ]
        );
        let cpus: Vec<_> = gpus.iter().map(|g| g.gpu.cpus.to_list()).collect();
        assert_eq!(cpus, ["4-7", ""]);
        let first = &gpus[0];
        assert_eq!(first.gpu.uuid, "GPU-00000000-0000-0000-0000-000000000000");
        assert_eq!(
            (first.gpu.irq, first.information.model.as_str()),
            (7, "NVIDIA GB300")
        );
    }

    #[test]
    fn a_real_driver_lists_a_gpu() {
        let proc_root = Path::new("/proc");
        assert!(!real_driver_loaded(&Fake::default(), proc_root));
        let files = Fake::default().gpu("0000:01:00.0", 0);
        assert!(real_driver_loaded(&files, proc_root));
    }

    #[test]
    fn missing_or_broken_trees_say_what_is_wrong() {
        let err = read(&Fake::default()).unwrap_err();
        assert!(err.is_not_found(), "{err}");
        assert_eq!(
            err.to_string(),
            "cannot read /proc/driver/nvidia/gpus: entity not found"
        );
        let files = Fake::default().file(
            "/proc/driver/nvidia/gpus/0000:01:00.0/information",
            "Model: x\n",
        );
        let err = read(&files).unwrap_err();
        assert!(!err.is_not_found());
        assert_eq!(
            err.to_string(),
            "/proc/driver/nvidia/gpus/0000:01:00.0/information: no `Bus Location:` line"
        );
    }
}
