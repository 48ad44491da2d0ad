//! Shared by the NVML library's tests: build and `dlopen` the library, render a mock tree.
#![allow(dead_code)] // each test binary uses a different subset

use std::ffi::{CString, OsString, c_void};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};

use mockgpu_agent::host::SysfsHost;
use mockgpu_agent::output::write_tree;
use mockgpu_agent::render::driver_tree_with;
use mockgpu_api::driver::{DriverFiles, read_gpus};
use mockgpu_api::fault::Fault;
use mockgpu_api::{DriverGpu, NodeTopology, Profile};

#[path = "../../../mockfs-shim/tests/common/cargo.rs"]
mod cargo;
#[path = "../../../mockfs-shim/tests/common/elf.rs"]
pub mod elf;

/// The target triple these tests were built for (from build.rs).
pub const TARGET: &str = env!("NVML_TARGET");

/// The release `libnvidia_ml.so`, built once per test binary.
pub fn library_path() -> PathBuf {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        cargo_build(&["--release", "-p", "mockgpu-nvml"]).join("release/libnvidia_ml.so")
    })
    .clone()
}

/// A directory holding `libnvidia-ml.so.1` (the library under test), for `LD_LIBRARY_PATH`.
pub fn library_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(library_path(), dir.path().join("libnvidia-ml.so.1")).unwrap();
    dir
}

/// `cargo build --target TARGET ARGS` of the library into the tests' own target directory.
pub fn cargo_build(args: &[&str]) -> PathBuf {
    cargo::build(
        TARGET,
        Path::new(env!("CARGO_MANIFEST_DIR")),
        "nvml-tests",
        args,
    )
}

/// The library, loaded once per test binary.
pub struct Nvml(*mut c_void);

/// An `nvmlDevice_t`.
pub type Dev = *mut c_void;

/// `nvmlEventData_t`.
#[repr(C)]
#[derive(Debug)]
pub struct EventData {
    pub device: Dev,
    pub event_type: u64,
    pub event_data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

/// `nvmlPciInfo_t`.
#[repr(C)]
#[derive(Default)]
pub struct PciInfo {
    pub bus_id_legacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pci_device_id: u32,
    pub pci_sub_system_id: u32,
    pub bus_id: [u8; 32],
}

// SAFETY: the handle is only used for dlsym, which is thread-safe.
unsafe impl Send for Nvml {}
// SAFETY: as above.
unsafe impl Sync for Nvml {}

impl Nvml {
    /// Loads the library, and takes the process-wide test lock: NVML's state is per process, and
    /// `MOCKFS_ROOT` is read at `nvmlInit`.
    pub fn get() -> (&'static Nvml, MutexGuard<'static, ()>) {
        static LOCK: Mutex<()> = Mutex::new(());
        static LIB: OnceLock<Nvml> = OnceLock::new();
        let guard = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let lib = LIB.get_or_init(|| {
            let path = CString::new(library_path().into_os_string().into_encoded_bytes()).unwrap();
            // SAFETY: a NUL-terminated path.
            let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            assert!(!h.is_null(), "dlopen {path:?} failed");
            Nvml(h)
        });
        (lib, guard)
    }

    /// The function `name`, as the type `F` (an `unsafe extern "C" fn`).
    ///
    /// # Safety
    /// `F` must be the function's C signature.
    pub unsafe fn sym<F: Copy>(&self, name: &str) -> F {
        let c = CString::new(name).unwrap();
        // SAFETY: a live handle and a NUL-terminated name.
        let p = unsafe { libc::dlsym(self.0, c.as_ptr()) };
        assert!(!p.is_null(), "{name} is not exported");
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        // SAFETY: `F` is a function pointer type by the caller's contract.
        unsafe { std::mem::transmute_copy(&p) }
    }
}

/// `nvml!(lib, nvmlFoo(T1, T2))` is the function `nvmlFoo` with that C signature returning
/// `nvmlReturn_t`.
#[macro_export]
macro_rules! nvml {
    ($lib:expr, $name:ident($($t:ty),* $(,)?)) => {{
        let lib: &$crate::common::Nvml = $lib;
        // SAFETY: the signature is the header's.
        unsafe { lib.sym::<extern "C" fn($($t),*) -> u32>(stringify!($name)) }
    }};
}

/// Sets the mock root the library reads at its next `nvmlInit` (callers hold the test lock).
pub fn set_root(root: &Path) {
    // SAFETY: the tests of this binary run one at a time under `Nvml::get`'s lock, and nothing
    // else in the process reads the environment meanwhile.
    unsafe { std::env::set_var("MOCKFS_ROOT", root) };
}

/// The fixture sysfs trees of the agent's tests.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent/tests/fixtures")
        .join(name)
}

/// A built-in profile rendered onto the two-socket fixture host, written below a temporary
/// directory (`root()`).
pub struct Rendered {
    pub dir: tempfile::TempDir,
    pub topo: NodeTopology,
}

impl Rendered {
    pub fn new(profile: &str) -> Rendered {
        Rendered::with_faults(profile, &[])
    }

    /// The tree as `faults` leave it.
    pub fn with_faults(profile: &str, faults: &[Fault]) -> Rendered {
        let host = SysfsHost::new(fixture("two-socket")).probe().unwrap();
        let topo =
            NodeTopology::build(&Profile::builtin(profile).unwrap(), "node-1", &host).unwrap();
        for f in faults {
            f.validate(&topo).unwrap();
        }
        let dir = tempfile::tempdir().unwrap();
        write_tree(
            &driver_tree_with(&topo, &host, faults),
            &dir.path().join("root"),
        )
        .unwrap();
        Rendered { dir, topo }
    }

    pub fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// The GPUs as the driver files say (`information`, sysfs).
    pub fn driver_gpus(&self) -> Vec<DriverGpu> {
        let root = self.root();
        read_gpus(&Files, &root.join("proc"), &root.join("sys")).unwrap()
    }
}

/// The file system as `DriverFiles`.
struct Files;

impl DriverFiles for Files {
    fn read(&self, path: &Path) -> io::Result<String> {
        std::fs::read_to_string(path)
    }

    fn list(&self, dir: &Path) -> io::Result<Vec<OsString>> {
        std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.file_name()))
            .collect()
    }
}

/// A C string buffer's text up to its NUL.
pub fn text(buf: &[u8]) -> &str {
    let end = buf.iter().position(|&b| b == 0).expect("NUL-terminated");
    std::str::from_utf8(&buf[..end]).unwrap()
}
