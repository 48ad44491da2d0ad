//! What a device reports of its memory's health, its links and its place: ECC counters,
//! retired pages and remapped rows, PCIe links, compute processes, CPU and NUMA affinity,
//! topology, NVLink and the fabric.

use std::ffi::{c_uint, c_ulong};

use super::*;

impl Nvml {
    /// Total ECC errors of one kind over the whole device.
    pub fn total_ecc_errors(&self, d: Device, uncorrected: bool, aggregate: bool) -> Val<u64> {
        let f = get(self.f.nvmlDeviceGetTotalEccErrors)?;
        let mut v = 0;
        // SAFETY: one out pointer to a live u64.
        check(unsafe { f(d, uncorrected as c_uint, aggregate as c_uint, &mut v) })?;
        Ok(v)
    }

    /// ECC errors of one kind in DRAM (`NVML_MEMORY_LOCATION_DRAM`) or SRAM.
    pub fn memory_errors(&self, d: Device, c: EccCounter) -> Val<u64> {
        const DRAM: c_uint = 2;
        const SRAM: c_uint = 7;
        let f = get(self.f.nvmlDeviceGetMemoryErrorCounter)?;
        let location = if c.sram { SRAM } else { DRAM };
        let mut v = 0;
        // SAFETY: one out pointer to a live u64.
        check(unsafe {
            f(
                d,
                c.uncorrected as c_uint,
                c.aggregate as c_uint,
                location,
                &mut v,
            )
        })?;
        Ok(v)
    }

    /// How many pages were retired for `cause`.
    pub fn retired_pages(&self, d: Device, cause: RetireCause) -> Val<u32> {
        let f = get(self.f.nvmlDeviceGetRetiredPages)?;
        let mut count = 0;
        // SAFETY: a zero count with no buffer asks only for the count.
        match check(unsafe { f(d, cause as c_uint, &mut count, std::ptr::null_mut()) }) {
            Ok(()) | Err(Ret::INSUFFICIENT_SIZE) => Ok(count),
            Err(e) => Err(e),
        }
    }

    pub fn retired_pages_pending(&self, d: Device) -> Val<bool> {
        Ok(self.u32_of(self.f.nvmlDeviceGetRetiredPagesPendingStatus, d)? != 0)
    }

    pub fn remapped_rows(&self, d: Device) -> Val<RemappedRows> {
        let f = get(self.f.nvmlDeviceGetRemappedRows)?;
        let (mut corr, mut unc, mut pending, mut failure) = (0, 0, 0, 0);
        // SAFETY: four out pointers to live u32s.
        check(unsafe { f(d, &mut corr, &mut unc, &mut pending, &mut failure) })?;
        Ok(RemappedRows {
            correctable: corr,
            uncorrectable: unc,
            pending: pending != 0,
            failure: failure != 0,
        })
    }

    pub fn pcie_generation(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetCurrPcieLinkGeneration, d)
    }

    pub fn max_pcie_generation(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetMaxPcieLinkGeneration, d)
    }

    pub fn gpu_max_pcie_generation(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetGpuMaxPcieLinkGeneration, d)
    }

    pub fn pcie_width(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetCurrPcieLinkWidth, d)
    }

    pub fn max_pcie_width(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetMaxPcieLinkWidth, d)
    }

    /// Processes with a compute context on the device.
    pub fn compute_processes(&self, d: Device) -> Val<Vec<Process>> {
        let f = get(self.f.nvmlDeviceGetComputeRunningProcesses_v3)?;
        let mut count = 0;
        // SAFETY: a zero count with no buffer asks only for the count.
        match check(unsafe { f(d, &mut count, std::ptr::null_mut()) }) {
            Ok(()) => return Ok(Vec::new()),
            Err(Ret::INSUFFICIENT_SIZE) => {}
            Err(e) => return Err(e),
        }
        let mut raw = vec![RawProcess::default(); count as usize];
        // SAFETY: raw holds `count` entries, as passed.
        check(unsafe { f(d, &mut count, raw.as_mut_ptr()) })?;
        raw.truncate(count as usize);
        Ok(raw
            .iter()
            .map(|p| Process {
                pid: p.pid,
                used_memory: p.used_gpu_memory,
            })
            .collect())
    }

    /// The CPUs the device is close to.
    pub fn cpu_affinity(&self, d: Device) -> Val<Vec<u32>> {
        let f = get(self.f.nvmlDeviceGetCpuAffinity)?;
        let mut words = [0 as c_ulong; MASK_WORDS];
        // SAFETY: words holds MASK_WORDS entries, as passed.
        check(unsafe { f(d, MASK_WORDS as c_uint, words.as_mut_ptr()) })?;
        Ok(mask_bits(&words))
    }

    /// The NUMA nodes whose memory the device is close to (`NVML_AFFINITY_SCOPE_NODE`).
    pub fn memory_affinity(&self, d: Device) -> Val<Vec<u32>> {
        let f = get(self.f.nvmlDeviceGetMemoryAffinity)?;
        let mut words = [0 as c_ulong; MASK_WORDS];
        // SAFETY: words holds MASK_WORDS entries, as passed.
        check(unsafe { f(d, MASK_WORDS as c_uint, words.as_mut_ptr(), 0) })?;
        Ok(mask_bits(&words))
    }

    pub fn numa_node(&self, d: Device) -> Val<u32> {
        self.u32_of(self.f.nvmlDeviceGetNumaNodeId, d)
    }

    /// `nvmlGpuTopologyLevel_t` between two devices.
    pub fn common_ancestor(&self, a: Device, b: Device) -> Val<u32> {
        let f = get(self.f.nvmlDeviceGetTopologyCommonAncestor)?;
        let mut level = 0;
        // SAFETY: one out pointer to a live u32.
        check(unsafe { f(a, b, &mut level) })?;
        Ok(level)
    }

    pub fn nvlink_active(&self, d: Device, link: u32) -> Val<bool> {
        Ok(self.u32_with(self.f.nvmlDeviceGetNvLinkState, d, link)? != 0)
    }

    pub fn nvlink_remote_pci(&self, d: Device, link: u32) -> Val<Pci> {
        let f = get(self.f.nvmlDeviceGetNvLinkRemotePciInfo_v2)?;
        // SAFETY: an all-zero nvmlPciInfo_t is valid.
        let mut raw: RawPci = unsafe { std::mem::zeroed() };
        // SAFETY: an out pointer to a live nvmlPciInfo_t.
        check(unsafe { f(d, link, &mut raw) })?;
        Ok(Pci::from(&raw))
    }

    pub fn fabric(&self, d: Device) -> Val<Fabric> {
        let f = get(self.f.nvmlDeviceGetGpuFabricInfo)?;
        let mut raw = RawFabric::default();
        // SAFETY: an out pointer to a live nvmlGpuFabricInfo_t.
        check(unsafe { f(d, &mut raw) })?;
        Ok(Fabric {
            cluster_uuid: raw.cluster_uuid,
            status: raw.status,
            clique_id: raw.clique_id,
            state: raw.state,
        })
    }
}
