#!/bin/sh
# Exhaustive check of the SIMD levels' element-wise primitives (docs/guide/cpu.md, "CPU SIMD levels"):
# every float32 bit pattern through the vector exp, exp_neg and the float16/bfloat16 stores, every 16-bit
# pattern through the loads, AVX2 against AVX-512 and each against simd.h's scalar reference.
# Needs an AVX-512 CPU (F/DQ/BW/VL), gcc and NumPy; a few minutes on 16 cores. Run from anywhere:
#   sh tools/simd_exhaustive/run.sh [python]
set -e
for f in avx512f avx512dq avx512bw avx512vl; do
    grep -qw $f /proc/cpuinfo || { echo "this CPU has no $f: nothing to compare" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd); src=$here/../../src_c/cpu; out=$(mktemp -d)
gcc -O2 -fPIC -shared -DLVL_AVX2 -I"$src" "$here/harness.c" -o "$out/avx2.so" -lm
gcc -O2 -fPIC -shared -DLVL_AVX512 -I"$src" "$here/harness.c" -o "$out/avx512.so" -lm
"${1:-python3}" "$here/compare.py" "$out/avx2.so" "$out/avx512.so"
