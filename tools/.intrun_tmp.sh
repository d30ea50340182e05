set -u
rm -rf .devbundle_i rf && tar xJf .devbundle_xz/bundle.tar.xz
source .devbundle_i/env.sh
mkdir -p rf/teserve/server rf/teserve/client rf/teserve/tests/integration
cp .devbundle_i/bin/teserve rf/teserve/server/; cp .devbundle_i/bin/teserve_cli rf/teserve/client/
cp .devbundle_i/bin/rename_pause.so rf/teserve/tests/integration/
nvidia-smi --query-gpu=name --format=csv,noheader
.devbundle_i/bin/copy_many_gpu_test 2>&1 | tail -4
for t in final_checkpoint_test cancellation_test checkpoint_kill_test; do
  mkdir -p $OUT/$t
  echo "== $t"
  TEST_SRCDIR=$PWD/rf TEST_WORKSPACE=teserve TESERVE_TEST_DEVICE=cuda:0 TEST_TMPDIR=$OUT/$t timeout 280 .devbundle_i/bin/$t > $OUT/$t/stdout.txt 2>&1; echo "rc=$?"
  grep -E "^\[ *(OK|FAILED|PASSED|SKIPPED) |layers: |SIGTERM to exit|Failure" $OUT/$t/stdout.txt | head -20
done
grep -h "saved: step\|shutdown complete\|outlived" $OUT/final_checkpoint_test/*.log 2>/dev/null | tail -8
