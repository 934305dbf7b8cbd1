"""ipyparallel launchers for a controller started inside a Slurm job.

ipyparallel records a cluster's processes by PID in the profile's cluster file
(``security/cluster-<id>.json``). A cluster started in a batch job is read from
the login node, where those PIDs mean nothing: ipyparallel then either decides
the cluster is gone and deletes the file, or finds an unrelated process with
the same PID and would signal it on ``ipcluster stop``.

:class:`JobControllerLauncher` records the Slurm job id as well. Read back in
another process it is running while the job is (``scontrol``/``sacct``), raises
``NotRunning`` once the job has ended (so ipyparallel removes the stale file),
and stopping or signalling it goes through ``scancel``.
"""
from __future__ import annotations

import asyncio
import os
import subprocess

from ipyparallel.cluster.launcher import LocalControllerLauncher, NotRunning
from traitlets import Unicode

from hpclab.slurm import jobs


class JobControllerLauncher(LocalControllerLauncher):
    """The controller of an engine job: a local process in the job, the Slurm job everywhere else."""

    job_id = Unicode(os.environ.get("SLURM_JOB_ID", "")).tag(to_dict=True)
    # How the cluster file names this class: ipyparallel's default ("module:Class") cannot be
    # imported back by ipyparallel itself unless it is an entry point; a dotted path can.
    entrypoint_name = "hpclab.slurm.launchers.JobControllerLauncher"
    _in_job_elsewhere = False

    def _reconstruct_process(self, d):
        if not self.job_id:  # not started in a job: plain ipyparallel behaviour
            return super()._reconstruct_process(d)
        info = jobs.job_info(self.job_id)
        if info is None or info.ended:
            raise NotRunning(f"Slurm job {self.job_id} " + (info.state if info else "is no longer known"))
        self._in_job_elsewhere = True
        self.state = "running"

    def poll(self):
        if not self._in_job_elsewhere:
            return super().poll()
        info = jobs.job_info(self.job_id)
        if info is None or info.ended:
            self.notify_stop(dict(exit_code=info.exit_code if info else None, job_id=self.job_id))
            return info.exit_code if info else "unknown"
        return None

    def signal(self, sig):
        if not self._in_job_elsewhere:
            return super().signal(sig)
        subprocess.run(["scancel", f"--signal={int(sig)}", self.job_id], capture_output=True, timeout=30)

    async def stop(self):
        if not self._in_job_elsewhere:
            return await super().stop()
        subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)
        await self.join(timeout=self.stop_timeout)

    async def join(self, timeout=None):
        if not self._in_job_elsewhere:
            return await super().join(timeout)
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while self.poll() is None:
            if deadline is not None and loop.time() > deadline:
                raise TimeoutError(f"Slurm job {self.job_id} did not end in {timeout} seconds")
            await asyncio.sleep(1)
