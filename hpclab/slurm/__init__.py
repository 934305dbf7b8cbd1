"""MPI engines from Slurm: profiles, job states in words, and the login-node rule.

Three routes put a notebook's MPI engines on GPU nodes (README, "Running on a cluster"):

* ``hpclab cluster init --slurm ...`` writes an ipyparallel profile whose engine
  launcher submits one Slurm job, one engine per GPU (:mod:`.profile`); the
  controller stays with the notebook on the login node;
* ``sbatch slurm/ipcluster_engines.sbatch`` runs controller and engines in a job
  (:mod:`.engines`), registered in the profile with the job id (:mod:`.launchers`);
* batch programs: ``slurm/*.sbatch`` with ``srun --mpi=<flavour>`` (:mod:`.mpi`).

What ``hpclab.cluster.connect()`` calls (small functions, no state):

``profile_is_slurm(profile)``, ``slurm_settings(profile)``
    Whether the profile's engines come from Slurm, and the settings
    ``hpclab cluster init --slurm`` wrote (partition, GPUs, engines, ``srun --mpi``).
``login_node_guard(profile)``
    None when local MPI engines may be started here, else one line saying why not
    and what to do (rules in :mod:`.guard`; ``HPCLAB_ALLOW_LOCAL_ENGINES=1`` allows).
``cluster_job_id(cluster)``
    The Slurm job behind an ``ipp.Cluster`` (its Slurm engine set, or an engine
    job's controller), or None.
``job_report(job_id)``
    One line: PENDING (reason), RUNNING on nodes for time, or ended with exit code; log path.
``job_ended(job_id)``
    None while the job is pending or running; once it has ended, :func:`diagnose`'s line.
``diagnose(job_id)``
    One line: job, state, cause (from the state and the known lines of its log) and fix.
``submit_failure(cluster)``
    Why sbatch refused the engine job (``sbatch --test-only`` on the generated script).

Integration into ``connect(n, profile, timeout)`` (after the cluster-ownership rewrite; the
tests marked ``needs_connect_integration`` in tests/test_slurm.py check it and run as soon as
``hpclab.cluster`` has the attribute ``slurm``):

0. ``from . import slurm`` in hpclab/cluster.py.
1. Claiming a running cluster: ``ipp.Cluster.from_file(profile=..., cluster_id=...)`` works for
   engine jobs too, because their controller is a :class:`.launchers.JobControllerLauncher`
   (running while the job runs; for a job that has ended ipyparallel sets ``controller`` to
   None and removes the stale file itself). Treat ``cluster.controller is None`` as "nothing
   to claim". If ``job = cluster_job_id(cluster)``, print ``"hpclab: " + job_report(job)``
   with the engines found.
2. Nothing to claim and ``profile_is_slurm(profile)``: a private cluster from the profile,
   ``ipp.Cluster(profile=profile, cluster_id=<own id>, n=n)`` (its config holds the Slurm
   launcher; ``n`` becomes the job's ``--ntasks``), ``start_controller_sync()``, then
   ``start_engines_sync(n)``; if that raises ``subprocess.CalledProcessError`` (sbatch
   refused), ``stop_cluster_sync()`` and raise ``ClusterError(submit_failure(cluster))``.
   Then ``job = cluster_job_id(cluster)``; wait for n engines with the progress bar, every
   2 s: ``msg = job_ended(job)``; if ``msg``: ``stop_cluster_sync()``, raise
   ``ClusterError(msg)``; the bar's description ``job_report(job)``. Deadline
   ``max(timeout, 300)`` (a job may queue): ``ClusterError(f"{k} of {n} engines after {t} s; "
   + diagnose(job))`` after ``stop_cluster_sync()`` (which scancels the job). The Session
   owns the cluster (``started=True``): ``close()`` stops it and so cancels the job.
3. Nothing to claim and the profile is not Slurm: ``reason = login_node_guard(profile)``; if
   ``reason``: raise ``ClusterError(reason)`` and start nothing; else start local MPI
   engines as before.
4. The test suite's conftest.py sets ``HPCLAB_ALLOW_LOCAL_ENGINES=1`` (its machines may have
   ``sbatch`` and no GPU, as CI has once the Slurm tier has installed Slurm).
"""
from __future__ import annotations

from hpclab.slurm.guard import login_node_guard, profile_is_slurm
from hpclab.slurm.jobs import diagnose, job_info, job_report, submit_error
from hpclab.slurm.profile import SlurmSettings, read_settings

__all__ = ["SlurmSettings", "cluster_job_id", "diagnose", "job_ended", "job_info", "job_report",
           "login_node_guard", "profile_is_slurm", "slurm_settings", "submit_failure"]


def slurm_settings(profile: str = "default", ipython_dir: str | None = None) -> SlurmSettings | None:
    """The settings ``hpclab cluster init --slurm`` wrote into ``profile``, or None."""
    return read_settings(profile, ipython_dir)


def cluster_job_id(cluster) -> str | None:
    """The Slurm job id behind an ``ipp.Cluster``: its Slurm engine set's, or its engine job's controller's."""
    for engine_set in list(getattr(cluster, "engines", {}).values()):
        job = getattr(engine_set, "job_id", "")
        if job:
            return str(job)
    job = getattr(getattr(cluster, "controller", None), "job_id", "")
    return str(job) if job else None


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
