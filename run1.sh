#!/bin/bash
# GPU call 1: benches on an idle GPU, then the GPU suite with memcheck.
set -u
t0=$(date +%s)
tar xJf .devbundle_xz/bundle.tar.xz
B=$PWD/.devbundle_r1
source $B/env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
cat $B/COMMIT
for op in linear_fp8_current_bf16_fwd_bwd linear_fp8_delayed_bf16_fwd_bwd; do
  LINEAR_BENCH_ONLY=$op timeout 120 $B/bin/linear_bench --shapes=16384x8192 2>&1 | tail -4
done
timeout 120 $B/bin/rpc_edge_bench --warmup=2 --iters=7 --shapes=16384x8192,1024x1024 2>&1 | tail -12
timeout 150 bash tools/gpu_demo.sh $B $OUT/demo > $OUT/demo.out 2>&1; echo "demo rc=$?"
cat $OUT/demo/demo_summary.txt
echo "benches done at $(( $(date +%s) - t0 )) s"
left=$(( 560 - ($(date +%s) - t0) ))
MEMCHECK_EXCLUDE='*16384*:*4x2048x8192*:*Large*:*Huge*:*LayerConfigsGpu*fp32:*LayerConfigsGpu*weird*' \
  TEST_TIMEOUT=300 MEMCHECK_TIMEOUT=300 TESERVE_CUDA_POISON_EMPTY=1 \
  timeout $left bash tools/gpu_suite.sh $B $OUT/suite check > $OUT/suite.out 2>&1
echo "suite rc=$? at $(( $(date +%s) - t0 )) s"
cat $OUT/suite/summary.txt
grep -h -E "^\[  FAILED|Failure|ERROR SUMMARY: [1-9]" $OUT/suite/tests.log $OUT/suite/memcheck.log 2>/dev/null | sort | uniq -c | head -40
