#!/usr/bin/env bash
# tools/gpu_proof.sh OUT_DIR: the GPU proof, one command on a bare GPU machine (docs/design/emulator-and-proof.md, "The GPU proof").
#
# Builds hipsched in place (no build isolation: such machines reach no package registry), then runs the
# GPU tests, the same tests again under compute-sanitizer's memcheck and racecheck, the GPU benchmark
# table (against CuPy/torch and a device-to-device copy in the same run), the call path's host time
# (bench/device_data.py) and the demo. Writes
# OUT_DIR/summary.md (one line per step, the test counts and the benchmark table) and one log per step:
# nine files in all, so the whole folder comes back from a lent machine. Every step has its own time
# limit; the limits add up to 10 minutes, the most one command may take on a lent H100. Exit status: 0 when every step passed.
#
# Wheels the machine lacks (faiss-cpu, gguf, jsonschema: their tests skip without them) are installed
# from ./.whl when that folder exists. PYTHON picks the interpreter (default python3).
set -uo pipefail
OUT=${1:?usage: tools/gpu_proof.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 HIPSCHED_CYTHON_JOBS=${HIPSCHED_CYTHON_JOBS:-16}
export HIPSCHED_CACHE_DIR="$OUT/.cache"        # a cold kernel cache: the proof compiles every kernel itself
SUMMARY="$OUT/summary.md"
FAILED=0
t_start=$SECONDS

{ echo "# hipsched GPU proof"; echo; # a lent machine gets a copy of the working tree, whose HEAD may be older than its files: say so
  dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | wc -l)
  echo "$(date -u +%FT%TZ) on $(hostname), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$([ "$dirty" -gt 0 ] && echo " with $dirty tracked files changed since")"; echo
  echo "| step | status | seconds | result |"; echo "|---|---|---|---|"; } >"$SUMMARY"

# step NAME LIMIT_S LOG COMMAND...: run with a time limit, log everything, add a row to the summary
step() {
  local name=$1 limit=$2 log=$3; shift 3
  local t0=$SECONDS rc status last
  echo "== $name: $*" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  case $rc in
    0) status=pass ;;
    124|137) status="TIMEOUT (${limit} s)"; FAILED=1 ;;
    *) status="FAIL ($rc)"; FAILED=1 ;;
  esac
  last=$(grep -E "passed|failed|error|ERROR SUMMARY|RACECHECK SUMMARY|no GPU|workload finished" "$log" | tail -1 | tr '|' '/')
  echo "| $name | $status | $((SECONDS - t0)) | ${last:-see $(basename "$log")} |" >>"$SUMMARY"
  echo "$name: $status ($((SECONDS - t0)) s)"
  return $rc
}

