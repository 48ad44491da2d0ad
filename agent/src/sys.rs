//! The host calls that change the mount table, create device nodes or probe mounts, behind
//! [`Sys`]: [`Linux`] makes the real calls, and the unit tests' recording fake lets the logic
//! around them run without root.

use std::fs;
use std::io;
use std::path::Path;

use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::{Mode, SFlag};

use crate::tree::Tree;

/// The host calls of mount chores, `render` and `exec`.
pub trait Sys {
    /// A mounted FUSE tree, unmounted by [`Sys::unmount_fuse`].
    type Fuse;

    /// `mount(2)` without a file system type or data: a bind mount when `source` is given, a
    /// propagation change otherwise.
    fn mount(&self, source: Option<&Path>, target: &Path, flags: MsFlags) -> nix::Result<()>;
    /// `umount2(2)`.
    fn umount2(&self, target: &Path, flags: MntFlags) -> nix::Result<()>;
    /// `mknod(2)`.
    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: libc::dev_t) -> nix::Result<()>;
    /// `unshare(2)`.
    fn unshare(&self, flags: CloneFlags) -> nix::Result<()>;
    /// The calling thread's mount table, in `/proc/<pid>/mountinfo` format.
    fn mountinfo(&self) -> io::Result<String>;
    /// Looks `path` up without following a final symlink (`lstat(2)`).
    fn lookup(&self, path: &Path) -> io::Result<()>;
    /// Whether the effective user is root.
    fn is_root(&self) -> bool;
    /// Serves `tree` over FUSE at `mountpoint`.
    fn mount_fuse(&self, tree: &Tree, mountpoint: &Path) -> io::Result<Self::Fuse>;
    /// Unmounts what [`Sys::mount_fuse`] mounted.
    fn unmount_fuse(&self, fuse: Self::Fuse) -> io::Result<()>;
}

/// Moves the calling thread (the process, when it has one thread) into a new mount namespace
/// with private propagation: mounts made there never reach the host and vanish with the last
/// process in it. Processes started from that thread inherit the namespace.
pub fn enter_private_namespace<S: Sys>(sys: &S) -> nix::Result<()> {
    sys.unshare(CloneFlags::CLONE_NEWNS)?;
    sys.mount(None, Path::new("/"), MsFlags::MS_REC | MsFlags::MS_PRIVATE)
}

/// The real host calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct Linux;

impl Sys for Linux {
    type Fuse = crate::fuse::Mounted;

    fn mount(&self, source: Option<&Path>, target: &Path, flags: MsFlags) -> nix::Result<()> {
        nix::mount::mount(source, target, None::<&str>, flags, None::<&str>)
    }

    fn umount2(&self, target: &Path, flags: MntFlags) -> nix::Result<()> {
        nix::mount::umount2(target, flags)
    }

    fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: libc::dev_t) -> nix::Result<()> {
        nix::sys::stat::mknod(path, kind, perm, dev)
    }

    fn unshare(&self, flags: CloneFlags) -> nix::Result<()> {
        nix::sched::unshare(flags)
    }

    fn mountinfo(&self) -> io::Result<String> {
        // The thread's, not the process's: a thread can have a mount namespace of its own.
        fs::read_to_string("/proc/thread-self/mountinfo")
    }

    fn lookup(&self, path: &Path) -> io::Result<()> {
        fs::symlink_metadata(path).map(drop)
    }

    fn is_root(&self) -> bool {
        nix::unistd::geteuid().is_root()
    }

    fn mount_fuse(&self, tree: &Tree, mountpoint: &Path) -> io::Result<Self::Fuse> {
        crate::fuse::mount(tree, mountpoint, None)
    }

    fn unmount_fuse(&self, fuse: Self::Fuse) -> io::Result<()> {
        fuse.unmount()
    }
}

#[cfg(test)]
pub(crate) mod fake {
    //! A [`Sys`] that records every call and keeps a mount table of its own.

    use std::cell::RefCell;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::PathBuf;

    use nix::errno::Errno;

    use super::*;

