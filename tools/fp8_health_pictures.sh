#!/usr/bin/env bash
# Produces the pictures of docs/fp8_health.md from real data: starts teserve (CPU,
# FP8 health measured every step) and a real Prometheus (Debian's `prometheus`, loaded
# with deploy/prometheus/teserve_rules.yml) scraping it every second, runs
# examples/fp8_health_scenarios.py and examples/char_lm.py against it, then plots
# Prometheus query results (tools/plot_prometheus.py) and screenshots Prometheus's own
# graph and alerts pages with headless Chromium (Debian's `chromium`), when installed.
#
#   tools/fp8_health_pictures.sh [PYTHON]     PYTHON: an interpreter with the teserve
#                                             package and matplotlib (default python3)
# Writes docs/images/fp8_*.png and docs/images/char_lm.png (LM_STEPS=0: no char LM run,
# only the scenario pictures). Takes 5-15 minutes, depending on the machine's load.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${1:-python3}
grpc_port=${GRPC_PORT:-15051}
metrics_port=${METRICS_PORT:-19464}
prom_port=${PROM_PORT:-19090}
steps=${STEPS:-300}
lm_steps=${LM_STEPS:-400}
out=docs/images
mkdir -p "$out"
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

bazel-bin/server/teserve --device=cpu --host=127.0.0.1 --port="$grpc_port" --metrics_port="$metrics_port" \
  --fp8_stats_interval=1 2> "$work/teserve.log" &
pids+=($!)

cat > "$work/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $PWD/deploy/prometheus/teserve_rules.yml
scrape_configs:
  - job_name: teserve
    static_configs:
      - targets: ["127.0.0.1:$metrics_port"]
YML
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" 2> "$work/prometheus.log" &
pids+=($!)
for _ in $(seq 60); do
  curl -fs "http://127.0.0.1:$prom_port/-/ready" >/dev/null 2>&1 && break
  sleep 1
done

start=$(date +%s)
lm=""
[ "$lm_steps" -gt 0 ] && "$py" examples/char_lm.py --server "127.0.0.1:$grpc_port" --steps "$lm_steps" --plot "$out/char_lm.png" \
  > "$work/char_lm.out" 2> "$work/char_lm.err" &
[ "$lm_steps" -gt 0 ] && lm=$!
# --keep: the scenario sessions stay (no longer stepping), so their last gauges and the
# alerts they hold pending are still there for the alerts page below.
"$py" examples/fp8_health_scenarios.py --server "127.0.0.1:$grpc_port" --steps "$steps" --keep
sleep 3
scenarios_end=$(date +%s)
if command -v chromium >/dev/null; then
  chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
    --virtual-time-budget=20000 --screenshot="$out/fp8_prometheus_alerts.png" \
    "http://127.0.0.1:$prom_port/classic/alerts" >/dev/null 2>&1 || echo "chromium: no alerts screenshot" >&2
fi
if [ -n "$lm" ]; then wait "$lm"; cat "$work/char_lm.out"; fi
sleep 3  # a last scrape
end=$(date +%s)

"$py" tools/plot_prometheus.py --prometheus "http://127.0.0.1:$prom_port" --start "$start" \
  --scenarios-end "$scenarios_end" --end "$end" --out "$out" \
  $([ "$lm_steps" -gt 0 ] || echo --no-char-lm)

if command -v chromium >/dev/null; then
  shot() {  # shot FILE URL
    chromium --headless=new --no-sandbox --disable-gpu --hide-scrollbars --window-size=1400,1000 \
      --virtual-time-budget=20000 --screenshot="$1" "$2" >/dev/null 2>&1 || echo "chromium: no screenshot $1" >&2
  }
  range=$(( (scenarios_end - start) / 60 + 1 ))m
  enc() { "$py" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$1"; }
  when=$(date -u -d @"$scenarios_end" +%Y-%m-%d%%20%H:%M)
  scen='layer=~"steady|spike|alternating.*"'
  shot "$out/fp8_prometheus_graph.png" \
    "http://127.0.0.1:$prom_port/classic/graph?g0.expr=$(enc "teserve_fp8_underflow_ratio{tensor=\"input\",$scen}")&g0.tab=0&g0.range_input=$range&g0.end_input=$when&g0.stacked=0"
fi
ls -l "$out"
