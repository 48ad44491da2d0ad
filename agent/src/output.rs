//! Writes a [`Tree`] as plain files, symlinks and device nodes (`mockgpu-agent render`).

use std::fs;
use std::io;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev};

use crate::sys::{Linux, Sys};
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
    write_tree_with(&Linux, tree, out)
}

/// [`write_tree`], creating device nodes through `sys`.
pub(crate) fn write_tree_with<S: Sys>(
    sys: &S,
    tree: &Tree,
    out: &Path,
) -> Result<Written, OutputError> {
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
                match sys.mknod(
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use nix::errno::Errno;

    use super::*;
    use crate::sys::fake::{Call, Fake};

    fn tree() -> Tree {
        let mut t = Tree::new();
        t.file("proc/driver/nvidia/version", "NVRM\n");
        t.chardev("dev/nvidia0", 195, 0, 0o666);
        t.chardev("dev/nvidiactl", 195, 255, 0o666);
        t
    }

    #[test]
    fn device_nodes_are_made_with_their_numbers_and_exact_mode() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let fake = Fake::new(true);
        let written = write_tree_with(&fake, &tree(), &out).unwrap();
        assert!(written.skipped_devices.is_empty());
        let mknods: Vec<Call> = fake.calls();
        assert_eq!(
            mknods,
            [
                Call::Mknod {
                    path: out.join("dev/nvidia0"),
                    kind: SFlag::S_IFCHR,
                    perm: Mode::from_bits_truncate(0o666),
                    dev: makedev(195, 0),
                },
                Call::Mknod {
                    path: out.join("dev/nvidiactl"),
                    kind: SFlag::S_IFCHR,
                    perm: Mode::from_bits_truncate(0o666),
                    dev: makedev(195, 255),
                },
            ]
        );
        // The mode is set after mknod, past the umask.
        let mode = fs::metadata(out.join("dev/nvidia0")).unwrap().mode() & 0o7777;
        assert_eq!(mode, 0o666);
        assert_eq!(
            fs::read_to_string(out.join("proc/driver/nvidia/version")).unwrap(),
            "NVRM\n"
        );
    }

    #[test]
    fn device_nodes_are_skipped_without_cap_mknod() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let fake = Fake::new(false).fail(|c| matches!(c, Call::Mknod { .. }), Errno::EPERM);
        let written = write_tree_with(&fake, &tree(), &out).unwrap();
        assert_eq!(written.skipped_devices, ["dev/nvidia0", "dev/nvidiactl"]);
        assert_eq!(written.entries, tree().len() - 2);
        assert!(!out.join("dev/nvidia0").exists());
        assert!(out.join("proc/driver/nvidia/version").exists());
    }

    #[test]
    fn other_mknod_errors_are_errors() {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let fake = Fake::new(true).fail(|c| matches!(c, Call::Mknod { .. }), Errno::ENOSPC);
        let err = write_tree_with(&fake, &tree(), &out)
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("cannot write "), "{err}");
        assert!(err.contains("dev/nvidia0"), "{err}");
        assert_eq!(fake.calls().len(), 1, "stops at the first failure");
    }
}
