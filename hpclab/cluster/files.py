"""The clusters of one IPython profile, as files: where they are, who owns them, which are stale.

ipyparallel records each cluster in ``<profile>/security/cluster-<id>.json`` and drops what has stopped
when it reads one back (``Cluster.from_file``). Kept here, as it lacks them: an owner record beside each
cluster (``hpclab-cluster-<id>.json``: the notebook's host, kernel pid and start time, a token), so that
the *shared* cluster (id ``""``) serves one notebook at a time and a *private* one (``hpclab-<pid>-...``)
ends with its notebook; and the processes a killed controller leaves behind (its schedulers).
"""
from __future__ import annotations

import contextlib
import glob
import json
import logging.handlers
import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

import ipyparallel as ipp
import psutil

from hpclab.cluster import jobs

SHARED_ID, PRIVATE_PREFIX = "", "hpclab-"
KILL_GRACE_S = 2   # stop and restart: TERM, then KILL after this


def profile_dir(profile: str = "default") -> str:
    """The profile's folder (made, with its security/ and log/ folders, if missing)."""
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    return ProfileDir.create_profile_dir_by_name(get_ipython_dir(), profile).location


def log_path(pdir: str) -> str:
    return os.path.join(pdir, "log", "hpclab-clusters.log")


def quiet_log(pdir: str) -> logging.Logger:
    """A logger into ``log_path``: ipyparallel's launchers log there what controllers and engines print,
    instead of into the notebook."""
    log = logging.getLogger(f"hpclab.clusters.{pdir}")
    if not log.handlers:
        handler = logging.handlers.RotatingFileHandler(log_path(pdir), maxBytes=4_000_000, backupCount=1)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def cluster_file(pdir: str, cluster_id: str) -> str:
    return os.path.join(pdir, "security", f"cluster-{cluster_id}.json")


def connection_files(pdir: str, cluster_id: str) -> list[str]:
    stem = "ipcontroller" + (f"-{cluster_id}" if cluster_id else "")
    return [os.path.join(pdir, "security", f"{stem}-{kind}.json") for kind in ("client", "engine")]


def _record_file(pdir: str, cluster_id: str) -> str:
    return os.path.join(pdir, "security", f"hpclab-cluster-{cluster_id}.json")


def cluster_ids(pdir: str) -> list[str]:
    return sorted(os.path.basename(p)[8:-5] for p in glob.glob(cluster_file(pdir, "*")))


