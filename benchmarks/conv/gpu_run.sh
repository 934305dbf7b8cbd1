#!/usr/bin/env bash
# Convolution with halo exchange on real GPUs: C2 throughput (direct kernel,
# im2col + GEMM, Winograd) against cuDNN FP32 and TF32, strong and weak scaling of one
# large layer, GPU correctness tests, and the conv-halo program (C2, trunk).
# Run from the repository root with python3 usable and $OUT writable.
# Writes (flat, 3 files): $OUT/conv_throughput.json, $OUT/conv_scaling.csv,
# $OUT/conv_runs.jsonl (raw scaling lines and the programs' JSON lines).
set -u
OUT=${OUT:?set OUT to a writable directory}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HPCLAB_BACKEND=gpu NCCL_NVLS_ENABLE=0
# NumPy's BLAS threads: a few per rank, so 4 ranks do not oversubscribe the CPUs.
export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
MPIRUN="mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
RUNS="$OUT/conv_runs.jsonl"
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/conv_gpu_run.XXXXXX")
: > "$RUNS"
log() { echo "[conv $(date +%H:%M:%S)] $*"; }
status=0
# step NAME TIMEOUT CMD...: run, log to $LOGS/NAME.log; on failure say why and show the log's tail.
step() {
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    status=1
    [ "$rc" -eq 124 ] && log "$name FAILED: timed out after $limit s" || log "$name FAILED (rc $rc)"
    echo "----- last 30 lines of $name's output -----"; tail -n 30 "$LOGS/$name.log"; echo "-----"
  fi
  return "$rc"
}

log "GPUs: $NG"
nvidia-smi -L 2>&1 | head -8

log "1/6 throughput: C2 (96->256, 5x5 pad 2, 27x27) batch 32: direct, im2col+GEMM, Winograd vs cuDNN FP32 (TF32 off) and TF32"
step throughput 150 python3 -m hpclab bench conv throughput --batch 32
grep '^{' "$LOGS/throughput.log" | tail -1 > "$OUT/conv_throughput.json"
grep -v '^{' "$LOGS/throughput.log" | grep -v '^hpclab backend' | tail -12

log "2/6 scaling: 96->256 5x5, width 256, 32768 rows (strong) and 8192 rows per GPU (weak), im2col+GEMM"
for n in 1 2 4; do
  if [ "$n" -le "$NG" ]; then
    log "  $n GPU(s)"
    step "scaling$n" 120 $MPIRUN -n "$n" python3 -m hpclab bench conv scaling
    grep '^{' "$LOGS/scaling$n.log" >> "$RUNS"
  fi
done
step summarize 60 python3 -m hpclab bench conv summarize "$RUNS" --csv "$OUT/conv_scaling.csv"
cat "$LOGS/summarize.log"

log "3/6 GPU correctness: pytest tests/test_conv.py -k 'not mpi' on the GPU"
step pytest 150 python3 -m pytest -x -q -p no:cacheprovider tests/test_conv.py -k "not mpi"
tail -3 "$LOGS/pytest.log"

NP=$(( NG >= 2 ? 2 : 1 ))
log "4/6 conv-halo program, AlexNet C2 full size, batch 8, V1..V5 on $NP rank(s)"
step c2 100 $MPIRUN -n "$NP" python3 -m hpclab run conv-halo --layer c2 --batch 8 --repeats 1 --progress --json
grep -v '^{' "$LOGS/c2.log" | grep -v '^\[conv-halo' | tail -16; grep '^{' "$LOGS/c2.log" | tail -1 >> "$RUNS"

NT=$(( NG >= 4 ? 4 : NP ))
log "5/6 conv-halo program, whole AlexNet trunk C1-C5 + FC6-FC8, batch 2, V1..V5 on $NT rank(s)"
step trunk 100 $MPIRUN -n "$NT" python3 -m hpclab run conv-halo --layer trunk --batch 2 --repeats 1 --progress --json
grep '^\[conv-halo' "$LOGS/trunk.log" | tail -12
grep -v '^{' "$LOGS/trunk.log" | grep -v '^\[conv-halo' | tail -16; grep '^{' "$LOGS/trunk.log" | tail -1 >> "$RUNS"

log "6/6 summary"
python3 - "$OUT" <<'PY' || true
import csv, json, os, sys
out = sys.argv[1]
mark = lambda ok: "MET" if ok else "NOT MET"
try:
    t = json.load(open(os.path.join(out, "conv_throughput.json")))
    ours, best = t["ours"], t["best"]
    d, g, wg = ours.get(t.get("best_direct") or "", {}), ours.get("gemm", {}), ours.get("winograd", {})
    print(f"throughput C2 batch 32: direct ({t.get('best_direct')}) {d.get('tflops', 0):.2f} TFLOP/s, "
          f"im2col+GEMM {g.get('tflops', 0):.2f}, Winograd F(2x2,5x5) {wg.get('tflops', 0):.2f} "
          f"(error vs float64 {wg.get('max_rel_error_vs_float64', float('nan')):.1e}) TFLOP/s (best: {best})")
    for label, what in (("cudnn_fp32", "cuDNN FP32 (TF32 off)"), ("cudnn_tf32", "cuDNN TF32"),
                        ("torch_im2col_sgemm_fp32", "PyTorch unfold + cuBLAS SGEMM FP32")):
        if label in t:
            print(f"  {what}: {t[label]['tflops']:.2f} TFLOP/s, error vs float64 "
                  f"{t[label]['max_rel_error_vs_float64']:.1e}; ours/it = {t['ratio_vs_' + label]:.3f}")
    print(f"  target ours >= 0.25 x cuDNN true FP32 (throughput, calls back to back): ratio "
          f"{t['ratio_vs_cudnn_fp32']:.3f} -> {mark(t['target_met'])}; synchronised per call: "
          f"{t['latency_ratio_vs_cudnn_fp32']:.3f}")
    if "cudnn_fp32_note" in t:
        print("  note:", t["cudnn_fp32_note"])
except Exception as exc:
    print("throughput: no result", repr(exc))
try:
    for r in csv.DictReader(open(os.path.join(out, "conv_scaling.csv"))):
        if r["ranks"] != "1":
            target = 0.90 if r["mode"] == "strong" else 0.95
            eff = float(r["efficiency"])
            print(f"{r['mode']} {r['version']} {r['comm']} {r['ranks']} GPUs: {float(r['wall_s']):.4f} s, "
                  f"efficiency {eff:.3f} (target >= {target:.2f}: {mark(eff >= target)}); split pass "
                  f"compute {float(r['compute_s']):.4f} + halo {float(r['halo_s']):.4f} s")
except Exception as exc:
    print("scaling: no result", repr(exc))
for line in open(os.path.join(out, "conv_runs.jsonl")):
    d = json.loads(line)
    if d.get("exercise") == "conv-halo":
        v = d["result"]["versions"]
        print(f"conv-halo {d['result']['layer']} on {d['ranks']} ranks ({d['result'].get('method')}): "
              f"{'PASSED' if d['passed'] else 'FAILED'}; " +
              ", ".join(f"{k} {x['wall_s']:.4f}s err {x['max_rel_error']:.1e}" for k, x in v.items()))
PY
rm -rf "$LOGS"
log "done (status $status)"
exit $status
