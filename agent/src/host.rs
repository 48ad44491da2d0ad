//! Reads the host's CPU sockets, NUMA nodes and PCI devices from sysfs.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mockgpu_api::{
    BusId, CpuListError, CpuSet, HostNumaNode, HostPciDevice, HostSocket, HostTopology,
};

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
    /// A CPU list file held something that is not a usable CPU list.
    #[error("unexpected content in {path}: {source}")]
    CpuList {
        /// The file.
        path: PathBuf,
        /// What is wrong with the list.
        source: CpuListError,
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
        self.parse_cpu_list(rel, &self.read(rel)?)
    }

    fn parse_cpu_list(&self, rel: &str, content: &str) -> Result<CpuSet, HostError> {
        CpuSet::parse_list(content).map_err(|source| HostError::CpuList {
            path: self.root.join(rel),
            source,
        })
    }

    /// A CPU's `physical_package_id`: `None` for `-1` (no package known, as on some VMs), `0`
    /// when the file is missing.
    fn package_of(&self, cpu: u32) -> Result<Option<u32>, HostError> {
        let rel = format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id");
        let Ok(content) = self.read(&rel) else {
            return Ok(Some(0));
        };
        match content.trim() {
            "-1" => Ok(None),
            id => id.parse().map(Some).map_err(|_| HostError::Parse {
                path: self.root.join(&rel),
                content,
            }),
        }
    }

    /// Reads the whole topology.
    pub fn probe(&self) -> Result<HostTopology, HostError> {
        let cpus = self.cpu_list("devices/system/cpu/online")?;
        // A missing `possible` leaves the mask width to the online CPUs; a bad one is an error.
        // CPU ids are below `MAX_CPUS` (checked by the parser), so `last + 1` cannot overflow.
        let possible = "devices/system/cpu/possible";
        let nr_cpu_ids = match self.read(possible) {
            Ok(content) => self.parse_cpu_list(possible, &content)?.last(),
            Err(_) => None,
        }
        .map_or(0, |last| last + 1);
        let mut by_package: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        let mut unknown_package = Vec::new();
        for cpu in cpus.iter() {
            match self.package_of(cpu)? {
                Some(package) => by_package.entry(package).or_default().push(cpu),
                None => unknown_package.push(cpu),
            }
        }
        // CPUs without a package form one socket, with the lowest id no real package has.
        if !unknown_package.is_empty() {
            let free = by_package.keys().zip(0u32..).find(|(id, i)| *id != i);
            let id = free.map_or(by_package.len() as u32, |(_, i)| i);
            by_package.insert(id, unknown_package);
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
            devices: Default::default(),
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

    /// A fake sysfs tree of `tests/fixtures`.
    fn fixture(name: &str) -> SysfsHost {
        SysfsHost::new(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(name),
        )
    }

    fn pci_paths(h: &HostTopology) -> Vec<&str> {
        h.pci_devices
            .iter()
            .map(|d| d.sysfs_path.as_str())
            .collect()
    }

    fn lists<'a>(sets: impl IntoIterator<Item = &'a CpuSet>) -> Vec<String> {
        sets.into_iter().map(|s| s.to_list()).collect()
    }

    #[test]
    fn probes_a_two_socket_host() {
        let h = fixture("two-socket").probe().unwrap();
        assert_eq!(h.cpus.to_list(), "0-7");
        assert_eq!(h.nr_cpu_ids, 16);
        let ids: Vec<_> = h.sockets.iter().map(|s| s.id).collect();
        assert_eq!(ids, [0, 1]);
        assert_eq!(lists(h.sockets.iter().map(|s| &s.cpus)), ["0-3", "4-7"]);
        assert_eq!(lists(h.numa_nodes.iter().map(|n| &n.cpus)), ["0-3", "4-7"]);
        assert_eq!(
            pci_paths(&h),
            [
                "/sys/devices/pci0000:00/0000:00:00.0",
                "/sys/devices/pci0000:00/0000:00:1e.0"
            ]
        );
    }

    #[test]
    fn probes_a_host_with_two_numa_nodes_per_socket() {
        let h = fixture("four-numa").probe().unwrap();
        assert_eq!(h.nr_cpu_ids, 16);
        assert_eq!(
            lists(h.sockets.iter().map(|s| &s.cpus)),
            ["0-3,8-11", "4-7,12-15"]
        );
        let ids: Vec<_> = h.numa_nodes.iter().map(|n| n.id).collect();
        assert_eq!(ids, [0, 1, 2, 3]);
        assert_eq!(
            lists(h.numa_nodes.iter().map(|n| &n.cpus)),
            ["0-1,8-9", "2-3,10-11", "4-5,12-13", "6-7,14-15"]
        );
    }

    /// A host whose CPUs 0-3 report the given `physical_package_id`s.
    fn host_with_packages(packages: [&str; 4]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "devices/system/cpu/online", "0-3\n");
        for (cpu, package) in packages.iter().enumerate() {
            write(
                dir.path(),
                &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
                &format!("{package}\n"),
            );
        }
        dir
    }

    #[test]
    fn cpus_without_a_package_form_one_socket() {
        // Some VMs report -1 for every CPU.
        let dir = host_with_packages(["-1"; 4]);
        let h = SysfsHost::new(dir.path()).probe().unwrap();
        assert_eq!(h.sockets.len(), 1);
        assert_eq!(
            (h.sockets[0].id, h.sockets[0].cpus.to_list()),
            (0, "0-3".into())
        );
        // Mixed with real packages, they get the lowest id no real package has.
        let dir = host_with_packages(["0", "0", "-1", "2"]);
        let h = SysfsHost::new(dir.path()).probe().unwrap();
        let sockets: Vec<_> = h.sockets.iter().map(|s| (s.id, s.cpus.to_list())).collect();
        assert_eq!(
            sockets,
            [(0, "0-1".into()), (1, "2".into()), (2, "3".into())]
        );
        // Anything else that is not a package id is still an error naming the file.
        let dir = host_with_packages(["0", "-2", "0", "0"]);
        let e = SysfsHost::new(dir.path()).probe().unwrap_err();
        assert!(
            e.to_string().contains("cpu1/topology/physical_package_id"),
            "{e}"
        );
    }

    #[test]
    fn the_largest_cpu_id_is_a_named_error() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "devices/system/cpu/online", "0-1\n");
        write(dir.path(), "devices/system/cpu/possible", "0-4294967295\n");
        let e = SysfsHost::new(dir.path()).probe().unwrap_err().to_string();
        assert!(e.contains("devices/system/cpu/possible"), "{e}");
        assert!(e.contains("cpu id 4294967295 is out of range"), "{e}");
        write(dir.path(), "devices/system/cpu/possible", "0-1\n");
        write(dir.path(), "devices/system/cpu/online", "4294967295\n");
        let e = SysfsHost::new(dir.path()).probe().unwrap_err().to_string();
        assert!(e.contains("devices/system/cpu/online"), "{e}");
        assert!(e.contains("cpu id 4294967295 is out of range"), "{e}");
    }

    #[test]
    fn pci_links_resolve_to_absolute_sysfs_paths() {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path();
        write(r, "devices/system/cpu/online", "0\n");
        fs::create_dir_all(r.join("bus/pci/devices")).unwrap();
        symlink(
            "../../../devices/pci0000:00/0000:00:03.0/0000:01:00.0",
            r.join("bus/pci/devices/0000:01:00.0"),
        )
        .unwrap();
        symlink(
            "/sys/devices/pci0000:40/0000:40:00.0",
            r.join("bus/pci/devices/0000:40:00.0"),
        )
        .unwrap();
        let h = SysfsHost::new(r).probe().unwrap();
        assert_eq!(
            pci_paths(&h),
            [
                "/sys/devices/pci0000:00/0000:00:03.0/0000:01:00.0",
                "/sys/devices/pci0000:40/0000:40:00.0"
            ]
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
        // Only what holds on any Linux host: the probe succeeds, the sockets split the online
        // CPUs between them, and every online CPU id is a possible one.
        let h = SysfsHost::default().probe().unwrap();
        assert!(!h.cpus.is_empty());
        let mut union = CpuSet::default();
        for s in &h.sockets {
            assert!(!s.cpus.is_empty() && s.cpus.is_subset(&h.cpus));
            union = union.union(&s.cpus);
        }
        assert_eq!(union, h.cpus);
        let in_sockets: usize = h.sockets.iter().map(|s| s.cpus.len()).sum();
        assert_eq!(in_sockets, h.cpus.len(), "a CPU is in two sockets");
        assert!(h.cpus.last() < Some(h.nr_cpu_ids));
    }
}
