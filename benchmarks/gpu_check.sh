#!/bin/bash
# One call on a GPU machine: build, run the parity suites on the cuda backend, compute-sanitizer over a subset of
# the op suite, and (with BENCH=1) the GPU benchmark. Logs go to $OUT (or ./gpu-logs).
set -o pipefail
OUT=${OUT:-gpu-logs}; mkdir -p "$OUT"
nvidia-smi -L
# A fresh build folder: a machine kept warm between callers may hold another tree's objects, which ninja can link
# stale (their timestamps can be newer than this tree's sources).
rm -rf build/gpu-check python/luminal/_core*.so
cmake -S . -B build/gpu-check -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build/gpu-check \
  >"$OUT/build.log" 2>&1 || { tail -50 "$OUT/build.log"; exit 1; }
export PYTHONPATH=python LUMINAL_TEST_SEED=${LUMINAL_TEST_SEED:-1234} PYTHONUNBUFFERED=1
SEL=${SEL:-"cuda and not nvrtc"}
if [ -z "$SKIP_TESTS" ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -n 8 -p no:cacheprovider --tb=line -rfE -k "$SEL" \
    tests/test_cuda*.py tests/test_ops.py tests/test_errors.py tests/test_llama.py tests/test_sdpa.py tests/test_conv.py \
    tests/test_batched_decode.py ${EXTRA_TESTS} 2>&1 \
    | tee "$OUT/pytest.log" | grep -v "^\[gw" | tail -${TAIL:-60}
fi
# SANITIZE: a -k expression over the cuda tests ("cuda" for all). One process per tool and file, all at once:
# compute-sanitizer does not follow pytest-xdist's workers (a run with -n 8 instrumented only the parent).
if [ -n "$SANITIZE" ]; then
  SAN_FILES=${SAN_FILES:-"tests/test_ops.py tests/test_cuda.py tests/test_errors.py tests/test_llama.py"}
  for tool in memcheck racecheck; do
    for f in $SAN_FILES; do
      log="$OUT/sanitizer-$tool-$(basename $f .py).log"
      ( timeout ${SAN_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q \
          -p no:cacheprovider -x $f -k "cuda and not nvrtc and ($SANITIZE)" >"$log" 2>&1
        echo "compute-sanitizer $tool $f: exit $? $(grep -hE 'ERROR SUMMARY|passed|failed' "$log" | tail -2 | tr '\n' ' ')" ) &
    done
  done
  wait
fi
if [ -n "$BENCH" ]; then
  timeout ${BENCH_TIMEOUT:-300} python3 benchmarks/llm_gpu.py $BENCH_ARGS 2>&1 | tee "$OUT/bench.log" | tail -40
fi
