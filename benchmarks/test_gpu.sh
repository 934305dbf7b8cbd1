#!/usr/bin/env bash
# make test-gpu: the whole test suite on this machine's GPUs, from the repository root.
#
#   make test-gpu                                  (the project's .venv)
#   source benchmarks/offline_env.sh; make test-gpu PYTHON_RUN=python3   (GPU node, no network)
#   PYTHON_RUN=python3 bash benchmarks/test_gpu.sh [extra pytest arguments]
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
if [ "${NGPU:-0}" -lt 1 ]; then
    echo "make test-gpu needs NVIDIA GPUs and nvidia-smi lists none here; 'make test' runs the" \
         "same suite on Numba's CUDA simulator." >&2
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
# shellcheck disable=SC2086 - HPCLAB_TEST_PATHS is a list of paths (default: all of the suite)
exec "$PY" -m pytest -q -rs --durations=20 --nbval-lax --nbval-cell-timeout=600 -p no:cacheprovider \
    ${HPCLAB_TEST_PATHS:-tests notebooks solutions} "$@"
