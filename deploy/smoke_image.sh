#!/usr/bin/env bash
# Smoke test of the image deploy/build_image.sh made: runs the server inside it (buildah
# run, host network, the image's own entrypoint, flags and user), then from a second
# container of the same image drives it with `teserve_cli health` (the image's
# HEALTHCHECK command) and a short `demo`, reads /metrics, and stops the server with
# SIGTERM, which must end it cleanly. Exits non-zero on any failure. Needs root and buildah.
#
#   deploy/smoke_image.sh [IMAGE]        (default localhost/teserve:dev)
#
# Free ports are picked on the host (the host network is shared with whatever else runs);
# they are passed after the image's CMD, which they override.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${1:-${TESERVE_IMAGE:-localhost/teserve:dev}}
isolation=${TESERVE_ISOLATION:-chroot}
work=$(mktemp -d /tmp/teserve-smoke.XXXXXX)
server_ctr="" cli_ctr="" server_pid=""
start=$SECONDS

log() { echo "smoke_image: $*" >&2; }
fail() {
  log "FAIL: $*"
  [ -s "$work/server.log" ] && { log "server log:"; sed 's/^/  | /' "$work/server.log" >&2; }
  exit 1
}

# Every process below the given one, deepest last (buildah run -> runtime -> teserve).
descendants() {
  local pid=$1 child children
  # Each task's children file is one line of space-separated pids.
  children=$(cat /proc/"$pid"/task/*/children 2>/dev/null || true)
  for child in $children; do
    echo "$child"
    descendants "$child"
  done
}

cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    for p in $(descendants "$server_pid"); do kill -KILL "$p" 2>/dev/null || true; done
    kill -KILL "$server_pid" 2>/dev/null || true
  fi
  [ -n "$server_ctr" ] && buildah rm "$server_ctr" >/dev/null 2>&1 || true
  [ -n "$cli_ctr" ] && buildah rm "$cli_ctr" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

buildah inspect --type image "$image" >/dev/null 2>&1 || fail "no image $image (deploy/build_image.sh)"

read -r grpc_port metrics_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

# The image's own configuration: entrypoint, default arguments, user, health check.
buildah inspect --type image "$image" >"$work/inspect.json"
config() {  # config FIELD: a field of the image's configuration, as JSON
  python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
oci, docker = d["OCIv1"]["config"], d.get("Docker", {}).get("config", {})
print(json.dumps(oci.get(sys.argv[2], docker.get(sys.argv[2]))))' "$work/inspect.json" "$1"
}
entrypoint=$(config Entrypoint)
cmd=$(config Cmd)
user=$(config User | tr -d '"')
healthcheck=$(config Healthcheck)
log "image $image: entrypoint $entrypoint, cmd $cmd, user $user"
log "healthcheck $healthcheck"
[ -n "$user" ] && [ "${user%%:*}" != 0 ] && [ "${user%%:*}" != root ] || fail "image runs as root ('$user')"
case "$healthcheck" in *teserve_cli*health*) ;; *) fail "no HEALTHCHECK through teserve_cli health" ;; esac
mapfile -t server_cmd < <(python3 -c 'import json,sys; [print(a) for a in json.loads(sys.argv[1]) + json.loads(sys.argv[2])]' \
  "$entrypoint" "$cmd")

server_ctr=$(buildah from --quiet "$image")
cli_ctr=$(buildah from --quiet "$image")

log "server: ${server_cmd[*]} --port=$grpc_port --metrics_port=$metrics_port"
buildah run --isolation "$isolation" --network host "$server_ctr" -- \
  "${server_cmd[@]}" --port="$grpc_port" --metrics_port="$metrics_port" >"$work/server.log" 2>&1 &
server_pid=$!

cli() { buildah run --isolation "$isolation" --network host "$cli_ctr" -- /usr/local/bin/teserve_cli "$@"; }

# health: the image's HEALTHCHECK command, against this run's port; retried while the
# server starts.
healthy=0
for _ in $(seq 1 60); do
  kill -0 "$server_pid" 2>/dev/null || fail "the server exited during start"
  if cli health --server="localhost:$grpc_port" >"$work/health.out" 2>&1; then healthy=1; break; fi
  sleep 1
done
[ "$healthy" = 1 ] || fail "teserve_cli health never succeeded: $(cat "$work/health.out")"
log "health: $(tr '\n' ' ' <"$work/health.out")(after $((SECONDS - start)) s)"

# The server runs as the image's user, not root.
uid_line=$(grep -m1 -E '^Uid:' /proc/"$(descendants "$server_pid" | tail -1)"/status || true)
log "server process ${uid_line:-Uid: ?}"
case "$uid_line" in "Uid:"*[[:space:]]0[[:space:]]*) fail "server process runs as root" ;; esac

cli server-info --server="localhost:$grpc_port" >"$work/info.out" 2>&1 || fail "server-info: $(cat "$work/info.out")"
grep -E '^(device|cuda_runtime_version|cublaslt_version|cudnn_version|nccl_version):' "$work/info.out" \
  | tr '\n' ' ' | sed 's/^/smoke_image: server-info: /; s/$/\n/' >&2
# The CUDA libraries from the wheels load inside the image: the server reports the versions
# of cudart and cuBLASLt (linked) and of cuDNN and NCCL (opened at run time), GPU or not.
for lib in cuda_runtime_version cublaslt_version cudnn_version nccl_version; do
  grep -q -E "^$lib: \"[0-9]" "$work/info.out" || fail "server-info reports no $lib: $(cat "$work/info.out")"
done

# A short demo: a LayerNorm/Linear student under delayed scaling, 20 steps.
cli demo --server="localhost:$grpc_port" --steps=20 >"$work/demo.out" 2>&1 || fail "demo: $(cat "$work/demo.out")"
grep -q -i "step" "$work/demo.out" || fail "demo printed no steps: $(cat "$work/demo.out")"
log "demo: $(grep -c . "$work/demo.out") lines, last loss line: $(grep -i 'step' "$work/demo.out" | tail -1)"

# /metrics: the RPCs the demo made are counted.
python3 - "$metrics_port" >"$work/metrics.out" <<'EOF' || fail "/metrics: $(cat "$work/metrics.out")"
import sys, urllib.request
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
need = ['teserve_rpc_requests_total{', 'method="Step"', 'teserve_sessions']
missing = [n for n in need if n not in text]
print(f"{len(text.splitlines())} lines" if not missing else f"missing {missing}")
sys.exit(1 if missing else 0)
EOF
log "metrics: $(cat "$work/metrics.out")"

# SIGTERM to the server process: it turns NOT_SERVING, drains and exits 0.
server_proc=$(descendants "$server_pid" | tail -1)
[ -n "$server_proc" ] || fail "cannot find the server process"
kill -TERM "$server_proc"
rc=0
for _ in $(seq 1 40); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
if kill -0 "$server_pid" 2>/dev/null; then fail "server still running 20 s after SIGTERM"; fi
wait "$server_pid" || rc=$?
server_pid=""
[ "$rc" = 0 ] || fail "server exited with $rc after SIGTERM"
log "server stopped cleanly on SIGTERM"
log "PASS in $((SECONDS - start)) s"
