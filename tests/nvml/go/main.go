// Command nvmllist is go-nvml (NVIDIA's Go bindings) as a consumer of the NVML library found as
// libnvidia-ml.so.1: it lists the devices, one line each, then waits for an Xid critical error
// on all of them and says how the wait ended; with -wait-xid it then waits up to that many
// seconds for one more and prints it. tests/nvml/run.sh compares the lines with the served driver
// files, and adds an Xid line to the served log during the second wait.
//
// Usage: nvmllist [-wait-xid SECONDS] TIMEOUT_MS
//
// Output:
//
//	gpu INDEX uuid=UUID minor=MINOR memory_total=BYTES bus=BUS_ID
//	xid wait: return CODE (TEXT) after ELAPSED ms of TIMEOUT_MS
//	xid CODE UUID
//
// Any failure but the first wait's ends the program with status 1 and the call that failed.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func main() {
	waitXid := flag.Uint("wait-xid", 0, "after the first wait, wait up to `SECONDS` for an Xid event and print it")
	flag.Parse()
	if flag.NArg() != 1 {
		fail("usage: nvmllist [-wait-xid SECONDS] TIMEOUT_MS")
	}
	timeout, err := strconv.ParseUint(flag.Arg(0), 10, 32)
	if err != nil {
		fail("TIMEOUT_MS %q: %v", flag.Arg(0), err)
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
	if *waitXid == 0 {
		return
	}
	data, ret := set.Wait(uint32(*waitXid * 1000))
	check("nvmlEventSetWait", ret)
	uuid, ret := data.Device.GetUUID()
	check("nvmlDeviceGetUUID (the event's device)", ret)
	fmt.Printf("xid %d %s\n", data.EventData, uuid)
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
