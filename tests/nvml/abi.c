/*
 * ABI check of the mock libnvidia-ml.so.1 against NVIDIA's nvml.h (Debian's libnvidia-ml-dev,
 * CUDA 12.4): the structs the library fills, read through the header's own layouts, and the enum
 * values it returns. Each struct is surrounded by guard bytes that must stay untouched (the
 * library writes exactly sizeof(struct)), and each field must hold the value the served tree
 * says (passed on the command line by run.sh).
 *
 * usage: abi MODEL BUS_ID MEMORY_BYTES RESERVED_BYTES MEMORY_MHZ ARCHITECTURE BRAND NVLINKS FABRIC
 *   FABRIC is 1 when the first GPU is on an NVLink fabric (GB200/GB300), else 0.
 */
#include <nvml.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int failures;

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "abi: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                    \
        }                                                                  \
    } while (0)

#define OK(call) CHECK((call) == NVML_SUCCESS)

/* A struct between two guard areas. */
#define GUARDED(type, name)                            \
    struct {                                           \
        unsigned char before[16];                      \
        type value;                                    \
        unsigned char after[16];                       \
    } name;                                            \
    memset(&name, 0xa5, sizeof name)

static int untouched(const unsigned char *guard)
{
    for (int i = 0; i < 16; i++)
        if (guard[i] != 0xa5)
            return 0;
    return 1;
}

#define GUARDS_INTACT(g) (untouched((g).before) && untouched((g).after))

