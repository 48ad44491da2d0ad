//! Mount-table chores around the FUSE mount: shared propagation of its parent and detaching a
//! stale mount left by a killed predecessor.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};

/// A mount operation that failed.
#[derive(Debug, thiserror::Error)]
#[error("{what} {path}: {source}")]
pub struct MountError {
    what: &'static str,
    path: PathBuf,
    source: io::Error,
}

fn error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |e| MountError {
        what,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Whether `path` is a mount point, per `/proc/self/mountinfo`.
pub fn is_mount_point(path: &Path) -> bool {
    let Ok(info) = fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape(m) == wanted)
}

/// Undoes the octal escapes of mountinfo (`\040` for a space).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest
            .get(i + 1..i + 4)
            .and_then(|o| u8::from_str_radix(o, 8).ok());
        match code {
            Some(c) => {
                out.push(c as char);
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Makes `dir` a mount point with shared propagation (bind-mounting it onto itself first if it
/// is not one), so that a FUSE mount made inside it later reaches containers that bound `dir`
/// with `rslave`.
pub fn make_shared(dir: &Path) -> Result<(), MountError> {
    fs::create_dir_all(dir).map_err(|source| MountError {
        what: "cannot create",
        path: dir.to_path_buf(),
        source,
    })?;
    if !is_mount_point(dir) {
        mount(Some(dir), dir, None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .map_err(error("cannot bind-mount onto itself", dir))?;
    }
    mount(
        None::<&str>,
        dir,
        None::<&str>,
        MsFlags::MS_SHARED,
        None::<&str>,
    )
    .map_err(error("cannot make shared", dir))
}

/// Detaches whatever is mounted at `path` (a dead FUSE mount answers `ENOTCONN`), so that a
/// fresh mount can take its place. Returns whether something was detached.
pub fn detach_stale(path: &Path) -> Result<bool, MountError> {
    let stale = match fs::metadata(path) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => true,
        _ => is_mount_point(path),
    };
    if stale {
        umount2(path, MntFlags::MNT_DETACH).map_err(error("cannot detach stale mount", path))?;
    }
    Ok(stale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\\"), r"/a\\");
        assert!(is_mount_point(Path::new("/proc")));
        assert!(!is_mount_point(Path::new("/proc/self")));
    }
}
