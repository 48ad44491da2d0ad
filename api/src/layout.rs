//! The `/run/mockgpu` layout: the one owner of where the agent puts things on the host and where
//! containers find them.
//!
//! ```text
//! /run/mockgpu/                 host directory (a shared mount), bound into GPU containers
//! ├── fs/                       the FUSE driver tree (the shim's mock root)
//! │   └── prefixes              the GPUs' sysfs directories the shim also redirects
//! ├── lib/libmockfs.so          the shim
//! ├── lib/libnvidia-ml.so.1     the mock NVML (`libnvidia-ml.so` links to it)
//! ├── bin/nvidia-smi            the mock's nvidia-smi
//! ├── dev/                      device nodes the device plugin hands to the kubelet
//! ├── faults.json               the node's local GPU faults (`mockgpu-agent fault`)
//! └── ld.so.preload             one line: the shim as containers see it
//! /run/mockgpu-keeper/          beside it, never bound into containers (mode 0700)
//! ├── keeper.sock               the keeper, which holds the FUSE connection across agent restarts
//! └── served-paths              the paths of the tree last served on that connection
//! ```

use std::path::{Path, PathBuf};

/// Default host directory, and default container destination.
pub const DEFAULT_DIR: &str = "/run/mockgpu";
/// The shim's file name.
pub const SHIM_FILE: &str = "libmockfs.so";
/// The file, relative to the mock root, listing the extra prefixes the shim redirects.
pub const PREFIXES_FILE: &str = "prefixes";
/// The mock NVML's file name (its SONAME).
pub const NVML_FILE: &str = "libnvidia-ml.so.1";
/// The name without version that some consumers `dlopen` (Slurm, before `gpu_nvml.so`).
pub const NVML_LINK: &str = "libnvidia-ml.so";
/// The node's local faults, in the host directory.
pub const FAULTS_FILE: &str = "faults.json";
/// The mock's `nvidia-smi`.
pub const SMI_FILE: &str = "nvidia-smi";
/// Where containers get `nvidia-smi`, as the NVIDIA container toolkit puts it.
pub const CONTAINER_SMI: &str = "/usr/bin/nvidia-smi";

/// The directories of a container image in which the dynamic loader finds a library by name
/// without `ldconfig` (its built-in search path), for a node of architecture `arch`
/// (`std::env::consts::ARCH`: `x86_64` or `aarch64`): Debian's and Ubuntu's multiarch directory
/// (`/usr/lib/x86_64-linux-gnu`), where the NVIDIA container toolkit puts the driver's
/// libraries, and `/usr/lib64` of the RHEL family (Fedora, Rocky, UBI; SUSE too).
pub fn container_lib_dirs(arch: &str) -> [PathBuf; 2] {
    [
        PathBuf::from(format!("/usr/lib/{arch}-linux-gnu")),
        PathBuf::from("/usr/lib64"),
    ]
}

/// A file of the host directory bound read-only into GPU containers at a path of their own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMount {
    /// The file on the host.
    pub source: PathBuf,
    /// Where the container sees it.
    pub destination: PathBuf,
}

/// A directory that cannot hold the layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {path:?} must be an absolute path other than /")]
pub struct LayoutError {
    /// Which directory.
    pub what: &'static str,
    /// The path given.
    pub path: PathBuf,
}

/// Where the agent's files live on the host, and where containers see them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    host: PathBuf,
    container: PathBuf,
}

impl Default for Layout {
    fn default() -> Self {
        Layout {
            host: DEFAULT_DIR.into(),
            container: DEFAULT_DIR.into(),
        }
    }
}

impl Layout {
    /// The layout rooted at `host` on the host and mounted at `container` in containers.
    pub fn new(
        host: impl Into<PathBuf>,
        container: impl Into<PathBuf>,
    ) -> Result<Self, LayoutError> {
        let check = |what, path: PathBuf| {
            if path.is_absolute() && path != Path::new("/") {
                Ok(path)
            } else {
                Err(LayoutError { what, path })
            }
        };
        Ok(Layout {
            host: check("host directory", host.into())?,
            container: check("container directory", container.into())?,
        })
    }

