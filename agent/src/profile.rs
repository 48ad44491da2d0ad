//! The profile to mock, where it comes from, and the driver tree it makes on this host: what
//! `render`, `exec` and `serve` (at start and on each change) load.

use std::fs;
use std::io::{self, Read as _};
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use mockgpu_api::{
    DevicesError, HostTopology, NodeTopology, ProcDevices, Profile, ProfileError, TopologyError,
};

use crate::host::{HostError, SysfsHost};
use crate::render;
use crate::tree::Tree;

/// Largest profile file accepted (real ones are well under 4 KiB).
pub(crate) const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// Where the profile comes from.
#[derive(Debug, Clone)]
pub enum ProfileSource {
    /// A built-in profile by name.
    Builtin(String),
    /// A YAML file, re-read when it changes (a ConfigMap's symlink swap included).
    File(PathBuf),
}

/// Errors of loading the profile and building its tree on this host.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The profile file could not be read.
    #[error("cannot read profile file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The profile path is not a regular file (a FIFO, a device, a directory).
    #[error("profile file {path} is a {kind}, not a regular file")]
    NotRegular {
        /// The path.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The profile file is larger than any profile.
    #[error("profile file {path} has {size} bytes, more than the {MAX_PROFILE_BYTES} accepted")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// The host's `/proc/devices` could not be read or parsed.
    #[error("cannot read the host's device numbers from {path}: {reason}")]
    ProcDevices {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The profile is invalid.
    #[error(transparent)]
    Profile(#[from] ProfileError),
    /// The GPUs do not fit this host.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// The host could not be read.
    #[error(transparent)]
    Host(#[from] HostError),
}

impl ProfileSource {
    /// Loads and validates the profile; also returns the raw bytes it came from.
    pub fn load(&self) -> Result<(Profile, Vec<u8>), LoadError> {
        let raw = self.read()?;
        Ok((self.parse(&raw)?, raw))
    }

    /// The bytes the profile is made from (a built-in's name), compared to see a change.
    pub fn read(&self) -> Result<Vec<u8>, LoadError> {
        match self {
            ProfileSource::Builtin(name) => Ok(name.as_bytes().to_vec()),
            ProfileSource::File(path) => read_profile_file(path),
        }
    }

    /// The profile `raw` (from [`read`](Self::read)) describes, validated.
    pub fn parse(&self, raw: &[u8]) -> Result<Profile, LoadError> {
        Ok(match self {
            ProfileSource::Builtin(name) => Profile::builtin(name)?,
            ProfileSource::File(path) => {
                Profile::from_yaml(&String::from_utf8_lossy(raw), &path.display().to_string())?
            }
        })
    }
}

/// Reads a profile file: a regular file (a FIFO would block for ever) of at most
/// [`MAX_PROFILE_BYTES`] (a huge file is refused, not read whole).
fn read_profile_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    let io_err = |source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    };
    // O_NONBLOCK: opening a FIFO without a writer must not block before the type is checked.
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err)?;
    let meta = file.metadata().map_err(io_err)?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_fifo() {
            "FIFO"
        } else if ft.is_dir() {
            "directory"
        } else if ft.is_socket() {
            "socket"
        } else {
            "device"
        };
        return Err(LoadError::NotRegular {
            path: path.to_path_buf(),
            kind,
        });
    }
    if meta.len() > MAX_PROFILE_BYTES {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
        });
    }
    let mut raw = Vec::with_capacity(meta.len() as usize);
    file.by_ref()
        .take(MAX_PROFILE_BYTES + 1)
        .read_to_end(&mut raw)
        .map_err(io_err)?;
    if raw.len() as u64 > MAX_PROFILE_BYTES {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            size: raw.len() as u64,
        });
    }
    Ok(raw)
}

/// Reads the host's `/proc/devices` below `procfs`.
pub(crate) fn host_devices(procfs: &Path) -> Result<ProcDevices, LoadError> {
    let path = procfs.join("devices");
    let error = |reason: String| LoadError::ProcDevices {
        path: path.clone(),
        reason,
    };
    let text = fs::read_to_string(&path).map_err(|e| error(e.to_string()))?;
    ProcDevices::parse(&text).map_err(|e: DevicesError| error(e.to_string()))
}

/// Probes the host below `sysfs` and `procfs`, places `profile`'s GPUs onto it for `node_name`
/// and renders their driver tree.
pub fn build(
    profile: &Profile,
    node_name: &str,
    sysfs: &Path,
    procfs: &Path,
) -> Result<(NodeTopology, Tree), LoadError> {
    let (topo, host) = place(profile, node_name, sysfs, procfs)?;
    let tree = render::driver_tree(&topo, &host);
    Ok((topo, tree))
}

/// Probes the host below `sysfs` and `procfs` and places `profile`'s GPUs onto it for
/// `node_name`: what [`render::driver_tree_with`] renders (with faults), and what a fault is
/// checked against.
pub fn place(
    profile: &Profile,
    node_name: &str,
    sysfs: &Path,
    procfs: &Path,
) -> Result<(NodeTopology, HostTopology), LoadError> {
    let mut host = SysfsHost::new(sysfs).probe()?;
    host.devices = host_devices(procfs)?;
    let topo = NodeTopology::build(profile, node_name, &host)?;
    Ok((topo, host))
}

/// The GPUs a fault is checked against: `profile` placed as [`place`] does, or, where this host
/// cannot take it (under `exec`, whose shim shows the mock's own device numbers and PCI
/// devices), on a bare host; the GPU indices and NVLinks are the profile's either way.
pub fn place_for_faults(
    profile: &Profile,
    node_name: &str,
    sysfs: &Path,
    procfs: &Path,
) -> Result<NodeTopology, LoadError> {
    match place(profile, node_name, sysfs, procfs) {
        Ok((topo, _)) => Ok(topo),
        Err(e) => {
            tracing::debug!(error = %e, "the profile does not fit this host; checking on a bare one");
            let host = HostTopology {
                cpus: mockgpu_api::CpuSet::from_ids(0..2),
                nr_cpu_ids: 2,
                ..Default::default()
            };
            Ok(NodeTopology::build(profile, node_name, &host)?)
        }
    }
}
