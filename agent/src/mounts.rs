//! Mount-table chores around the FUSE mount: shared propagation of its parent and detaching a
//! stale mount left by a killed predecessor.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags};

use crate::sys::{Linux, Sys};

/// A mount chore that failed.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// A host call failed.
    #[error("{what} {path}: {source}")]
    Call {
        /// What was being done.
        what: &'static str,
        /// The path it was done to.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
    /// The mount point is served by a live process.
    #[error(
        "another process serves the mount point {path} (a lookup there answered: {answer}); stop it or choose another mount point"
    )]
    InUse {
        /// The mount point.
        path: PathBuf,
        /// What the probing lookup answered.
        answer: io::Error,
    },
}

fn error<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(nix::Error) -> MountError + 'a {
    move |e| MountError::Call {
        what,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// A name the driver tree never holds: looking it up always reaches the server, because the
/// kernel caches no negative entries for it.
pub(crate) const PROBE: &str = ".mockgpu-liveness-probe";

/// Whether `path` is a mount point in the calling thread's mount table.
pub fn is_mount_point(path: &Path) -> bool {
    is_mount_point_with(&Linux, path)
}

/// [`is_mount_point`] through `sys`.
pub(crate) fn is_mount_point_with<S: Sys>(sys: &S, path: &Path) -> bool {
    let Ok(info) = sys.mountinfo() else {
        return false;
    };
    let wanted = path.to_string_lossy();
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|m| unescape(m) == wanted)
}

/// Undoes the octal escapes of mountinfo (`\040` for a space).
pub(crate) fn unescape(s: &str) -> String {
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
pub(crate) fn make_shared<S: Sys>(sys: &S, dir: &Path) -> Result<(), MountError> {
    fs::create_dir_all(dir).map_err(|source| MountError::Call {
        what: "cannot create",
        path: dir.to_path_buf(),
        source,
    })?;
    if !is_mount_point_with(sys, dir) {
        sys.mount(Some(dir), dir, MsFlags::MS_BIND)
            .map_err(error("cannot bind-mount onto itself", dir))?;
    }
    sys.mount(None, dir, MsFlags::MS_SHARED)
        .map_err(error("cannot make shared", dir))
}

/// Detaches the mount at `path` if its server is dead, so that a fresh mount can take its
/// place; returns whether something was detached. A dead FUSE mount still answers what the
/// kernel cached (the mount point itself included), so the test is a lookup of a name that
/// does not exist: `ENOTCONN` means dead, any other answer means a live server, and then the
/// mount stays and [`MountError::InUse`] is returned.
pub(crate) fn detach_stale<S: Sys>(sys: &S, path: &Path) -> Result<bool, MountError> {
    if !is_mount_point_with(sys, path) {
        return Ok(false);
    }
    match sys.lookup(&path.join(PROBE)) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            sys.umount2(path, MntFlags::MNT_DETACH)
                .map_err(error("cannot detach stale mount", path))?;
            Ok(true)
        }
        answer => Err(MountError::InUse {
            path: path.to_path_buf(),
            answer: answer.err().unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::AlreadyExists, "the probed name exists")
            }),
        }),
    }
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;

    use super::*;
    use crate::sys::fake::{Call, Fake};

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape(r"/a\040b"), "/a b");
        assert_eq!(unescape(r"/a\\"), r"/a\\");
        assert!(is_mount_point(Path::new("/proc")));
        assert!(!is_mount_point(Path::new("/proc/self")));
        let fake = Fake::new(true).mounted(Path::new("/run/a b"));
        assert!(is_mount_point_with(&fake, Path::new("/run/a b")));
        assert!(!is_mount_point_with(&fake, Path::new("/run/a")));
    }

    fn bind(dir: &Path) -> Call {
        Call::Mount {
            source: Some(dir.to_path_buf()),
            target: dir.to_path_buf(),
            flags: MsFlags::MS_BIND,
        }
    }

    fn shared(dir: &Path) -> Call {
        Call::Mount {
            source: None,
            target: dir.to_path_buf(),
            flags: MsFlags::MS_SHARED,
        }
    }

    #[test]
    fn make_shared_binds_a_plain_directory_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let fake = Fake::new(true);
        make_shared(&fake, &dir).unwrap();
        assert!(dir.is_dir());
        assert_eq!(fake.calls(), [bind(&dir), shared(&dir)]);
        assert!(fake.is_mounted(&dir));
    }

    #[test]
    fn make_shared_only_changes_the_propagation_of_a_mount_point() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Fake::new(true).mounted(tmp.path());
        make_shared(&fake, tmp.path()).unwrap();
        assert_eq!(fake.calls(), [shared(tmp.path())]);
    }

    #[test]
    fn make_shared_names_the_failing_step() {
        let tmp = tempfile::tempdir().unwrap();
        let fake = Fake::new(true).fail(
            |c| matches!(c, Call::Mount { flags, .. } if flags.contains(MsFlags::MS_BIND)),
            Errno::EPERM,
        );
        let err = make_shared(&fake, tmp.path()).unwrap_err().to_string();
        assert!(err.starts_with("cannot bind-mount onto itself /"), "{err}");
        assert!(
            err.contains("EPERM") || err.contains("not permitted"),
            "{err}"
        );
        assert_eq!(fake.calls(), [bind(tmp.path())], "stops at the failure");
    }

    #[test]
    fn detach_stale_leaves_a_plain_directory_alone() {
        let fake = Fake::new(true);
        assert!(!detach_stale(&fake, Path::new("/run/mockgpu/fs")).unwrap());
        assert_eq!(fake.calls(), []);
    }

    #[test]
    fn detach_stale_detaches_a_dead_mount() {
        let mnt = Path::new("/run/mockgpu/fs");
        let fake = Fake::new(true)
            .mounted(mnt)
            .answers(&mnt.join(PROBE), Errno::ENOTCONN);
        assert!(detach_stale(&fake, mnt).unwrap());
        assert_eq!(
            fake.calls(),
            [
                Call::Lookup(mnt.join(PROBE)),
                Call::Umount2 {
                    target: mnt.to_path_buf(),
                    flags: MntFlags::MNT_DETACH,
                },
            ]
        );
        assert!(!fake.is_mounted(mnt));
    }

    #[test]
    fn detach_stale_refuses_a_live_mount() {
        let mnt = Path::new("/run/mockgpu/fs");
        for answer in [Errno::ENOENT, Errno::EACCES] {
            let fake = Fake::new(true)
                .mounted(mnt)
                .answers(&mnt.join(PROBE), answer);
            let err = detach_stale(&fake, mnt).unwrap_err();
            assert!(matches!(err, MountError::InUse { .. }), "{err}");
            let msg = err.to_string();
            assert!(
                msg.contains("another process serves the mount point /run/mockgpu/fs"),
                "{msg}"
            );
            assert_eq!(fake.calls(), [Call::Lookup(mnt.join(PROBE))]);
            assert!(fake.is_mounted(mnt));
        }
    }

    #[test]
    fn detach_stale_reports_a_failed_detach() {
        let mnt = Path::new("/run/mockgpu/fs");
        let fake = Fake::new(true)
            .mounted(mnt)
            .answers(&mnt.join(PROBE), Errno::ENOTCONN)
            .fail(|c| matches!(c, Call::Umount2 { .. }), Errno::EBUSY);
        let err = detach_stale(&fake, mnt).unwrap_err().to_string();
        assert!(
            err.starts_with("cannot detach stale mount /run/mockgpu/fs"),
            "{err}"
        );
    }
}
