#!/usr/bin/env bash
# Installs what teserve needs to build and test, and nothing that is already there:
# Debian/Ubuntu packages (Bazel, gRPC, protobuf, abseil, prometheus-cpp, GoogleTest,
# Google Benchmark, OpenBLAS, and prometheus: the server and promtool that
# tests/integration/prometheus_test runs against deploy/; the test starts its own
# instance, the package's system service is not needed) and the cuDNN frontend headers
# (pip). The CUDA toolkit is not installed here: with one in CUDA_PATH or
# /usr/local/cuda the CUDA kernels are built, without one the build falls back to the
# CPU backend.
#
# --fuzz adds what the fuzz targets need (tests/fuzz/run_fuzzers.sh): clang and the
# compiler-rt runtimes with libFuzzer and the sanitizers (libclang-rt-dev, which clang
# only recommends; Debian 12: clang 14, Ubuntu 24.04: clang 18).
set -euo pipefail

packages=(
  bazel-bootstrap g++ python3 python3-pip python3-venv
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
  prometheus
)
if [ "${1:-}" = "--fuzz" ]; then
  packages+=(clang libclang-rt-dev)
fi

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    # A python3 / pip outside dpkg (pyenv, a venv) is as good as the package.
    case "$pkg" in
      python3) command -v python3 >/dev/null && continue ;;
      python3-pip) python3 -m pip --version >/dev/null 2>&1 && continue ;;
      # .ci/run makes a venv for the Python client's tests: needs venv and ensurepip.
      python3-venv) python3 -c 'import venv, ensurepip' >/dev/null 2>&1 && continue ;;
    esac
    missing+=("$pkg")
  fi
done

if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "teserve: installing ${missing[*]}" >&2
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# cuDNN frontend (header-only; the fused attention path builds on it). Located at
# configure time through importlib.metadata, as tools/cuda/cuda_configure.bzl does.
if ! python3 -c "import importlib.metadata as m; m.distribution('nvidia-cudnn-frontend')" 2>/dev/null; then
  echo "teserve: installing nvidia-cudnn-frontend (pip)" >&2
  python3 -m pip install -q nvidia-cudnn-frontend 2>/dev/null ||
    python3 -m pip install -q --break-system-packages nvidia-cudnn-frontend
fi
