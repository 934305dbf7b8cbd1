# Sourced by every slurm/*.sbatch after its #SBATCH header: the project's environment, the MPI
# launch and the output folder, the same way in every job. Each setting can be given from
# outside with sbatch --export=ALL,NAME=value (never overwritten here):
#
#   HPCLAB_ROOT      the checkout (default: the folder sbatch was run from)
#   HPCLAB_ENV       a venv or conda environment to use (default: $HPCLAB_ROOT/.venv, else the
#                    active conda env, else the python on PATH); site modules go in HPCLAB_SETUP
#   HPCLAB_SETUP     shell line(s) run first, e.g. "module load openmpi/4.1"
#   HPCLAB_PYTHON    the Python to run (default: python, else python3, after the activation)
#   HPCLAB_BACKEND   gpu (default: a GPU job must not fall back to the simulator), sim, auto
#   HPCLAB_SRUN_MPI  srun --mpi flavour (default: chosen from the MPI mpi4py uses: the mpich
#                    wheel -> pmi2, Open MPI -> pmix; python -m hpclab.cluster mpi says which and why)
#   HPCLAB_MPIEXEC   the launcher without a rank count (default in a job: the line of
#                    python -m hpclab.cluster srun, srun --mpi=<flavour> --kill-on-bad-exit=1;
#                    outside Slurm: mpiexec, e.g. "bash slurm/ex0_collectives.sbatch")
#   HPCLAB_RANKS     ranks (default: SLURM_NTASKS in a job, 4 outside)
#   HPCLAB_OUT       folder for result files (default: build/slurm/<job name>-<job id>)
# Sets HPCLAB_LAUNCH="$HPCLAB_MPIEXEC -n $HPCLAB_RANKS" and HPCLAB_PYTHON for the program lines.
set -euo pipefail

if [ -n "${HPCLAB_SETUP:-}" ]; then
    eval "$HPCLAB_SETUP"
fi

hpclab_env=${HPCLAB_ENV:-}
if [ -z "$hpclab_env" ] && [ -x "$HPCLAB_ROOT/.venv/bin/python" ]; then
    hpclab_env=$HPCLAB_ROOT/.venv
fi
if [ -n "$hpclab_env" ]; then
    if [ -f "$hpclab_env/bin/activate" ]; then
        source "$hpclab_env/bin/activate"             # a venv
    else
        export PATH="$hpclab_env/bin:$PATH" CONDA_PREFIX="$hpclab_env"   # a conda environment
    fi
fi
HPCLAB_PYTHON=${HPCLAB_PYTHON:-$(command -v python || command -v python3 || echo python)}
if ! "$HPCLAB_PYTHON" -c "import hpclab, numba, mpi4py" 2>/dev/null; then
    echo "hpclab job: $HPCLAB_PYTHON cannot import hpclab, numba and mpi4py." >&2
    echo "  Set up the project once on the login node (make setup, in $HPCLAB_ROOT) or give its environment:" >&2
    echo "  sbatch --export=ALL,HPCLAB_ENV=/path/to/env ... (and HPCLAB_SETUP='module load ...' for site MPI)" >&2
    exit 2
fi

export HPCLAB_BACKEND=${HPCLAB_BACKEND:-gpu}
# NCCL_NVLS_ENABLE is left as the site or the submitting shell has it (NVLink SHARP stays on where
# NCCL can use it); a site without NVLink multicast passes --export=ALL,NCCL_NVLS_ENABLE=0 (docs/cluster.md).
if [ -n "${SLURM_JOB_ID:-}" ]; then
    HPCLAB_MPIEXEC=${HPCLAB_MPIEXEC:-$("$HPCLAB_PYTHON" -m hpclab.cluster srun "${HPCLAB_SRUN_MPI:-auto}")}
    HPCLAB_RANKS=${HPCLAB_RANKS:-$SLURM_NTASKS}
    HPCLAB_OUT=${HPCLAB_OUT:-$HPCLAB_ROOT/build/slurm/$SLURM_JOB_NAME-$SLURM_JOB_ID}
else
    HPCLAB_MPIEXEC=${HPCLAB_MPIEXEC:-mpiexec}
    HPCLAB_RANKS=${HPCLAB_RANKS:-4}
    HPCLAB_OUT=${HPCLAB_OUT:-$HPCLAB_ROOT/build/slurm/$(basename "$0" .sbatch)-$$}
fi
HPCLAB_LAUNCH="$HPCLAB_MPIEXEC -n $HPCLAB_RANKS"
echo "hpclab job ${SLURM_JOB_ID:-(no Slurm)} on ${SLURM_JOB_NODELIST:-$(hostname)}: $HPCLAB_PYTHON," \
     "backend $HPCLAB_BACKEND, launch: $HPCLAB_LAUNCH, NCCL_NVLS_ENABLE ${NCCL_NVLS_ENABLE-unset}"
