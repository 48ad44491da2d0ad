//! The `/run/mockgpu` layout: the one owner of where the agent puts things on the host and where
//! containers find them.
//!
//! ```text
//! /run/mockgpu/                 host directory (a shared mount), bound into GPU containers
//! ├── fs/                       the FUSE driver tree (the shim's mock root)
//! │   └── prefixes              the GPUs' sysfs directories the shim also redirects
//! ├── lib/libmockfs.so          the shim
//! ├── dev/                      device nodes the device plugin hands to the kubelet
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

    /// The directory holding the shim (`/run/mockgpu/lib`).
    pub fn lib_dir(&self) -> PathBuf {
        self.host.join("lib")
    }

    /// The directory of the device nodes the device plugin allocates (`/run/mockgpu/dev`):
    /// `/dev/nvidia0` of a container is `/run/mockgpu/dev/nvidia0` on the host.
    pub fn dev_dir(&self) -> PathBuf {
        self.host.join("dev")
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