BUILD_LOG="$OUT/build.log"
{
  echo "== machine"; nvidia-smi 2>&1 | head -15; "$PY" --version
  "$PY" -c "import numpy, torch; print('numpy', numpy.__version__, 'torch', torch.__version__, torch.version.cuda)" 2>&1
  "$PY" -c "import cupy; print('cupy', cupy.__version__)" 2>&1
  command -v compute-sanitizer nvcc 2>&1
} >"$BUILD_LOG" 2>&1
if [ -d .whl ] && compgen -G ".whl/*.whl" >/dev/null; then
  step "wheels from .whl" 120 "$BUILD_LOG" "$PY" -m pip install -q --no-index --no-deps --target /tmp/hipsched-site .whl/*.whl
  export PYTHONPATH=/tmp/hipsched-site${PYTHONPATH:+:$PYTHONPATH}
fi
step "build in place" "${HIPSCHED_PROOF_BUILD_S:-150}" "$BUILD_LOG" \
  "$PY" setup.py -q build_ext --inplace -j "$HIPSCHED_CYTHON_JOBS" || { echo "build failed: see $BUILD_LOG"; exit 1; }
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
# a GPU must be taken, or everything after this proves nothing
step "GPU detected" 30 "$BUILD_LOG" "$PY" -c "
import sys, hipsched.gpu.bindings.detect as d
ok = d.gpu_available()
for a in d.attempts(): print(a)
print('GPU available' if ok else 'no GPU'); sys.exit(0 if ok else 1)" || { echo "no GPU: see $BUILD_LOG"; exit 1; }
"$PY" -m hipsched info >>"$BUILD_LOG" 2>&1

PYTEST=("$PY" -m pytest -p no:cacheprovider -q -rs)
# tests/dask holds no GPU test, and its modules fail their collection on purpose where the test extra is
# missing (tests/support/requires.py): a GPU machine without dask leaves that folder out instead
GPU_TESTS=(tests)
NOTES=""
if ! "$PY" -c "import dask.array, distributed" >/dev/null 2>&1; then
  GPU_TESTS=(tests --ignore=tests/dask)
  NOTES="dask or distributed is not installed here: tests/dask (no GPU tests) was not collected."
fi
step "pytest -m gpu" 150 "$OUT/gpu-tests.log" "${PYTEST[@]}" -m gpu "${GPU_TESTS[@]}"
# The sanitizers slow kernels 10-100x: the op tests on their own (small shapes), without the deliberate
# out-of-memory test whose failed allocation the sanitizer would report as an API error.
SAN=(compute-sanitizer --error-exitcode 99 --report-api-errors no --print-limit 50)
SAN_TESTS=("${PYTEST[@]}" -m gpu tests/gpu/device/test_gpu_ops.py tests/gpu/device/test_gpu_quant_attention_spread.py)
# memcheck also takes the half kernels (2-byte addressing); racecheck leaves them out, as CI's emulator
# racecheck does: they are the float32 templates' barriers and shared memory, and its limit is spent
step "memcheck" 90 "$OUT/memcheck.log" "${SAN[@]}" --tool memcheck --leak-check no "${SAN_TESTS[@]}" \
  -k "not out_of_memory"
step "racecheck" 60 "$OUT/racecheck.log" "${SAN[@]}" --tool racecheck "${SAN_TESTS[@]}" \
  -k "not out_of_memory and not half" -x
# --quick: smaller shapes that fit the step's minute; HIPSCHED_PROOF_BENCH_ARGS= (empty) runs the full shapes
# issue 21's table names (about three minutes on an H100)
step "GPU benchmark" "${HIPSCHED_PROOF_BENCH_S:-60}" "$OUT/bench.log" "$PY" bench/gpu_ops.py ${HIPSCHED_PROOF_BENCH_ARGS---quick}
step "call path benchmark" 30 "$OUT/device-data.log" "$PY" bench/device_data.py --calls 40 --repeat 5
# issue 23: one top_k over a host corpus twice the resident budget (1M x 768, 3 GiB; budget 1.5 GiB), split
# across the CPU and the GPU against each alone
step "split benchmark" 120 "$OUT/split.log" "$PY" bench/split.py --real-gpu --rows 1048576 --calls 5 \
  --resident-bytes 1610612736
step "demo" 30 "$OUT/demo.log" "$PY" -m hipsched demo --quick --no-progress --log "$OUT/demo.jsonl"

{
  echo
  echo "Total: $((SECONDS - t_start)) s. Overall: $([ $FAILED -eq 0 ] && echo PASS || echo FAIL)"
  [ -n "$NOTES" ] && { echo; echo "$NOTES"; }
  echo
  echo "## GPU benchmark"
  echo
  table=$(ls -t bench/results/gpu_ops*.md 2>/dev/null | head -1)
  if [ -n "$table" ]; then cat "$table"; else tail -40 "$OUT/bench.log"; fi
  echo
  echo "## Roofline (rows at the full shapes; --quick rows have no measured time here)"
  echo
  "$PY" bench/roofline.py ${table:+--measured "$table"}
  echo
  echo "## Call path: device and host arrays against torch"
  echo
  cat bench/results/device_data.md 2>/dev/null || tail -20 "$OUT/device-data.log"
  echo
  echo "## One call split across the CPU and the GPU"
  echo
  cat bench/results/split.md 2>/dev/null || tail -20 "$OUT/split.log"
  echo
  echo "## Demo: where calls ran"
  echo
  grep -A12 "Per op and backend" "$OUT/demo.log" | head -14
} >>"$SUMMARY"
rm -rf "$OUT/.cache"
cat "$SUMMARY"
exit $FAILED
