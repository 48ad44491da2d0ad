#!/usr/bin/env python3
"""pynvml (nvidia-ml-py) against a rendered mock tree: every value NVML reports must equal the
driver files' (information, sysfs) and the nvml/ files', and the profile's where the profile
states it.

usage: MOCKFS_ROOT=DIR LD_LIBRARY_PATH=<dir of libnvidia-ml.so.1> pynvml_check.py [--without-fabric] PROFILE.yaml

--without-fabric leaves out nvmlDeviceGetGpuFabricInfo, for bindings older than its struct: Debian
bookworm's pynvml 11.525 declares nvmlGpuFabricInfo_t with an 80-byte clusterUuid and no cliqueId
(the header's has 16 bytes and a cliqueId), so it reads neither field where the library writes it.
"""
import ctypes
import os
import sys

import pynvml as nv

ROOT = os.environ["MOCKFS_ROOT"]


class Checks:
    """Counts the comparisons; the first mismatch ends the program, naming it."""

    def __init__(self, program, source):
        self.program, self.source, self.count = program, source, 0

    def same(self, what, got, want):
        self.count += 1
        if got != want:
            sys.exit(f"{self.program}: {what}: {self.source} says {got!r}, expected {want!r}")


def kv(path):
    """`Key: value` lines of a served file."""
    with open(os.path.join(ROOT, path)) as f:
        return {k.strip(): v.strip() for k, _, v in (l.partition(":") for l in f) if _}


def sysfs(bus, attr):
    with open(os.path.join(ROOT, "sys/bus/pci/devices", bus, attr)) as f:
        return f.read().strip()


def profile(path):
    """The flat `key: value` fields of a profile YAML, `nvml.` prefixed inside its section."""
    out, section = {}, ""
    with open(path) as f:
        for line in f:
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            key, _, value = line.strip().partition(":")
            if not line.startswith(" "):
                section = key + "." if not value.strip() else ""
                if value.strip():
                    out[key] = value.strip().strip('"')
            else:
                out[section + key] = value.strip().strip('"')
    return out


def gpus():
    """The bus ids of the served GPUs in NVML's order: by `Device Minor`."""
    return sorted(os.listdir(os.path.join(ROOT, "proc/driver/nvidia/gpus")),
                  key=lambda b: int(kv(f"proc/driver/nvidia/gpus/{b}/information")["Device Minor"]))


