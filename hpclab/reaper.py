"""Stop a notebook's private cluster when the notebook's kernel is gone.

    python -m hpclab.reaper KERNEL_PID KERNEL_START_TIME CLUSTER_FILE

``hpclab.cluster`` starts one of these, in its own session (so that signals to the
kernel's process group do not reach it), beside every private cluster. ipyparallel
stops a cluster at the normal exit of the process that started it, but nothing
when that process is killed (SIGKILL, out of memory, a kernel restart that kills):
then this process stops the controller and the engines within about a second.
It ends by itself when the cluster file disappears (the cluster was stopped).
"""
from __future__ import annotations

import os
import sys
import time

import psutil


def _kernel_alive(pid: int, started: float) -> bool:
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - started) < 1 and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def main(argv: list[str]) -> int:
    pid, started, cluster_file = int(argv[0]), float(argv[1]), argv[2]
    while os.path.exists(cluster_file):
        if not _kernel_alive(pid, started):
            from hpclab import profile_clusters

            pdir = os.path.dirname(os.path.dirname(cluster_file))
            log = profile_clusters.quiet_log(pdir)
            cluster_id = os.path.basename(cluster_file)[len("cluster-"):-len(".json")]
            found = profile_clusters.load(pdir, cluster_id, log)
            if found.state == "running":
                log.info("kernel %s is gone: stopping its cluster %r", pid, cluster_id)
                profile_clusters.stop(found.cluster, log, polite=False)
            return 0
        time.sleep(0.5)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