int main(int argc, char **argv)
{
    if (argc != 10) {
        fprintf(stderr, "usage: abi MODEL BUS_ID MEMORY RESERVED MEMORY_MHZ ARCH BRAND NVLINKS FABRIC\n");
        return 2;
    }
    const char *model = argv[1], *bus_id = argv[2];
    unsigned long long memory = strtoull(argv[3], NULL, 10), reserved = strtoull(argv[4], NULL, 10);
    unsigned int memory_mhz = strtoul(argv[5], NULL, 10), arch = strtoul(argv[6], NULL, 10);
    unsigned int brand = strtoul(argv[7], NULL, 10), nvlinks = strtoul(argv[8], NULL, 10);
    int fabric = atoi(argv[9]);

    /* Layouts of the header this check is compiled against (the library's Rust definitions
     * must match them; the guarded calls below check that it writes these layouts). */
    CHECK(sizeof(nvmlPciInfo_t) == 68 && offsetof(nvmlPciInfo_t, busId) == 36);
    CHECK(offsetof(nvmlPciInfo_t, pciSubSystemId) == 32);
    CHECK(sizeof(nvmlPciInfoExt_t) == 64 && offsetof(nvmlPciInfoExt_t, busId) == 32);
    CHECK(sizeof(nvmlMemory_v2_t) == 40 && offsetof(nvmlMemory_v2_t, total) == 8);
    CHECK(sizeof(nvmlGpuFabricInfo_t) == 28 && offsetof(nvmlGpuFabricInfo_t, state) == 24);
    CHECK(sizeof(nvmlGpuFabricInfoV_t) == 36 && offsetof(nvmlGpuFabricInfoV_t, healthMask) == 32);
    CHECK(sizeof(nvmlEventData_t) == 32 && offsetof(nvmlEventData_t, gpuInstanceId) == 24);

    CHECK(nvmlDeviceGetCount(NULL) == NVML_ERROR_UNINITIALIZED);
    OK(nvmlInit());
    OK(nvmlInitWithFlags(NVML_INIT_FLAG_NO_GPUS));
    CHECK(strcmp(nvmlErrorString(NVML_ERROR_NOT_SUPPORTED), "Not Supported") == 0);

    nvmlDevice_t dev, again;
    OK(nvmlDeviceGetHandleByIndex(0, &dev));
    OK(nvmlDeviceGetHandleByPciBusId(bus_id, &again));
    CHECK(dev == again);
    CHECK(nvmlDeviceGetHandleByIndex(1000, &again) == NVML_ERROR_INVALID_ARGUMENT);

    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    OK(nvmlDeviceGetName(dev, name, sizeof name));
    CHECK(strcmp(name, model) == 0);
    CHECK(nvmlDeviceGetName(dev, name, strlen(model)) == NVML_ERROR_INSUFFICIENT_SIZE);
    CHECK(nvmlDeviceGetName(dev, NULL, sizeof name) == NVML_ERROR_INVALID_ARGUMENT);

    GUARDED(nvmlPciInfo_t, pci);
    OK(nvmlDeviceGetPciInfo(dev, &pci.value));
    CHECK(GUARDS_INTACT(pci));
    CHECK(strcasecmp(pci.value.busIdLegacy, bus_id) == 0);
    CHECK(strcasecmp(pci.value.busId + 4, bus_id) == 0 && strncmp(pci.value.busId, "0000", 4) == 0);
    CHECK((pci.value.pciDeviceId & 0xffff) == 0x10de);

    GUARDED(nvmlPciInfoExt_t, ext);
    ext.value.version = nvmlPciInfoExt_v1;
    OK(nvmlDeviceGetPciInfoExt(dev, &ext.value));
    CHECK(GUARDS_INTACT(ext));
    CHECK(ext.value.pciDeviceId == pci.value.pciDeviceId && ext.value.baseClass == 3);
    CHECK(strcmp(ext.value.busId, pci.value.busId) == 0);

    GUARDED(nvmlMemory_t, mem);
    OK(nvmlDeviceGetMemoryInfo(dev, &mem.value));
    CHECK(GUARDS_INTACT(mem));
    CHECK(mem.value.total == memory && mem.value.used == reserved);
    CHECK(mem.value.free == memory - reserved);

    GUARDED(nvmlMemory_v2_t, mem2);
    mem2.value.version = nvmlMemory_v2;
    OK(nvmlDeviceGetMemoryInfo_v2(dev, &mem2.value));
    CHECK(GUARDS_INTACT(mem2));
    CHECK(mem2.value.total == memory && mem2.value.reserved == reserved);
    CHECK(mem2.value.free + mem2.value.reserved + mem2.value.used == memory);
    mem2.value.version = 1;
    CHECK(nvmlDeviceGetMemoryInfo_v2(dev, &mem2.value) == NVML_ERROR_ARGUMENT_VERSION_MISMATCH);

    GUARDED(nvmlBAR1Memory_t, bar1);
    OK(nvmlDeviceGetBAR1MemoryInfo(dev, &bar1.value));
    CHECK(GUARDS_INTACT(bar1));
    CHECK(bar1.value.bar1Total >= memory && bar1.value.bar1Free + bar1.value.bar1Used == bar1.value.bar1Total);

    GUARDED(nvmlUtilization_t, util);
    OK(nvmlDeviceGetUtilizationRates(dev, &util.value));
    CHECK(GUARDS_INTACT(util) && util.value.gpu == 0 && util.value.memory == 0);

    nvmlDeviceArchitecture_t a;
    OK(nvmlDeviceGetArchitecture(dev, &a));
    CHECK(a == arch);
    nvmlBrandType_t b;
    OK(nvmlDeviceGetBrand(dev, &b));
    CHECK(b == brand);
    CHECK(brand == NVML_BRAND_NVIDIA || brand == NVML_BRAND_TESLA);
    if (arch <= NVML_DEVICE_ARCH_HOPPER)
        CHECK(arch >= NVML_DEVICE_ARCH_TURING);

    unsigned int mhz;
    OK(nvmlDeviceGetMaxClockInfo(dev, NVML_CLOCK_MEM, &mhz));
    CHECK(mhz == memory_mhz);
    OK(nvmlDeviceGetClock(dev, NVML_CLOCK_SM, NVML_CLOCK_ID_APP_CLOCK_DEFAULT, &mhz));
    nvmlPstates_t pstate;
    OK(nvmlDeviceGetPerformanceState(dev, &pstate));
    CHECK(pstate == NVML_PSTATE_0);
    nvmlComputeMode_t mode;
    OK(nvmlDeviceGetComputeMode(dev, &mode));
    CHECK(mode == NVML_COMPUTEMODE_DEFAULT);
    nvmlEnableState_t persistence;
    OK(nvmlDeviceGetPersistenceMode(dev, &persistence));
    CHECK(persistence == NVML_FEATURE_ENABLED);
    unsigned int t;
    OK(nvmlDeviceGetTemperatureThreshold(dev, NVML_TEMPERATURE_THRESHOLD_SLOWDOWN, &t));
    unsigned int shutdown;
    OK(nvmlDeviceGetTemperatureThreshold(dev, NVML_TEMPERATURE_THRESHOLD_SHUTDOWN, &shutdown));
    CHECK(t < shutdown);
    unsigned long long ecc = 1;
    nvmlEnableState_t ecc_mode, ecc_pending;
    OK(nvmlDeviceGetEccMode(dev, &ecc_mode, &ecc_pending));
    if (ecc_mode == NVML_FEATURE_ENABLED) {
        OK(nvmlDeviceGetTotalEccErrors(dev, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, &ecc));
        CHECK(ecc == 0);
    }
    unsigned int current_mig, pending_mig;
    OK(nvmlDeviceGetMigMode(dev, &current_mig, &pending_mig));
    CHECK(current_mig == NVML_DEVICE_MIG_DISABLE);

    unsigned int count = 0;
    OK(nvmlDeviceGetComputeRunningProcesses(dev, &count, NULL));
    CHECK(count == 0);

    for (unsigned int link = 0; link < NVML_NVLINK_MAX_LINKS; link++) {
        nvmlEnableState_t active;
        nvmlReturn_t r = nvmlDeviceGetNvLinkState(dev, link, &active);
        if (link < nvlinks) {
            CHECK(r == NVML_SUCCESS && active == NVML_FEATURE_ENABLED);
            GUARDED(nvmlPciInfo_t, remote);
            OK(nvmlDeviceGetNvLinkRemotePciInfo(dev, link, &remote.value));
            CHECK(GUARDS_INTACT(remote) && strcmp(remote.value.busId, pci.value.busId) != 0);
            unsigned int p2p;
            OK(nvmlDeviceGetNvLinkCapability(dev, link, NVML_NVLINK_CAP_P2P_SUPPORTED, &p2p));
            CHECK(p2p == 1);
        } else {
            CHECK(r == (nvlinks ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_NOT_SUPPORTED));
        }
    }

    GUARDED(nvmlGpuFabricInfo_t, fi);
    nvmlReturn_t r = nvmlDeviceGetGpuFabricInfo(dev, &fi.value);
    GUARDED(nvmlGpuFabricInfoV_t, fv);
    fv.value.version = nvmlGpuFabricInfo_v2;
    nvmlReturn_t rv = nvmlDeviceGetGpuFabricInfoV(dev, &fv.value);
    if (fabric) {
        CHECK(r == NVML_SUCCESS && rv == NVML_SUCCESS);
        CHECK(GUARDS_INTACT(fi) && GUARDS_INTACT(fv));
        CHECK(fi.value.state == NVML_GPU_FABRIC_STATE_COMPLETED && fi.value.status == NVML_SUCCESS);
        CHECK(fv.value.cliqueId == fi.value.cliqueId);
        CHECK(memcmp(fv.value.clusterUuid, fi.value.clusterUuid, NVML_GPU_FABRIC_UUID_LEN) == 0);
    } else {
        CHECK(r == NVML_ERROR_NOT_SUPPORTED && rv == NVML_ERROR_NOT_SUPPORTED);
    }

    unsigned int path;
    OK(nvmlDeviceGetTopologyCommonAncestor(dev, dev, &path));
    CHECK(path == NVML_TOPOLOGY_INTERNAL);

    nvmlEventSet_t set;
    OK(nvmlEventSetCreate(&set));
    OK(nvmlDeviceRegisterEvents(dev, nvmlEventTypeXidCriticalError, set));
    GUARDED(nvmlEventData_t, ev);
    CHECK(nvmlEventSetWait(set, &ev.value, 10) == NVML_ERROR_TIMEOUT);
    CHECK(GUARDS_INTACT(ev));
    OK(nvmlEventSetFree(set));

    /* Not implemented: present, and says so. */
    unsigned int enc, period;
    CHECK(nvmlDeviceGetEncoderUtilization(dev, &enc, &period) == NVML_ERROR_NOT_SUPPORTED);

    OK(nvmlShutdown());
    OK(nvmlShutdown());
    CHECK(nvmlShutdown() == NVML_ERROR_UNINITIALIZED);
    if (failures) {
        fprintf(stderr, "abi: %d checks failed\n", failures);
        return 1;
    }
    printf("abi: %s (%s): all checks passed\n", model, bus_id);
    return 0;
}
