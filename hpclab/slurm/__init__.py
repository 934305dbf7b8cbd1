"""MPI engines from Slurm: profiles, job states in words, and the login-node rule.

Three routes put a notebook's MPI engines on GPU nodes (README, "Running on a cluster"):

* ``hpclab cluster init --slurm ...`` writes an ipyparallel profile whose engine
  launcher submits one Slurm job, one engine per GPU (:mod:`.profile`); the
  controller stays with the notebook on the login node;
* ``sbatch slurm/ipcluster_engines.sbatch`` runs controller and engines in a job
  (:mod:`.engines`), registered in the profile with the job id (:mod:`.launchers`);
* batch programs: ``slurm/*.sbatch`` with ``srun --mpi=<flavour>`` (:mod:`.mpi`).

What ``hpclab.cluster`` calls (small functions, no state besides :class:`EngineJob`):

``profile_is_slurm(profile)``, ``slurm_settings(profile)``
    Whether the profile's engines come from Slurm, and the settings
    ``hpclab cluster init --slurm`` wrote (partition, GPUs, engines, ``srun --mpi``).
``job_plan(profile, n)``
    What starting ``n`` engines through such a profile does, in words.
``login_node_guard(profile)``
    None when local MPI engines may be started here, else one line saying why not
    and what to do (rules in :mod:`.guard`; ``HPCLAB_ALLOW_LOCAL_ENGINES=1`` allows).
``EngineJob.of(cluster)``
    The Slurm job behind an ``ipp.Cluster`` (its Slurm engine set, or an engine job's
    controller), or None; while engines register, ``check()`` gives its state for the
    progress bar and raises :class:`JobEnded` with the diagnosis once it has ended
    (:mod:`.watch`).
``job_report(job_id)``
    One line: PENDING (reason), RUNNING on nodes for time, or ended with exit code; log path.
``diagnose(job_id)``
    One line: job, state, cause (from the state and the known lines of its log) and fix.
``submit_failure(cluster)``
    Why sbatch refused the engine job (``sbatch --test-only`` on the generated script).

How ``connect()`` uses them (hpclab/cluster.py):

* a running cluster whose engines are a Slurm job (an engine job, or a shared cluster
  started through a Slurm profile) is claimed as any shared cluster; connect() says which
  job it is (``job_report``) and waits for its engines with the job's state on the bar;
* otherwise, with a Slurm profile, ``launch_plan`` lets the profile's launcher submit the
  engine job for a private cluster; connect() waits up to ``watch.deadline`` (a job may
  queue) and stops at once, naming the job, the cause, the fix and the log, when the job ends
  first; at the deadline the job is cancelled with the same kind of message. ``session.close()``
  (and the reaper, when the kernel dies) cancels the job;
* without a Slurm profile, ``launch_plan`` asks ``login_node_guard`` before starting local
  MPI engines, and refuses with its line on a login node.

The test suite's conftest.py sets ``HPCLAB_ALLOW_LOCAL_ENGINES=1`` (its machines may have
``sbatch`` and no GPU, as CI has once the Slurm tier has installed Slurm).
"""
from __future__ import annotations

from hpclab.slurm.guard import login_node_guard, profile_is_slurm
from hpclab.slurm.jobs import cancel, diagnose, job_info, job_report, submit_error
from hpclab.slurm.profile import SlurmSettings, read_settings
from hpclab.slurm.watch import (EngineJob, JobEnded, cluster_job_id, controller_job_id, deadline, job_is_active,
                    recorded_job_id)

__all__ = ["EngineJob", "JobEnded", "SlurmSettings", "cancel", "cluster_job_id", "controller_job_id", "deadline",
           "diagnose", "job_ended", "job_info", "job_is_active", "job_plan", "job_report", "login_node_guard",
           "profile_is_slurm", "recorded_job_id", "slurm_settings", "submit_failure"]


def slurm_settings(profile: str = "default", ipython_dir: str | None = None) -> SlurmSettings | None:
    """The settings ``hpclab cluster init --slurm`` wrote into ``profile``, or None."""
    return read_settings(profile, ipython_dir)


def job_plan(profile: str, n: int, ipython_dir: str | None = None) -> str:
    """What starting ``n`` engines through a Slurm profile does, in words (for connect()'s messages)."""
    s = read_settings(profile, ipython_dir)
    if s is None:
        return f"{n} engines as a Slurm job, through the profile's own Slurm launcher configuration"
    nodes = f"{s.nodes} node(s), " if s.nodes else ""
    return (f"{n} engines as one Slurm job (partition {s.partition}, {nodes}{s.gpus_per_node} GPUs per node, "
            f"time {s.time}" + (f", account {s.account}" if s.account else "") + f", srun --mpi={s.mpi})")


def job_ended(job_id: str | int) -> str | None:
    """None while the job is pending or running; once it has ended (or is unknown), why, in one line."""
    info = job_info(job_id)
    if info is not None and info.active:
        return None
    return diagnose(job_id)


def submit_failure(cluster) -> str:
    """Why sbatch refused the cluster's engine job, and the batch script to look at."""
    for engine_set in list(getattr(cluster, "engines", {}).values()):
        batch_file = getattr(engine_set, "batch_file", "")
        if batch_file:
            why = submit_error(batch_file) or "sbatch accepts it now; submitting again may work"
            return f"sbatch refused the engine job ({why}); the batch script is {batch_file}"
    return "the engine job could not be submitted (no batch script was written)"
