//! Every host call `doctor` makes, behind [`Node`]: [`Live`] makes them on this node, the unit
//! tests' fake answers from tables.

use std::collections::BTreeMap;
use std::fs;
use std::io::{self, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::FileTypeExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::sync::mpsc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use mockgpu_api::gpunode::GpuNode;

use crate::real::{read_gpus, real_driver_loaded};
use crate::report::{Credentials, GpuNodes as _, Live as Api};
use crate::sys::{Linux, Sys as _};

/// How long one host call may take: a FUSE server that hangs, or an endpoint that accepts and
/// never answers, must not hang the doctor.
const TIMEOUT: Duration = Duration::from_secs(3);

/// How long the API server has to answer both reads.
const API_TIMEOUT: Duration = Duration::from_secs(10);

/// The largest file or HTTP body read.
const MAX_READ: u64 = 4 << 20;

/// The program run with the shim preloaded: a trivial dynamically linked one.
pub(crate) const PRELOAD_PROGRAM: &str = "/bin/true";

/// What the NVIDIA driver of this node says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RealDriver {
    /// No driver lists a GPU: mock mode.
    Absent,
    /// The driver lists these GPUs (their model names).
    Gpus(Vec<String>),
    /// A driver is loaded but its files cannot be read.
    Unreadable(String),
    /// This process runs under mockgpu's shim (a container the NRI plugin injected): the driver
    /// files it reads are the mock's, so the node is a mock node.
    UnderShim,
}

/// How a program the doctor ran ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// Its exit status.
    pub status: ExitStatus,
    /// What it wrote to stdout.
    pub stdout: String,
    /// What it wrote to stderr (the dynamic loader's complaints, the shim's notes).
    pub stderr: String,
}

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

/// The host calls of the checks.
pub trait Node {
    /// The mount table, in `/proc/<pid>/mountinfo` format.
    fn mountinfo(&self) -> io::Result<String>;
    /// Looks `path` up without following a final symlink.
    fn lookup(&self, path: &Path) -> io::Result<()>;
    /// The content of the file at `path`.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Whether `path` (followed) is a socket.
    fn is_socket(&self, path: &Path) -> io::Result<bool>;
    /// Runs [`PRELOAD_PROGRAM`] with `shim` in `LD_PRELOAD`, the shim's root at `root` and its
    /// notes on (`MOCKFS_DEBUG=1`).
    fn preload(&self, shim: &Path, root: &Path) -> io::Result<Ran>;
    /// Runs `nvidia_smi -L` with `lib_dir` (the mock NVML's) first on `LD_LIBRARY_PATH` and the
    /// mock root at `root`.
    fn nvidia_smi(&self, nvidia_smi: &Path, lib_dir: &Path, root: &Path) -> io::Result<Ran>;
    /// The names in the directory `dir`.
    fn list(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// The version of the C library this program runs with (`None` when it is not glibc).
    fn glibc(&self) -> Option<String>;
    /// `GET path` from `addr`.
    fn http_get(&self, addr: SocketAddr, path: &str) -> io::Result<HttpReply>;
    /// The NVIDIA driver's GPUs below `procfs` and `sysfs`.
    fn real_driver(&self, procfs: &Path, sysfs: &Path) -> RealDriver;
    /// The Node `node` and its GpuNode, read from the API server `credentials` name.
    fn cluster(&self, credentials: &Credentials, node: &str) -> Result<ClusterView, String>;
}

/// What the API server says of this node.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// The Node's `status.allocatable`, or `None` when there is no such Node.
    pub allocatable: Option<BTreeMap<String, String>>,
    /// The node's GpuNode, if there is one.
    pub gpunode: Option<GpuNode>,
    /// When it was read.
    pub now: Timestamp,
}

/// This node.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live;

/// Runs `f` on a thread of its own and gives up after [`TIMEOUT`] (the thread is left behind,
/// blocked; it ends with the process).
fn bounded<T: Send + 'static>(
    what: &Path,
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(TIMEOUT).unwrap_or_else(|_| {
        Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("{} did not answer within {TIMEOUT:?}", what.display()),
        ))
    })
}

impl Node for Live {
    fn mountinfo(&self) -> io::Result<String> {
        Linux.mountinfo()
    }

