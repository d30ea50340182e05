#!/usr/bin/env bash
# Runs every GPU test, compute-sanitizer memcheck on each test binary (large shapes
# filtered out: memcheck slows kernels ~100x) and the benchmarks, on the GPU host, from
# a bundle made by tools/device_bundle.sh (docs/gpu.md):
#
#   bash tools/gpu_suite.sh BUNDLE OUTDIR [tests|memcheck|check|bench|all]   (default all)
#
# The 16384 x 8192 cases spend most of their time in the CPU reference, so each test
# binary runs as SHARDS gtest shards in parallel (default: the host's cores / 2) and the
# memcheck runs of the binaries run side by side ("check" runs the tests and memcheck at
# the same time: both are bound by the CPU side); the benchmarks run alone afterwards, on
# an otherwise idle GPU. A stage that is not asked for is skipped, so one host call can
# run the checks and a second one the benchmarks (each call has a time limit).
#
# Environment: SHARDS (above); TEST_TIMEOUT, seconds one test shard may take before it is
# killed (default 600; a hang then shows as rc=124 instead of eating the host call; SIGKILL
# 30 s after SIGTERM); MEMCHECK_TIMEOUT, the same for one (unsharded, ~100x slower)
# memcheck run (default 1200); MEMCHECK_EXCLUDE, the gtest patterns kept out of memcheck
# (default: the benchmark-size cases; set it empty to memcheck everything).
#
# Exits 1 when a test, a memcheck run or the benchmark driver failed (see summary.txt).
# Writes OUTDIR/tests.log (every test's output), OUTDIR/memcheck.log, OUTDIR/bench.log,
# OUTDIR/bench.json and OUTDIR/summary.txt (one line per binary with its exit code and
# the gtest counts summed over shards).
set -uo pipefail
bundle=${1:?bundle folder}
out=${2:?output folder}
stage=${3:-all}
case $stage in
  tests | memcheck | check | bench | all) ;;
  *) echo "unknown stage '$stage' (tests, memcheck, check, bench or all)" >&2; exit 2 ;;
esac
mkdir -p "$out"
# shellcheck disable=SC1091
source "$bundle/env.sh"
summary="$out/summary.txt"
shards=${SHARDS:-$(( $(nproc) / 2 > 1 ? $(nproc) / 2 : 1 ))}
work=$(mktemp -d)
test_timeout=${TEST_TIMEOUT:-600}
memcheck_timeout=${MEMCHECK_TIMEOUT:-1200}
memcheck_exclude=${MEMCHECK_EXCLUDE-'*16384*:*4x2048x8192*:*Large*:*Huge*'}
if [[ ! -f "$summary" ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$summary"
  echo "commit $(cat "$bundle/COMMIT" 2>/dev/null || echo unknown)" >> "$summary"
fi

# Sums "[  PASSED  ] N tests." style lines over the shard logs of one binary.
count() {  # count LABEL FILES...
  local label=$1
  shift
  grep -h -E "^\[ +$label +\] [0-9]+ test" "$@" 2>/dev/null | awk '{n += $4} END {print n + 0}'
}

# Distinct failed tests named in the shard logs (gtest prints a failure's name once inline
# and, without --gtest_brief, again in its closing list).
failures() {
  grep -h -E '^\[  FAILED  \] [^0-9]' "$@" 2>/dev/null | sed 's/^\[  FAILED  \] //; s/[ ,].*//' | sort -u | wc -l
}

run_tests() {
  for test in "$bundle"/bin/*_test; do
    name=$(basename "$test")
    pids=()
    for ((i = 0; i < shards; ++i)); do
      GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i timeout -k 30 "$test_timeout" "$test" --gtest_brief=1 > "$work/$name.$i" 2>&1 &
      pids+=($!)
    done
    rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
    echo "$name rc=$rc passed=$(count PASSED "$work/$name".[0-9]*) failed=$(failures "$work/$name".[0-9]*)" \
         "skipped=$(count SKIPPED "$work/$name".[0-9]*)" >> "$summary"
    { echo "=== $name"; cat "$work/$name".[0-9]*; } >> "$out/tests.log"
  done
}

run_memcheck() {
  local pids=()
  for test in "$bundle"/bin/*_test; do
    name=$(basename "$test")
    ( timeout -k 30 "$memcheck_timeout" compute-sanitizer --tool memcheck --error-exitcode 3 "$test" --gtest_brief=1 \
          --gtest_filter="-$memcheck_exclude" > "$work/$name.memcheck" 2>&1
      echo $? > "$work/$name.memcheck.rc" ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  for test in "$bundle"/bin/*_test; do
    name=$(basename "$test")
    { echo "=== $name"; cat "$work/$name.memcheck"; } >> "$out/memcheck.log"
    echo "memcheck $name rc=$(cat "$work/$name.memcheck.rc") $(grep 'ERROR SUMMARY' "$work/$name.memcheck" | tail -1)" \
         >> "$summary"
  done
}

case $stage in
  tests) run_tests ;;
  memcheck) run_memcheck ;;
  check | all)
    run_memcheck_summary="$work/memcheck.summary"
    summary_main=$summary
    summary=$run_memcheck_summary run_memcheck &
    memcheck_pid=$!
    run_tests
    wait $memcheck_pid
    cat "$run_memcheck_summary" >> "$summary_main"
    ;;
esac

if [[ $stage == all || $stage == bench ]] && ls "$bundle"/bin/*_bench > /dev/null 2>&1; then
  benches=$(cd "$bundle/bin" && ls *_bench | tr '\n' ',' | sed 's/,$//')
  python3 bench/run_bench.py --bin-dir "$bundle/bin" --benches "$benches" --json "$out/bench.json" \
      > "$out/bench.log" 2>&1
  echo "bench rc=$?" >> "$summary"
fi
rm -rf "$work"
cat "$summary"
# Exit 1 when any line of summary.txt reports a non-zero rc or failed tests.
if grep -E ' rc=[1-9]|failed=[1-9]' "$summary" > /dev/null; then exit 1; fi
