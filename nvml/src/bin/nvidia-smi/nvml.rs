//! `libnvidia-ml.so.1` loaded at run time by name, as NVIDIA's tool does, and the few NVML calls
//! this program makes, each as a safe method returning [`Val`].
//!
//! ABI facts (names, struct layouts, enum values, return codes) are those of the public `nvml.h`.
//! A symbol the library lacks answers `NVML_ERROR_FUNCTION_NOT_FOUND`, shown as `N/A`.

use std::ffi::{CString, c_char, c_int, c_uint, c_ulong, c_ulonglong, c_void};

use libloading::Library;

mod health;
mod types;

pub use types::{
    Bar1, Clock, EccCounter, Fabric, Memory, Pci, Process, RemappedRows, Ret, RetireCause,
    Threshold,
};

/// The name the dynamic loader looks up, as the real tool's.
pub const LIBRARY: &str = "libnvidia-ml.so.1";

/// A value from NVML, or the code it answered instead.
pub type Val<T> = Result<T, Ret>;

fn check(code: u32) -> Val<()> {
    if code == 0 { Ok(()) } else { Err(Ret(code)) }
}

/// A handle lookup that failed: NVML's code, and the handle it wrote all the same, if any (the
/// mock library writes a lost GPU's, whose `nvmlDeviceGetPciInfo` still names its bus).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Missing {
    pub ret: Ret,
    pub handle: Option<Device>,
}

impl From<Ret> for Missing {
    fn from(ret: Ret) -> Self {
        Missing { ret, handle: None }
    }
}

/// A handle lookup's answer.
pub type Found = Result<Device, Missing>;

fn found(code: u32, d: Device) -> Found {
    match check(code) {
        Ok(()) => Ok(d),
        Err(ret) => Err(Missing {
            ret,
            handle: (!d.0.is_null()).then_some(d),
        }),
    }
}

/// `nvmlDevice_t`: an opaque handle, compared by address.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Device(*mut c_void);

