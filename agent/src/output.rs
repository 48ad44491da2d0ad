//! Writes a [`Tree`] as plain files, symlinks and device nodes (`mockgpu-agent render`).

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use crate::tree::{Kind, Tree};

/// Why a tree could not be written.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The output directory exists and is not empty.
    #[error("{0} exists and is not empty; refusing to overwrite it")]
    NotEmpty(PathBuf),
    /// A file system operation failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The path being written.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
}

/// What [`write_tree`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Written {
    /// Entries written.
    pub entries: usize,
    /// Device nodes skipped because this process may not create them (no `CAP_MKNOD`).
    pub skipped_devices: Vec<String>,
}

/// Writes `tree` below `out`, which must be absent or empty.
pub fn write_tree(tree: &Tree, out: &Path) -> Result<Written, OutputError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| OutputError::Io { path, source }
    };
    if out.exists() && fs::read_dir(out).map_err(io_err(out))?.next().is_some() {
        return Err(OutputError::NotEmpty(out.to_path_buf()));
    }
    fs::create_dir_all(out).map_err(io_err(out))?;
    let mut written = Written::default();
    let mut dirs = Vec::new();
    for (rel, entry) in tree.iter() {
        let path = out.join(rel);
        match &entry.kind {
            Kind::Dir => {
                fs::create_dir_all(&path).map_err(io_err(&path))?;
                dirs.push((path, entry.mode));
            }
            Kind::File(content) => {
                fs::write(&path, content).map_err(io_err(&path))?;
                fs::set_permissions(&path, fs::Permissions::from_mode(entry.mode.into()))
                    .map_err(io_err(&path))?;
            }
            Kind::Symlink(target) => symlink(target, &path).map_err(io_err(&path))?,
            Kind::CharDev { major, minor } => {
                let mode = Mode::from_bits_truncate(entry.mode.into());
                match mknod(
                    &path,
                    SFlag::S_IFCHR,
                    mode,
                    makedev((*major).into(), (*minor).into()),
                ) {
                    // mknod applies the umask; set the exact mode afterwards.
                    Ok(()) => {
                        fs::set_permissions(&path, fs::Permissions::from_mode(entry.mode.into()))
                            .map_err(io_err(&path))?
                    }
                    Err(nix::errno::Errno::EPERM) => {
                        written.skipped_devices.push(rel.to_string());
                        continue;
                    }
                    Err(e) => return Err(io_err(&path)(e.into())),
                }
            }
        }
        written.entries += 1;
    }
    // Directories last, deepest first, so that read-only modes do not block their contents.
    for (path, mode) in dirs.into_iter().rev() {
        fs::set_permissions(&path, fs::Permissions::from_mode(mode.into()))
            .map_err(io_err(&path))?;
    }
    Ok(written)
}