    /// One recorded call with its arguments.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Call {
        Mount {
            source: Option<PathBuf>,
            target: PathBuf,
            flags: MsFlags,
        },
        Umount2 {
            target: PathBuf,
            flags: MntFlags,
        },
        Mknod {
            path: PathBuf,
            kind: SFlag,
            perm: Mode,
            dev: libc::dev_t,
        },
        Unshare(CloneFlags),
        Lookup(PathBuf),
        MountFuse(PathBuf),
        UnmountFuse(PathBuf),
    }

    type Rule = (Box<dyn Fn(&Call) -> bool>, Errno);

    /// The fake. A successful bind or FUSE mount adds its target to the fake mount table, an
    /// unmount removes it; `mknod` leaves an empty regular file in the node's place so that the
    /// caller's later steps (setting the mode) find something.
    pub(crate) struct Fake {
        /// What [`Sys::is_root`] answers.
        pub root: bool,
        calls: RefCell<Vec<Call>>,
        mounted: RefCell<BTreeSet<PathBuf>>,
        lookups: BTreeMap<PathBuf, Errno>,
        failures: Vec<Rule>,
    }

    impl Fake {
        /// A fake for root (`root`) or an ordinary user with an empty mount table.
        pub fn new(root: bool) -> Fake {
            Fake {
                root,
                calls: RefCell::default(),
                mounted: RefCell::default(),
                lookups: BTreeMap::new(),
                failures: Vec::new(),
            }
        }

        /// Adds `path` to the mount table.
        pub fn mounted(self, path: &Path) -> Fake {
            self.mounted.borrow_mut().insert(path.to_path_buf());
            self
        }

        /// Makes lookups of `path` answer `errno` (`ENOENT` otherwise: nothing exists).
        pub fn answers(mut self, path: &Path, errno: Errno) -> Fake {
            self.lookups.insert(path.to_path_buf(), errno);
            self
        }

        /// Makes every call that `which` matches fail with `errno` (it is still recorded).
        pub fn fail(mut self, which: impl Fn(&Call) -> bool + 'static, errno: Errno) -> Fake {
            self.failures.push((Box::new(which), errno));
            self
        }

        /// The calls made so far.
        pub fn calls(&self) -> Vec<Call> {
            self.calls.borrow().clone()
        }

        /// Whether `path` is in the fake mount table.
        pub(crate) fn is_mounted(&self, path: &Path) -> bool {
            self.mounted.borrow().contains(path)
        }

        fn call(&self, call: Call) -> nix::Result<()> {
            let failure = self.failures.iter().find(|(which, _)| which(&call));
            self.calls.borrow_mut().push(call);
            failure.map_or(Ok(()), |(_, errno)| Err(*errno))
        }
    }

    impl Sys for Fake {
        type Fuse = PathBuf;

        fn mount(&self, source: Option<&Path>, target: &Path, flags: MsFlags) -> nix::Result<()> {
            self.call(Call::Mount {
                source: source.map(Path::to_path_buf),
                target: target.to_path_buf(),
                flags,
            })?;
            if flags.contains(MsFlags::MS_BIND) {
                self.mounted.borrow_mut().insert(target.to_path_buf());
            }
            Ok(())
        }

        fn umount2(&self, target: &Path, flags: MntFlags) -> nix::Result<()> {
            self.call(Call::Umount2 {
                target: target.to_path_buf(),
                flags,
            })?;
            self.mounted.borrow_mut().remove(target);
            Ok(())
        }

        fn mknod(&self, path: &Path, kind: SFlag, perm: Mode, dev: libc::dev_t) -> nix::Result<()> {
            self.call(Call::Mknod {
                path: path.to_path_buf(),
                kind,
                perm,
                dev,
            })?;
            fs::write(path, "").map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))
        }

        fn unshare(&self, flags: CloneFlags) -> nix::Result<()> {
            self.call(Call::Unshare(flags))
        }

        fn mountinfo(&self) -> io::Result<String> {
            Ok(self
                .mounted
                .borrow()
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    let escaped = p.to_string_lossy().replace(' ', r"\040");
                    format!("{} 1 0:{i} / {escaped} rw - fake fake rw\n", i + 2)
                })
                .collect())
        }

        fn lookup(&self, path: &Path) -> io::Result<()> {
            self.call(Call::Lookup(path.to_path_buf()))?;
            let errno = self.lookups.get(path).copied().unwrap_or(Errno::ENOENT);
            Err(io::Error::from_raw_os_error(errno as i32))
        }

        fn is_root(&self) -> bool {
            self.root
        }

        fn mount_fuse(&self, _tree: &Tree, mountpoint: &Path) -> io::Result<PathBuf> {
            self.call(Call::MountFuse(mountpoint.to_path_buf()))?;
            self.mounted.borrow_mut().insert(mountpoint.to_path_buf());
            Ok(mountpoint.to_path_buf())
        }

        fn unmount_fuse(&self, fuse: PathBuf) -> io::Result<()> {
            self.call(Call::UnmountFuse(fuse.clone()))?;
            self.mounted.borrow_mut().remove(&fuse);
            Ok(())
        }
    }
}