/// `nvmlPciInfo_t` (the `_v3` layout).
#[repr(C)]
#[derive(Clone, Copy)]
struct RawPci {
    bus_id_legacy: [c_char; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_sub_system_id: c_uint,
    bus_id: [c_char; 32],
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
struct RawMemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlMemory_t` and `nvmlBAR1Memory_t` (same layout).
#[repr(C)]
#[derive(Default)]
struct RawMemory {
    total: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Default)]
struct RawUtilization {
    gpu: c_uint,
    memory: c_uint,
}

/// `nvmlProcessInfo_t` (the layout of `nvmlDeviceGetComputeRunningProcesses_v3`).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct RawProcess {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// `nvmlGpuFabricInfo_t`.
#[repr(C)]
#[derive(Default)]
struct RawFabric {
    cluster_uuid: [u8; 16],
    status: u32,
    clique_id: c_uint,
    state: u8,
}

impl From<&RawPci> for Pci {
    fn from(p: &RawPci) -> Self {
        Pci {
            bus_id: c_text(&p.bus_id),
            domain: p.domain,
            bus: p.bus,
            device: p.device,
            device_id: p.pci_device_id,
            sub_system_id: p.pci_sub_system_id,
        }
    }
}

/// The most links `nvmlDeviceGetNvLinkState` takes (`NVML_NVLINK_MAX_LINKS`).
pub const NVLINK_MAX_LINKS: u32 = 18;

/// Words of the CPU and NUMA node masks asked for (64 × 64 bits).
const MASK_WORDS: usize = 64;

type DevU32 = unsafe extern "C" fn(Device, *mut c_uint) -> u32;
type DevTwoU32 = unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> u32;
type DevArgU32 = unsafe extern "C" fn(Device, c_uint, *mut c_uint) -> u32;
type DevText = unsafe extern "C" fn(Device, *mut c_char, c_uint) -> u32;
type ByText = unsafe extern "C" fn(*const c_char, *mut Device) -> u32;
type DevU64 = unsafe extern "C" fn(Device, *mut c_ulonglong) -> u32;

macro_rules! functions {
    ($($name:ident: $ty:ty;)*) => {
        /// The library's entry points this program calls; `None` where the library lacks one.
        #[allow(non_snake_case)]
        struct Functions {
            $($name: Option<$ty>,)*
        }

        impl Functions {
            fn resolve(lib: &Library) -> Self {
                Self {
                    // SAFETY: each name is declared with its C signature from nvml.h.
                    $($name: unsafe {
                        lib.get::<$ty>(concat!(stringify!($name), "\0").as_bytes())
                            .ok()
                            .map(|symbol| *symbol)
                    },)*
                }
            }
        }
    };
}

functions! {
    nvmlInit_v2: unsafe extern "C" fn() -> u32;
    nvmlShutdown: unsafe extern "C" fn() -> u32;
    nvmlSystemGetDriverVersion: unsafe extern "C" fn(*mut c_char, c_uint) -> u32;
    nvmlSystemGetNVMLVersion: unsafe extern "C" fn(*mut c_char, c_uint) -> u32;
    nvmlSystemGetCudaDriverVersion_v2: unsafe extern "C" fn(*mut c_int) -> u32;
    nvmlSystemGetProcessName: unsafe extern "C" fn(c_uint, *mut c_char, c_uint) -> u32;
    nvmlDeviceGetCount_v2: unsafe extern "C" fn(*mut c_uint) -> u32;
    nvmlDeviceGetHandleByIndex_v2: unsafe extern "C" fn(c_uint, *mut Device) -> u32;
    nvmlDeviceGetHandleByUUID: ByText;
    nvmlDeviceGetHandleByPciBusId_v2: ByText;
    nvmlDeviceGetHandleBySerial: ByText;
    nvmlDeviceGetName: DevText;
    nvmlDeviceGetUUID: DevText;
    nvmlDeviceGetSerial: DevText;
    nvmlDeviceGetVbiosVersion: DevText;
    nvmlDeviceGetBoardPartNumber: DevText;
    nvmlDeviceGetInforomImageVersion: DevText;
    nvmlDeviceGetIndex: DevU32;
    nvmlDeviceGetMinorNumber: DevU32;
    nvmlDeviceGetBrand: DevU32;
    nvmlDeviceGetArchitecture: DevU32;
    nvmlDeviceGetCudaComputeCapability: unsafe extern "C" fn(Device, *mut c_int, *mut c_int) -> u32;
    nvmlDeviceGetPciInfo_v3: unsafe extern "C" fn(Device, *mut RawPci) -> u32;
    nvmlDeviceGetMemoryInfo_v2: unsafe extern "C" fn(Device, *mut RawMemoryV2) -> u32;
    nvmlDeviceGetMemoryInfo: unsafe extern "C" fn(Device, *mut RawMemory) -> u32;
    nvmlDeviceGetBAR1MemoryInfo: unsafe extern "C" fn(Device, *mut RawMemory) -> u32;
    nvmlDeviceGetTemperature: DevArgU32;
    nvmlDeviceGetTemperatureThreshold: DevArgU32;
    nvmlDeviceGetPowerUsage: DevU32;
    nvmlDeviceGetPowerManagementLimit: DevU32;
    nvmlDeviceGetEnforcedPowerLimit: DevU32;
    nvmlDeviceGetPowerManagementDefaultLimit: DevU32;
    nvmlDeviceGetPowerManagementLimitConstraints: DevTwoU32;
    nvmlDeviceGetFanSpeed: DevU32;
    nvmlDeviceGetUtilizationRates: unsafe extern "C" fn(Device, *mut RawUtilization) -> u32;
    nvmlDeviceGetClockInfo: DevArgU32;
    nvmlDeviceGetMaxClockInfo: DevArgU32;
    nvmlDeviceGetApplicationsClock: DevArgU32;
    nvmlDeviceGetDefaultApplicationsClock: DevArgU32;
    nvmlDeviceGetMaxCustomerBoostClock: DevArgU32;
    nvmlDeviceGetPerformanceState: DevU32;
    nvmlDeviceGetCurrentClocksEventReasons: DevU64;
    nvmlDeviceGetSupportedClocksEventReasons: DevU64;
    nvmlDeviceGetPersistenceMode: DevU32;
    nvmlDeviceGetComputeMode: DevU32;
    nvmlDeviceGetDisplayMode: DevU32;
    nvmlDeviceGetDisplayActive: DevU32;
    nvmlDeviceGetEccMode: DevTwoU32;
    nvmlDeviceGetMigMode: DevTwoU32;
    nvmlDeviceGetTotalEccErrors: unsafe extern "C" fn(Device, c_uint, c_uint, *mut c_ulonglong) -> u32;
    nvmlDeviceGetMemoryErrorCounter: unsafe extern "C" fn(Device, c_uint, c_uint, c_uint, *mut c_ulonglong) -> u32;
    nvmlDeviceGetRetiredPages: unsafe extern "C" fn(Device, c_uint, *mut c_uint, *mut c_ulonglong) -> u32;
    nvmlDeviceGetRetiredPagesPendingStatus: DevU32;
    nvmlDeviceGetRemappedRows: unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint, *mut c_uint, *mut c_uint) -> u32;
    nvmlDeviceGetCurrPcieLinkGeneration: DevU32;
    nvmlDeviceGetMaxPcieLinkGeneration: DevU32;
    nvmlDeviceGetGpuMaxPcieLinkGeneration: DevU32;
    nvmlDeviceGetCurrPcieLinkWidth: DevU32;
    nvmlDeviceGetMaxPcieLinkWidth: DevU32;
    nvmlDeviceGetComputeRunningProcesses_v3: unsafe extern "C" fn(Device, *mut c_uint, *mut RawProcess) -> u32;
    nvmlDeviceGetCpuAffinity: unsafe extern "C" fn(Device, c_uint, *mut c_ulong) -> u32;
    nvmlDeviceGetMemoryAffinity: unsafe extern "C" fn(Device, c_uint, *mut c_ulong, c_uint) -> u32;
    nvmlDeviceGetNumaNodeId: DevU32;
    nvmlDeviceGetTopologyCommonAncestor: unsafe extern "C" fn(Device, Device, *mut c_uint) -> u32;
    nvmlDeviceGetNvLinkState: DevArgU32;
    nvmlDeviceGetNvLinkRemotePciInfo_v2: unsafe extern "C" fn(Device, c_uint, *mut RawPci) -> u32;
    nvmlDeviceGetGpuFabricInfo: unsafe extern "C" fn(Device, *mut RawFabric) -> u32;
}

/// Why NVML could not be started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartError {
    /// The dynamic loader found no `libnvidia-ml.so.1`.
    LibraryNotFound,
    /// `nvmlInit_v2` failed with this code.
    Init(Ret),
}

/// An initialized NVML; shut down on drop.
pub struct Nvml {
    f: Functions,
    _lib: Library,
}

fn get<T>(f: Option<T>) -> Val<T> {
    f.ok_or(Ret::FUNCTION_NOT_FOUND)
}

/// The text of a NUL-terminated C buffer (lossy; the whole buffer when no NUL).
fn c_text(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The set bits of a mask of `c_ulong` words, in order.
fn mask_bits(words: &[c_ulong]) -> Vec<u32> {
    let bits = c_ulong::BITS;
    (0..words.len() as u32 * bits)
        .filter(|&i| words[(i / bits) as usize] >> (i % bits) & 1 == 1)
        .collect()
}

impl Nvml {
    /// Loads the library by name and calls `nvmlInit_v2`.
    pub fn start() -> Result<Self, StartError> {
        // SAFETY: loading NVML runs its initializers, which is what this program is for.
        let lib = unsafe { Library::new(LIBRARY) }.map_err(|_| StartError::LibraryNotFound)?;
        let f = Functions::resolve(&lib);
        let init = f
            .nvmlInit_v2
            .ok_or(StartError::Init(Ret::FUNCTION_NOT_FOUND))?;
        // SAFETY: nvmlInit_v2 takes no arguments.
        check(unsafe { init() }).map_err(StartError::Init)?;
        Ok(Nvml { f, _lib: lib })
    }

    fn text(&self, f: Option<DevText>, d: Device, size: usize) -> Val<String> {
        let f = get(f)?;
        let mut buf = vec![0 as c_char; size];
        // SAFETY: buf holds `size` bytes, as passed.
        check(unsafe { f(d, buf.as_mut_ptr(), size as c_uint) })?;
        Ok(c_text(&buf))
    }

    fn system_text(
        &self,
        f: Option<unsafe extern "C" fn(*mut c_char, c_uint) -> u32>,
    ) -> Val<String> {
        let f = get(f)?;
        let mut buf = [0 as c_char; 80];
        // SAFETY: buf holds 80 bytes, as passed.
        check(unsafe { f(buf.as_mut_ptr(), buf.len() as c_uint) })?;
        Ok(c_text(&buf))
    }

    fn u32_of(&self, f: Option<DevU32>, d: Device) -> Val<u32> {
        let f = get(f)?;
        let mut v = 0;
        // SAFETY: one out pointer to a live u32.
        check(unsafe { f(d, &mut v) })?;
        Ok(v)
    }

    fn u64_of(&self, f: Option<DevU64>, d: Device) -> Val<u64> {
        let f = get(f)?;
        let mut v = 0;
        // SAFETY: one out pointer to a live u64.
        check(unsafe { f(d, &mut v) })?;
        Ok(v)
    }

    fn u32_with(&self, f: Option<DevArgU32>, d: Device, arg: u32) -> Val<u32> {
        let f = get(f)?;
        let mut v = 0;
        // SAFETY: one out pointer to a live u32.
        check(unsafe { f(d, arg, &mut v) })?;
        Ok(v)
    }

    fn two_u32(&self, f: Option<DevTwoU32>, d: Device) -> Val<(u32, u32)> {
        let f = get(f)?;
        let (mut a, mut b) = (0, 0);
        // SAFETY: two out pointers to live u32s.
        check(unsafe { f(d, &mut a, &mut b) })?;
        Ok((a, b))
    }

    fn by_text(&self, f: Option<ByText>, id: &str) -> Found {
        let f = get(f).map_err(Missing::from)?;
        let id = CString::new(id).map_err(|_| Missing::from(Ret::INVALID_ARGUMENT))?;
        let mut d = Device(std::ptr::null_mut());
        // SAFETY: a NUL-terminated string and an out pointer to a live handle.
        found(unsafe { f(id.as_ptr(), &mut d) }, d)
    }

    pub fn driver_version(&self) -> Val<String> {
        self.system_text(self.f.nvmlSystemGetDriverVersion)
    }

    pub fn nvml_version(&self) -> Val<String> {
        self.system_text(self.f.nvmlSystemGetNVMLVersion)
    }

    /// The CUDA driver version as NVML encodes it (`1000 * major + 10 * minor`).
    pub fn cuda_version(&self) -> Val<i32> {
        let f = get(self.f.nvmlSystemGetCudaDriverVersion_v2)?;
        let mut v = 0;
        // SAFETY: one out pointer to a live int.
        check(unsafe { f(&mut v) })?;
        Ok(v)
    }

    pub fn process_name(&self, pid: u32) -> Val<String> {
        let f = get(self.f.nvmlSystemGetProcessName)?;
        let mut buf = [0 as c_char; 1024];
        // SAFETY: buf holds 1024 bytes, as passed.
        check(unsafe { f(pid, buf.as_mut_ptr(), buf.len() as c_uint) })?;
        Ok(c_text(&buf))
    }

    pub fn count(&self) -> Val<u32> {
        let f = get(self.f.nvmlDeviceGetCount_v2)?;
        let mut n = 0;
        // SAFETY: one out pointer to a live u32.
        check(unsafe { f(&mut n) })?;
        Ok(n)
    }

    pub fn by_index(&self, index: u32) -> Found {
        let f = get(self.f.nvmlDeviceGetHandleByIndex_v2).map_err(Missing::from)?;
        let mut d = Device(std::ptr::null_mut());
        // SAFETY: an out pointer to a live handle.
        found(unsafe { f(index, &mut d) }, d)
    }

    pub fn by_uuid(&self, uuid: &str) -> Found {
        self.by_text(self.f.nvmlDeviceGetHandleByUUID, uuid)
    }

    pub fn by_bus_id(&self, bus_id: &str) -> Found {
        self.by_text(self.f.nvmlDeviceGetHandleByPciBusId_v2, bus_id)
    }

    pub fn by_serial(&self, serial: &str) -> Found {
        self.by_text(self.f.nvmlDeviceGetHandleBySerial, serial)
    }

    pub fn name(&self, d: Device) -> Val<String> {
        self.text(self.f.nvmlDeviceGetName, d, 96)
    }

    pub fn uuid(&self, d: Device) -> Val<String> {
        self.text(self.f.nvmlDeviceGetUUID, d, 96)
    }

    pub fn serial(&self, d: Device) -> Val<String> {
        self.text(self.f.nvmlDeviceGetSerial, d, 30)
    }

    pub fn vbios(&self, d: Device) -> Val<String> {
        self.text(self.f.nvmlDeviceGetVbiosVersion, d, 32)
    }

    pub fn board_part_number(&self, d: Device) -> Val<String> {
        self.text(self.f.nvmlDeviceGetBoardPartNumber, d, 80)
    }

    pub fn inforom_image(&self, d: Device) -> Val<String> {
        self.text(self.f.nvmlDeviceGetInforomImageVersion, d, 16)
    }

    pub fn index(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetIndex, d)
    }

    pub fn minor(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetMinorNumber, d)
    }

    pub fn brand(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetBrand, d)
    }

    pub fn architecture(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetArchitecture, d)
    }

    pub fn compute_capability(&self, d: Device) -> Val<(i32, i32)> {
        let f = get(self.f.nvmlDeviceGetCudaComputeCapability)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two out pointers to live ints.
        check(unsafe { f(d, &mut major, &mut minor) })?;
        Ok((major, minor))
    }

    pub fn pci(&self, d: Device) -> Val<Pci> {
        let f = get(self.f.nvmlDeviceGetPciInfo_v3)?;
        // SAFETY: an all-zero nvmlPciInfo_t is valid.
        let mut raw: RawPci = unsafe { std::mem::zeroed() };
        // SAFETY: an out pointer to a live nvmlPciInfo_t.
        check(unsafe { f(d, &mut raw) })?;
        Ok(Pci::from(&raw))
    }

    /// `nvmlDeviceGetMemoryInfo_v2`, or `nvmlDeviceGetMemoryInfo` (no reserved) without it.
    pub fn memory(&self, d: Device) -> Val<Memory> {
        if let Some(f) = self.f.nvmlDeviceGetMemoryInfo_v2 {
            let mut raw = RawMemoryV2 {
                version: std::mem::size_of::<RawMemoryV2>() as u32 | 2 << 24,
                total: 0,
                reserved: 0,
                free: 0,
                used: 0,
            };
            // SAFETY: an out pointer to a live, versioned nvmlMemory_v2_t.
            match check(unsafe { f(d, &mut raw) }) {
                Ok(()) => {
                    return Ok(Memory {
                        total: raw.total,
                        reserved: Some(raw.reserved),
                        used: raw.used,
                        free: raw.free,
                    });
                }
                Err(Ret::NOT_SUPPORTED) => {}
                Err(e) => return Err(e),
            }
        }
        let f = get(self.f.nvmlDeviceGetMemoryInfo)?;
        let mut raw = RawMemory::default();
        // SAFETY: an out pointer to a live nvmlMemory_t.
        check(unsafe { f(d, &mut raw) })?;
        Ok(Memory {
            total: raw.total,
            reserved: None,
            used: raw.used,
            free: raw.free,
        })
    }

    pub fn bar1(&self, d: Device) -> Val<Bar1> {
        let f = get(self.f.nvmlDeviceGetBAR1MemoryInfo)?;
        let mut raw = RawMemory::default();
        // SAFETY: an out pointer to a live nvmlBAR1Memory_t.
        check(unsafe { f(d, &mut raw) })?;
        Ok(Bar1 {
            total: raw.total,
            used: raw.used,
            free: raw.free,
        })
    }

    /// The GPU core temperature (`NVML_TEMPERATURE_GPU`), °C.
    pub fn temperature(&self, d: Device) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetTemperature, d, 0)
    }

    pub fn temperature_threshold(&self, d: Device, t: Threshold) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetTemperatureThreshold, d, t as u32)
    }

    /// Power draw, mW.
    pub fn power_usage(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetPowerUsage, d)
    }

    /// The requested power limit, mW.
    pub fn power_limit(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetPowerManagementLimit, d)
    }

    /// The enforced power limit, mW.
    pub fn enforced_power_limit(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetEnforcedPowerLimit, d)
    }

    pub fn default_power_limit(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetPowerManagementDefaultLimit, d)
    }

    /// (min, max) power limits, mW.
    pub fn power_limit_constraints(&self, d: Device) -> Val<(u32, u32)> {
        self.two_u32(self.f.nvmlDeviceGetPowerManagementLimitConstraints, d)
    }

    pub fn fan_speed(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetFanSpeed, d)
    }

    /// (gpu, memory) utilization, %.
    pub fn utilization(&self, d: Device) -> Val<(u32, u32)> {
        let f = get(self.f.nvmlDeviceGetUtilizationRates)?;
        let mut raw = RawUtilization::default();
        // SAFETY: an out pointer to a live nvmlUtilization_t.
        check(unsafe { f(d, &mut raw) })?;
        Ok((raw.gpu, raw.memory))
    }

    pub fn clock(&self, d: Device, c: Clock) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetClockInfo, d, c as u32)
    }

    pub fn max_clock(&self, d: Device, c: Clock) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetMaxClockInfo, d, c as u32)
    }

    pub fn applications_clock(&self, d: Device, c: Clock) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetApplicationsClock, d, c as u32)
    }

    pub fn default_applications_clock(&self, d: Device, c: Clock) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetDefaultApplicationsClock, d, c as u32)
    }

    pub fn max_customer_boost_clock(&self, d: Device, c: Clock) -> Val<u32> {
        self.u32_with(self.f.nvmlDeviceGetMaxCustomerBoostClock, d, c as u32)
    }

    pub fn performance_state(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetPerformanceState, d)
    }

    pub fn persistence_mode(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetPersistenceMode, d)
    }

    pub fn compute_mode(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetComputeMode, d)
    }

    pub fn display_mode(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetDisplayMode, d)
    }

    pub fn display_active(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetDisplayActive, d)
    }

    /// The clocks event reasons now (`nvmlClocksEventReason*` bits).
    pub fn clocks_event_reasons(&self, d: Device) -> Val<u64> {
        self.u64_of(self.f.nvmlDeviceGetCurrentClocksEventReasons, d)
    }

    /// The clocks event reasons the GPU can report.
    pub fn supported_clocks_event_reasons(&self, d: Device) -> Val<u64> {
        self.u64_of(self.f.nvmlDeviceGetSupportedClocksEventReasons, d)
    }

    /// (current, pending) ECC mode.
    pub fn ecc_mode(&self, d: Device) -> Val<(u32, u32)> {
        self.two_u32(self.f.nvmlDeviceGetEccMode, d)
    }

    /// (current, pending) MIG mode.
    pub fn mig_mode(&self, d: Device) -> Val<(u32, u32)> {
        self.two_u32(self.f.nvmlDeviceGetMigMode, d)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Some(shutdown) = self.f.nvmlShutdown {
            // SAFETY: NVML was initialized by `start`; shutdown takes no arguments.
            unsafe { shutdown() };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_bits_reads_every_word() {
        let mut words = [0 as c_ulong; 3];
        words[0] = 0b1011;
        words[2] = 1;
        assert_eq!(mask_bits(&words), vec![0, 1, 3, 2 * c_ulong::BITS]);
    }

    #[test]
    fn c_text_stops_at_nul() {
        let buf: Vec<c_char> = b"GPU-1\0junk".iter().map(|&b| b as c_char).collect();
        assert_eq!(c_text(&buf), "GPU-1");
    }

    #[test]
    fn unsupported_values_read_n_a() {
        assert_eq!(Ret::NOT_SUPPORTED.na(), "N/A");
        assert_eq!(Ret::FUNCTION_NOT_FOUND.na(), "N/A");
        assert_eq!(Ret(4).na(), "Insufficient Permissions");
        assert_eq!(Ret(12345).na(), "Unknown Error");
    }

    #[test]
    fn struct_layouts_match_nvml_h() {
        assert_eq!(std::mem::size_of::<RawPci>(), 68);
        assert_eq!(std::mem::size_of::<RawMemoryV2>(), 40);
        assert_eq!(std::mem::size_of::<RawProcess>(), 24);
        assert_eq!(std::mem::size_of::<RawFabric>(), 28);
    }
}
