"""The ipyparallel clusters of one IPython profile, as hpclab sees them.

ipyparallel records each running cluster in ``<profile>/security/cluster-<id>.json``
(its controller and engine-set processes). Two kinds matter here:

* the **shared** cluster, id ``""``: what ``ipcluster start``, ``hpclab cluster start``
  or a batch job started, outside any notebook; notebooks claim it one at a time;
* **private** clusters, ids ``hpclab-<pid>-<token>``: started by one notebook for itself.

Beside each, hpclab keeps ``hpclab-cluster-<id>.json``: the owner (the notebook's
host, kernel pid and its start time, a token) and the engines' ranks and pids.
This module finds clusters, tells live from stale ones (every process gone) and
from orphans (a private cluster whose notebook is gone), and stops them.
"""
from __future__ import annotations

import glob
import json
import logging
import logging.handlers
import os
import re
import signal
import socket
import time
from dataclasses import dataclass, field

import ipyparallel as ipp
import psutil

from hpclab import slurm

SHARED_ID = ""
PRIVATE_PREFIX = "hpclab-"


def profile_dir(profile: str) -> str:
    from IPython.paths import get_ipython_dir

    path = os.path.join(get_ipython_dir(), f"profile_{profile}")
    for sub in ("security", "log"):
        os.makedirs(os.path.join(path, sub), exist_ok=True)
    return path


def log_path(pdir: str) -> str:
    return os.path.join(pdir, "log", "hpclab-clusters.log")


def quiet_log(pdir: str) -> logging.Logger:
    """A logger that writes only to ``<profile>/log/hpclab-clusters.log``.

    ipyparallel's launchers log there what the controller and engines printed
    (up to 100 lines each when they stop), instead of into the notebook."""
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


def record_file(pdir: str, cluster_id: str) -> str:
    return os.path.join(pdir, "security", f"hpclab-cluster-{cluster_id}.json")


def connection_files(pdir: str, cluster_id: str) -> list[str]:
    stem = "ipcontroller" + (f"-{cluster_id}" if cluster_id else "")
    return [os.path.join(pdir, "security", f"{stem}-{kind}.json") for kind in ("client", "engine")]


def cluster_ids(pdir: str) -> list[str]:
    pattern = os.path.join(pdir, "security", "cluster-*.json")
    return sorted(os.path.basename(p)[len("cluster-"):-len(".json")] for p in glob.glob(pattern))


def read_record(pdir: str, cluster_id: str) -> dict:
    try:
        with open(record_file(pdir, cluster_id)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def write_record(pdir: str, cluster_id: str, record: dict) -> None:
    path = record_file(pdir, cluster_id)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)


def _remove(paths: list[str]) -> list[str]:
    removed = []
    for path in paths:
        try:
            os.remove(path)
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


# --- owners -------------------------------------------------------------------------------------

def this_process() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def alive(owner: dict) -> bool | None:
    """Whether the process of an owner record still runs; None when it ran on another host."""
    if owner.get("host") != socket.gethostname():
        return None
    try:
        process = psutil.Process(owner["pid"])
        same = abs(process.create_time() - owner.get("started", process.create_time())) < 1
        return same and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def describe_owner(owner: dict) -> str:
    since = time.strftime("%H:%M", time.localtime(owner.get("since", 0)))
    return f"the notebook with kernel pid {owner.get('pid')} on {owner.get('host')} (since {since})"


def _private_pid(cluster_id: str) -> int | None:
    match = re.match(rf"{PRIVATE_PREFIX}(\d+)-", cluster_id)
    return int(match.group(1)) if match else None


def orphaned(pdir: str, cluster_id: str) -> dict | None:
    """The owner record of a private cluster whose notebook is gone, else None."""
    if not cluster_id.startswith(PRIVATE_PREFIX):
        return None
    owner = read_record(pdir, cluster_id).get("owner")
    if owner is None:  # no record: judge by the pid in the id
        pid = _private_pid(cluster_id)
        if pid is None or psutil.pid_exists(pid):
            return None
        return {"pid": pid, "host": socket.gethostname()}
    return owner if alive(owner) is False else None


