//! `mockgpu-agent exec -- CMD…`: runs one command on this machine as if it had the profile's
//! GPUs. The tree is served over FUSE in a private temporary mount (a private mount namespace
//! as root, `fusermount3` otherwise, a rendered temporary directory when FUSE is unavailable)
//! and the command runs with the shim preloaded, the mock NVML first on `LD_LIBRARY_PATH` and
//! the mock's `nvidia-smi` first on `PATH`. The command gets `MOCKGPU_FAULTS` naming a fault
//! file of its own: `mockgpu-agent fault` run from it injects GPU faults into the tree it sees
//! (over FUSE; a rendered copy does not change).

use std::ffi::OsString;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::mount::MntFlags;
use nix::sys::signal::{SigHandler, SigSet, Signal, signal};

use mockgpu_api::{HostTopology, NodeTopology};

use crate::faults::{self, Checked};
use crate::sys::{self, Linux, Sys};
use crate::{carried, output, tree::Tree};

/// Why `exec` could not run the command.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The temporary directory could not be prepared.
    #[error("cannot prepare {path}: {source}")]
    Prepare {
        /// The path.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// A carried file could not be installed.
    #[error(transparent)]
    Install(#[from] carried::InstallError),
    /// The fallback rendering failed.
    #[error(transparent)]
    Render(#[from] output::OutputError),
    /// The command could not be started.
    #[error("cannot run {command:?}: {source}")]
    Spawn {
        /// The command.
        command: OsString,
        /// Why.
        source: io::Error,
    },
}

/// How the tree reached the command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// FUSE in a private mount namespace (root).
    PrivateFuse,
    /// FUSE mounted through `fusermount3` (unprivileged).
    Fuse,
    /// Plain files in a temporary directory (FUSE unavailable).
    Rendered,
}

/// Signals sent to the agent that are passed on to the command.
const FORWARDED: [Signal; 2] = [Signal::SIGTERM, Signal::SIGHUP];
/// Signals the terminal sends to the whole process group: the command gets them directly.
const IGNORED: [Signal; 2] = [Signal::SIGINT, Signal::SIGQUIT];

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Removes the temporary directory on every exit path.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        remove_all(&self.0);
    }
}

/// Deletes `dir` and everything below it, first giving the owner full access to each directory
/// (a rendered tree has read-only ones, which would stop an ordinary user).
fn remove_all(dir: &Path) {
    fn open_up(dir: &Path) {
        let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                open_up(&entry.path());
            }
        }
    }
    open_up(dir);
    let _ = std::fs::remove_dir_all(dir);
}

/// Serves `tree` privately and runs `command` under the shim; returns its exit code (128 +
/// signal number when it was killed by a signal). Call it before the process starts threads:
/// entering a private mount namespace and forking the cleanup helper require a single-threaded
/// process. The command dies with the agent, and the temporary directory goes even when the
/// agent is killed.
pub fn run(
    tree: &Tree,
    command: &[OsString],
    follow: Option<Follow>,
) -> Result<(i32, Backing), ExecError> {
    // SIGTERM or SIGHUP from now on stays pending until the command's pid is known, and is then
    // forwarded to it.
    let forwarded: SigSet = FORWARDED.into_iter().collect();
    let _ = forwarded.thread_block();
    // SAFETY: the handler only reads an atomic and calls kill.
    unsafe {
        for sig in FORWARDED {
            let _ = signal(sig, SigHandler::Handler(forward));
        }
    }
    let tmp =
        nix::unistd::mkdtemp(&std::env::temp_dir().join("mockgpu-exec.XXXXXX")).map_err(|e| {
            ExecError::Prepare {
                path: std::env::temp_dir(),
                source: e.into(),
            }
        })?;
    let tmp = TempDir(tmp);
    spawn_reaper(&tmp.0).map_err(|source| ExecError::Prepare {
        path: tmp.0.clone(),
        source,
    })?;
    let dirs = Dirs {
        lib: tmp.0.join("lib"),
        bin: tmp.0.join("bin"),
        root: tmp.0.join("fs"),
    };
    carried::install_all(&dirs.lib, &dirs.bin)?;
    let (mounted, backing) = serve(&Linux, tree, &dirs.root)?;
    tracing::debug!(root = %dirs.root.display(), ?backing, "mock root ready");
    let faults_file = tmp.0.join(mockgpu_api::layout::FAULTS_FILE);
    let mut env = vec![(
        OsString::from(faults::FAULTS_ENV),
        faults_file.clone().into(),
    )];
    let mut follower = None;
    if let Some(follow) = follow {
        env.extend(follow.env.iter().cloned());
        if let Some(m) = &mounted {
            let handle = m.handle.clone();
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let stopped = stop.clone();
            let thread = std::thread::Builder::new()
                .name("faults".into())
                .spawn(move || follow.run(&faults_file, &handle, &stopped))
                .map_err(|source| ExecError::Prepare {
                    path: tmp.0.clone(),
                    source,
                })?;
            follower = Some((stop, thread));
        }
    }
    let code = spawn_and_wait(command, &dirs, &env, &forwarded);
    if let Some((stop, thread)) = follower {
        stop.store(true, Ordering::Relaxed);
        let _ = thread.join();
    }
    if let Some(m) = mounted
        && let Err(e) = Linux.unmount_fuse(m)
    {
        tracing::warn!(error = %e, "unmounting the temporary tree failed");
    }
    Ok((code?, backing))
}

