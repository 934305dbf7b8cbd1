#!/usr/bin/env bash
# Strong scaling of the distributed GEMM (rows of A scattered, B broadcast, C gathered)
# over 1, 2, 4 GPUs through the scaling harness. Run from the repository root with
# $OUT set (benchmarks/gpu_suite.sh does). Writes matmul_strong.csv and .png.
set -u
: "${OUT:?set OUT}"
export HPCLAB_BACKEND=gpu NCCL_NVLS_ENABLE=0
MPIRUN=${MPIRUN:-mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND}
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
RANKS=1; [ "$NGPU" -ge 2 ] && RANKS=1,2; [ "$NGPU" -ge 4 ] && RANKS=1,2,4
N=${GEMM_N:-16384}
echo "distributed GEMM, N=$N float32, fast kernel, ranks $RANKS (wall time includes scatter, broadcast, gather)"
timeout 300 python3 -m hpclab scaling matmul --ranks "$RANKS" --work-arg=--n --n "$N" --kernel fast \
    --trials 3 --mpiexec "$MPIRUN" --timeout 240 --out "$OUT" --no-progress
echo "summary:"
python3 - "$OUT/matmul_strong.csv" <<'PY' || true
import csv, sys
for r in csv.DictReader(open(sys.argv[1])):
    if r["trial"] == "0":
        print(f"  {r['ranks']} GPU(s): median wall {float(r['median_wall_s']):.4f} s, "
              f"speedup {float(r['speedup']):.2f}, efficiency {float(r['efficiency']):.3f}")
PY
