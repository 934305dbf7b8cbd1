"""Ends a cluster that nobody will use again: ipyparallel stops one only at the normal exit of the process
that started it, and has no idle limit. ``python -m hpclab.cluster.reaper CLUSTER_FILE --kernel PID START``
ends a private cluster with its kernel, killed too; ``... --idle SECONDS`` the shared engines job after that
long without a notebook, or with its job. It runs in a session of its own (signals to the kernel's process
group miss it), and ends by itself once the cluster file is gone.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from hpclab.cluster import files, jobs


def start(cluster_file: str, kernel: dict | None = None, idle_s: float | None = None) -> subprocess.Popen:
    args = ["--kernel", str(kernel["pid"]), repr(kernel["started"])] if kernel else ["--idle", str(idle_s)]
    pdir = os.path.dirname(os.path.dirname(cluster_file))
    with open(os.devnull, "rb") as stdin, open(files.log_path(pdir), "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "hpclab.cluster.reaper", cluster_file, *args], stdin=stdin,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


def _why_end(pdir: str, cluster_id: str, argv: list[str], idle_since: list[float]) -> str | None:
    if argv[0] == "--kernel":
        gone = files.alive({"host": files.this_process()["host"], "pid": int(argv[1]), "started": float(argv[2])})
        return None if gone is not False else f"kernel {argv[1]} is gone"
    raw = files.read_record(pdir, cluster_id)
    # used: by a notebook, or by the process that started the job and still waits for its engines (a job's queue
    # and start-up are not idle time; that process gone, they are)
    holder = raw.get("owner") or raw.get("starting")
    if holder and files.alive(holder) is not False:
        idle_since[:] = []
        return None
    idle_since[:] = idle_since or [raw.get("released") or time.time()]
    try:
        with open(files.cluster_file(pdir, cluster_id)) as f:
            job = jobs.job_of(raw=json.load(f))
    except (OSError, ValueError):
        return None
    if job and not jobs.active(job):
        return f"its {jobs.report(job)}"
    if time.time() - idle_since[0] > float(argv[1]):
        return f"no notebook used it for {float(argv[1]) / 60:g} min"
    return None


def main(argv: list[str]) -> int:
    cluster_file, rest = argv[0], argv[1:]
    pdir, cluster_id = os.path.dirname(os.path.dirname(cluster_file)), os.path.basename(cluster_file)[8:-5]
    idle_since: list[float] = []
    while os.path.exists(cluster_file):
        why = _why_end(pdir, cluster_id, rest, idle_since)
        if why:
            log = files.quiet_log(pdir)
            found = files.load(pdir, cluster_id, log)
            if found.cluster is not None:
                log.info("stopping cluster %r: %s", cluster_id, why)
                files.stop(found.cluster, log, polite=False)
            return 0
        time.sleep(0.5 if rest[0] == "--kernel" else 5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
