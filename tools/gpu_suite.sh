#!/usr/bin/env bash
# Runs every GPU test, compute-sanitizer memcheck on each test binary (large shapes
# filtered out: memcheck slows kernels ~100x) and the benchmarks, on the GPU host, from
# a bundle made by shared/tools/device-bundle.sh (shared/GPU.md):
#
#   bash tools/gpu_suite.sh BUNDLE OUTDIR
#
# Writes OUTDIR/tests.log (every test's output), OUTDIR/memcheck.log, OUTDIR/bench.log,
# OUTDIR/bench.json and OUTDIR/summary.txt (one line per binary with its exit code).
set -uo pipefail
bundle=${1:?bundle folder}
out=${2:?output folder}
mkdir -p "$out"
# shellcheck disable=SC1091
source "$bundle/env.sh"
summary="$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$summary"
echo "commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)" >> "$summary"
for test in "$bundle"/bin/*_test; do
  name=$(basename "$test")
  "$test" --gtest_brief=1 > "$out/$name.tmp" 2>&1
  rc=$?
  echo "$name rc=$rc $(grep -E '^\[  (PASSED|FAILED|SKIPPED) +\] [0-9]' "$out/$name.tmp" | tr '\n' ' ')" >> "$summary"
  { echo "=== $name"; cat "$out/$name.tmp"; } >> "$out/tests.log"
  rm -f "$out/$name.tmp"
done
for test in "$bundle"/bin/*_test; do
  name=$(basename "$test")
  echo "=== $name" >> "$out/memcheck.log"
  compute-sanitizer --tool memcheck --error-exitcode 3 "$test" --gtest_brief=1 \
      --gtest_filter='-*16384*:*Large*:*Huge*' >> "$out/memcheck.log" 2>&1
  echo "memcheck $name rc=$?" >> "$summary"
done
if ls "$bundle"/bin/*_bench > /dev/null 2>&1; then
  benches=$(cd "$bundle/bin" && ls *_bench | tr '\n' ',' | sed 's/,$//')
  python3 bench/run_bench.py --bin-dir "$bundle/bin" --benches "$benches" --json "$out/bench.json" \
      > "$out/bench.log" 2>&1
  echo "bench rc=$?" >> "$summary"
fi
cat "$summary"