def read_record(pdir: str, cluster_id: str) -> dict:
    try:
        with open(_record_file(pdir, cluster_id)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_record(pdir: str, cluster_id: str, record: dict) -> None:
    path = _record_file(pdir, cluster_id)
    with open(f"{path}.{os.getpid()}.tmp", "w") as f:
        json.dump(record, f, indent=1)
    os.replace(f"{path}.{os.getpid()}.tmp", path)


def remove(paths: list[str]) -> None:
    for path in paths:
        Path(path).unlink(missing_ok=True)


def this_process() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def alive(owner: dict) -> bool | None:
    """Whether the process of an owner record still runs; None when it ran on another host."""
    if owner.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(owner["pid"])
        return abs(process.create_time() - owner.get("started", process.create_time())) < 1 \
            and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe_owner(owner: dict) -> str:
    since = time.strftime("%H:%M", time.localtime(owner.get("since", 0)))
    return f"the notebook with kernel pid {owner.get('pid')} on {owner.get('host')} (since {since})"


def orphaned(pdir: str, cluster_id: str) -> dict | None:
    """The owner record of a private cluster whose notebook is gone, else None."""
    if not cluster_id.startswith(PRIVATE_PREFIX):
        return None
    owner = read_record(pdir, cluster_id).get("owner")
    if owner is None:  # no record yet: judge by the pid in the id
        pid = int(re.match(rf"{PRIVATE_PREFIX}(\d+)", cluster_id).group(1))
        return None if psutil.pid_exists(pid) else {"pid": pid, "host": socket.gethostname()}
    return owner if alive(owner) is False else None


def running(process) -> bool:
    """Whether a process, or a launcher's local one, runs (not a zombie): ipyparallel notices an exit only while
    its event loop runs, which in a script is only during its own calls."""
    process = process if isinstance(process, psutil.Process) else getattr(process, "process", None)
    try:
        return process is not None and process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass
class Found:
    """One cluster file, read back: ``cluster`` while its controller runs, else None (``message`` says
    what was removed)."""

    cluster: ipp.Cluster | None = None
    raw: dict = field(default_factory=dict)
    message: str = ""

    @property
    def engine_sets(self) -> list:
        return list(self.cluster.engines.values()) if self.cluster is not None else []

    @property
    def expected(self) -> int | None:
        """How many engines its engine sets started."""
        return sum(s.n for s in self.engine_sets) or None

    @property
    def engines_gone(self) -> bool:
        """The file lists engine sets and none of them runs (a batch job's: by its Slurm state)."""
        return bool(self.raw.get("engines", {}).get("sets")) and not any(
            jobs.active(s.job_id) if getattr(s, "job_id", "") else running(s) for s in self.engine_sets)


@contextlib.contextmanager
def _working_dir(path: str):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def load(pdir: str, cluster_id: str, log: logging.Logger) -> Found:
    """Read one cluster file through ipyparallel, which drops what has stopped; a cluster whose controller
    is gone is stale: what still runs of it is stopped and its files are removed."""
    path = cluster_file(pdir, cluster_id)
    try:
        with open(path) as f:
            raw = json.load(f)
        with _working_dir(pdir):  # ipyparallel (9.x) builds a Slurm launcher's log path before its profile is
            cluster = ipp.Cluster.from_file(path, log=log, profile_dir=pdir)   # set: "log/" in the cwd (my-work/)
    except FileNotFoundError:
        return Found()
    except (OSError, ValueError, ImportError) as exc:
        remove([path, _record_file(pdir, cluster_id), *connection_files(pdir, cluster_id)])
        return Found(message=f"removed the unreadable cluster file {path} ({exc})")
    cluster.cluster_file = ""  # a copy for reading: its watcher threads must not rewrite the file later
    if running(cluster.controller):  # (not a zombie, which ipyparallel counts as running)
        return Found(cluster, raw)
    stop(cluster, log, polite=False)
    pid = raw.get("controller", {}).get("state", {}).get("pid", "?")
    return Found(message=f"removed the stale cluster file {path}: its controller (pid {pid}) is no longer running")


def wait_gone(processes: list, timeout: float) -> list:
    """The processes still running after up to ``timeout`` seconds. Polls ``running`` rather than calling
    psutil.wait_procs: psutil 7.2's wait opens a pidfd, which fails with ENOENT or EINVAL when the process ends
    during the call on recent kernels (psutil issue 2715), and a stop must not fail because its target ended."""
    end = time.monotonic() + timeout
    left = [p for p in processes if running(p)]
    while left and time.monotonic() < end:
        time.sleep(0.05)
        left = [p for p in left if running(p)]
    return left


def _leftovers(pdir: str, cluster_id: str) -> list[psutil.Process]:
    """This user's processes of one cluster, wherever their parent is (the schedulers of a killed controller):
    ipyparallel gives each process it starts IPP_PROFILE_DIR and IPP_CLUSTER_ID."""
    found = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        try:
            if process.info["uids"].real == os.getuid() and process.pid != os.getpid() \
                    and "ipyparallel" in " ".join(process.info["cmdline"] or []):
                env = process.environ()
                if env.get("IPP_PROFILE_DIR") == pdir and env.get("IPP_CLUSTER_ID") == cluster_id:
                    found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return found


def stop(cluster: ipp.Cluster, log: logging.Logger, polite: bool = True) -> None:
    """Stop a cluster and remove its files: politely first (no signal handlers printing), then TERM and, after
    ``KILL_GRACE_S``, KILL. A Slurm job is cancelled through ipyparallel (scancel: it ends CANCELLED, not FAILED as
    after a polite shutdown); local processes are signalled here, as ipyparallel's launchers wait a minute
    for a zombie that is not their child."""
    pdir, cluster_id, path = cluster.profile_dir, cluster.cluster_id, cluster.cluster_file
    cluster.cluster_file = ""
    launchers = [launcher for launcher in [cluster.controller, *cluster.engines.values()] if launcher]
    processes = [launcher.process for launcher in launchers if getattr(launcher, "process", None)]
    processes += [p for p in _leftovers(pdir, cluster_id) if p not in processes]
    batch = [set_id for set_id, s in cluster.engines.items() if getattr(s, "job_id", "")]
    for set_id in batch:
        cluster.engines[set_id].output_file = ""  # a job's log is named in messages: kept
        try:
            cluster.stop_engines_sync(set_id)
        except Exception as exc:  # noqa: BLE001 - e.g. a job that has ended already
            log.info("cancelling engine set %s of %r: %s", set_id, cluster_id, exc)
    if polite and not batch and cluster.controller is not None and cluster.controller.state == "running":
        try:
            client = cluster.connect_client_sync(timeout=3)
            client.shutdown(targets="all", hub=True, block=False)
            client.close()
            wait_gone(processes, timeout=3)
        except Exception as exc:  # noqa: BLE001 - busy or dead engines: the signals below end them
            log.info("polite shutdown of %r failed: %s", cluster_id, exc)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in processes if running(p)]
        for process in left:
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        if not wait_gone(left, timeout=KILL_GRACE_S):
            break
    for launcher in launchers:
        text = launcher.get_output(remove=True) if getattr(launcher, "output_file", "") else ""
        log.info("output of %s:\n%s", type(launcher).__name__, text[-20000:]) if text else None
    remove([path or cluster_file(pdir, cluster_id), _record_file(pdir, cluster_id), *connection_files(pdir, cluster_id),
            os.path.join(pdir, "log", f"engines{cluster_id}.json")])  # (ipyparallel never removes the last one)


def dead_rank(pdir: str, cluster_id: str, rank_of: dict[int, int]) -> str | None:
    """Which rank's death ended a cluster's MPI engine set (``rank_of``: engine id -> rank), from its logs:
    Open MPI names the rank. MPICH's mpiexec does not (its "BAD TERMINATION" names some process of the job,
    not always the one that died first), so the controller's log says whose nanny reported its engine gone
    first; MPICH ends the others at once, so that may be another rank, and the message says only that."""
    try:
        with open(cluster_file(pdir, cluster_id)) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    sets = raw.get("engines", {}).get("sets", {}).values()
    ompi = re.search(r"process rank (\d+) with PID (\d+)[^\n]*?(exited on signal \d+[^\n]*)?\n",
                     "\n".join(jobs.read_tail(s.get("output_file", ""), 20000) for s in sets))
    if ompi:
        how = f" ({ompi.group(3).strip()})" if ompi.group(3) else ""
        return f"rank {ompi.group(1)} (pid {ompi.group(2)}) died{how} and MPI ended the other ranks"
    controller = jobs.read_tail(raw.get("controller", {}).get("state", {}).get("output_file", ""), 20000)
    for engine in re.findall(r"unregister_engine\((\d+)\)", controller):
        if int(engine) in rank_of:
            return f"rank {rank_of[int(engine)]} was the first reported gone, and MPI ended the other ranks"
    return None
