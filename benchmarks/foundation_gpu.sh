#!/usr/bin/env bash
# Foundation checks on a GPU node: hpclab info, the collectives program with one
# rank per GPU, and notebooks 00 and 01 on MPI engines. Writes into ${OUT:-build/gpu}.
set -u
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
source benchmarks/offline_env.sh
export HPCLAB_BACKEND=gpu
n=${HPCLAB_GPUS:-2}
echo "== nvidia-smi"; nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -8
echo "== hpclab info"; python3 -m hpclab info
echo "== $MPIRUN -n $n python3 -m hpclab run collectives --json"
$MPIRUN -n "$n" python3 -m hpclab run collectives --json | tee "$OUT/collectives.txt"
echo "== notebooks 00, 01 on $n MPI engines (nbval)"
HPCLAB_ENGINES=$n timeout 400 python3 -m pytest -q -p no:cacheprovider --nbval-lax --nbval-cell-timeout=300 \
    notebooks/00_setup.ipynb notebooks/01_collectives.ipynb 2>&1 | tail -15
