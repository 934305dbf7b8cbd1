#!/usr/bin/env bash
# Why is a rank slower on 4 GPUs than alone? The same work per GPU (8192 x 256
# rows of the scaling layer), measured several ways on one node:
#   a. one rank alone on each GPU in turn            (GPU-to-GPU spread)
#   b. one independent process per GPU, all at once  (no MPI between them)
#   c. mpirun -n N, Open MPI's default binding       (what the scaling bench does)
#   d. mpirun -n N --bind-to none
#   e. mpirun -n N, each rank seeing only its own GPU (CUDA_VISIBLE_DEVICES from
#      Open MPI's local rank); and the GPU contexts each process holds in c
# SM clocks and power are sampled by nvidia-smi during b and c.
# Run from the repository root after `source benchmarks/offline_env.sh`; $OUT writable.
#   PARTS=ce OUT=/tmp/d bash benchmarks/conv/diagnose_scaling.sh
set -u
OUT=${OUT:?set OUT}
PARTS=${PARTS:-abcde}
export HPCLAB_BACKEND=gpu OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4
NG=$(nvidia-smi -L | wc -l)
ARGS="--height 8192 --rows-per-rank 8192 --repeats 5"
MPI="$MPIRUN -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS -n $NG"
WALL=$(mktemp)
cat > "$WALL" <<'PY'
import json, sys
for line in sys.stdin:
    if line.startswith("{"):
        print(" ".join(f"{r['mode']}/{r['version']}={r['wall_s']:.4f}" for r in json.loads(line)["runs"]))
PY
wall() { python3 "$WALL"; }
sample() { nvidia-smi --query-gpu=index,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 > "$OUT/smi_$1.csv" & }
bench() { python3 -m hpclab bench conv scaling $ARGS; }

if [[ $PARTS == *a* ]]; then
  echo "a. alone, GPU by GPU"
  for g in $(seq 0 $((NG-1))); do
    echo -n "  GPU $g: "; CUDA_VISIBLE_DEVICES=$g bench 2>/dev/null | wall
  done
fi
if [[ $PARTS == *b* ]]; then
  echo "b. $NG independent processes at once"
  sample b; SMI=$!
  pids=()
  for g in $(seq 0 $((NG-1))); do
    (CUDA_VISIBLE_DEVICES=$g bench 2>/dev/null | wall | sed "s/^/  GPU $g: /") &
    pids+=($!)
  done
  wait "${pids[@]}"; kill $SMI
fi
if [[ $PARTS == *c* ]]; then
  echo "c. mpirun -n $NG (default binding)"
  sample c; SMI=$!
  ( sleep 12; nvidia-smi --query-compute-apps=pid,gpu_bus_id,used_memory --format=csv,noheader > "$OUT/apps_c.csv" ) &
  $MPI --report-bindings python3 -m hpclab bench conv scaling $ARGS 2>"$OUT/bind_c.txt" | wall
  kill $SMI
  grep -o 'MCW rank [0-9]* bound to socket [0-9]*' "$OUT/bind_c.txt" | head -8
  echo "  GPU contexts while it ran (pid, GPU bus, memory):"; sed 's/^/    /' "$OUT/apps_c.csv"
fi
if [[ $PARTS == *d* ]]; then
  echo "d. mpirun -n $NG --bind-to none"
  $MPI --bind-to none python3 -m hpclab bench conv scaling $ARGS 2>/dev/null | wall
fi
if [[ $PARTS == *e* ]]; then
  echo "e. mpirun -n $NG, one visible GPU per rank"
  $MPI bash -c 'CUDA_VISIBLE_DEVICES=$OMPI_COMM_WORLD_LOCAL_RANK exec python3 -m hpclab bench conv scaling '"$ARGS" \
    2>/dev/null | wall
fi
for f in b c; do
  [ -f "$OUT/smi_$f.csv" ] || continue
  echo "clocks during $f (SM MHz min/median/max, power W max, per GPU):"
  python3 - "$OUT/smi_$f.csv" <<'PY'
import collections, statistics, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p = [x.strip().split()[0] for x in line.split(",")]
    try:
        d[int(p[0])].append((float(p[1]), float(p[2]), float(p[3])))
    except (ValueError, IndexError):
        pass
for g, v in sorted(d.items()):
    busy = [x for x in v if x[1] > 200] or v
    c = [x[0] for x in busy]
    print(f"  GPU {g}: SM {min(c):.0f}/{statistics.median(c):.0f}/{max(c):.0f} MHz, power max "
          f"{max(x[1] for x in v):.0f} W, temp max {max(x[2] for x in v):.0f} C, {len(busy)} busy samples")
PY
done
rm -f "$WALL"
