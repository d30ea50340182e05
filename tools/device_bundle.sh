#!/usr/bin/env bash
# Packs built programs for the GPU host, which has the CUDA stack but no Bazel and none of
# the gRPC / protobuf / abseil libraries our binaries link (docs/gpu.md).
#
#   bash tools/device_bundle.sh OUTDIR PROGRAM...
#
# OUTDIR receives bin/ (the programs, symlinks resolved), lib/ (every shared library they
# load except the ones the GPU host provides itself: glibc, libstdc++, libgcc and the CUDA,
# cuBLAS, cuDNN, NCCL and driver libraries, which must match the host's driver), COMMIT
# (the source commit, read by tools/gpu_suite.sh) and env.sh, which sets LD_LIBRARY_PATH and
# PATH on the GPU host. Keep OUTDIR out of git (the .devbundle* folders are ignored).
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 OUTDIR PROGRAM..." >&2
  exit 2
fi
out=$1
shift
mkdir -p "$out/bin" "$out/lib"

# Libraries the GPU host has in versions that fit its driver; never ship our copies.
host_provided='/(ld-linux[^/]*|lib(c|m|dl|rt|pthread|util|resolv|stdc\+\+|gcc_s))\.so'
host_provided+='|/usr/local/cuda/|/lib(cuda|nvidia[^/]*|cudart|cublas|cublasLt|cudnn[^/]*|curand|cufft|cusparse|cusolver|nccl|nvrtc)\.so'

for program in "$@"; do
  if [[ ! -f $program ]]; then
    echo "$0: no such file: $program" >&2
    exit 2
  fi
  cp -L "$program" "$out/bin/"
  # ldd prints "name => /path (address)" for each library it resolved.
  while read -r library; do
    [[ -e $out/lib/$(basename "$library") ]] || cp -L "$library" "$out/lib/"
  done < <(ldd "$program" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | { grep -vE "$host_provided" || true; })
done

git rev-parse --short HEAD > "$out/COMMIT" 2>/dev/null || echo unknown > "$out/COMMIT"

cat > "$out/env.sh" <<'ENV'
# Source this on the GPU host: bash's "source OUTDIR/env.sh".
bundle_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# A newer cuDNN than the system's may come with the Python environment (nvidia.cudnn).
python_cudnn=$(python3 -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$bundle_dir/lib${python_cudnn:+:$python_cudnn}:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$bundle_dir/bin:$PATH"
ENV
du -sh "$out"
