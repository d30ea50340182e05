#!/usr/bin/env bash
# The user's path on a GPU host: the real server binary on --device=cuda:0 (and, for the
# comparison, --device=cpu), driven by teserve_cli over gRPC: `demo` under every recipe
# and `demo --model=transformer`, each one's loss line and wall time, and what
# GetSession says about where the demo sessions ran (device, device_note).
#
#   bash tools/gpu_demo.sh BUNDLE OUTDIR
#
# BUNDLE is a folder made by tools/device_bundle.sh holding teserve and teserve_cli.
# Writes OUTDIR/demo_<device>.log (the CLI's full output), OUTDIR/server_<device>.log and
# OUTDIR/demo_summary.txt (one line per run: device, model, recipe, exit code, milliseconds,
# the loss line). Exits 1 when a run failed or a loss did not fall.
set -uo pipefail
bundle=${1:?bundle folder}
out=${2:?output folder}
mkdir -p "$out"
# shellcheck disable=SC1091
source "$bundle/env.sh"
summary="$out/demo_summary.txt"
: > "$summary"
status=0

run_device() {  # run_device DEVICE PORT
  local device=$1 port=$2
  local log="$out/demo_${device//:/_}.log"
  teserve --device="$device" --port="$port" --metrics_port=0 > "$out/server_${device//:/_}.log" 2>&1 &
  local server=$!
  for _ in $(seq 100); do
    teserve_cli health --server="localhost:$port" > /dev/null 2>&1 && break
    sleep 0.1
  done
  for model in mlp transformer; do
    local recipes="delayed current mxfp8 block nvfp4"
    [[ $model == transformer ]] && recipes="delayed"
    for recipe in $recipes; do
      local start end rc line
      start=$(date +%s%N)
      teserve_cli demo --server="localhost:$port" --model="$model" --recipe="$recipe" >> "$log" 2>&1
      rc=$?
      end=$(date +%s%N)
      line=$(grep -E "loss .* -> " "$log" | tail -1)
      printf '%s model=%s recipe=%s rc=%d ms=%d %s\n' "$device" "$model" "$recipe" "$rc" \
        $(((end - start) / 1000000)) "$line" >> "$summary"
      [[ $rc -eq 0 ]] || status=1
    done
  done
  kill "$server"
  wait "$server" 2> /dev/null
}

run_device cuda:0 50151
run_device cpu 50152
cat "$summary"
# The device the server logged and each loss falling are part of the check.
grep -h "device" "$out"/server_*.log | head -4
if grep -E 'rc=[1-9]|\(0\.[0-9]x lower\)|\(1\.0x lower\)' "$summary" > /dev/null; then status=1; fi
exit $status