# --- clusters -----------------------------------------------------------------------------------

def _processes(launcher) -> list[psutil.Process]:
    """The local processes of a launcher (none for batch-job launchers)."""
    if launcher is None:
        return []
    if getattr(launcher, "process", None) is not None:
        return [launcher.process]
    return [p for sub in getattr(launcher, "launchers", {}).values() for p in _processes(sub)]


def _running(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running; a zombie (exited, its parent gone and not yet reaped) is not."""
    left = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except psutil.NoSuchProcess:
            pass
    return left


def _wait_gone(processes: list[psutil.Process], seconds: float) -> list[psutil.Process]:
    end = time.monotonic() + seconds
    while (left := _running(processes)) and time.monotonic() < end:
        time.sleep(0.1)
    return left


def _leftovers(pdir: str, cluster_id: str) -> list[psutil.Process]:
    """This user's ipyparallel processes of one cluster, wherever their parent is: the
    controller's schedulers outlive a controller that was killed. ipyparallel gives every
    process it starts IPP_PROFILE_DIR and IPP_CLUSTER_ID."""
    found = []
    for process in psutil.process_iter(["uids", "cmdline"]):
        try:
            if process.info["uids"].real != os.getuid() or process.pid == os.getpid() \
                    or "ipyparallel" not in " ".join(process.info["cmdline"] or []):
                continue
            env = process.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("IPP_PROFILE_DIR") == pdir and env.get("IPP_CLUSTER_ID") == cluster_id:
            found.append(process)
    return found


def _alive(launcher) -> bool:
    """Whether a launcher's processes still run; a Slurm job's (no local process): whether the job
    is queued or running; another batch system's: assumed so."""
    if launcher is None:
        return False
    processes = _processes(launcher)
    if processes:
        return bool(_running(processes))
    job = getattr(launcher, "job_id", "")
    if job and "slurm" in f"{type(launcher).__module__}.{type(launcher).__name__}".lower():
        return slurm.job_is_active(job)
    return True


def controller_host(pdir: str, cluster_id: str) -> str | None:
    """Where the cluster's controller runs, from its connection file ("location")."""
    try:
        with open(connection_files(pdir, cluster_id)[0]) as f:
            return json.load(f).get("location") or None
    except (OSError, ValueError):
        return None


def _here(host: str | None) -> bool:
    return not host or host in (socket.gethostname(), socket.getfqdn(), "localhost") or host.startswith("127.")


@dataclass
class Found:
    """One cluster file: ``state`` is "none" (no file), "stale" (its controller is gone;
    the files were removed, ``message`` says which) or "running". A cluster whose controller
    runs on another host (e.g. inside a batch job) has ``cluster`` None and ``host`` set:
    the processes its file records are that host's, so only its controller can say how it is."""

    cluster_id: str
    state: str
    cluster: ipp.Cluster | None = None
    raw: dict = field(default_factory=dict)
    message: str = ""
    host: str | None = None
    profile_dir: str = ""

    def connect(self, timeout: float) -> ipp.Client:
        if self.cluster is not None:
            return self.cluster.connect_client_sync(timeout=timeout)
        return ipp.Client(profile_dir=self.profile_dir, cluster_id=self.cluster_id, timeout=timeout)

    @property
    def live_sets(self) -> list:
        """Engine sets still running; on another host, those recorded (they cannot be checked)."""
        if self.cluster is None:
            return list(self.raw.get("engines", {}).get("sets", {}).values())
        return [s for s in self.cluster.engines.values() if _alive(s)]

    @property
    def expected(self) -> int | None:
        """How many engines the running engine sets started, if they say; for an engine job
        (its controller and engines run in one Slurm job, no engine set recorded), the job's."""
        counts = [s.get("n") if isinstance(s, dict) else getattr(s, "n", None) for s in self.live_sets]
        if not counts and slurm.controller_job_id(self.raw):
            counts = [self.raw.get("cluster", {}).get("n")]
        return sum(counts) if counts and all(isinstance(c, int) for c in counts) else None

    @property
    def engines_gone(self) -> bool:
        """The file lists engine sets but none of them runs any more."""
        return bool(self.raw.get("engines", {}).get("sets")) and not self.live_sets

    def engine_logs(self) -> list[str]:
        sets = self.raw.get("engines", {}).get("sets", {})
        return [s["output_file"] for s in sets.values() if s.get("output_file")]


def load(pdir: str, cluster_id: str, log: logging.Logger) -> Found:
    """Read one cluster file; a stale one (controller gone) is removed with its connection files."""
    path = cluster_file(pdir, cluster_id)
    try:
        with open(path) as f:
            raw = json.load(f)
    except FileNotFoundError:
        return Found(cluster_id, "none")
    except (OSError, ValueError) as exc:
        _remove([path, *connection_files(pdir, cluster_id)])
        return Found(cluster_id, "stale", message=f"removed the unreadable cluster file {path} ({exc})")
    host = controller_host(pdir, cluster_id)
    if not _here(host):  # loading it here would check (and drop) this host's processes of the same pids
        return Found(cluster_id, "running", None, raw, host=host, profile_dir=pdir)
    # ipyparallel checks each recorded process; those that are gone are dropped. (profile_dir:
    # the profile's own configuration, e.g. its Slurm batch template, for engines started again)
    cluster = ipp.Cluster.from_file(path, log=log, profile_dir=pdir)
    # This copy is for reading: its watcher threads must not rewrite the file later
    # (whoever starts engines through it sets ``cluster_file`` back).
    cluster.cluster_file = ""
    if _alive(cluster.controller):
        return Found(cluster_id, "running", cluster, raw, profile_dir=pdir)
    pid = raw.get("controller", {}).get("state", {}).get("pid", "?")
    job = slurm.controller_job_id(raw)
    stop(cluster, log, polite=False)  # engines without their controller cannot be used
    _remove([path, *connection_files(pdir, cluster_id)])
    why = f"its controller's {slurm.job_report(job)}" if job else f"its controller (pid {pid}) is no longer running"
    return Found(cluster_id, "stale", raw=raw, profile_dir=pdir,
                 message=f"removed the stale cluster file {path}: {why}")


def dead_rank_note(engine_output: str, controller_output: str, rank_of: dict[int, int]) -> str | None:
    """Which rank's death ended an MPI engine set (``rank_of``: engine id -> rank).

    Open MPI names the rank. MPICH names only some process of the job, so the controller's
    log is read instead: the engine whose nanny reported its death first is the one that died;
    MPI then ended the others."""
    ompi = re.search(r"process rank (\d+) with PID (\d+)[^\n]*?(exited on signal \d+[^\n]*)?\n", engine_output)
    if ompi:
        how = f" ({ompi.group(3).strip()})" if ompi.group(3) else ""
        return f"rank {ompi.group(1)} (pid {ompi.group(2)}) died{how} and MPI ended the other ranks"
    for engine in re.findall(r"unregister_engine\((\d+)\)", controller_output):
        if int(engine) in rank_of:
            return f"rank {rank_of[int(engine)]} died first and MPI ended the other ranks"
    return None


def stop(cluster: ipp.Cluster, log: logging.Logger, grace: float = 2.0, polite: bool = True) -> None:
    """Stop a cluster and remove its files. First, if ``polite``, ask engines and controller
    to shut down (they exit cleanly, no signal handlers printing); then TERM what remains
    and, after ``grace`` s, KILL it. What they printed goes to the hpclab log.

    Local processes are signalled here rather than by ipyparallel's launchers, which wait
    up to a minute for a process that is not their child and has become a zombie."""
    pdir, cluster_id, path = cluster.profile_dir, cluster.cluster_id, cluster.cluster_file
    cluster.cluster_file = ""  # ipyparallel's watcher threads must not write it again once removed
    launchers = [launcher for launcher in [cluster.controller, *cluster.engines.values()] if launcher]
    for launcher in launchers:  # a batch job's log is its record, named in messages: ipyparallel must not
        if getattr(launcher, "job_id", ""):  # remove it when the job is cancelled (nor this function)
            launcher.output_file = ""
    processes = [p for launcher in launchers for p in _processes(launcher)]
    processes += [p for p in _leftovers(pdir, cluster_id) if p not in processes]
    # Engine sets that are batch jobs (no local process) are cancelled first, through ipyparallel's
    # launchers (scancel): the job then ends CANCELLED, not FAILED as it would after a polite
    # shutdown of its engines (srun sees them exit non-zero).
    # (Their engines then never answer a polite shutdown, which would wait for them: none is sent.)
    batch = [engine_set_id for engine_set_id, engine_set in cluster.engines.items() if not _processes(engine_set)]
    for engine_set_id in batch:
        try:
            cluster.stop_engines_sync(engine_set_id)
        except Exception as exc:  # noqa: BLE001 - e.g. a job that has ended already
            log.info("cancelling engine set %s of %r: %s", engine_set_id, cluster_id, exc)
    # A controller that is itself a batch job (engines started inside that job) is cancelled too:
    # a polite shutdown makes its srun step exit non-zero and the job end FAILED.
    controller_job = cluster.controller is not None and not _processes(cluster.controller)
    if polite and not batch and not controller_job and _alive(cluster.controller):
        try:
            client = cluster.connect_client_sync(timeout=3)
            client.shutdown(targets="all", hub=True, block=False)
            client.close()
            _wait_gone(processes, 3)  # engines exit in ~2 s; mpiexec waits for their nannies too
        except Exception as exc:  # noqa: BLE001 - busy or dead engines: the signals below end them
            log.info("polite shutdown of %r failed: %s", cluster.cluster_id, exc)
    _terminate(processes, grace)
    try:  # a controller in a batch job (no local process): its launcher cancels the job
        if controller_job:
            cluster.stop_controller_sync()
    except Exception as exc:  # noqa: BLE001
        log.warning("stopping cluster %r: %s", cluster_id, exc)
    for output in [f for launcher in launchers for f in _output_files(launcher)]:
        text = _read_file(output)
        if text:
            log.info("output of %s:\n%s", os.path.basename(output), text[-20000:])
        _remove([output])
    # (ipyparallel never removes the controller's engine-state file itself)
    _remove([path or cluster_file(pdir, cluster_id), record_file(pdir, cluster_id),
             *connection_files(pdir, cluster_id), os.path.join(pdir, "log", f"engines{cluster_id}.json")])


def _terminate(processes: list[psutil.Process], grace: float) -> None:
    """TERM, and KILL what is still running after ``grace`` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for process in _running(processes):
            try:
                process.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        if not _wait_gone(processes, grace):
            break


def end_engine_sets(cluster: ipp.Cluster, grace: float = 2.0) -> None:
    """Make sure no local engine set of ``cluster`` still runs (e.g. an mpiexec whose ranks
    were killed, still exiting), so that new engines are not mistaken for old ones."""
    _terminate([p for engine_set in cluster.engines.values() for p in _processes(engine_set)], grace)


def stop_remote(found: Found, log: logging.Logger) -> str:
    """Stop a cluster whose controller runs on another host: ask it to shut down with its
    engines; if it does not answer, its files are left over (e.g. its job has ended)."""
    name = "the shared cluster" if found.cluster_id == SHARED_ID else found.cluster_id
    pdir = found.profile_dir
    files = [cluster_file(pdir, found.cluster_id), record_file(pdir, found.cluster_id),
             *connection_files(pdir, found.cluster_id)]
    job = slurm.recorded_job_id(found.raw)
    try:
        client = found.connect(timeout=5)
    except Exception as exc:  # noqa: BLE001 - "Hub connection request timed out"
        _remove(files)
        if job:
            done = "cancelled" if slurm.cancel(job) else "could not cancel (it has ended?)"
            return (f"removed the files of {name}: its controller on {found.host} does not answer; "
                    f"{done} Slurm job {job}")
        return (f"removed the files of {name}: its controller on {found.host} does not answer ({exc}); "
                "if its batch job is still queued or running, cancel it (e.g. scancel)")
    client.shutdown(targets="all", hub=True, block=False)
    client.close()
    _remove(files)
    log.info("asked %s on %s to shut down", name, found.host)
    return f"asked {name} on {found.host} to shut down with its engines"


def _output_files(launcher) -> list[str]:
    own = [launcher.output_file] if getattr(launcher, "output_file", "") else []
    return own + [p for sub in getattr(launcher, "launchers", {}).values() for p in _output_files(sub)]


def _read_file(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def sweep(pdir: str, log: logging.Logger) -> list[str]:
    """Stop the private clusters whose notebook is gone; say what was stopped."""
    notes = []
    for cluster_id in cluster_ids(pdir):
        owner = orphaned(pdir, cluster_id)
        if owner is None:
            continue
        found = load(pdir, cluster_id, log)
        if found.state == "running" and found.cluster is not None:
            stop(found.cluster, log, polite=False)
            notes.append(f"stopped cluster {cluster_id}, left running by a notebook that is gone "
                         f"(kernel pid {owner.get('pid')})")
        elif found.state == "stale":
            notes.append(found.message)
    return notes


# --- for `hpclab cluster status` and `hpclab cluster stop` ----------------------------------------

def status_lines(pdir: str, log: logging.Logger) -> list[str]:
    lines = []
    for cluster_id in cluster_ids(pdir):
        found = load(pdir, cluster_id, log)
        name = "shared cluster (id '')" if cluster_id == SHARED_ID else f"private cluster {cluster_id}"
        if found.state != "running":
            lines.append(f"{name}: {found.message}")
            continue
        owner = read_record(pdir, cluster_id).get("owner")
        up = _engines_up(found)
        engines = f"{up} of {found.expected or '?'} engines up"
        if owner is None:
            who = "free" if cluster_id == SHARED_ID else "no owner recorded"
        else:
            state = {True: "", False: " - gone: an orphan", None: " (on another host)"}[alive(owner)]
            who = f"{'claimed by' if cluster_id == SHARED_ID else 'started by'} {describe_owner(owner)}{state}"
        job = slurm.EngineJob.of(found.cluster, found.raw)
        lines.append(f"{name}: {engines}; {who}" + (f"; {job.report()}" if job is not None else ""))
    return lines or [f"no clusters in {pdir}"]


def _engines_up(found: Found) -> str:
    try:
        client = found.connect(timeout=3)
    except Exception:  # noqa: BLE001
        return "? (the controller does not answer)"
    try:
        return str(len(client.ids))
    finally:
        client.close()


def stop_lines(pdir: str, log: logging.Logger, everything: bool = False) -> list[str]:
    """Stop the shared cluster and every orphan; private clusters of live notebooks only with
    ``everything`` (they belong to notebooks that are still open)."""
    lines = []
    for cluster_id in cluster_ids(pdir):
        owner = read_record(pdir, cluster_id).get("owner")
        in_use = cluster_id.startswith(PRIVATE_PREFIX) and owner is not None and alive(owner) is not False
        if in_use and not everything:
            lines.append(f"left private cluster {cluster_id}: it belongs to {describe_owner(owner)}, "
                         "which is still open (close it there, or use --all)")
            continue
        found = load(pdir, cluster_id, log)
        if found.state == "running" and found.cluster is None:
            lines.append(stop_remote(found, log))
        elif found.state == "running":
            stop(found.cluster, log)
            lines.append(f"stopped {'the shared cluster' if cluster_id == SHARED_ID else cluster_id}")
        elif found.state == "stale":
            lines.append(found.message)
    return lines or [f"no clusters in {pdir}"]
