//! The process that keeps the served tree in the kernel's caches: `mockgpu-agent pin-tree`.
//!
//! Warming reads every file of the agent's own mount and keeps an `O_PATH` descriptor on every
//! entry, so that the kernel holds every entry before the first consumer asks, and maps every
//! file's pages into the process, locked where the memory lock limit allows: the kernel neither
//! drops mapped pages with its caches (`drop_caches`, `POSIX_FADV_DONTNEED`) nor reclaims locked
//! ones, so a consumer's read after either needs no request at all. An invalidation of the file
//! (a reload) still drops them, and the next walk maps the new pages. The
//! agent must not do it itself: a process killed while it waits for a FUSE reply that the
//! server has already read waits on, uninterruptibly. Had the agent sent the request, nothing
//! would be left to answer it: the agent would never finish exiting, its descriptors (the
//! keeper's connection, the health port) would stay open, and the keeper would go on relaying
//! to it. A child process walks the tree instead and holds the descriptors; when the agent dies,
//! its connection closes and the keeper gives the child's request to the next agent.
//!
//! The protocol, over the child's standard input and output: the agent writes the entries, each
//! as `f` (a file: read, map and pin it) or `p` (pin only) and its path relative to the mount
//! point, ending in a NUL byte, then an empty record; the child walks them and answers one line,
//! `walked <visited> <pinned> <mapped> <locked>`. It holds its descriptors and mappings until
//! its input closes (the agent replaced it, or died), then exits.

use std::ffi::c_void;
use std::io::{self, BufRead, Read, Write};
use std::num::NonZeroUsize;
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::ptr::NonNull;

use crate::tree::{Kind, Tree};

/// Descriptors the walk leaves to the rest of the child.
const FD_HEADROOM: u64 = 16;

/// What a walk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    /// Entries opened (those that vanished meanwhile are not counted).
    pub visited: usize,
    /// Entries pinned: all visited ones, unless the descriptor limit was too low.
    pub pinned: usize,
    /// Files whose pages are mapped: every visited file that is not empty.
    pub mapped: usize,
    /// Mapped files whose pages are also locked: all, unless the memory lock limit was too low.
    pub locked: usize,
}

/// A running `pin-tree` process. Dropping it ends the process and waits for it.
#[derive(Debug)]
pub(crate) struct Pinner {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Pinner {
    /// Starts `<program> pin-tree <mountpoint>` (`program`: this agent's executable) and hands
    /// it `tree`'s entries; returns once it has walked them all.
    pub(crate) fn start(
        program: &Path,
        mountpoint: &Path,
        tree: &Tree,
    ) -> io::Result<(Pinner, Walked)> {
        let mut child = Command::new(program)
            .arg0("mockgpu-agent")
            .arg("pin-tree")
            .arg(mountpoint)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        // From here on, dropping the pinner ends the child.
        let mut pinner = Pinner { child, stdin };
        let input = pinner.stdin.as_mut().expect("stdin is piped");
        input.write_all(&entries(tree))?;
        input.flush()?;
        let mut line = String::new();
        io::BufReader::new(stdout.expect("stdout is piped")).read_line(&mut line)?;
        let walked = parse_answer(&line).ok_or_else(|| {
            let status = pinner.child.try_wait().ok().flatten();
            io::Error::other(match status {
                Some(status) => format!("pin-tree ended before walking the tree ({status})"),
                None => format!("pin-tree answered {line:?}"),
            })
        })?;
        Ok((pinner, walked))
    }

