//! Reads the host's CPU sockets, NUMA nodes and PCI devices from sysfs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mockgpu_api::{BusId, CpuSet, HostNumaNode, HostPciDevice, HostSocket, HostTopology};

/// A sysfs read that failed.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A file held something unexpected.
    #[error("unexpected content in {path}: {content:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What it held.
        content: String,
    },
}

/// Reads the host's layout below a sysfs root (`/sys` on a real host, a directory in tests).
#[derive(Debug, Clone)]
pub struct SysfsHost {
    root: PathBuf,
}

impl Default for SysfsHost {
    fn default() -> Self {
        Self::new("/sys")
    }
}

impl SysfsHost {
    /// A reader for the sysfs mounted at `root`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    fn read(&self, rel: &str) -> Result<String, HostError> {
        let path = self.root.join(rel);
        fs::read_to_string(&path).map_err(|source| HostError::Read { path, source })
    }

    fn cpu_list(&self, rel: &str) -> Result<CpuSet, HostError> {
        let content = self.read(rel)?;
        CpuSet::parse_list(&content).map_err(|_| HostError::Parse {
            path: self.root.join(rel),
            content,
        })
    }

    /// Reads the whole topology.
    pub fn probe(&self) -> Result<HostTopology, HostError> {
        let cpus = self.cpu_list("devices/system/cpu/online")?;
        let nr_cpu_ids = self
            .cpu_list("devices/system/cpu/possible")
            .ok()
            .and_then(|p| p.iter().last())
            .map_or(0, |last| last + 1);
        let mut by_package: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for cpu in cpus.iter() {
            let rel = format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id");
            let package = match self.read(&rel) {
                Ok(s) => s.trim().parse().map_err(|_| HostError::Parse {
                    path: self.root.join(&rel),
                    content: s.clone(),
                })?,
                Err(_) => 0,
            };
            by_package.entry(package).or_default().push(cpu);
        }
        let sockets = by_package
            .into_iter()
            .map(|(id, cpus)| HostSocket {
                id,
                cpus: CpuSet::from_ids(cpus),
            })
            .collect();
        Ok(HostTopology {
            cpus,
            nr_cpu_ids,
            sockets,
            numa_nodes: self.numa_nodes()?,
            pci_devices: self.pci_devices()?,
        })
    }

    fn numa_nodes(&self) -> Result<Vec<HostNumaNode>, HostError> {
        let mut nodes = Vec::new();
        for name in self.dir_names("devices/system/node")? {
            let Some(id) = name.strip_prefix("node").and_then(|n| n.parse().ok()) else {
                continue;
            };
            nodes.push(HostNumaNode {
                id,
                cpus: self.cpu_list(&format!("devices/system/node/{name}/cpulist"))?,
            });
        }
        nodes.sort_by_key(|n| n.id);
        Ok(nodes)
    }

    /// The PCI devices listed in `bus/pci/devices`, by bus id, each with the absolute
    /// `/sys/devices/...` path its link points to.
    pub fn pci_devices(&self) -> Result<Vec<HostPciDevice>, HostError> {
        let mut devices = Vec::new();
        for name in self.dir_names("bus/pci/devices")? {
            let Ok(bus_id) = name.parse::<BusId>() else {
                continue;
            };
            let link = self.root.join("bus/pci/devices").join(&name);
            let target = fs::read_link(&link).map_err(|source| HostError::Read {
                path: link.clone(),
                source,
            })?;
            devices.push(HostPciDevice {
                bus_id,
                sysfs_path: absolute_sysfs_path(Path::new("/sys/bus/pci/devices"), &target),
            });
        }
        devices.sort_by_key(|d| d.bus_id);
        Ok(devices)
    }

    /// Entry names of a directory; a missing directory has none.
    fn dir_names(&self, rel: &str) -> Result<Vec<String>, HostError> {
        let path = self.root.join(rel);
        let entries = match fs::read_dir(&path) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => return Err(HostError::Read { path, source }),
        };
        Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .collect())
    }
}

/// Resolves a link target found in `dir` lexically into an absolute path.
fn absolute_sysfs_path(dir: &Path, target: &Path) -> String {
    let mut parts: Vec<String> = if target.is_absolute() {
        Vec::new()
    } else {
        dir.iter()
            .skip(1)
            .map(|c| c.to_string_lossy().into_owned())
            .collect()
    };
    for c in target.iter() {
        match c.to_str() {
            Some("/") | Some(".") => {}
            Some("..") => {
                parts.pop();
            }
            _ => parts.push(c.to_string_lossy().into_owned()),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn write(root: &Path, rel: &str, content: &str) {
        let p = root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, content).unwrap();
    }

    #[test]
    fn probes_a_two_socket_host() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "devices/system/cpu/online", "0-3\n");
        write(r, "devices/system/cpu/possible", "0-7\n");
        for cpu in 0..4 {
            let pkg = if cpu < 2 { "0" } else { "1" };
            write(
                r,
                &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
                pkg,
            );
        }
        write(r, "devices/system/node/node0/cpulist", "0-1\n");
        write(r, "devices/system/node/node1/cpulist", "2-3\n");
        write(r, "devices/system/node/online", "0-1\n");
        fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:00:1e.0",
            r.join("bus/pci/devices/0000:00:1e.0"),
        )
        .unwrap();
        let h = SysfsHost::new(r).probe().unwrap();
        assert_eq!(h.nr_cpu_ids, 8);
        assert_eq!(h.sockets.len(), 2);
        assert_eq!(h.sockets[1].cpus.to_list(), "2-3");
        assert_eq!(h.numa_nodes.len(), 2);
        assert_eq!(
            h.pci_devices[0].sysfs_path,
            "/sys/devices/pci0000:00/0000:00:1e.0"
        );
    }

    #[test]
    fn missing_cpu_list_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        let e = SysfsHost::new(dir.path()).probe().unwrap_err();
        assert!(e.to_string().contains("devices/system/cpu/online"), "{e}");
    }

    #[test]
    fn probes_this_host() {
        let h = SysfsHost::default().probe().unwrap();
        assert!(!h.cpus.is_empty());
        assert!(!h.sockets.is_empty());
    }
}
