#!/usr/bin/env bash
# make test-gpu: the whole test suite on this machine's GPUs, from the repository root.
#
#   make test-gpu                                  (the project's .venv)
#   source benchmarks/offline_env.sh; make test-gpu PYTHON_RUN=python3   (GPU node, no network)
#   PYTHON_RUN=python3 bash benchmarks/test_gpu.sh [extra pytest arguments]
#   HPCLAB_GPU_SHARD=1/2 make test-gpu ...; HPCLAB_GPU_SHARD=2/2 make test-gpu ...
#                                                  (the suite in parts, for jobs with a short time limit)
#
# The same tests and notebooks as `make test`, with HPCLAB_BACKEND=gpu: kernels, MPI programs
# (through $HPCLAB_MPIEXEC, else $MPIRUN, else mpiexec) and every notebook on GPU engines,
# max(2, GPUs) of them (HPCLAB_ENGINES overrides): on one GPU two engines share it, which
# exercises the shared-GPU path; on a multi-GPU node each engine has its own and NCCL runs.
# Tests that mean something only on the simulator, only on a GPU, or only with one GPU per
# rank are skipped with the reason, and pytest's summary counts them (-rs).
set -u
PY=${PYTHON_RUN:-python3}
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ "${NGPU:-0}" -gt 0 ]; then   # nvidia-smi lists them all
    NGPU=$(tr ',' '\n' <<< "$CUDA_VISIBLE_DEVICES" | grep -c .)
fi
if [ "${NGPU:-0}" -lt 1 ]; then
    echo "make test-gpu needs NVIDIA GPUs and nvidia-smi lists none here; 'make test' runs the" \
         "same suite on Numba's CUDA simulator." >&2
    exit 2
fi
# HPCLAB_GPU_SHARD=i/n runs part i of n: the notebooks in part 1, the test files dealt out in turn from part 2.
SHARD=${HPCLAB_GPU_SHARD:-1/1}
PART=${SHARD%/*} PARTS=${SHARD#*/}
if ! [[ "$PART" =~ ^[0-9]+$ && "$PARTS" =~ ^[0-9]+$ ]] || [ "$PART" -lt 1 ] || [ "$PART" -gt "$PARTS" ]; then
    echo "HPCLAB_GPU_SHARD must be i/n with 1 <= i <= n (e.g. 1/2, then 2/2); got '$SHARD'" >&2
    exit 2
fi
export HPCLAB_BACKEND=gpu NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
export HPCLAB_ENGINES=${HPCLAB_ENGINES:-$(( NGPU > 2 ? NGPU : 2 ))}
# Open MPI (the GPU machines' MPI) as root, and more ranks than cores; harmless for MPICH.
if [ "$(id -u)" = 0 ]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1
# The notebook engines and the tests' mpiexec jobs run side by side: do not bind both to the first cores.
export OMPI_MCA_hwloc_base_binding_policy=${OMPI_MCA_hwloc_base_binding_policy:-none}
# The Slurm tier sets up a local Slurm from Debian's packages: a CPU-side test (make test runs it), and GPU
# nodes have no network to install them. HPCLAB_SLURM_TIER=1 runs it here too.
export HPCLAB_SLURM_TIER=${HPCLAB_SLURM_TIER:-0}
# `hpclab scaling` (run by some tests) launches through HPCLAB_MPIEXEC: the same launcher as the tests.
[ -n "${MPIRUN:-}" ] && export HPCLAB_MPIEXEC=${HPCLAB_MPIEXEC:-$MPIRUN}
echo "make test-gpu: $NGPU GPU(s), $HPCLAB_ENGINES notebook engines, python: $("$PY" -c 'import sys; print(sys.executable)')," \
     "launcher: ${HPCLAB_MPIEXEC:-${MPIRUN:-mpiexec}}"
"$PY" -m hpclab info || exit 1
"$PY" -m hpclab exercises check || exit 1
COMMON=(-q -rs --durations=10 --nbval-lax --nbval-cell-timeout=600 -p no:cacheprovider)
if [ -n "${HPCLAB_TEST_PATHS:-}" ]; then
    # shellcheck disable=SC2086 - HPCLAB_TEST_PATHS is a list of paths
    exec "$PY" -m pytest "${COMMON[@]}" --durations=20 $HPCLAB_TEST_PATHS "$@"
fi

# On a GPU most of the time goes to compiling kernels, once per process: one pytest process
# runs the notebooks (on their engines) while the test files run two at a time beside it,
# the slowest first. Each process has its own profile directory, so their engines never meet.
set -m   # background jobs keep SIGINT, so a stopped run still prints pytest's summaries
LOGS=$(mktemp -d)
START=$SECONDS
trap 'kill -INT $(jobs -p) 2>/dev/null; wait' INT TERM
if [ "$PART" = 1 ]; then
    "$PY" -m pytest "${COMMON[@]}" notebooks solutions "$@" > "$LOGS/notebooks.log" 2>&1 &
fi
SLOWEST="tests/test_cluster.py tests/test_conv.py tests/test_ddp.py tests/test_pi.py tests/test_comm.py
         tests/test_matmul.py tests/test_bad_input.py"
TURN=0
for f in $SLOWEST $(ls tests/test_*.py | grep -vxF -f <(printf '%s\n' $SLOWEST)); do
    TURN=$(( TURN + 1 ))
    [ $(( TURN % PARTS + 1 )) = "$PART" ] || continue
    while [ "$(jobs -rp | wc -l)" -ge 3 ]; do sleep 0.5; done
    "$PY" -m pytest "${COMMON[@]}" "$f" "$@" > "$LOGS/$(basename "$f" .py).log" 2>&1 &
done
wait
"$PY" - "$LOGS" "$(( SECONDS - START ))" "$SHARD" <<'PY'
"""One summary of the pytest runs: counts, each failure's log, skips by reason."""
import re
import sys
from collections import Counter
from pathlib import Path

logs, seconds = sorted(Path(sys.argv[1]).glob("*.log")), sys.argv[2]
totals, skips, bad = Counter(), Counter(), []
for log in logs:
    text = log.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|error)", ln)]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", lines[-1] if lines else "")}
    totals.update(counts)
    for n, reason in re.findall(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", text, re.M):
        skips[reason] += int(n)
    if not counts or counts.get("failed") or counts.get("error") or counts.get("errors"):   # none: stopped
        bad.append(log)
for log in bad:
    print(f"\n===== {log.stem}: failed or did not finish\n{log.read_text(errors='replace')}")
for reason, n in skips.most_common():
    print(f"SKIPPED [{n}] {reason}")
summary = ", ".join(f"{n} {k}" for k, n in sorted(totals.items()))
part = "" if sys.argv[3] == "1/1" else f" (part {sys.argv[3]})"
print(f"make test-gpu{part}: {summary or 'no results'} in {seconds} s ({len(logs)} pytest runs"
      f"{'; failing: ' + ', '.join(b.stem for b in bad) if bad else ''})")
sys.exit(1 if bad else 0)
PY