    /// The host directory (`/run/mockgpu`).
    pub fn host_dir(&self) -> &Path {
        &self.host
    }

    /// Where containers see the host directory (`/run/mockgpu`).
    pub fn container_dir(&self) -> &Path {
        &self.container
    }

    /// The FUSE mount point (`/run/mockgpu/fs`).
    pub fn mount_point(&self) -> PathBuf {
        self.host.join("fs")
    }

    /// The directory holding the shim and the mock NVML (`/run/mockgpu/lib`).
    pub fn lib_dir(&self) -> PathBuf {
        self.host.join("lib")
    }

    /// The directory holding the mock's programs (`/run/mockgpu/bin`).
    pub fn bin_dir(&self) -> PathBuf {
        self.host.join("bin")
    }

    /// The mock NVML on the host (`/run/mockgpu/lib/libnvidia-ml.so.1`).
    pub fn nvml(&self) -> PathBuf {
        self.lib_dir().join(NVML_FILE)
    }

    /// The mock's `nvidia-smi` on the host (`/run/mockgpu/bin/nvidia-smi`).
    pub fn nvidia_smi(&self) -> PathBuf {
        self.bin_dir().join(SMI_FILE)
    }

    /// The files bound into GPU containers of a node of architecture `arch` where NVIDIA's
    /// container toolkit puts the driver's: the NVML under both its names in each of
    /// [`container_lib_dirs`], and `nvidia-smi` at [`CONTAINER_SMI`].
    pub fn tool_mounts(&self, arch: &str) -> Vec<FileMount> {
        let nvml = self.nvml();
        let mut mounts: Vec<FileMount> = container_lib_dirs(arch)
            .iter()
            .flat_map(|dir| [dir.join(NVML_FILE), dir.join(NVML_LINK)])
            .map(|destination| FileMount {
                source: nvml.clone(),
                destination,
            })
            .collect();
        mounts.push(FileMount {
            source: self.nvidia_smi(),
            destination: CONTAINER_SMI.into(),
        });
        mounts
    }

    /// The directory of the device nodes the device plugin allocates (`/run/mockgpu/dev`):
    /// `/dev/nvidia0` of a container is `/run/mockgpu/dev/nvidia0` on the host.
    pub fn dev_dir(&self) -> PathBuf {
        self.host.join("dev")
    }

    /// The node's local GPU faults (`/run/mockgpu/faults.json`, a JSON
    /// [`FaultFile`](crate::fault::FaultFile)), which `mockgpu-agent fault` edits and the agent follows.
    pub fn faults_file(&self) -> PathBuf {
        self.host.join(FAULTS_FILE)
    }

    /// The keeper's directory (`/run/mockgpu-keeper`), beside the host directory rather than in
    /// it: the host directory is bound into GPU containers, and their root must not reach the
    /// keeper.
    pub fn keeper_dir(&self) -> PathBuf {
        let mut name = self.host.file_name().unwrap_or_default().to_os_string();
        name.push("-keeper");
        self.host.with_file_name(name)
    }

    /// The socket of the keeper, the process that holds the FUSE connection while agents come
    /// and go (`/run/mockgpu-keeper/keeper.sock`).
    pub fn keeper_socket(&self) -> PathBuf {
        self.keeper_dir().join("keeper.sock")
    }

    /// The paths of the tree last served through the keeper, one per line
    /// (`/run/mockgpu-keeper/served-paths`): what the kernel may still cache of it when the next
    /// agent serves another tree on the same connection.
    pub fn served_paths(&self) -> PathBuf {
        self.keeper_dir().join("served-paths")
    }

    /// The `ld.so.preload` file bound onto containers' `/etc/ld.so.preload`.
    pub fn ld_so_preload(&self) -> PathBuf {
        self.host.join("ld.so.preload")
    }

