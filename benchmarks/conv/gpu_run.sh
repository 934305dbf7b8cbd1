#!/usr/bin/env bash
# Convolution with halo exchange on real GPUs: correctness, C2 throughput
# against cuDNN, strong and weak scaling of one large layer.
# Run from the repository root with python3 usable and $OUT writable.
# Writes (flat, 3 files): $OUT/conv_throughput.json, $OUT/conv_scaling.csv,
# $OUT/conv_runs.jsonl (program checks and raw scaling lines).
set -u
OUT=${OUT:?set OUT to a writable directory}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HPCLAB_BACKEND=gpu NCCL_NVLS_ENABLE=0
NG=$(nvidia-smi -L 2>/dev/null | wc -l)
MPIRUN="mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND"
RUNS="$OUT/conv_runs.jsonl"
: > "$RUNS"
log() { echo "[conv $(date +%H:%M:%S)] $*"; }
status=0

log "GPUs: $NG"
nvidia-smi -L 2>&1 | head -8

log "1/5 throughput: C2 (96->256, 5x5 pad 2, 27x27) batch 32, ours vs PyTorch conv2d (cuDNN)"
timeout 150 python3 -m hpclab bench conv throughput --batch 32 > "$OUT/conv_throughput.json" \
  || { log "throughput FAILED (rc $?)"; status=1; }
tail -c 1500 "$OUT/conv_throughput.json"; echo

log "2/5 scaling: 32768 x 128 rows, 96->256 5x5 (strong) and 8192 rows per GPU (weak)"
for n in 1 2 4; do
  if [ "$n" -le "$NG" ]; then
    log "  $n GPU(s)"
    timeout 150 $MPIRUN -n "$n" python3 -m hpclab bench conv scaling >> "$RUNS" \
      || { log "  scaling on $n GPU(s) FAILED (rc $?)"; status=1; }
  fi
done
timeout 60 python3 -m hpclab bench conv summarize "$RUNS" --csv "$OUT/conv_scaling.csv" \
  || { log "summarize FAILED"; status=1; }

log "3/5 GPU correctness: pytest tests/test_conv.py -k 'not mpi' on the GPU"
timeout 240 python3 -m pytest -x -q -p no:cacheprovider tests/test_conv.py -k "not mpi" 2>&1 | tail -5
[ "${PIPESTATUS[0]}" -eq 0 ] || { log "pytest FAILED"; status=1; }

NP=$(( NG >= 2 ? 2 : 1 ))
log "4/5 conv-halo program, AlexNet C2 full size, batch 8, V1..V5 on $NP rank(s)"
timeout 150 $MPIRUN -n "$NP" python3 -m hpclab run conv-halo --layer c2 --batch 8 --repeats 1 --json \
  > "$OUT/c2.txt" 2>&1 || { log "conv-halo c2 FAILED"; status=1; }
grep -v '^{' "$OUT/c2.txt" | tail -14; grep '^{' "$OUT/c2.txt" | tail -1 >> "$RUNS"; rm -f "$OUT/c2.txt"

NT=$(( NG >= 4 ? 4 : NP ))
log "5/5 conv-halo program, whole AlexNet trunk C1-C5 + FC6-FC8, batch 2, V1..V5 on $NT rank(s)"
timeout 150 $MPIRUN -n "$NT" python3 -m hpclab run conv-halo --layer trunk --batch 2 --repeats 1 --json \
  > "$OUT/trunk.txt" 2>&1 || { log "conv-halo trunk FAILED"; status=1; }
grep -v '^{' "$OUT/trunk.txt" | tail -14; grep '^{' "$OUT/trunk.txt" | tail -1 >> "$RUNS"; rm -f "$OUT/trunk.txt"

log "summary"
python3 - "$OUT" <<'PY' || true
import json, sys, csv, os
out = sys.argv[1]
try:
    t = json.load(open(os.path.join(out, "conv_throughput.json")))
    best = t.get("best_config")
    print(f"throughput: ours {t['ours'][best]['tflops']:.2f} TFLOP/s ({best}), cuDNN FP32 "
          f"{t['cudnn_fp32']['tflops']:.2f}, TF32 {t['cudnn_tf32']['tflops']:.2f}; ratio vs FP32 "
          f"{t['ratio_vs_cudnn_fp32']:.3f} (target 0.25: {'met' if t['target_met'] else 'NOT met'})")
except Exception as exc:
    print("throughput: no result", exc)
try:
    for r in csv.DictReader(open(os.path.join(out, "conv_scaling.csv"))):
        if r["ranks"] != "1":
            print(f"{r['mode']} {r['version']} {r['comm']} {r['ranks']} GPUs: efficiency {float(r['efficiency']):.3f}")
except Exception as exc:
    print("scaling: no result", exc)
for line in open(os.path.join(out, "conv_runs.jsonl")):
    d = json.loads(line)
    if d.get("exercise") == "conv-halo":
        v = d["result"]["versions"]
        print(f"conv-halo {d['result']['layer']} on {d['ranks']} ranks: passed {d['passed']}; " +
              ", ".join(f"{k} {x['wall_s']:.4f}s err {x['max_rel_error']:.1e}" for k, x in v.items()))
PY
log "done (status $status)"
exit $status
