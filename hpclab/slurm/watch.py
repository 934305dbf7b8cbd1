"""Waiting for the engines of a Slurm job, as ``hpclab.cluster.connect()`` does.

    job = EngineJob.of(cluster)      # None unless the cluster's engines are a Slurm job
    job.check()                      # the job's state when it changed (job.text for the bar); JobEnded once ended
    job.at_deadline(what)            # the message when the engines are not all up in time

A job may wait in the queue before its engines exist, so its engines get a longer
deadline than local ones (:data:`QUEUE_WAIT_S`, or the profile's ``c.Cluster.engine_timeout``).
While waiting, the job's state is looked up every few seconds: a job that has ended
(a wrong ``srun --mpi`` flavour, a missing module, cancelled) ends the wait at once with
:func:`.jobs.diagnose`'s line (job, state, cause, fix and log).
"""
from __future__ import annotations

import time

from hpclab.slurm import jobs

QUEUE_WAIT_S = 600   # a job's engines: long enough for a short queue; connect(timeout=...) to change
POLL_S = 2           # scontrol at most this often


class JobEnded(RuntimeError):
    """The engine job ended before all its engines registered (the message says why and what to do)."""


def recorded_job_id(raw: dict) -> str | None:
    """The Slurm job a cluster file (as JSON) records: its newest engine set's job, or its controller's."""
    sets = (raw.get("engines") or {}).get("sets") or {}
    for engine_set in reversed(list(sets.values())):
        job = engine_set.get("job_id") if isinstance(engine_set, dict) else ""
        if job:
            return str(job)
    return controller_job_id(raw)


def controller_job_id(raw: dict) -> str | None:
    """The Slurm job a cluster file's controller runs in (an engine job), or None."""
    job = ((raw.get("controller") or {}).get("state") or {}).get("job_id")
    return str(job) if job else None


def cluster_job_id(cluster) -> str | None:
    """The Slurm job id behind an ``ipp.Cluster``: its Slurm engine set's, or its engine job's controller's.
    With several engine sets (engines started again), the newest that is still queued or running."""
    found = [str(s.job_id) for s in list(getattr(cluster, "engines", {}).values()) if getattr(s, "job_id", "")]
    for job in reversed(found):
        info = jobs.job_info(job)
        if info is not None and info.active:
            return job
    if found:
        return found[-1]
    job = getattr(getattr(cluster, "controller", None), "job_id", "")
    return str(job) if job else None


def job_is_active(job_id: str) -> bool:
    """Whether the job is queued or running (False once it has ended or is unknown)."""
    info = jobs.job_info(job_id)
    return info is not None and info.active


def deadline(cluster=None) -> float:
    """How long to wait for a job's engines by default: the profile's engine_timeout, if longer."""
    return max(QUEUE_WAIT_S, float(getattr(cluster, "engine_timeout", 0) or 0))


class EngineJob:
    """The Slurm job whose engines a notebook waits for."""

    def __init__(self, job_id: str, deadline_s: float = QUEUE_WAIT_S):
        self.job_id = str(job_id)
        self.deadline_s = deadline_s
        self._checked = 0.0
        self._seen: tuple[str, str] = ("", "")
        self.text = f"Slurm job {self.job_id}"     # short, for the progress bar

    @classmethod
    def of(cls, cluster=None, raw: dict | None = None) -> "EngineJob | None":
        job = (cluster_job_id(cluster) if cluster is not None else None) or recorded_job_id(raw or {})
        return cls(job, deadline(cluster)) if job else None

    def check(self) -> str | None:
        """Look at the job (at most every few seconds): its state in one line when it has changed
        since the last look (PENDING with the reason, RUNNING on nodes), else None. Raises
        :class:`JobEnded` with the diagnosis once the job has ended."""
        now = time.monotonic()
        if now - self._checked < POLL_S:
            return None
        self._checked = now
        info = jobs.job_info(self.job_id)
        if info is None or info.ended:
            raise JobEnded(jobs.diagnose(self.job_id))
        seen = (info.state, info.reason if info.state == "PENDING" and info.reason != "None" else "")
        if seen == self._seen:
            return None
        self._seen = seen
        self.text = f"Slurm job {self.job_id} {info.state}" + (f" ({info.reason})" if seen[1] else "")
        return jobs.describe(info, log=False)

    def report(self) -> str:
        """One line: state, nodes, time and log."""
        return jobs.job_report(self.job_id)

    def at_deadline(self, what: str) -> str:
        """The message when the engines are not all up in time (``what``); ask before cancelling the job."""
        why = jobs.diagnose(self.job_id).rstrip(".")
        return (f"{what}; {why}. The job is cancelled now; to wait longer for a queued job: "
                "connect(..., timeout=SECONDS).")