/// Serves `tree` at `root` (created here): over FUSE, in a private mount namespace when root,
/// or as a rendered copy when FUSE cannot mount.
fn serve<S: Sys>(
    sys: &S,
    tree: &Tree,
    root: &Path,
) -> Result<(Option<S::Fuse>, Backing), ExecError> {
    let private = sys.is_root() && sys::enter_private_namespace(sys).is_ok();
    std::fs::create_dir(root).map_err(|source| ExecError::Prepare {
        path: root.to_path_buf(),
        source,
    })?;
    match sys.mount_fuse(tree, root) {
        Ok(m) => Ok((
            Some(m),
            if private {
                Backing::PrivateFuse
            } else {
                Backing::Fuse
            },
        )),
        Err(e) => {
            tracing::warn!(error = %e, "FUSE unavailable; serving a rendered copy of the tree instead");
            std::fs::remove_dir(root).map_err(|source| ExecError::Prepare {
                path: root.to_path_buf(),
                source,
            })?;
            output::write_tree_with(sys, tree, root)?;
            Ok((None, Backing::Rendered))
        }
    }
}

/// Forks a helper that removes `tmp` once this process is gone, however it ends (SIGKILL
/// included): it waits for the end of a pipe whose only writer is this process, detaches the
/// tree's mount if one is left (a FUSE mount without its server) and deletes the directory.
/// Must run while the process is single-threaded.
fn spawn_reaper(tmp: &Path) -> io::Result<()> {
    let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: the process is single-threaded here, so the child may run ordinary code.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Parent { .. } => {
            drop(read);
            // The write end stays open for the life of the process.
            std::mem::forget(write);
            Ok(())
        }
        nix::unistd::ForkResult::Child => {
            drop(write);
            // The terminal's signals and the agent's forwarded ones are not for the reaper.
            // SAFETY: setting dispositions to SIG_IGN.
            unsafe {
                for sig in FORWARDED.into_iter().chain(IGNORED) {
                    let _ = signal(sig, SigHandler::SigIgn);
                }
            }
            let _ = SigSet::all().thread_unblock();
            if let Ok(null) = std::fs::File::options()
                .read(true)
                .write(true)
                .open("/dev/null")
            {
                for fd in 0..3 {
                    // SAFETY: dup2 onto the standard descriptors of this process.
                    unsafe { libc::dup2(null.as_raw_fd(), fd) };
                }
            }
            let mut byte = [0u8; 1];
            while let Err(nix::errno::Errno::EINTR) = nix::unistd::read(&read, &mut byte) {}
            reap(&Linux, tmp);
            // SAFETY: leaving the forked child without running the parent's exit handlers.
            unsafe { libc::_exit(0) }
        }
    }
}

/// What the reaper does: detach `tmp/fs` if it is still mounted (with `fusermount3` when
/// unprivileged) and delete `tmp`.
fn reap<S: Sys>(sys: &S, tmp: &Path) {
    let root = tmp.join("fs");
    if sys.umount2(&root, MntFlags::MNT_DETACH) == Err(nix::errno::Errno::EPERM) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg("-z")
            .arg(&root)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    remove_all(tmp);
}

