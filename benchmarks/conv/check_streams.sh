#!/usr/bin/env bash
# The halo executor's streams on a multi-GPU node, quickly: the backends' sendrecv on a
# stream, the compute and phase probes, the scaling layer on 1..N GPUs, the GPU tests
# of tests/test_conv.py, and the conv-halo program (C2, trunk) on N ranks.
# From the repository root after `source benchmarks/offline_env.sh`; $OUT writable.
set -u
OUT=${OUT:?set OUT}
export HPCLAB_BACKEND=gpu OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4
NG=$(nvidia-smi -L | wc -l)
MPI="$MPIRUN -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
quiet() { grep -v -i "warning\|^hpclab backend" ; }
echo "== comm ops (sendrecv with and without a stream) on $NG ranks"
timeout 120 $MPI -n "$NG" python3 tests/mpi_scripts/comm_ops.py mpi-host,nccl 2>&1 | tail -3
echo "== compute probe"; timeout 120 $MPI -n "$NG" python3 benchmarks/conv/compute_probe.py 8192 2>&1 | quiet | tail -12
echo "== phase probe"; timeout 120 $MPI -n "$NG" python3 benchmarks/conv/phase_probe.py 8192 2>&1 | quiet | tail -14
: > "$OUT/conv_runs.jsonl"
for n in $(seq 1 "$NG") "$NG"; do    # N GPUs twice: how much do two runs differ?
  echo "== scaling on $n GPU(s)"
  timeout 150 $MPI -n "$n" python3 -m hpclab bench conv scaling 2>&1 | grep '^{' >> "$OUT/conv_runs.jsonl"
done
python3 -m hpclab bench conv summarize "$OUT/conv_runs.jsonl" --csv "$OUT/conv_scaling.csv"
echo "== GPU tests"; timeout 200 python3 -m pytest -x -q -p no:cacheprovider tests/test_conv.py -k "not mpi" 2>&1 | tail -2
for layer in c2 trunk; do
  echo "== conv-halo $layer on $NG ranks"
  timeout 120 $MPI -n "$NG" python3 -m hpclab run conv-halo --layer $layer --batch 2 --repeats 1 --json 2>&1 \
    | grep '^{' | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); print('passed', d['passed'], {k: (round(v['wall_s'], 4), v['max_rel_error']) for k, v in d['result']['versions'].items()})"
done
