"""Where a notebook's engines come from: a Slurm job, this allocation, or this machine.

ipyparallel starts engines wherever its launcher says, login nodes included. Kept here, as it has no
such rule, the route, first match wins: (1) ``HPCLAB_ALLOW_LOCAL_ENGINES=1``: mpiexec here (``=0``
refuses it); (2) inside a Slurm job with GPUs (JupyterLab in an allocation): ``srun`` in that job, one
rank per GPU, no second job; (3) a Slurm profile (``hpclab cluster init --slurm``): its engines job;
(4) inside a job without GPUs: mpiexec on the allocated node; (5) ``sbatch`` here, a Slurm that
``scontrol ping`` finds, and no GPU: a login node, refused; (6) otherwise (a laptop, a GPU node): mpiexec.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
from pathlib import Path

import ipyparallel as ipp

from hpclab.cluster import jobs, mpi, profile

ALLOW = "HPCLAB_ALLOW_LOCAL_ENGINES"


class ClusterError(RuntimeError):
    """Engines could not be started or used (the message says why and what to do)."""


def profile_is_slurm(pdir: str) -> bool:
    """A profile of ``hpclab cluster init --slurm``, or an ``ipcluster_config.py`` naming a Slurm launcher."""
    config = Path(pdir) / profile.CONFIG_FILE
    text = config.read_text(errors="replace") if config.is_file() else ""
    return os.path.exists(os.path.join(pdir, profile.SETTINGS_FILE)) or bool(
        re.search(r"^\s*c\.Cluster\.engine_launcher_class\s*=\s*['\"][\w.]*slurm", text, re.I | re.M))


def job_gpus() -> int:
    """GPUs per node of the Slurm job this process runs in (0 outside a job, or in one without)."""
    listed = os.environ.get("SLURM_JOB_GPUS", "")
    gpus = os.environ.get("SLURM_GPUS_ON_NODE") or (len(listed.split(",")) if listed else 0) or \
        os.environ.get("SLURM_GPUS_PER_NODE", "0").split(":")[-1]  # (salloc's shell: only what was asked, e.g. a100:4)
    return int(gpus) if os.environ.get("SLURM_JOB_ID") and str(gpus).isdigit() else 0


def _gpus() -> int:
    return __import__("hpclab.backend").backend.count_gpus()


def _slurm_configured() -> bool:
    """Whether Slurm's commands here belong to a cluster; a controller silent for 5 s counts as one."""
    text = jobs.run(["scontrol", "ping"], timeout=5)[1]   # (sbatch without scontrol: trust sbatch)
    return "could not establish a configuration source" not in text.lower()


def login_node_guard(pdir: str) -> str | None:
    """None when MPI engines may be started on this machine under mpiexec; else why not, and what to do."""
    allow = os.environ.get(ALLOW, "").strip()
    if allow in ("0", "1"):
        return None if allow == "1" else (f"{ALLOW}=0 forbids starting engines on this machine: get them from "
                                           "Slurm (hpclab cluster init --slurm) or run inside an allocation")
    if profile_is_slurm(pdir):
        return (f"profile {os.path.basename(pdir)[8:]!r} starts its engines through Slurm (hpclab cluster init "
                "--slurm); they are not started on this machine: hpclab.cluster.connect() or `hpclab cluster start` "
                "submits them as a job")
    if os.environ.get("SLURM_JOB_ID"):
        return None
    if shutil.which("sbatch") and _gpus() == 0 and _slurm_configured():
        return ("this looks like a Slurm login node (sbatch is here, no GPU is): engines started here would get no "
                "GPU. Get engines on GPU nodes with `hpclab cluster init --slurm --partition P --gpus-per-node G` "
                "(then connect() submits them), or run JupyterLab inside an allocation (salloc, then `make lab`); "
                f"set {ALLOW}=1 to run them here on the simulator anyway")
    return None


def plan(cluster: ipp.Cluster, n: int) -> str:
    """Set ``cluster`` up to start ``n`` engines by the first route that applies; say how, in words.
    Raises :class:`ClusterError` to refuse."""
    pdir = cluster.profile_dir
    gpus = job_gpus() if os.environ.get(ALLOW) != "1" else 0
    if gpus:
        srun = [*mpi.srun_command(), "--overlap"]  # (a step beside the one the kernel may run in: salloc + srun --pty)
        cluster.engine_launcher_class = "mpi"
        cluster.config.MPIEngineSetLauncher.mpi_cmd = srun
        if not os.environ.get("SLURMD_NODENAME") or int(os.environ.get("SLURM_JOB_NUM_NODES", "1")) > 1:
            cluster.controller_ip, cluster.controller_location = "*", socket.gethostname()  # ranks on other nodes
        share = "one rank per GPU" if n == gpus else f"{n} ranks on its {gpus} GPUs of this node"
        return (f"{n} MPI engines in this Slurm job {os.environ['SLURM_JOB_ID']} ({shlex.join(srun)} -n {n}, "
                f"{share}); no second job")
    if profile_is_slurm(pdir):
        s = profile.settings(pdir)
        if s is None:
            return f"{n} engines as a Slurm job, through the profile's own Slurm launcher configuration"
        site = "".join(f", {k} {s[k]}" for k in profile.SITE_OPTIONS if s[k])
        return (f"{n} engines as one Slurm job (partition {s['partition']}, {s['gpus_per_node']} GPUs per node, "
                f"time {s['time']}{site}, {shlex.join(s['srun'])})")
    if "engine_launcher_class" in cluster.config.get("Cluster", {}):
        return f"{n} engines through the profile's {cluster.engine_launcher_class.__name__}"
    refusal = login_node_guard(pdir)
    if refusal:
        raise ClusterError(f"no engines were started: {refusal}")
    cluster.engine_launcher_class = "mpi"
    return f"{n} MPI engines on this machine (mpiexec)"