/// Where the command finds the mock: the carried libraries and programs, and the tree.
struct Dirs {
    lib: PathBuf,
    bin: PathBuf,
    root: PathBuf,
}

/// The search path `first`, then `existing` if it is set and not empty.
fn prepend(first: &Path, existing: Option<OsString>) -> OsString {
    let mut value = first.as_os_str().to_owned();
    if let Some(existing) = existing.filter(|v| !v.is_empty()) {
        value.push(":");
        value.push(existing);
    }
    value
}

/// What `exec` needs to follow the faults its command writes: the GPUs placed on the host, and
/// the variables that let `mockgpu-agent fault` in the command check a fault against them.
pub struct Follow {
    /// The GPUs.
    pub topo: NodeTopology,
    /// The host they are placed on.
    pub host: HostTopology,
    /// Passed to the command (the profile's `MOCKGPU_*` settings).
    pub env: Vec<(OsString, OsString)>,
}

/// How often `exec` reads its fault file.
const FAULT_POLL: std::time::Duration = std::time::Duration::from_millis(200);

impl Follow {
    /// Until `stop`: reads `file` and, when it changed, serves the tree its faults leave
    /// (entries that are no fault, or do not fit the GPUs, are logged and skipped).
    fn run(
        &self,
        file: &Path,
        handle: &crate::fuse::TreeHandle,
        stop: &std::sync::atomic::AtomicBool,
    ) {
        let mut last: Vec<u8> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(FAULT_POLL);
            let Ok(raw) = faults::read_raw(file) else {
                continue;
            };
            if raw == last {
                continue;
            }
            last = raw;
            let local = match faults::parse_lenient(&last) {
                Ok((local, errors)) => {
                    for error in errors {
                        tracing::warn!(%error, "local fault skipped");
                    }
                    local
                }
                Err(e) => {
                    tracing::warn!(error = %e, "the fault file is invalid");
                    continue;
                }
            };
            let checked = Checked::of(&self.topo, &local);
            for (source, error) in &checked.refused {
                tracing::warn!(%source, %error, "GPU fault skipped: it does not fit the GPUs");
            }
            let tree = crate::render::driver_tree_with(&self.topo, &self.host, &checked.faults());
            handle.replace(&tree);
        }
    }
}

