#!/usr/bin/env bash
# Every topic's GPU benchmark and GPU checks on one GPU node, from the repository root:
#
#   make bench                                            (OUT=build/bench, every topic)
#   OUT=/path bash benchmarks/gpu_suite.sh [TOPIC ...]    TOPIC: collectives matmul pi comm conv ddp (default all)
#
# Writes under $OUT: suite.log (everything printed), TOPIC/ (its result files, below; logs/ holds each step's
# output), runs.jsonl (which command wrote each result file, when, on which GPU) and curated/ (those results
# as rows of the curated tables: `python benchmarks/record.py $OUT` adds them to benchmarks/results/).
#   collectives/  collectives.txt                    the collectives program on every GPU; notebooks 00, 01 (nbval)
#   matmul/       matmul_bench.json                  kernels against cuBLAS (python3 -m benchmarks matmul)
#                 matmul_programs.jsonl              matmul-reduce (twice) and matmul on 2 ranks
#                 matmul_strong.json, .csv, .png     distributed GEMM over 1, 2, 4 GPUs (hpclab scaling)
#   pi/           bench_pi.json                      generators and midpoint kernels (python3 -m benchmarks pi)
#                 pi_programs.jsonl                  pi-mc on 1, 2, 4 GPUs (same estimate?) and pi-midpoint
#                 pi-mc_strong.json, .csv, .png      strong scaling of pi-mc (hpclab scaling)
#   comm/         allreduce.json                     every backend and raw NCCL, 4 B .. 1 GiB (python3 -m benchmarks allreduce)
#                 checks.jsonl                       every backend operation; Exercises 3, 4; collectives over NCCL
#   conv/         conv_throughput.json               C2 three ways against cuDNN FP32 / TF32
#                 conv_trunk.json                    AlexNet's trunk forward against cuDNN FP32
#                 conv_scaling.json, conv_runs.jsonl halo-exchange scaling on 1, 2, 4 GPUs; conv-halo C2 and trunk
#   ddp/          ddp_mlp_equivalence.json           ddp-mlp losses on 1 and 2 GPUs
#                 ddp_digits.json, ddp_scaling.json  digits on one GPU; throughput of a 3 x 4096 MLP on 1, 2, 4 GPUs
# Every step has a time limit; a failing step shows its output's tail and the others still run. The GPU
# tests of each topic run first (pytest -k "not mpi" with HPCLAB_BACKEND=gpu).
set -u
OUT=${OUT:-build/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
source benchmarks/offline_env.sh
export HPCLAB_BACKEND=${HPCLAB_BACKEND:-gpu} NCCL_NVLS_ENABLE=0
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "${NGPU:-0}" -ge 1 ] || { echo "gpu_suite.sh needs NVIDIA GPUs and nvidia-smi lists none here" >&2; exit 2; }
DEVICE=$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0)
RANKS=1; [ "$NGPU" -ge 2 ] && RANKS=1,2; [ "$NGPU" -ge 4 ] && RANKS=1,2,4
PAIR=$(( NGPU >= 2 ? 2 : 1 ))
TOPICS=("$@"); [ $# -gt 0 ] || TOPICS=(collectives matmul pi comm conv ddp)
FAILED=()
exec > >(tee -a "$OUT/suite.log") 2>&1

say() { echo "[$(date +%T)] $*"; }

step() {  # step NAME LIMIT CMD...: run in $DIR with a time limit, output in $DIR/logs/NAME.log
    local name=$1 limit=$2; shift 2
    local shown="$*"; shown=${shown//"$MPIRUN"/'$MPIRUN'}; shown=${shown//"$OUT"/'$OUT'}
    LAST_COMMAND=$shown
    say "$TOPIC/$name: $shown"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$DIR/logs/$name.log" 2>&1
    local rc=$?
    if [ "$rc" -ne 0 ]; then
        FAILED+=("$TOPIC/$name: $([ "$rc" -eq 124 ] && echo "timed out after $limit s" || echo "exit $rc")")
        echo "----- $TOPIC/$name failed (exit $rc); the last 30 lines of its output:"; tail -n 30 "$DIR/logs/$name.log"
        echo "-----"
    fi
    say "$TOPIC/$name: exit $rc after $((SECONDS - t0)) s"
    return "$rc"
}

last_json() {  # last_json NAME: the last JSON line a step printed
    grep '^{' "$DIR/logs/$1.log" | tail -n 1
}

check_json() {  # check_json NAME [all]: the step's last (or every) JSON line, tagged with the step -> checks.jsonl
    python3 - "$DIR/logs/$1.log" "$1" "${2:-last}" >> "$DIR/checks.jsonl" <<'PY'
import json, sys
log, step, which = sys.argv[1:]
lines = [json.loads(line) for line in open(log) if line.startswith("{")]
for d in lines if which == "all" else lines[-1:]:
    d["step"] = step
    print(json.dumps(d))
    if "results" in d and isinstance(d["results"], dict):
        bad = [k for k, ok in d["results"].items() if not ok]
        print(f"{step} {d.get('requested')} -> {d.get('backend')}: {len(d['results']) - len(bad)}/{len(d['results'])} ok",
              bad or "", file=sys.stderr)
    else:
        print(f"{step}: passed = {d.get('passed')}", file=sys.stderr)
PY
}

note() {  # note FILE [COMMAND]: FILE (in $DIR) was written by COMMAND (default: the last step's) -> runs.jsonl
    [ -s "$DIR/$1" ] || return 0
    python3 - "$TOPIC/$1" "${2:-$LAST_COMMAND}" "$DEVICE" >> "$OUT/runs.jsonl" <<'PY'
import datetime, json, sys
print(json.dumps({"file": sys.argv[1], "command": sys.argv[2], "device": sys.argv[3],
                  "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}))
PY
}

gpu_tests() {  # gpu_tests FILE...: the topic's tests that need no mpiexec, on the GPU
    step pytest 240 python3 -m pytest -x -q -p no:cacheprovider "$@" -k "not mpi" && tail -n 1 "$DIR/logs/pytest.log"
}

topic_collectives() {
    step info 60 python3 -m hpclab info && cat "$DIR/logs/info.log"
    step collectives 90 $MPIRUN -n "$NGPU" python3 -m hpclab run collectives --json
    cp "$DIR/logs/collectives.log" "$DIR/collectives.txt"
    grep -E "Ring bytes/rank|Ring vs MPI|Check" "$DIR/collectives.txt"
    HPCLAB_ENGINES=$NGPU step notebooks 400 python3 -m pytest -q -p no:cacheprovider --nbval-lax \
        --nbval-cell-timeout=300 notebooks/00_setup.ipynb notebooks/01_collectives.ipynb
    tail -n 1 "$DIR/logs/notebooks.log"
}

topic_matmul() {
    gpu_tests tests/test_matmul.py
    # naive (4096 only), tiled, the fast kernel's candidate tile shapes and cuBLAS, in one process
    step bench 170 python3 -m benchmarks matmul --sizes 4096,8192 --out "$DIR/matmul_bench.json"
    note matmul_bench.json "python3 -m benchmarks matmul --sizes 4096,8192"
    grep -E "^(device|N =|cublas|naive|tiled|best)" "$DIR/logs/bench.log"
    # the tutorial's sum (N = 256, 2 ranks), a training loop, and the distributed GEMM at N = 4096
    step matmul-reduce 90 $MPIRUN -n 2 python3 -m hpclab run matmul-reduce --json
    last_json matmul-reduce >> "$DIR/matmul_programs.jsonl"
    step matmul-reduce-loop 90 $MPIRUN -n 2 python3 -m hpclab run matmul-reduce --n 2048 --init random \
        --iterations 5 --kernel fast --json
    last_json matmul-reduce-loop >> "$DIR/matmul_programs.jsonl"
    step matmul 120 $MPIRUN -n 2 python3 -m hpclab run matmul --n 4096 --kernel fast --repeats 3 --json
    last_json matmul >> "$DIR/matmul_programs.jsonl"
    grep -hE "Aggregated global sum|Expected|Max error|Check" "$DIR"/logs/matmul*.log | sed 's/^/    /'
    # strong scaling of the distributed GEMM: rows of A scattered, B broadcast, C gathered (all in the wall time)
    step scaling 300 python3 -m hpclab scaling matmul --ranks "$RANKS" --work-arg=--n --n "${GEMM_N:-16384}" \
        --kernel fast --trials 3 --mpiexec "$MPIRUN" --timeout 240 --out "$DIR" --no-progress
    note matmul_strong.json
    sed -n '/^ranks/,/serial fraction/p' "$DIR/logs/scaling.log"
}

topic_pi() {
    CUDA_VISIBLE_DEVICES=0 gpu_tests tests/test_pi.py
    # pi-mc must give the same estimate on every rank count; pi-midpoint must pass its error bound
    for n in ${RANKS//,/ }; do
        step "pi-mc-$n" 90 $MPIRUN -n "$n" python3 -m hpclab run pi-mc --samples 1e10 --seed 7 --json
        last_json "pi-mc-$n" >> "$DIR/pi_programs.jsonl"
    done
    step pi-midpoint 90 $MPIRUN -n "$NGPU" python3 -m hpclab run pi-midpoint --bins 1e11 --json
    last_json pi-midpoint >> "$DIR/pi_programs.jsonl"
    python3 - "$DIR/pi_programs.jsonl" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
mc = [r for r in runs if r["exercise"] == "pi-mc"]
print("pi-mc on " + ", ".join(f"{r['ranks']} rank(s): pi {r['result']['pi']!r}, hits {r['result']['hits']}" for r in mc))
print("pi-mc gives the same hits on every rank count:", len({r["result"]["hits"] for r in mc}) == 1)
print("passed:", {f"{r['exercise']} -n {r['ranks']}": r["passed"] for r in runs})
PY
    CUDA_VISIBLE_DEVICES=0 step bench 150 python3 -m benchmarks pi --json
    last_json bench > "$DIR/bench_pi.json"
    note bench_pi.json "CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks pi --json"
    grep -v '^{' "$DIR/logs/bench.log" | tail -n 20
    # samples for about 5 s on one GPU (3 trials x (1 + 1/2 + 1/4) x 5 s), at most the workshop's 1e13
    local samples
    samples=$(python3 -c "import json; r = json.load(open('$DIR/bench_pi.json'))['mc_counter_samples_per_s']; \
print(f\"{float(f'{min(1e13, max(1e11, 5 * r)):.1e}'):.0f}\")" 2>/dev/null || echo 2500000000000)
    step scaling 240 python3 -m hpclab scaling pi-mc --ranks "$RANKS" --samples "$samples" --seed 123 --trials 3 \
        --mpiexec "$MPIRUN" --timeout 120 --out "$DIR" --no-progress
    note pi-mc_strong.json
    sed -n '/^ranks/,/serial fraction/p' "$DIR/logs/scaling.log"
}

topic_comm() {
    step info 60 $MPIRUN -n 1 python3 -m hpclab info
    # every operation of every backend against NumPy (mpi-cuda only where MPI is CUDA-aware)
    step ops 120 $MPIRUN -n "$NGPU" python3 tests/mpi_scripts/comm_ops.py mpi-host,nccl,auto
    check_json ops all
    # every backend that runs here and raw NCCL (cupy.cuda.nccl), interleaved size by size
    step bench 240 $MPIRUN -n "$NGPU" python3 -m benchmarks allreduce --backend all \
        --sizes 4,64,1K,4K,16K,64K,256K,1M,4M,16M,64M,256M,1G --json
    last_json bench > "$DIR/allreduce.json"
    note allreduce.json
    grep -v '^{' "$DIR/logs/bench.log" | tail -n 50
    # Exercise 3 (one process drives every GPU), Exercise 4 (one rank per GPU), Exercise 0 over NCCL
    step exercise3 90 $MPIRUN -n 1 python3 -m hpclab run pi-nccl-node --json; check_json exercise3
    step exercise4 90 $MPIRUN -n "$NGPU" python3 -m hpclab run pi-nccl-mpi --json; check_json exercise4
    step collectives 90 $MPIRUN -n "$NGPU" python3 -m hpclab run collectives --backend nccl --json
    check_json collectives
}

topic_conv() {
    # NumPy's BLAS threads: a few per rank, so 4 ranks do not oversubscribe the CPUs
    export OMP_NUM_THREADS=4 OPENBLAS_NUM_THREADS=4
    local mpirun="$MPIRUN -x OMP_NUM_THREADS -x OPENBLAS_NUM_THREADS"
    gpu_tests tests/test_conv.py
    # C2 (96->256, 5x5 pad 2, 27x27) batch 32: direct, im2col + GEMM, Winograd; cuDNN FP32 (TF32 off) and TF32
    step throughput 150 python3 -m benchmarks conv throughput --batch 32
    last_json throughput > "$DIR/conv_throughput.json"
    note conv_throughput.json
    grep -v '^{' "$DIR/logs/throughput.log" | grep -v '^hpclab backend' | tail -n 12
    # AlexNet's whole trunk forward at batch 32, Winograd where a layer allows it, against PyTorch (cuDNN FP32)
    step trunk_vs_cudnn 90 python3 -m benchmarks conv trunk --batch 32 --method winograd
    last_json trunk_vs_cudnn > "$DIR/conv_trunk.json"
    note conv_trunk.json
    grep -v '^{' "$DIR/logs/trunk_vs_cudnn.log" | tail -n 5
    # one 96->256 5x5 layer 256 wide: 32768 rows (strong), 8192 rows per GPU (weak), host-staged and NCCL halos
    local n
    for n in ${RANKS//,/ }; do
        step "scaling$n" 120 $mpirun -n "$n" python3 -m benchmarks conv scaling && \
            grep '^{' "$DIR/logs/scaling$n.log" >> "$DIR/conv_runs.jsonl"
    done
    step summarize 60 python3 -m benchmarks conv summarize "$DIR/conv_runs.jsonl" --csv "$DIR/conv_scaling.csv" && \
        grep -v '^{' "$DIR/logs/summarize.log"
    last_json summarize > "$DIR/conv_scaling.json"
    note conv_scaling.json "\$MPIRUN -n N python3 -m benchmarks conv scaling   (N = $RANKS; then python3 -m benchmarks conv summarize --csv)"
    # the conv-halo program, every version checked against V1: AlexNet C2 (batch 8) and the whole trunk (batch 2)
    step c2 100 $mpirun -n "$PAIR" python3 -m hpclab run conv-halo --layer c2 --batch 8 --repeats 1 --progress --json
    last_json c2 >> "$DIR/conv_runs.jsonl"
    step trunk 100 $mpirun -n $(( NGPU >= 4 ? 4 : PAIR )) python3 -m hpclab run conv-halo --layer trunk --batch 2 --repeats 1 --progress --json
    last_json trunk >> "$DIR/conv_runs.jsonl"
    grep -hv '^{' "$DIR/logs/c2.log" "$DIR/logs/trunk.log" | grep -v '^\[conv-halo' | tail -n 32
    unset OMP_NUM_THREADS OPENBLAS_NUM_THREADS
}

topic_ddp() {
    gpu_tests tests/test_mlp.py tests/test_ddp.py
    # Exercise 5: ddp-mlp on 1 and 2 GPUs at global batch 32 gives the same losses (to 1e-4)?
    if [ "$NGPU" -ge 2 ]; then
        step mlp1 120 $MPIRUN -n 1 python3 -m hpclab run ddp-mlp --global-batch 32 --json
        step mlp2 120 $MPIRUN -n 2 python3 -m hpclab run ddp-mlp --global-batch 32 --json
        python3 - "$DIR" "$DEVICE" <<'PY' && note ddp_mlp_equivalence.json "\$MPIRUN -n N python3 -m hpclab run ddp-mlp --global-batch 32 --json   (N = 1, 2; losses compared step by step)"
import json, sys
import numpy as np
out = sys.argv[1]
runs = {n: json.loads([l for l in open(f"{out}/logs/mlp{n}.log") if l.startswith("{")][-1]) for n in (1, 2)}
l1, l2 = (np.array(runs[n]["result"]["losses"]) for n in (1, 2))
rel = float(np.max(np.abs(l1 - l2) / np.abs(l1)))
from hpclab.results.recorded import figure
summary = {"max_rel_diff": rel, "equal_to_1e-4": rel <= 1e-4, "topic": "ddp", "device_name": sys.argv[2],
           "figures": [figure("ddp-mlp", "1-vs-2-gpus", 2, "", "", "max_rel_diff", rel, "1")],
           "replicas_identical": [runs[n]["result"]["replicas_identical"] for n in (1, 2)],
           "epoch_losses": {n: runs[n]["result"]["epoch_losses"] for n in (1, 2)},
           "timings": {n: runs[n]["timings"] for n in (1, 2)}, "comm": runs[2]["result"]["comm"]}
json.dump(summary, open(f"{out}/ddp_mlp_equivalence.json", "w"), indent=1)
print(f"ddp-mlp: {len(l1)} steps, max relative difference 1 vs 2 GPUs = {rel:.2e} "
      f"({'OK' if rel <= 1e-4 else 'TOO LARGE'}), replicas identical = {summary['replicas_identical']}")
sys.exit(0 if rel <= 1e-4 else 1)
PY
    else
        step mlp1 120 python3 -m hpclab run ddp-mlp --global-batch 32
    fi
    # Exercise 6: digits on one GPU, fp32 and mixed precision (test accuracy >= 95 %); then batch x lr on one GPU
    step digits 240 python3 -m benchmarks ddp --mode digits --json-out "$DIR/ddp_digits.json"
    note ddp_digits.json
    grep -v '^Epoch' "$DIR/logs/digits.log" | tail -n 8
    step sweep 180 python3 -m benchmarks ddp --mode sweep && grep -v '"bench"' "$DIR/logs/sweep.log" | tail -n 8
    # throughput of a 3 x 4096 MLP: strong (global batch 2048) and weak (1024 per GPU)
    local n
    for n in ${RANKS//,/ }; do
        step "scaling$n" 150 $MPIRUN -n "$n" python3 -m benchmarks ddp --mode scaling --csv "$DIR/ddp_scaling.csv"
    done
    if [ -f "$DIR/ddp_scaling.csv" ]; then
        python3 -m benchmarks ddp --summarize "$DIR/ddp_scaling.csv" | tee "$DIR/logs/summarize.log" | grep -v '^{'
        last_json summarize > "$DIR/ddp_scaling.json"
        note ddp_scaling.json "\$MPIRUN -n N python3 -m benchmarks ddp --mode scaling --csv ddp_scaling.csv   (N = $RANKS)"
    fi
}

say "hpclab GPU suite on $(hostname): $NGPU x $DEVICE; topics: ${TOPICS[*]}"
nvidia-smi -L; nvidia-smi topo -m 2>/dev/null | head -n $((NGPU + 1))
for TOPIC in "${TOPICS[@]}"; do
    declare -F "topic_$TOPIC" > /dev/null || { echo "unknown topic $TOPIC (collectives matmul pi comm conv ddp)"; exit 2; }
done
for TOPIC in "${TOPICS[@]}"; do
    DIR=$OUT/$TOPIC
    rm -rf "$DIR"; mkdir -p "$DIR/logs"          # a topic run again replaces its files and its notes
    if [ -f "$OUT/runs.jsonl" ]; then
        grep -v "\"file\": \"$TOPIC/" "$OUT/runs.jsonl" > "$OUT/runs.jsonl.tmp"; mv "$OUT/runs.jsonl.tmp" "$OUT/runs.jsonl"
    fi
    say "##### $TOPIC"
    "topic_$TOPIC"
    say "##### $TOPIC done"
done
# the results as curated rows, for review: `python benchmarks/record.py $OUT` adds them to benchmarks/results/
rm -rf "$OUT/curated"
[ -s "$OUT/runs.jsonl" ] && python3 benchmarks/record.py "$OUT" --into "$OUT/curated"
if [ ${#FAILED[@]} -eq 0 ]; then say "all steps passed"; else say "FAILED:"; printf '  %s\n' "${FAILED[@]}"; fi
[ ${#FAILED[@]} -eq 0 ]