    /// The content of [`ld_so_preload`](Self::ld_so_preload): the shim as containers see it.
    pub fn ld_so_preload_content(&self) -> String {
        format!("{}\n", self.container_shim().display())
    }

    /// The mock root as containers see it (`/run/mockgpu/fs`).
    pub fn container_root(&self) -> PathBuf {
        self.container.join("fs")
    }

    /// The shim as containers see it (`/run/mockgpu/lib/libmockfs.so`).
    pub fn container_shim(&self) -> PathBuf {
        self.container.join("lib").join(SHIM_FILE)
    }

    /// Whether containers see the tree where the shim looks without configuration.
    pub fn container_root_is_default(&self) -> bool {
        self.container == Path::new(DEFAULT_DIR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_paths() {
        let l = Layout::default();
        assert_eq!(l.mount_point(), Path::new("/run/mockgpu/fs"));
        assert_eq!(l.lib_dir(), Path::new("/run/mockgpu/lib"));
        assert_eq!(l.dev_dir(), Path::new("/run/mockgpu/dev"));
        assert_eq!(l.faults_file(), Path::new("/run/mockgpu/faults.json"));
        assert_eq!(
            l.keeper_socket(),
            Path::new("/run/mockgpu-keeper/keeper.sock")
        );
        assert!(
            !l.keeper_socket().starts_with(l.host_dir()),
            "containers see the host directory"
        );
        assert_eq!(
            l.served_paths(),
            Path::new("/run/mockgpu-keeper/served-paths")
        );
        assert_eq!(l.ld_so_preload(), Path::new("/run/mockgpu/ld.so.preload"));
        assert_eq!(l.ld_so_preload_content(), "/run/mockgpu/lib/libmockfs.so\n");
        assert!(l.container_root_is_default());
        assert_eq!(l.nvml(), Path::new("/run/mockgpu/lib/libnvidia-ml.so.1"));
        assert_eq!(l.nvidia_smi(), Path::new("/run/mockgpu/bin/nvidia-smi"));
    }

    #[test]
    fn tools_go_where_the_container_toolkit_puts_them() {
        let l = Layout::new("/var/lib/m", "/opt/m").unwrap();
        let mounts = |arch| -> Vec<(String, String)> {
            l.tool_mounts(arch)
                .into_iter()
                .map(|m| {
                    (
                        m.source.display().to_string(),
                        m.destination.display().to_string(),
                    )
                })
                .collect()
        };
        let lib = "/var/lib/m/lib/libnvidia-ml.so.1";
        let expected = |multiarch: &str| -> Vec<(String, String)> {
            [
                format!("/usr/lib/{multiarch}/libnvidia-ml.so.1"),
                format!("/usr/lib/{multiarch}/libnvidia-ml.so"),
                "/usr/lib64/libnvidia-ml.so.1".into(),
                "/usr/lib64/libnvidia-ml.so".into(),
            ]
            .into_iter()
            .map(|d| (lib.to_owned(), d))
            .chain([(
                "/var/lib/m/bin/nvidia-smi".into(),
                "/usr/bin/nvidia-smi".into(),
            )])
            .collect()
        };
        assert_eq!(mounts("x86_64"), expected("x86_64-linux-gnu"));
        assert_eq!(mounts("aarch64"), expected("aarch64-linux-gnu"));
    }

    #[test]
    fn host_and_container_differ() {
        let l = Layout::new("/var/lib/m", "/opt/m").unwrap();
        assert_eq!(l.mount_point(), Path::new("/var/lib/m/fs"));
        assert_eq!(l.container_root(), Path::new("/opt/m/fs"));
        assert_eq!(l.ld_so_preload_content(), "/opt/m/lib/libmockfs.so\n");
        assert!(!l.container_root_is_default());
    }

    #[test]
    fn relative_or_root_directories_are_refused() {
        let e = Layout::new("run/m", "/m").unwrap_err();
        assert_eq!(
            e.to_string(),
            "host directory \"run/m\" must be an absolute path other than /"
        );
        assert!(Layout::new("/m", "/").is_err());
    }
}