fn spawn_and_wait(
    command: &[OsString],
    dirs: &Dirs,
    env: &[(OsString, OsString)],
    forwarded: &SigSet,
) -> Result<i32, ExecError> {
    let (program, args) = command.split_first().ok_or_else(|| ExecError::Spawn {
        command: OsString::new(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "no command given"),
    })?;
    let mut cmd = Command::new(program);
    // (a PATH set here is also where `program` is looked for)
    cmd.args(args)
        .env(
            "LD_PRELOAD",
            prepend(
                &dirs.lib.join(carried::SHIM.name),
                std::env::var_os("LD_PRELOAD"),
            ),
        )
        .env(
            "LD_LIBRARY_PATH",
            prepend(&dirs.lib, std::env::var_os("LD_LIBRARY_PATH")),
        )
        // without PATH, where the C library's execvp looks
        .env(
            "PATH",
            prepend(
                &dirs.bin,
                Some(std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into())),
            ),
        )
        .env("MOCKFS_ROOT", &dirs.root)
        .env("MOCKFS_DEV", "1")
        .envs(env.iter().map(|(k, v)| (k, v)));
    let agent = std::process::id();
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            // The command dies with the agent: without it, its files are gone.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(io::Error::last_os_error());
            }
            if libc::getppid() as u32 != agent {
                // The agent died before the line above took effect.
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            for sig in [libc::SIGINT, libc::SIGQUIT] {
                libc::signal(sig, libc::SIG_DFL);
            }
            let mut none = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(none.as_mut_ptr());
            libc::sigprocmask(libc::SIG_SETMASK, none.as_ptr(), std::ptr::null_mut());
            Ok(())
        });
    }
    // The terminal's Ctrl-C reaches the command directly; SIGTERM and SIGHUP sent to the agent
    // are forwarded to it. Either way the agent lives on to clean up.
    // SAFETY: setting dispositions to SIG_IGN.
    unsafe {
        for sig in IGNORED {
            let _ = signal(sig, SigHandler::SigIgn);
        }
    }
    let spawned = cmd.spawn();
    if let Ok(child) = &spawned {
        CHILD.store(child.id() as i32, Ordering::Relaxed);
    }
    // What arrived while the command was being started is delivered (and forwarded) now.
    let _ = forwarded.thread_unblock();
    let mut child = spawned.map_err(|source| ExecError::Spawn {
        command: program.clone(),
        source,
    })?;
    let status = child.wait().map_err(|source| ExecError::Spawn {
        command: program.clone(),
        source,
    })?;
    CHILD.store(0, Ordering::Relaxed);
    Ok(status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use nix::errno::Errno;
    use nix::mount::MsFlags;
    use nix::sched::CloneFlags;

    use super::*;
    use crate::sys::fake::{Call, Fake};

    fn tree() -> Tree {
        let mut t = Tree::new();
        t.file("proc/driver/nvidia/version", "NVRM\n");
        t.chardev("dev/nvidiactl", 195, 255, 0o666);
        t
    }

    fn private_root() -> Call {
        Call::Mount {
            source: None,
            target: PathBuf::from("/"),
            flags: MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        }
    }

    /// What [`serve`] chose with `fake`, the root it served at and the temporary directory
    /// holding it.
    fn served(fake: &Fake) -> (Option<PathBuf>, Backing, PathBuf, tempfile::TempDir) {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("fs");
        let (mounted, backing) = serve(fake, &tree(), &root).unwrap();
        (mounted, backing, root, tmp)
    }

    #[test]
    fn root_mounts_fuse_in_a_private_namespace() {
        let fake = Fake::new(true);
        let (mounted, backing, root, _tmp) = served(&fake);
        assert_eq!(backing, Backing::PrivateFuse);
        assert_eq!(mounted.as_deref(), Some(root.as_path()));
        assert_eq!(
            fake.calls(),
            [
                Call::Unshare(CloneFlags::CLONE_NEWNS),
                private_root(),
                Call::MountFuse(root.clone()),
            ]
        );
    }

    #[test]
    fn root_without_a_private_namespace_still_mounts_fuse() {
        let fake = Fake::new(true).fail(|c| matches!(c, Call::Unshare(_)), Errno::EPERM);
        let (_, backing, root, _tmp) = served(&fake);
        assert_eq!(backing, Backing::Fuse);
        assert_eq!(
            fake.calls(),
            [
                Call::Unshare(CloneFlags::CLONE_NEWNS),
                Call::MountFuse(root.clone())
            ]
        );
    }

    #[test]
    fn an_ordinary_user_mounts_fuse_without_unsharing() {
        let fake = Fake::new(false);
        let (_, backing, root, _tmp) = served(&fake);
        assert_eq!(backing, Backing::Fuse);
        assert_eq!(fake.calls(), [Call::MountFuse(root.clone())]);
    }

    #[test]
    fn without_fuse_a_rendered_copy_is_served() {
        let fake = Fake::new(false)
            .fail(|c| matches!(c, Call::MountFuse(_)), Errno::ENODEV)
            .fail(|c| matches!(c, Call::Mknod { .. }), Errno::EPERM);
        let (mounted, backing, root, _tmp) = served(&fake);
        assert_eq!(backing, Backing::Rendered);
        assert!(mounted.is_none());
        assert_eq!(
            std::fs::read_to_string(root.join("proc/driver/nvidia/version")).unwrap(),
            "NVRM\n"
        );
        assert!(matches!(
            fake.calls().as_slice(),
            [Call::MountFuse(_), Call::Mknod { path, .. }] if path == &root.join("dev/nvidiactl")
        ));
    }

    #[test]
    fn the_reaper_detaches_then_deletes() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("mockgpu-exec.x");
        std::fs::create_dir_all(dir.join("fs/proc")).unwrap();
        let fake = Fake::new(true).mounted(&dir.join("fs"));
        reap(&fake, &dir);
        assert_eq!(
            fake.calls(),
            [Call::Umount2 {
                target: dir.join("fs"),
                flags: MntFlags::MNT_DETACH
            }]
        );
        assert!(!fake.is_mounted(&dir.join("fs")));
        assert!(!dir.exists());
    }
}