def cpus(text):
    out = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def main():
    args = sys.argv[1:]
    fabric_info = "--without-fabric" not in args
    if not fabric_info:
        args.remove("--without-fabric")
    if len(args) != 1:
        sys.exit("usage: pynvml_check.py [--without-fabric] PROFILE.yaml")
    prof = profile(args[0])
    checks = Checks("pynvml_check", "NVML")
    same = checks.same

    nv.nvmlInit()
    with open(os.path.join(ROOT, "proc/driver/nvidia/version")) as f:
        driver = [w for w in f.readline().split("  ") if w and w[0].isdigit()][0]
    same("driver version", nv.nvmlSystemGetDriverVersion(), driver)
    same("driver version (profile)", driver, prof["driver_version"])
    system = kv("nvml/system")
    same("CUDA driver version", nv.nvmlSystemGetCudaDriverVersion(), int(system["CUDA Driver Version"]))
    buses = gpus()
    same("device count", nv.nvmlDeviceGetCount(), len(buses))
    same("device count (profile)", len(buses), int(prof["gpus"]))
    by_bus = {}
    for index, bus in enumerate(buses):
        info = kv(f"proc/driver/nvidia/gpus/{bus}/information")
        data = kv(f"nvml/gpus/{bus}")
        h = nv.nvmlDeviceGetHandleByIndex(index)
        by_bus[bus] = h
        same("name", nv.nvmlDeviceGetName(h), info["Model"])
        same("name (profile)", info["Model"], prof["model"])
        same("UUID", nv.nvmlDeviceGetUUID(h), info["GPU UUID"])
        same("minor", nv.nvmlDeviceGetMinorNumber(h), int(info["Device Minor"]))
        same("VBIOS", nv.nvmlDeviceGetVbiosVersion(h), info["Video BIOS"].upper())
        same("serial", nv.nvmlDeviceGetSerial(h), data["Serial"])
        same("board part number", nv.nvmlDeviceGetBoardPartNumber(h), data["Board Part Number"])
        same("handle by UUID", nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(info["GPU UUID"])), index)
        same("handle by bus", nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByPciBusId(bus)), index)
        pci = nv.nvmlDeviceGetPciInfo(h)
        same("PCI bus id", pci.busIdLegacy, bus.upper())
        same("PCI device id", pci.pciDeviceId,
             int(sysfs(bus, "device"), 16) << 16 | int(sysfs(bus, "vendor"), 16))
        same("PCI subsystem id", pci.pciSubSystemId,
             int(sysfs(bus, "subsystem_device"), 16) << 16 | int(sysfs(bus, "subsystem_vendor"), 16))
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        same("memory total", mem.total, int(prof["memory_mib"]) << 20)
        same("memory used", mem.used, int(data["Memory Reserved"]))
        mem2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
        same("memory v2 reserved", mem2.reserved, int(prof["nvml.reserved_mib"]) << 20)
        same("BAR1", nv.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total, int(data["BAR1 Total"]))
        mask = nv.nvmlDeviceGetCpuAffinity(h, 4)
        got = [c for c in range(4 * 64) if mask[c // 64] >> (c % 64) & 1]
        same("CPU affinity", got, cpus(sysfs(bus, "local_cpulist")))
        same("compute capability", "%d.%d" % nv.nvmlDeviceGetCudaComputeCapability(h),
             prof["nvml.compute_capability"])
        same("power limit", nv.nvmlDeviceGetPowerManagementLimit(h), int(prof["nvml.power_limit_w"]) * 1000)
        same("power usage", nv.nvmlDeviceGetPowerUsage(h), int(data["Power Usage"]))
        same("temperature", nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
             int(prof["nvml.temperature_c"]))
        same("slowdown", nv.nvmlDeviceGetTemperatureThreshold(h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN),
             int(prof["nvml.slowdown_c"]))
        same("max SM clock", nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM), int(prof["nvml.graphics_max_mhz"]))
        same("memory clocks", nv.nvmlDeviceGetSupportedMemoryClocks(h), [int(prof["nvml.memory_mhz"])])
        same("graphics clocks", nv.nvmlDeviceGetSupportedGraphicsClocks(h, int(prof["nvml.memory_mhz"])),
             [int(c) for c in data["Supported Graphics Clocks"].split(",")])
        same("processes", nv.nvmlDeviceGetComputeRunningProcesses(h), [])
        same("MIG mode", nv.nvmlDeviceGetMigMode(h), [0, 0])
        links = int(prof.get("nvml.nvlinks", "0"))
        remotes = data.get("NVLink Remote", "").split(",") if links else []
        same("NVLinks", len(remotes), links)
        for link, remote in enumerate(remotes):
            same(f"NVLink {link} state", nv.nvmlDeviceGetNvLinkState(h, link), nv.NVML_FEATURE_ENABLED)
            same(f"NVLink {link} remote", nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busIdLegacy,
                 remote.upper())
        if fabric_info and "nvml.fabric_clique_id" in prof:
            fabric = nv.c_nvmlGpuFabricInfo_t()
            nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(fabric))
            same("fabric clique", fabric.cliqueId, int(prof["nvml.fabric_clique_id"]))
            same("fabric cluster", bytes(fabric.clusterUuid).hex(),
                 prof["nvml.fabric_cluster_uuid"].replace("-", ""))
    try:
        nv.nvmlDeviceGetEncoderUtilization(by_bus[buses[0]])
        sys.exit("pynvml_check: an unimplemented function succeeded")
    except nv.NVMLError_NotSupported:
        checks.count += 1
    nv.nvmlShutdown()
    left_out = "" if fabric_info else " (fabric info left out)"
    print(f"pynvml_check: {prof['name']}: {len(buses)} GPUs, {checks.count} values match{left_out}")


if __name__ == "__main__":
    main()
