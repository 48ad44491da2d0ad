// Command nvmllist is go-nvml (NVIDIA's Go bindings) as a consumer of the NVML library found as
// libnvidia-ml.so.1: it lists the devices, one line each, then waits for an Xid critical error
// on all of them and says how the wait ended. tests/nvml/run.sh compares the lines with the
// served driver files.
//
// Usage: nvmllist TIMEOUT_MS
//
// Output:
//
//	gpu INDEX uuid=UUID minor=MINOR memory_total=BYTES bus=BUS_ID
//	xid wait: return CODE (TEXT) after ELAPSED ms of TIMEOUT_MS
//
// Any failure before the wait ends the program with status 1 and the call that failed.
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {
	if len(os.Args) != 2 {
		fail("usage: nvmllist TIMEOUT_MS")
	}
	timeout, err := strconv.ParseUint(os.Args[1], 10, 32)
	if err != nil {
		fail("TIMEOUT_MS %q: %v", os.Args[1], err)
	}
	check("nvmlInit", nvml.Init())
	defer func() { check("nvmlShutdown", nvml.Shutdown()) }()

	count, ret := nvml.DeviceGetCount()
	check("nvmlDeviceGetCount", ret)
	set, ret := nvml.EventSetCreate()
	check("nvmlEventSetCreate", ret)
	defer func() { check("nvmlEventSetFree", set.Free()) }()
	for i := range count {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		check("nvmlDeviceGetHandleByIndex", ret)
		uuid, ret := dev.GetUUID()
		check("nvmlDeviceGetUUID", ret)
		minor, ret := dev.GetMinorNumber()
		check("nvmlDeviceGetMinorNumber", ret)
		mem, ret := dev.GetMemoryInfo()
		check("nvmlDeviceGetMemoryInfo", ret)
		pci, ret := dev.GetPciInfo()
		check("nvmlDeviceGetPciInfo", ret)
		fmt.Printf("gpu %d uuid=%s minor=%d memory_total=%d bus=%s\n", i, uuid, minor, mem.Total, cString(pci.BusId[:]))
		check("nvmlDeviceRegisterEvents", dev.RegisterEvents(nvml.EventTypeXidCriticalError, set))
	}

	start := time.Now()
	_, ret = set.Wait(uint32(timeout))
	fmt.Printf("xid wait: return %d (%s) after %d ms of %d\n", int32(ret), nvml.ErrorString(ret), time.Since(start).Milliseconds(), timeout)
}

// check ends the program when an NVML call did not succeed.
func check(call string, ret nvml.Return) {
	if ret != nvml.SUCCESS {
		fail("%s: return %d (%s)", call, int32(ret), nvml.ErrorString(ret))
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "nvmllist: "+format+"\n", args...)
	os.Exit(1)
}

// cString is the text of a NUL-terminated C char array.
func cString(chars []int8) string {
	b := make([]byte, 0, len(chars))
	for _, c := range chars {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}
