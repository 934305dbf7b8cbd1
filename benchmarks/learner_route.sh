#!/usr/bin/env bash
# The learner's route on a GPU machine, from the repository root (source benchmarks/offline_env.sh first on a
# node without network). Everything below runs as on a cluster's login node: each notebook's kernel sees no GPU
# and launches nothing; the engines have the GPUs. Side by side, each with its own engines and logs in $OUT:
#   workbook  every notebook on all GPUs, one engine per GPU (hpclab workbook --login-node), executed into
#             build/gpu for docs/render.py --executed build/gpu
#   one-gpu   every notebook by nbval on GPU ${ONE_GPU:-0} alone, two engines sharing it
#   solutions every solution notebook by nbval, on the other GPUs
#   stubs-N   every exercise notebook unfilled (tests/test_exercise_stubs.py), in three parts
# then the benchmarks once each, at small sizes, to show they run and what they print.
set -u
OUT=${OUT:-build/learner-route}
mkdir -p "$OUT" build/gpu
NGPU=$(nvidia-smi -L | grep -c '^GPU')
ALL=$(seq -s, 0 $((NGPU - 1)))
REST=$(seq -s, 1 $((NGPU - 1))); REST=${REST:-0}
LIMIT=${LIMIT:-430}
export PYTHON_RUN=python3 HPCLAB_BACKEND=gpu
t0=$SECONDS
timeout "$LIMIT" python3 -m hpclab workbook --login-node --engines "$NGPU" --out build/gpu > "$OUT/workbook.log" 2>&1 &
CUDA_VISIBLE_DEVICES=${ONE_GPU:-0} HPCLAB_TEST_PATHS=notebooks timeout "$LIMIT" bash benchmarks/test_gpu.sh > "$OUT/one-gpu.log" 2>&1 &
CUDA_VISIBLE_DEVICES=$REST HPCLAB_TEST_PATHS=solutions timeout "$LIMIT" bash benchmarks/test_gpu.sh > "$OUT/solutions.log" 2>&1 &
for part in "01 or 02 or 03" "04 or 05 or 06" "07 or 08"; do
    CUDA_VISIBLE_DEVICES=$ALL HPCLAB_TEST_PATHS=tests/test_exercise_stubs.py timeout "$LIMIT" bash benchmarks/test_gpu.sh \
        -k "$part" > "$OUT/stubs-${part%% *}.log" 2>&1 &
done
wait
python3 - "$OUT" "$NGPU" <<'PY'
import datetime, json, subprocess, sys
name = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True,
                      text=True).stdout.strip()
json.dump({"device": f"{sys.argv[2]}x {name}, {sys.argv[2]} MPI engines, one per GPU (the notebook kernel without a GPU, "
                     "as on a login node)", "date": datetime.date.today().isoformat(),
           "command": f"python -m hpclab workbook --login-node --engines {sys.argv[2]} --out build/gpu"},
          open("build/gpu/run.json", "w"), indent=1)
PY
echo "tiers done after $((SECONDS - t0)) s"
{
    python3 -m benchmarks pi --seconds 0.2 --repeats 1 --no-shapes --json
    python3 -m benchmarks matmul --sizes 2048 --no-sweep --json
    $MPIRUN -n 2 python3 -m benchmarks allreduce --backend all --sizes 1K,1M --json
    python3 -m benchmarks conv throughput --batch 8
    $MPIRUN -n 2 python3 -m benchmarks ddp --mode scaling --steps 5 --csv "$OUT/ddp.csv"
} > "$OUT/benchmarks.log" 2>&1
echo "benchmarks exit $? after $((SECONDS - t0)) s"
for log in "$OUT"/*.log; do echo "== $log: $(grep -aE 'passed|failed|make test-gpu:|^[0-9]+_.*(pass|FAIL)' "$log" | tail -n 12)"; done
