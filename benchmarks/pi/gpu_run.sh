#!/usr/bin/env bash
# Pi kernels on real GPUs: correctness on the GPU, one-GPU benchmark, strong scaling of pi-mc.
# Run from the repository root with python3 usable and $OUT writable. Writes (flat, 3 files):
#   $OUT/bench_pi.json          hpclab bench pi --json on GPU 0
#   $OUT/pi-mc_strong.csv/.png  hpclab scaling pi-mc over 1, 2, 4 GPUs (3 trials, medians)
# The sample count of the sweep is chosen from the measured rate so that the sweep takes
# about a minute and a half (at most 1e13, the workshop's size).
set -u
: "${OUT:?set OUT to a writable directory}"
export OUT
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 HPCLAB_BACKEND=gpu
MPIRUN="mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND"
log() { echo "[$(date +%H:%M:%S)] $*"; }
T0=$(date +%s)

log "step 1: hpclab info"
timeout 60 python3 -m hpclab info || log "info failed ($?)"
NGPU=$(python3 -c "from hpclab import backend; print(backend.count_gpus())" 2>/dev/null || echo 1)
[ "$NGPU" -ge 1 ] 2>/dev/null || NGPU=1
RANKS=1; [ "$NGPU" -ge 2 ] && RANKS=1,2; [ "$NGPU" -ge 4 ] && RANKS=1,2,4
log "GPUs: $NGPU -> rank counts $RANKS"

log "step 2: kernel tests on the GPU (pytest tests/test_pi.py -k 'not mpi')"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m pytest -x -q -p no:cacheprovider tests/test_pi.py -k "not mpi" 2>&1 | tail -5 \
  || log "pytest failed"

log "step 3: pi-mc gives the same estimate on every rank count (1e10 samples, seed 7), pi-midpoint passes"
for n in ${RANKS//,/ }; do
  timeout 90 $MPIRUN -n "$n" python3 -m hpclab run pi-mc --samples 1e10 --seed 7 --json > "/tmp/pi_mc_$n.txt" 2>&1
  echo "  pi-mc -n $n rc=$? $(grep '^{' /tmp/pi_mc_$n.txt | python3 -c 'import sys,json; d=json.loads(sys.stdin.read()); print("pi", repr(d["result"]["pi"]), "hits", d["result"]["hits"], "passed", d["passed"], "wall_s %.4f" % d["timings"]["wall_s"])' 2>&1)"
done
timeout 90 $MPIRUN -n "$NGPU" python3 -m hpclab run pi-midpoint --bins 1e11 --json > /tmp/pi_mid.txt 2>&1
echo "  pi-midpoint -n $NGPU rc=$?"; grep -E "Absolute error|Error bound|Wall time|Bins/s|Check" /tmp/pi_mid.txt | sed 's/^/    /'

log "step 4: hpclab bench pi on GPU 0"
CUDA_VISIBLE_DEVICES=0 timeout 150 python3 -m hpclab bench pi --json > /tmp/bench_pi.txt 2>&1
log "bench rc=$?"; grep -v '^{' /tmp/bench_pi.txt | tail -20
grep '^{' /tmp/bench_pi.txt | tail -1 > "$OUT/bench_pi.json"

SAMPLES=$(python3 - <<'PY'
import json
try:
    rate = json.load(open(__import__("os").environ["OUT"] + "/bench_pi.json"))["mc_counter_samples_per_s"]
except Exception:
    rate = 5e11
t1 = 5.0                                   # seconds on one GPU; 3 trials x (1 + 1/2 + 1/4) x t1 ~ 26 s
n = min(1e13, max(1e11, rate * t1))
print(f"{float(f'{n:.1e}'):.0f}")
PY
)
log "step 5: strong scaling of pi-mc on $RANKS GPUs with $SAMPLES samples (3 trials each)"
timeout 240 python3 -m hpclab scaling pi-mc --ranks "$RANKS" --samples "$SAMPLES" --seed 123 --trials 3 \
  --mpiexec "$MPIRUN" --timeout 120 --out "$OUT" --no-progress || log "scaling failed or a check FAILED ($?)"

log "step 6: summary against the targets and the workshop's A100"
python3 - <<'PY' || log "summary failed"
import csv, json, os
from hpclab import reference
out = os.environ["OUT"]
try:
    b = json.load(open(f"{out}/bench_pi.json"))
    print(f"device {b['device']}: MC counter {b['mc_counter_samples_per_s']:.3e} samples/s (target 8e11: "
          f"{'MET' if b['mc_counter_samples_per_s'] >= 8e11 else 'NOT MET'}, {b.get('mc_counter_generator', '?')}), "
          f"Philox4x32-10 {b.get('mc_philox10_samples_per_s', float('nan')):.3e}, SplitMix64 {b.get('mc_splitmix_samples_per_s', float('nan')):.3e}, "
          f"xoroshiro {b['mc_xoroshiro_samples_per_s']:.3e}, "
          f"state init {b['xoroshiro_init_s']:.3f} s for {b['xoroshiro_states']} states")
    print(f"midpoint {b['midpoint_bins_per_s']:.3e} bins/s (target 1e12: {'MET' if b['midpoint_bins_per_s'] >= 1e12 else 'NOT MET'}), "
          f"one division per bin {b['midpoint_plain_bins_per_s']:.3e}")
except Exception as exc:
    print("no bench result:", exc)
try:
    rows = list(csv.DictReader(open(f"{out}/pi-mc_strong.csv")))
    a100 = {r["ranks"]: r for r in reference.a100_scaling("ex2_pi_mc")}
    seen = {}
    for r in rows:
        seen[int(r["ranks"])] = r
    for n, r in sorted(seen.items()):
        rate = float(r["work"]) / float(r["median_wall_s"])
        a = a100.get(n)
        cmp = f" | A100 {a['work'] / a['median_wall_s']:.3e}/s eff {a['efficiency']:.4f} -> {rate / (a['work'] / a['median_wall_s']):.2f}x" if a else ""
        print(f"{n} GPU: median {float(r['median_wall_s']):.3f} s, {rate:.3e} samples/s, speedup {float(r['speedup']):.3f}, "
              f"efficiency {float(r['efficiency']):.4f}{cmp}")
    last = seen[max(seen)]
    print(f"efficiency at {max(seen)} GPUs {float(last['efficiency']):.4f} (target 0.98: "
          f"{'MET' if float(last['efficiency']) >= 0.98 else 'NOT MET'}); Amdahl serial fraction {float(last['serial_fraction']):.5f}")
except Exception as exc:
    print("no scaling result:", exc)
PY
log "done in $(( $(date +%s) - T0 )) s; files: $(ls "$OUT" | tr '\n' ' ')"
