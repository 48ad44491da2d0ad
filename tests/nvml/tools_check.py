#!/usr/bin/env python3
"""gpustat and nvitop (from PyPI) over a rendered mock tree: `gpustat --json`, nvitop's Python API
(`nvitop.Device`) and `nvitop --once` must show the profile's GPUs, in the driver files' order
with their UUIDs and bus ids, and the profile's memory, nothing of it used.

usage: MOCKFS_ROOT=DIR LD_LIBRARY_PATH=<dir of libnvidia-ml.so.1> tools_check.py PROFILE.yaml
(run by the Python of the environment that has gpustat and nvitop)
"""
import json
import os
import re
import subprocess
import sys

import nvitop

from pynvml_check import Checks, gpus, kv, profile

BIN = os.path.dirname(sys.executable)
BUS_ID = r"[0-9A-F]{8}:[0-9A-F]{2}:[0-9A-F]{2}\.[0-7]"


def run(tool, *args):
    """The standard output of a tool of this environment; its failure ends the check."""
    # No TERM: nvitop writes plain text, without colours or cursor movement.
    env = {k: v for k, v in os.environ.items() if k != "TERM"} | {"PYTHONUTF8": "1"}
    out = subprocess.run([os.path.join(BIN, tool), *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tools_check: `{tool} {' '.join(args)}` exited {out.returncode}:\n{out.stderr}")
    return out.stdout


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: tools_check.py PROFILE.yaml")
    prof = profile(sys.argv[1])
    checks = Checks("tools_check", "the tool")
    same = checks.same

    count = int(prof["gpus"])
    buses = gpus()
    infos = [kv(f"proc/driver/nvidia/gpus/{bus}/information") for bus in buses]
    total = int(prof["memory_mib"]) << 20
    # NVML's bus id: an 8-digit domain, upper case.
    bus_ids = ["0000" + info["Bus Location"].upper() for info in infos]

    stat = json.loads(run("gpustat", "--json"))
    same("gpustat: driver version", stat["driver_version"], prof["driver_version"])
    same("gpustat: GPU count", len(stat["gpus"]), count)
    for index, (gpu, info) in enumerate(zip(stat["gpus"], infos)):
        same("gpustat: index", gpu["index"], index)
        same("gpustat: name", gpu["name"], prof["model"])
        same("gpustat: UUID", gpu["uuid"], info["GPU UUID"])
        same("gpustat: memory total (MiB)", gpu["memory.total"], int(prof["memory_mib"]))
        same("gpustat: memory used (MiB)", gpu["memory.used"], 0)
        same("gpustat: processes", gpu["processes"], [])

    devices = nvitop.Device.all()
    same("nvitop: driver version", nvitop.Device.driver_version(), prof["driver_version"])
    same("nvitop: GPU count", len(devices), count)
    for index, (dev, info, bus_id) in enumerate(zip(devices, infos, bus_ids)):
        same("nvitop: index", dev.index, index)
        same("nvitop: name", dev.name(), prof["model"])
        same("nvitop: UUID", dev.uuid(), info["GPU UUID"])
        same("nvitop: bus id", dev.bus_id(), bus_id)
        same("nvitop: memory total", dev.memory_total(), total)
        same("nvitop: memory used", dev.memory_used(), 0)

    # `nvitop --once`: a box per GPU, its first row `│ INDEX NAME … │ BUS-ID …`, the next
    # `│ … │ USED / TOTAL │`.
    lines = run("nvitop", "--once").splitlines()
    shown = re.search(r"Driver Version: (\S+)", "\n".join(lines))
    same("nvitop --once: driver version", shown and shown[1], prof["driver_version"])
    cells = [[c.strip() for c in l.split("│")] for l in lines]
    rows = [i for i, c in enumerate(cells) if len(c) > 2 and re.fullmatch(BUS_ID, c[2].split(" ")[0])]
    same("nvitop --once: GPU rows (index, bus id)",
         [(cells[i][1].split()[0], cells[i][2].split()[0]) for i in rows],
         [(str(index), bus_id) for index, bus_id in enumerate(bus_ids)])
    for row in rows:
        same("nvitop --once: memory", cells[row + 1][2], f"0B / {nvitop.bytes2human(total)}")
    print(f"tools_check: {prof['name']}: {count} GPUs, {checks.count} values match")


if __name__ == "__main__":
    main()
