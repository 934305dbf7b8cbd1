#!/usr/bin/env bash
# Run here (Debian 12, with network): Debian's Slurm 22.05, munge and iproute2 with the libraries a GPU machine
# (Ubuntu 24.04, no network, no Slurm, no `ip`) lacks, into .slurm-debs/ at the project root (about 6 MB), for
#   benchmarks/slurm/gpu_tier.sh   there, with .slurm-debs carried along.
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
grep -qx '/.slurm-debs/' .git/info/exclude 2>/dev/null || echo '/.slurm-debs/' >> .git/info/exclude
rm -rf .slurm-debs && mkdir -p .slurm-debs/slurm .slurm-debs/ip
# The Slurm daemons and commands, munge, and the libraries dpkg asked for there (those present are skipped there).
(cd .slurm-debs/slurm && apt-get download -q slurm-wlm slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge \
    libmunge2 libpmix2 ucf libdbus-1-3 libjson-c5 liblua5.1-0 libyaml-0-2 libevent-core-2.1-7 \
    libevent-pthreads-2.1-7 libhwloc15 libhwloc-plugins 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
# `ip` (iproute2) for the network namespaces of tests/slurm_local.py: unpacked apart, never installed.
(cd .slurm-debs/ip && apt-get download -q iproute2 libbpf1 libmnl0 libxtables12 libelf1 libtirpc3 libcap2 libbsd0 \
    libmd0 libdb5.3 libselinux1 libpcre2-8-0 2>&1 | grep -v '^W: Download is performed unsandboxed' || true)
# MPICH (the mpich wheel) and an mpi4py for it, Python 3.12: srun starts MPICH ranks through pmi2, as in CI, while
# the GPU machine's own Open MPI would need a PMIx that Debian's Slurm plugin was not built against.
mkdir -p .slurm-debs/wheels
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .slurm-debs/wheels "mpich==5.0.2" "mpi4py==4.1.2"
du -sh .slurm-debs
