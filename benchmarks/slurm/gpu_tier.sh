#!/usr/bin/env bash
# The Slurm tier with real GPUs, on a GPU machine without network or Slurm, from the repository root:
#
#   source benchmarks/offline_env.sh; bash benchmarks/slurm/gpu_tier.sh [pytest arguments]
#
# with .whl/ (benchmarks' wheelhouse) and .slurm-debs/ (benchmarks/slurm/fetch_debs.sh, run where there is
# network) carried along. It installs Debian's Slurm and munge (only the packages the machine lacks: a library it
# already has is never replaced), unpacks `ip` apart with just the libraries it misses, then runs
# tests/test_slurm_gpu.py: routes 1, 2 and 3 on a local Slurm whose GRES are the machine's GPUs.
set -u
[ -d .slurm-debs ] || { echo "gpu_tier.sh: no .slurm-debs/ here: run benchmarks/slurm/fetch_debs.sh first" >&2; exit 2; }
install=()
for deb in .slurm-debs/slurm/*.deb; do
    name=$(dpkg-deb -f "$deb" Package)
    dpkg -s "$name" 2>/dev/null | grep -q '^Status: install ok installed' && continue
    # a library the machine has under another package name (Ubuntu's t64 renames) is there already: keep its own
    libs=$(dpkg-deb -c "$deb" | awk '{print $6}' | grep -E '\.so\.[0-9]' | sed 's|^\.||')
    if [ -n "$libs" ] && (for f in $libs; do [ -e "$f" ] || exit 1; done); then continue; fi
    install+=("$deb")
done
echo "gpu_tier: installing ${#install[@]} packages: $(for d in "${install[@]}"; do basename "$d" | cut -d_ -f1; done | tr '\n' ' ')"
DEBIAN_FRONTEND=noninteractive dpkg -i "${install[@]}" > /tmp/slurm-dpkg.log 2>&1 || {
    grep -E "depends on|not installable|error" /tmp/slurm-dpkg.log | sort -u | head -n 20
    echo "gpu_tier: dpkg could not configure every package (above); installing them regardless of those dependencies"
    DEBIAN_FRONTEND=noninteractive dpkg -i --force-depends "${install[@]}" > /tmp/slurm-dpkg2.log 2>&1 || tail -n 5 /tmp/slurm-dpkg2.log; }
if ! command -v ip > /dev/null; then
    rm -rf /opt/hpclab-ip && mkdir -p /opt/hpclab-ip/root /opt/hpclab-ip/lib /opt/hpclab-ip/bin
    for deb in .slurm-debs/ip/*.deb; do dpkg-deb -x "$deb" /opt/hpclab-ip/root; done
    real=$(find /opt/hpclab-ip/root -path '*bin/ip' -type f | head -n 1)
    # only what the machine lacks: its own (newer) libraries stay first
    for lib in $(ldd "$real" | awk '/not found/ {print $1}'); do
        ln -sf "$(find /opt/hpclab-ip/root -name "$lib" | head -n 1)" /opt/hpclab-ip/lib/
    done
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/opt/hpclab-ip/lib exec %s "$@"\n' "$real" > /opt/hpclab-ip/bin/ip
    chmod +x /opt/hpclab-ip/bin/ip
    export PATH=/opt/hpclab-ip/bin:$PATH
fi
# MPICH for the jobs' ranks (srun --mpi=pmi2), ahead of the machine's Open MPI for everything this tier starts
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site-mpich \
    .slurm-debs/wheels/*.whl || exit 1
export PYTHONPATH=/tmp/site-mpich${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site-mpich/bin:$PATH
# mpi4py's wheel loads the first libmpi it finds: the machine's Open MPI, unless told which (pip --target leaves
# the mpich wheel's lib/ out: take it from the wheel)
python3 -m zipfile -e .slurm-debs/wheels/mpich-*.whl /tmp/mpich-wheel && mkdir -p /tmp/site-mpich/lib &&
    cp -r /tmp/mpich-wheel/mpich-*.data/data/lib/. /tmp/site-mpich/lib/ || exit 1
export MPI4PY_LIBMPI=/tmp/site-mpich/lib/libmpi.so.12 LD_LIBRARY_PATH=/tmp/site-mpich/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
unset MPIRUN HPCLAB_MPIEXEC
ip -V && slurmctld -V && munged -V 2>&1 | head -n 1 || exit 1
python3 -c "from mpi4py import MPI; print(MPI.Get_library_version().splitlines()[0])" || exit 1
export HPCLAB_SLURM_TIER=1 HPCLAB_BACKEND=gpu
exec python3 -m pytest -q -rs -s --durations=20 -p no:cacheprovider tests/test_slurm_gpu.py "$@"
