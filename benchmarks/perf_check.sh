#!/usr/bin/env bash
# GPU checks of the warp-tiled SGEMM on any shape, the roofline and the timelines: one GPU (the
# timeline part needs two and is skipped, with a message, on one). About 4 minutes on an H100/H200.
# From the repository root, after `source benchmarks/offline_env.sh`:
#
#   OUT=/path bash benchmarks/perf_check.sh
#
# Writes to $OUT: summary.txt (each step, its exit status and seconds, the SGEMM ratios), one log per
# step, matmul.json (`python -m benchmarks matmul --json`, which benchmarks/record.py reads: N = 4096, 8192,
# 4095 under "sizes", 3000x5000x700 under "shapes"), roofline.csv (the format of
# hpclab/data/roofline.csv) and, on two GPUs, timeline.csv (the format of hpclab/data/timeline.csv).
# Exits 1 when any step fails (a wrong product, a failed test, a step over its time limit). BUDGET
# (seconds, default 340) bounds the whole run: each step's limit is cut to what is left of it.
set -u
OUT=${OUT:?set OUT to a folder for the results}
mkdir -p "$OUT"
PY=${PYTHON_RUN:-python3}
LAUNCH=${MPIRUN:-mpiexec}
export HPCLAB_BACKEND=gpu NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0} PYTHONUNBUFFERED=1
GPUS=${HPCLAB_GPUS:-$(nvidia-smi -L 2>/dev/null | wc -l)}
SUMMARY=$OUT/summary.txt
BUDGET=${BUDGET:-340}
FAILED=()
{ echo "# hpclab perf check, $(date -u +%FT%TZ), $(hostname), $GPUS GPU(s)"; nvidia-smi -L 2>/dev/null; } > "$SUMMARY"

step() {  # step NAME SECONDS COMMAND...: run it under a time limit into NAME.log; note a failure
    local name=$1 limit=$2 t0=$SECONDS rc
    shift 2
    [ "$limit" -le $((BUDGET - SECONDS)) ] || limit=$((BUDGET - SECONDS))
    echo "== $name (limit $limit s): $*" | tee -a "$SUMMARY"
    if [ "$limit" -le 0 ]; then FAILED+=("$name (not run: out of time)"); return; fi
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?
    tail -n 3 "$OUT/$name.log" | sed 's/^/   /' >> "$SUMMARY"
    echo "   exit $rc after $((SECONDS - t0)) s" | tee -a "$SUMMARY"
    [ "$rc" -eq 0 ] || FAILED+=("$name (exit $rc, see $name.log)")
}

# The tests of the three parts on the GPU: the warp kernel against NumPy at small odd shapes with the
# GPU's 128 x 128 x 16 tiles (all edge tiles), the roof kernels, the timeline bookkeeping.
step tests 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_matmul.py tests/test_roofline.py \
    tests/test_timeline.py -k "warp or test_roofline or test_timeline"

# The warp kernel against NumPy (float64) at large odd shapes: full tiles and edge tiles in one product.
step odd_shapes 90 "$PY" - <<'EOF'
import numpy as np
from hpclab.matmul import fast as mm
for m, k, n in ((4095, 4095, 4095), (3000, 700, 5000), (515, 300, 1029), (129, 17, 131), (256, 64, 384)):
    rng = np.random.default_rng(m + k + n)
    a, b = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (k, n)))
    ref = a.astype(np.float64) @ b.astype(np.float64)
    err = float(np.abs(mm.matmul(a, b, "warp") - ref).max() / np.abs(ref).max())
    print(f"warp {m} x {k} @ {k} x {n}: max relative error {err:.2e}")
    assert err < 1e-5, f"warp kernel wrong at M={m}, K={k}, N={n}: {err:.2e}"
EOF

# SGEMM against cuBLAS in turns, N = 4096, 8192, 4095 and M x N x K = 3000 x 5000 x 700 (exit 1: a wrong result).
step bench_matmul 150 "$PY" -m benchmarks matmul --no-sweep --out "$OUT/matmul.json"
[ -f "$OUT/matmul.json" ] && "$PY" - "$OUT/matmul.json" >> "$SUMMARY" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for key, block in {**d["sizes"], **d.get("shapes", {})}.items():
    for r in block["rows"]:
        if "vs_cublas" in r:
            print(f"   {key:>14} {r['kernel']:<6} {r['tflops']:7.2f} TFLOP/s = {100 * r['vs_cublas']:5.1f} % of cuBLAS")
EOF

# The roofs and the kernels of notebooks 02, 04 and 06 (hpclab/data/roofline.csv).
step roofline 120 "$PY" benchmarks/perf_record.py roofline "$OUT/roofline.csv"
[ -f "$OUT/roofline.csv" ] && "$PY" - "$OUT/roofline.csv" >> "$SUMMARY" <<'EOF'
import sys
from hpclab import roofline
for p in roofline.read(open(sys.argv[1]).read()):
    print(f"   {p.notebook or '--':>3} {p.kernel:<18} {p.rate / 1e12:8.3f} T{'FLOP' if p.flops else 'B'}/s "
          f"({p.count}){f', {p.intensity:.3g} FLOP/B' if p.flops and p.bytes else ''}")
EOF

# A DDP step and a halo-exchange layer on two ranks, with and without overlap (hpclab/data/timeline.csv).
if [ "$GPUS" -ge 2 ]; then
    step timeline 120 $LAUNCH -n 2 "$PY" benchmarks/perf_record.py timeline "$OUT/timeline.csv"
    [ -f "$OUT/timeline.csv" ] && "$PY" - "$OUT/timeline.csv" >> "$SUMMARY" <<'EOF'
import sys
from hpclab import timeline
for name, spans in timeline.read(open(sys.argv[1]).read()).items():
    print(f"   {name}: {len(spans)} spans, last ends at {max(s['end_ms'] for s in spans):.3f} ms")
EOF
else
    echo "== timeline: skipped, it needs two GPUs and this machine has $GPUS" | tee -a "$SUMMARY"
fi

if [ "${#FAILED[@]}" -gt 0 ]; then
    printf 'FAILED: %s\n' "${FAILED[@]}" | tee -a "$SUMMARY"
    exit 1
fi
echo "all perf checks passed ($SECONDS s)" | tee -a "$SUMMARY"
