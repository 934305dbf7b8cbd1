"""May engines be started on this machine, or is this a Slurm login node?

Starting MPI engines next to the notebook is right on a laptop, a GPU
workstation or inside a Slurm allocation (``salloc``, a batch job), and wrong
on a cluster's login node: the engines would get no GPU, share the login node
with everyone, and the learner would believe the GPUs were in use.
:func:`login_node_guard` says which, by these rules, first match wins:

1. ``HPCLAB_ALLOW_LOCAL_ENGINES=1``: allowed (the learner, or the test suite, says so);
   ``HPCLAB_ALLOW_LOCAL_ENGINES=0``: refused.
2. The profile was written by ``hpclab cluster init --slurm`` (or its
   ``ipcluster_config.py`` sets a Slurm engine launcher): refused, the engines
   must come from that profile's launcher.
3. Inside a Slurm job (``SLURM_JOB_ID`` set): allowed, the engines run on the
   allocated node.
4. ``sbatch`` is on PATH, Slurm has a configuration here and the driver sees no GPU:
   refused (a login node). Slurm's client commands without a configuration (installed
   but no cluster to talk to: ``scontrol`` "Could not establish a configuration
   source") do not make a login node.
5. Otherwise allowed.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from hpclab.slurm import profile as slurm_profile

ALLOW = "HPCLAB_ALLOW_LOCAL_ENGINES"


def profile_is_slurm(profile: str = "default", ipython_dir: str | None = None) -> bool:
    """Whether the profile's engines come from Slurm (hpclab cluster init --slurm, or a hand-written config)."""
    pdir = slurm_profile.profile_dir(profile, ipython_dir)
    if (pdir / slurm_profile.SETTINGS_FILE).exists():
        return True
    try:
        text = (pdir / slurm_profile.CONFIG_FILE).read_text(errors="replace")
    except OSError:
        return False
    return bool(re.search(r"^\s*c\.Cluster\.engine_launcher_class\s*=\s*['\"][\w.]*slurm", text,
                          re.IGNORECASE | re.MULTILINE))


def _gpus() -> int:
    from hpclab.backend import count_gpus

    return count_gpus()


def _slurm_configured() -> bool:
    """Whether Slurm's commands here belong to a cluster: ``scontrol ping`` finds a configuration
    (a file, or configless through DNS). A controller that does not answer in 5 s counts as one."""
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        return True
    except OSError:       # sbatch without scontrol: trust sbatch
        return True
    return "could not establish a configuration source" not in (proc.stdout + proc.stderr).lower()


def login_node_guard(profile: str = "default", ipython_dir: str | None = None) -> str | None:
    """None when local MPI engines may be started here; otherwise why not and what to do (one line)."""
    allow = os.environ.get(ALLOW, "").strip()
    if allow == "1":
        return None
    if allow == "0":
        return (f"{ALLOW}=0 forbids starting engines on this machine: start them elsewhere "
                "(sbatch slurm/ipcluster_engines.sbatch) and connect to them")
    if profile_is_slurm(profile, ipython_dir):
        return (f"profile {profile!r} starts its engines through Slurm (hpclab cluster init --slurm); "
                "they are not started on this machine: hpclab.cluster.connect() or `hpclab cluster start "
                f"--profile {profile}` submits them as a job, or set {ALLOW}=1 to run engines here instead")
    if os.environ.get("SLURM_JOB_ID"):
        return None
    if shutil.which("sbatch") and _gpus() == 0 and _slurm_configured():
        return ("this looks like a Slurm login node (sbatch is here, no GPU is): engines started here would "
                "get no GPU. Get engines on GPU nodes with `hpclab cluster init --slurm --partition P "
                "--gpus-per-node G` (then connect() submits them) or `sbatch slurm/ipcluster_engines.sbatch`; "
                f"set {ALLOW}=1 to run them here on the simulator anyway")
    return None
