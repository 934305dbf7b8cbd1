#!/usr/bin/env bash
# Data-parallel training on real GPUs (run from the repo root, $OUT writable, python3 usable).
#   1. MLP kernels checked against NumPy on the GPU (tests/test_mlp.py), sampler tests
#   2. Exercise 5: ddp-mlp on 1 and 2 GPUs at global batch 32 -> same losses to 1e-4?
#   3. Exercise 6: digits on one GPU, fp32 and mixed precision: test accuracy (target >= 95 %),
#      time to 95 % validation accuracy, GPU utilisation/memory, 14 x P estimate
#   3b. Batch size x learning rate sweep on digits, one GPU (3 x 3 grid, table on stdout)
#   4. Throughput scaling of a 3 x 4096 MLP (50.3 M parameters) on 1, 2, 4 GPUs,
#      strong (global batch 2048) and weak (1024 per GPU); efficiency target >= 0.85 at 4
# Writes $OUT/ddp_mlp_equivalence.json, $OUT/ddp_digits.json, $OUT/ddp_scaling.csv.
set -u -o pipefail
: "${OUT:?set OUT to a writable directory}"
export NCCL_NVLS_ENABLE=0 HPCLAB_BACKEND=gpu
PY=python3
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND)
log() { echo "[ddp $(date +%H:%M:%S)] $*"; }
status=0

log "GPUs visible: $NGPU"
log "step 1: kernel tests on the GPU"
timeout 240 $PY -m pytest -x -q -p no:cacheprovider tests/test_mlp.py tests/test_ddp.py -k "not mpi" 2>&1 | tail -5 \
  || { log "step 1 FAILED"; status=1; }

log "step 2: ddp-mlp, 1 vs 2 GPUs, global batch 32"
if [ "$NGPU" -ge 2 ]; then
  for n in 1 2; do
    timeout 120 "${MPIRUN[@]}" -n $n $PY -m hpclab run ddp-mlp --global-batch 32 --json \
      > "$OUT/.mlp_$n.txt" 2> "$OUT/.mlp_$n.err" || { log "ddp-mlp -n $n FAILED"; tail -5 "$OUT/.mlp_$n.err"; status=1; }
  done
  $PY - "$OUT" <<'PYEOF' || { log "step 2 comparison FAILED"; status=1; }
import json, sys, numpy as np
out = sys.argv[1]
runs = {n: json.loads(open(f"{out}/.mlp_{n}.txt").read().strip().splitlines()[-1]) for n in (1, 2)}
l1, l2 = (np.array(runs[n]["result"]["losses"]) for n in (1, 2))
rel = float(np.max(np.abs(l1 - l2) / np.abs(l1)))
summary = {"max_rel_diff": rel, "equal_to_1e-4": rel <= 1e-4,
           "replicas_identical": [runs[n]["result"]["replicas_identical"] for n in (1, 2)],
           "epoch_losses": {n: runs[n]["result"]["epoch_losses"] for n in (1, 2)},
           "timings": {n: runs[n]["timings"] for n in (1, 2)}, "comm": runs[2]["result"]["comm"]}
json.dump(summary, open(f"{out}/ddp_mlp_equivalence.json", "w"), indent=1)
print(f"ddp-mlp: {len(l1)} steps, max relative difference 1 vs 2 GPUs = {rel:.2e} "
      f"({'OK' if rel <= 1e-4 else 'TOO LARGE'}), replicas identical = {summary['replicas_identical']}")
PYEOF
  rm -f "$OUT"/.mlp_*
else
  log "only $NGPU GPU: ddp-mlp on 1 GPU only"
  timeout 120 $PY -m hpclab run ddp-mlp --global-batch 32 2>&1 | tail -12 || status=1
fi

log "step 3: digits on one GPU, fp32 and mixed precision"
timeout 240 $PY -m hpclab bench ddp --mode digits --json-out "$OUT/ddp_digits.json" 2>&1 \
  | grep -v '^Epoch' | tail -8 || { log "step 3 FAILED (or accuracy below 95 %)"; status=1; }

log "step 3b: digits, global batch x learning rate sweep on one GPU"
timeout 180 $PY -m hpclab bench ddp --mode sweep 2>&1 | grep -v '"bench"' | tail -8 \
  || { log "step 3b FAILED"; status=1; }

log "step 4: throughput scaling, 3 x 4096 MLP"
rm -f "$OUT/ddp_scaling.csv"
for n in 1 2 4; do
  [ "$n" -le "$NGPU" ] || { log "skip $n GPUs (only $NGPU)"; continue; }
  timeout 150 "${MPIRUN[@]}" -n $n $PY -m hpclab bench ddp --mode scaling --csv "$OUT/ddp_scaling.csv" 2>&1 \
    | grep '"bench"' | cut -c1-220 || { log "scaling on $n GPUs FAILED"; status=1; }
done
[ -f "$OUT/ddp_scaling.csv" ] && $PY -m hpclab bench ddp --summarize "$OUT/ddp_scaling.csv"
log "done (status $status)"
exit $status
