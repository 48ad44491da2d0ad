#!/usr/bin/env bash
# check.sh NVMLLIST ROOT PROFILE: runs the go-nvml program NVMLLIST (built from this directory)
# over the rendered tree ROOT, with libnvidia-ml.so.1 on LD_LIBRARY_PATH. Its devices must be
# the driver files' (UUID, minor, bus id, in minor order) with the nvml/ files' memory, as many
# as the profile says, and its wait for an Xid event must end in NVML_ERROR_TIMEOUT (10) after
# the timeout it was given: nothing raises an Xid. Then, run again with -wait-xid, it must receive
# the Xid 13 whose driver line is added to the served log (log/nvidia-xid) during its wait, as
# the first GPU's.
set -euo pipefail
NVMLLIST=$1 ROOT=$2 PROFILE=$3
TIMEOUT_MS=500
# The wait may end this much after its timeout on a loaded machine.
SLACK_MS=2000
fail() { echo "tests/nvml/go/check.sh: $ROOT: $*" >&2; exit 1; }
value() { sed -n "s/^$1:\s*//p" "$2"; }

gpus=$ROOT/proc/driver/nvidia/gpus
expected=$(
  for info in "$gpus"/*/information; do
    echo "$(value "Device Minor" "$info") $(basename "$(dirname "$info")")"
  done | sort -n | while read -r minor bus; do
    echo "uuid=$(value "GPU UUID" "$gpus/$bus/information") minor=$minor" \
      "memory_total=$(value "Memory Total" "$ROOT/nvml/gpus/$bus") bus=0000${bus^^}"
  done | nl -v0 -w1 -s' ' | sed 's/^/gpu /'
)

out=$(MOCKFS_ROOT=$ROOT "$NVMLLIST" "$TIMEOUT_MS") || fail "nvmllist failed"
count=$(value gpus "$PROFILE")
listed=$(grep -c '^gpu ' <<<"$out" || true)
[ "$listed" = "$count" ] || fail "go-nvml lists $listed GPUs, $PROFILE has $count"
if ! diff <(echo "$expected") <(grep '^gpu ' <<<"$out"); then
  fail "go-nvml's devices (>) differ from the driver files' (<)"
fi
wait=$(grep '^xid wait: ' <<<"$out") || fail "nvmllist did not wait: $out"
read -r code elapsed < <(sed -E 's/^xid wait: return (-?[0-9]+) \(.*\) after ([0-9]+) ms of .*/\1 \2/' <<<"$wait")
[ "$code" = 10 ] || fail "the Xid wait ended with return $code, not NVML_ERROR_TIMEOUT (10): $wait"
if [ "$elapsed" -lt "$TIMEOUT_MS" ] || [ "$elapsed" -gt $((TIMEOUT_MS + SLACK_MS)) ]; then
  fail "the Xid wait's timeout took $elapsed ms, not $TIMEOUT_MS (up to $SLACK_MS more): $wait"
fi

read -r uuid bus < <(sed -nE 's/^gpu 0 uuid=([^ ]+) .* bus=0000(.*)$/\1 \2/p' <<<"$out")
bus=${bus,,}
log=$ROOT/log/nvidia-xid
events=$(mktemp)
cp "$log" "$events.log"
trap 'mv "$events.log" "$log"; rm -f "$events"' EXIT
MOCKFS_ROOT=$ROOT "$NVMLLIST" -wait-xid 20 "$TIMEOUT_MS" >"$events" &
pid=$!
# The first wait ends after the program registered: the line added now is new to it.
for _ in $(seq 200); do
  grep -q '^xid wait: ' "$events" && break
  sleep 0.05
done
echo "NVRM: Xid (PCI:${bus%.*}): 13, pid='<unknown>', name=<unknown>, Graphics Exception: ESR 0x404600=0x80000002" >>"$log"
wait "$pid" || fail "nvmllist -wait-xid failed: $(cat "$events")"
grep -qx "xid 13 $uuid" "$events" || fail "no Xid 13 event on $uuid: $(cat "$events")"
echo "go-nvml: $(basename "$PROFILE" .yaml): $count GPUs as the driver files say; $wait; then xid 13 on GPU 0"
