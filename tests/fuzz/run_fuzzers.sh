#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer (bazel --config=fuzz, .bazelrc) and runs each from its
# checked-in corpus (docs/fuzzing.md):
#
#   tests/fuzz/run_fuzzers.sh [--seconds N] [--out DIR] [--junit FILE] [TARGET...]
#
# N seconds per target (default 60), one target after another; every target by default.
# DIR (default .fuzz-out) gets per target: corpus/ (the seeds plus what fuzzing added),
# log, and any input that crashed, leaked, hung or ran out of memory (crash-*, leak-*,
# timeout-*, oom-*). Prints one line per target (executions, exec/s, corpus, result) and
# exits 1 when a target failed. --junit writes a JUnit report with one testcase per
# target, which tools/test_summary.py counts (.ci/run). TESERVE_BAZEL_JOBS caps Bazel's
# parallelism. clang and its libFuzzer runtime are installed when missing
# (tools/install_deps.sh --fuzz).
set -uo pipefail
cd "$(dirname "$0")/../.."

seconds=60
out=.fuzz-out
junit=""
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --junit) junit="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "run_fuzzers: unknown flag $1" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
((${#targets[@]})) || targets=(request_fuzzer spec_fuzzer checkpoint_fuzzer safetensors_fuzzer)

mkdir -p "$out"
results="$out/results.tsv"
: > "$results"

# The JUnit report from results.tsv (target, result, seconds, detail file).
write_junit() {
  [ -n "$junit" ] || return 0
  python3 - "$results" "$junit" <<'PY'
import sys
from xml.sax.saxutils import escape, quoteattr
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
failures = sum(1 for r in rows if r[1] != "ok")
with open(sys.argv[2], "w") as out:
    out.write('<?xml version="1.0" encoding="UTF-8"?>\n')
    out.write(f'<testsuites><testsuite name="fuzz" tests="{len(rows)}" failures="{failures}">\n')
    for target, result, secs, detail in rows:
        out.write(f'<testcase classname="tests.fuzz" name={quoteattr(target)} time="{secs}">')
        if result != "ok":
            try:
                text = open(detail, errors="replace").read()[-4000:]
            except OSError:
                text = ""
            out.write(f'<failure message={quoteattr(result)}>{escape(text)}</failure>')
        out.write("</testcase>\n")
    out.write("</testsuite></testsuites>\n")
PY
}

if ! bash tools/install_deps.sh --fuzz; then
  printf '%s\t%s\t0\t\n' build "install_deps --fuzz failed" >> "$results"
  write_junit
  exit 1
fi

labels=()
for t in "${targets[@]}"; do labels+=("//tests/fuzz:$t"); done
build_log="$out/build.log"
start=$(date +%s)
if ! bazel build --config=fuzz ${TESERVE_BAZEL_JOBS:+--jobs=$TESERVE_BAZEL_JOBS} "${labels[@]}" > "$build_log" 2>&1; then
  tail -30 "$build_log" >&2
  printf '%s\t%s\t%s\t%s\n' build "the fuzz build failed" "$(($(date +%s) - start))" "$build_log" >> "$results"
  write_junit
  exit 1
fi
echo "run_fuzzers: built ${#targets[@]} targets in $(($(date +%s) - start)) s" >&2
bin="$(bazel info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz"

status=0
for t in "${targets[@]}"; do
  dir="$out/$t"
  rm -rf "$dir" && mkdir -p "$dir/corpus"
  dict=()
  case "$t" in
    checkpoint_fuzzer|safetensors_fuzzer) dict=(-dict=tests/fuzz/checkpoint.dict) ;;
    request_fuzzer|spec_fuzzer) dict=(-dict=tests/fuzz/request.dict) ;;
  esac
  start=$(date +%s)
  # New inputs go to $dir/corpus; the checked-in corpus is read only.
  "$bin/$t" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=25 -print_final_stats=1 \
    -artifact_prefix="$dir/" "${dict[@]}" "$dir/corpus" "tests/fuzz/corpus/$t" > "$dir/log" 2>&1
  rc=$?
  took=$(($(date +%s) - start))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/log" | tail -1)
  corpus=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$dir/log" | sed -n 's/.*corp: \([^ ]*\).*/\1/p' | tail -1)
  artifacts=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | wc -l)
  if [ "$rc" -eq 0 ] && [ "$artifacts" -eq 0 ]; then
    result=ok
  else
    result="failed (exit $rc, $artifacts inputs saved in $dir)"
    status=1
    grep -m1 -E 'ERROR: |fuzz invariant violated|runtime error' "$dir/log" >&2
  fi
  printf 'run_fuzzers: %-20s %4ss  %10s execs  %6s exec/s  corpus %-14s %s\n' \
    "$t" "$took" "${execs:-?}" "${rate:-?}" "${corpus:-?}" "$result"
  printf '%s\t%s\t%s\t%s\n' "$t" "$result" "$took" "$dir/log" >> "$results"
done
write_junit
exit "$status"