    fn lookup(&self, path: &Path) -> io::Result<()> {
        let owned = path.to_path_buf();
        bounded(path, move || Linux.lookup(&owned))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let owned = path.to_path_buf();
        bounded(path, move || {
            let mut out = Vec::new();
            std::fs::File::open(&owned)?
                .take(MAX_READ)
                .read_to_end(&mut out)?;
            Ok(out)
        })
    }

    fn is_socket(&self, path: &Path) -> io::Result<bool> {
        std::fs::metadata(path).map(|m| m.file_type().is_socket())
    }

    fn preload(&self, shim: &Path, root: &Path) -> io::Result<Ran> {
        let mut command = Command::new(PRELOAD_PROGRAM);
        command
            .env("LD_PRELOAD", shim)
            .env("MOCKFS_ROOT", root)
            .env("MOCKFS_DEBUG", "1");
        ran(command)
    }

    fn nvidia_smi(&self, nvidia_smi: &Path, lib_dir: &Path, root: &Path) -> io::Result<Ran> {
        let mut command = Command::new(nvidia_smi);
        command
            .arg("-L")
            .env("LD_LIBRARY_PATH", lib_dir)
            .env("MOCKFS_ROOT", root);
        ran(command)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<String>> {
        let owned = dir.to_path_buf();
        bounded(dir, move || {
            fs::read_dir(&owned)?
                .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
                .collect()
        })
    }

    #[cfg(target_env = "gnu")]
    fn glibc(&self) -> Option<String> {
        // SAFETY: gnu_get_libc_version returns a static NUL-terminated string.
        let version = unsafe { std::ffi::CStr::from_ptr(libc::gnu_get_libc_version()) };
        Some(version.to_string_lossy().into_owned())
    }

    #[cfg(not(target_env = "gnu"))]
    fn glibc(&self) -> Option<String> {
        None
    }

    fn http_get(&self, addr: SocketAddr, path: &str) -> io::Result<HttpReply> {
        let mut s = TcpStream::connect_timeout(&addr, TIMEOUT)?;
        s.set_read_timeout(Some(TIMEOUT))?;
        s.set_write_timeout(Some(TIMEOUT))?;
        write!(
            s,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut raw = Vec::new();
        s.take(MAX_READ).read_to_end(&mut raw)?;
        parse_http(&String::from_utf8_lossy(&raw))
    }

    fn real_driver(&self, procfs: &Path, sysfs: &Path) -> RealDriver {
        let maps = fs::read_to_string(procfs.join("self/maps")).unwrap_or_default();
        if maps.contains(mockgpu_api::layout::SHIM_FILE) {
            return RealDriver::UnderShim;
        }
        if !real_driver_loaded(procfs) {
            return RealDriver::Absent;
        }
        match read_gpus(procfs, sysfs) {
            Ok(gpus) => RealDriver::Gpus(gpus.into_iter().map(|g| g.information.model).collect()),
            Err(e) => RealDriver::Unreadable(e.to_string()),
        }
    }

    fn cluster(&self, credentials: &Credentials, node: &str) -> Result<ClusterView, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start an async runtime: {e}"))?;
        let api = Api::new(credentials.clone());
        let read = async {
            let allocatable = api.node(node).await?.map(|n| {
                n.status
                    .and_then(|s| s.allocatable)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| (k, v.0))
                    .collect()
            });
            let gpunode = api.get(node).await?;
            Ok(ClusterView {
                allocatable,
                gpunode,
                now: Timestamp::now(),
            })
        };
        runtime.block_on(async {
            match tokio::time::timeout(API_TIMEOUT, read).await {
                Ok(result) => result.map_err(|e: crate::report::ApiError| e.to_string()),
                Err(_) => Err(format!(
                    "the API server did not answer within {API_TIMEOUT:?}"
                )),
            }
        })
    }
}

/// Runs `command` (bounded by [`TIMEOUT`]) with nothing on its standard input.
fn ran(mut command: Command) -> io::Result<Ran> {
    command.stdin(std::process::Stdio::null());
    let program = PathBuf::from(command.get_program());
    bounded(&program, move || {
        let out = command.output()?;
        Ok(Ran {
            status: out.status,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    })
}

/// Splits an HTTP/1.1 response into its status code and body.
pub(crate) fn parse_http(raw: &str) -> io::Result<HttpReply> {
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "not an HTTP/1.1 response");
    let (head, body) = raw.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .ok_or_else(bad)?;
    Ok(HttpReply {
        status,
        body: body.to_string(),
    })
}
