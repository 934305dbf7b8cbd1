# Source this on a GPU node without network access, from the repository root:
#   source benchmarks/offline_env.sh
# It installs the wheels carried in .whl/ (numpy < 2.5, ipyparallel, nbval, ...)
# into /tmp/site, puts them first on PYTHONPATH (ahead of a numpy 2.5 that
# numba-cuda 0.30 cannot use), and sets what Open MPI and NCCL need there.
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || echo "offline_env: wheel install failed" >&2
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
# Data files of the wheels (nbconvert's HTML templates, for docs/render.py) land beside them: tell Jupyter.
export JUPYTER_PATH=/tmp/site/share/jupyter${JUPYTER_PATH:+:$JUPYTER_PATH}
export PYTHONUNBUFFERED=1
# NVLink multicast off in every process (it can take a shared node's GPUs out of service).
export NCCL_NVLS_ENABLE=0
# Open MPI as root in a container, more ranks than cores allowed.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export MPIRUN="mpirun --allow-run-as-root --oversubscribe -x PYTHONPATH -x PATH -x NCCL_NVLS_ENABLE -x HPCLAB_BACKEND -x PYTHONUNBUFFERED"
export HPCLAB_GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