    /// The process id of the `pin-tree` process.
    pub(crate) fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Pinner {
    fn drop(&mut self) {
        // Its input closing ends it; the kill also ends it mid-walk (a request the kernel has
        // already given to the server is still answered first).
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tree`'s entries (the root excepted) in the protocol's records, with the closing empty one.
fn entries(tree: &Tree) -> Vec<u8> {
    let mut out = Vec::new();
    for (path, entry) in tree.iter().filter(|(path, _)| !path.is_empty()) {
        out.push(if matches!(entry.kind, Kind::File(_)) {
            b'f'
        } else {
            b'p'
        });
        out.extend_from_slice(path.as_bytes());
        out.push(0);
    }
    out.push(0);
    out
}

fn parse_answer(line: &str) -> Option<Walked> {
    let mut words = line.strip_prefix("walked ")?.split_whitespace();
    let mut next = || words.next()?.parse().ok();
    Some(Walked {
        visited: next()?,
        pinned: next()?,
        mapped: next()?,
        locked: next()?,
    })
}

/// The `pin-tree` process: walks the entries read from `input` below `root`, answers on
/// `output`, then holds its descriptors until `input` ends. Raises its soft `RLIMIT_NOFILE`
/// towards the hard limit for them; entries beyond the limit are read but stay unpinned.
pub fn run(root: &Path, mut input: impl BufRead, mut output: impl Write) -> io::Result<Walked> {
    let mut records = Vec::new();
    loop {
        let mut record = Vec::new();
        if input.read_until(0, &mut record)? == 0 || record.pop() != Some(0) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the entry list ended without its closing empty record",
            ));
        }
        if record.is_empty() {
            break;
        }
        records.push(record);
    }
    let budget = raise_nofile_limit(records.len() as u64 + FD_HEADROOM).saturating_sub(FD_HEADROOM);
    raise_memlock_limit();
    let mut pins = Vec::with_capacity(records.len().min(budget as usize));
    let mut maps = Vec::new();
    let mut buf = Vec::with_capacity(8192);
    let (mut visited, mut locked, mut may_lock) = (0, 0, true);
    for record in &records {
        let (kind, rel) = record.split_first().expect("records are not empty");
        let path = root.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(rel));
        let opened = match kind {
            // Read, mapped, closed, then pinned with `O_PATH`: the close answers the kernel's
            // one FLUSH now, and an `O_PATH` descriptor never sends one.
            b'f' => std::fs::File::open(&path)
                .and_then(|mut f| {
                    buf.clear();
                    f.read_to_end(&mut buf)?;
                    if let Some(mapped) = Mapped::new(&f, buf.len())? {
                        // After one refusal (the limit is reached) the rest stay unlocked.
                        may_lock = may_lock && mapped.lock();
                        locked += usize::from(may_lock);
                        maps.push(mapped);
                    }
                    Ok(())
                })
                .and_then(|_| pin(&path)),
            b'p' => pin(&path),
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("unknown entry kind {:?}", char::from(*other)),
                ));
            }
        };
        // An entry that vanished meanwhile is skipped.
        if let Ok(fd) = opened {
            visited += 1;
            if (pins.len() as u64) < budget {
                pins.push(fd);
            }
        }
    }
    let walked = Walked {
        visited,
        pinned: pins.len(),
        mapped: maps.len(),
        locked,
    };
    writeln!(
        output,
        "walked {} {} {} {}",
        walked.visited, walked.pinned, walked.mapped, walked.locked
    )?;
    output.flush()?;
    io::copy(&mut input, &mut io::sink())?;
    Ok(walked)
}

/// A file's pages mapped shared and read-only into this process; unmapped when dropped. The
/// mapping keeps the file open without a descriptor.
struct Mapped {
    addr: NonNull<c_void>,
    len: NonZeroUsize,
}

impl Mapped {
    /// Maps the first `len` bytes of `file` (its pages already cached: mapping them asks the
    /// server for nothing); `None` for an empty file, which has no page to hold.
    fn new(file: &std::fs::File, len: usize) -> io::Result<Option<Mapped>> {
        use nix::sys::mman::{MapFlags, ProtFlags, mmap};
        let Some(len) = NonZeroUsize::new(len) else {
            return Ok(None);
        };
        // SAFETY: a new read-only mapping at an address the kernel picks; this process never
        // reads it, so a file that shrinks meanwhile cannot fault a read here.
        let addr = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ,
                MapFlags::MAP_SHARED | MapFlags::MAP_POPULATE,
                file,
                0,
            )
        }?;
        Ok(Some(Mapped { addr, len }))
    }

    /// Locks the mapped pages in memory; false if the memory lock limit refused it.
    fn lock(&self) -> bool {
        // SAFETY: the range is this mapping's own.
        unsafe { nix::sys::mman::mlock(self.addr, self.len.get()) }.is_ok()
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the range is this mapping's own, and nothing refers to it any more.
        let _ = unsafe { nix::sys::mman::munmap(self.addr, self.len.get()) };
    }
}

/// An `O_PATH` descriptor on `path` itself (a symlink is not followed).
fn pin(path: &Path) -> io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    nix::fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io::Error::from)
}

/// Raises the soft `RLIMIT_MEMLOCK` to the hard limit (without `CAP_IPC_LOCK`, locked pages
/// count against it).
fn raise_memlock_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_MEMLOCK)
        && soft < hard
    {
        let _ = setrlimit(Resource::RLIMIT_MEMLOCK, hard, hard);
    }
}

/// Raises the soft `RLIMIT_NOFILE` to `wanted` (at most the hard limit); the soft limit now.
fn raise_nofile_limit(wanted: u64) -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return 0;
    };
    if soft >= wanted {
        return soft;
    }
    let raised = wanted.min(hard);
    match setrlimit(Resource::RLIMIT_NOFILE, raised, hard) {
        Ok(()) => raised,
        Err(_) => soft,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> Tree {
        let mut tree = Tree::new();
        tree.dir("a");
        tree.file("a/file", "contents");
        tree.symlink("a/link", "file");
        tree
    }

    #[test]
    fn entries_mark_files_for_reading_and_end_with_an_empty_record() {
        assert_eq!(entries(&tree()), b"pa\0fa/file\0pa/link\0\0");
    }

    #[test]
    fn run_walks_the_entries_answers_and_holds_them_until_its_input_ends() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("a")).unwrap();
        std::fs::write(dir.path().join("a/file"), "contents").unwrap();
        std::os::unix::fs::symlink("missing", dir.path().join("a/link")).unwrap();
        // "a/gone" vanished before the walk: skipped, not counted
        let input = b"pa\0fa/file\0pa/link\0fa/gone\0\0more input is drained".as_slice();
        let mut output = Vec::new();
        let walked = run(dir.path(), input, &mut output).unwrap();
        assert_eq!(
            walked,
            Walked {
                visited: 3,
                pinned: 3,
                mapped: 1,
                locked: 1
            }
        );
        assert_eq!(String::from_utf8(output).unwrap(), "walked 3 3 1 1\n");
        assert_eq!(parse_answer("walked 3 3 1 1\n"), Some(walked));
    }

    #[test]
    fn run_refuses_a_truncated_list_or_an_unknown_kind() {
        let dir = tempfile::tempdir().unwrap();
        for (input, want) in [
            (
                b"pa\0".as_slice(),
                "the entry list ended without its closing empty record",
            ),
            (
                b"pa".as_slice(),
                "the entry list ended without its closing empty record",
            ),
            (b"xa\0\0".as_slice(), "unknown entry kind 'x'"),
        ] {
            let mut output = Vec::new();
            let err = run(dir.path(), input, &mut output).unwrap_err();
            assert_eq!(err.to_string(), want);
            assert!(output.is_empty());
        }
    }

    #[test]
    fn parse_answer_refuses_anything_else() {
        for line in [
            "",
            "walked",
            "walked 3 3 1",
            "walked x 3 1 1",
            "pinned 3 3 1 1",
        ] {
            assert_eq!(parse_answer(line), None, "{line:?}");
        }
    }
}
