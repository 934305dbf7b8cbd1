#!/usr/bin/env bash
# Matrix multiply on one GPU: Numba kernels against cuBLAS, GPU correctness tests,
# and the two programs. Run from the repo root with python3 usable and $OUT set.
# Writes $OUT/matmul_bench.json, $OUT/matmul_programs.jsonl, $OUT/matmul_log.txt.
# Every step is logged; a failing step does not stop the others.
set -u
OUT=${OUT:?set OUT to a writable directory}
LOG="$OUT/matmul_log.txt"
PROGS="$OUT/matmul_programs.jsonl"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
# MATMUL_SMOKE=1 (with HPCLAB_BACKEND=sim MPIRUN=mpiexec) tries this script without a GPU, tiny sizes.
SMOKE=${MATMUL_SMOKE:-0}
export HPCLAB_BACKEND=${HPCLAB_BACKEND:-gpu} NCCL_NVLS_ENABLE=0
: > "$LOG"; : > "$PROGS"
MPIRUN=${MPIRUN:-"mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND"}
if [ "$SMOKE" = 1 ]; then SIZES=32; N_LOOP=16; N_GEMM=24; else SIZES=4096,8192; N_LOOP=2048; N_GEMM=4096; fi
status=0

step() {  # step NAME TIMEOUT CMD...: run, log, remember failure
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS
  timeout "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  [ $rc -eq 0 ] || status=1
  return 0
}

prog() {  # prog NAME TIMEOUT CMD...: like step, and keep the program's JSON line
  local name=$1 limit=$2; shift 2
  echo "=== $name: $*" | tee -a "$LOG"
  local t0=$SECONDS tmp; tmp=$(mktemp)
  timeout "$limit" "$@" >"$tmp" 2>&1
  local rc=$?
  cat "$tmp" >>"$LOG"
  grep '^{"exercise"' "$tmp" | tail -1 >>"$PROGS"
  grep -E "Aggregated global sum|Expected|Max error|Wall time|Check" "$tmp" | sed 's/^/    /'
  rm -f "$tmp"
  echo "=== $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  [ $rc -eq 0 ] || status=1
  return 0
}

date -u +"date: %Y-%m-%dT%H:%M:%SZ" | tee -a "$LOG"
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader 2>&1 | tee -a "$LOG"
step info 60 python3 -m hpclab info

# 1. Benchmark: naive (4096 only), tiled, the fast kernel's candidate tile shapes, cuBLAS.
step bench 170 python3 -m hpclab bench matmul --sizes "$SIZES" --out "$OUT/matmul_bench.json"
sed -n '/^device:/,$p' "$LOG" | grep -E "^(device|N =|kernel|naive|tiled|fast|cublas|best|WRONG)" | tail -40

# 2. Correctness of every kernel on the real GPU (same tests as on the simulator).
[ "$SMOKE" = 1 ] || step pytest 150 python3 -m pytest -x -q -p no:cacheprovider tests/test_matmul.py -k "not mpi"
tail -3 "$LOG"

# 3. The programs: the tutorial's sum (N = 256, 2 ranks sharing the GPU), a training
#    loop, and the distributed GEMM at N = 4096 with the fast kernel.
prog matmul-reduce 90 $MPIRUN -n 2 python3 -m hpclab run matmul-reduce --json
prog matmul-reduce-loop 90 $MPIRUN -n 2 python3 -m hpclab run matmul-reduce --n "$N_LOOP" --init random --iterations 5 --kernel fast --json
prog matmul-gemm 120 $MPIRUN -n 2 python3 -m hpclab run matmul --n "$N_GEMM" --kernel fast --repeats 3 --json

echo "files: $(ls "$OUT" | tr '\n' ' ')"
echo "overall: $([ $status -eq 0 ] && echo all steps passed || echo SOME STEPS FAILED, see matmul_log.txt)"
exit $status
