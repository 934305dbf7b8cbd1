"""MPI engines for a notebook (ipyparallel): each notebook gets engines of its own.

    session = hpclab.cluster.connect(n=4)   # in a notebook
    %%px                                    # cells now run on every MPI rank
    ...
    session.restart()                       # a %%px cell hangs: replace the engines
    session.close()                         # give the engines back (or stop them)

**Who owns the engines.** Engines belong to exactly one notebook (kernel) at a time.

1. The *shared* cluster of a profile is one started outside any notebook:
   ``hpclab cluster start``, ``ipcluster start --engines=MPI -n 4 --daemonize``, or engines
   started as a batch job. If it is free, ``connect`` claims it: it sets an owner record
   (host, kernel pid, a random token) on every engine, rank 0 first; an engine runs one
   request at a time, so of two notebooks claiming at once exactly one wins. The engines'
   namespace is emptied on claim, so no name of an earlier notebook is seen. A claim whose
   notebook is gone is taken over, with a message.
2. If the shared cluster is claimed by another open notebook, has a dead engine, or there is
   none, ``connect`` starts a *private* cluster for this notebook (cluster id
   ``hpclab-<pid>-<token>``, not the profile's default one) and says why.
3. A private cluster is stopped by ``session.close()``, at the kernel's exit, and when the
   kernel is killed: ipyparallel stops clusters only at a normal exit and its controller
   and engines have no option to follow a parent process, so a small watcher process
   (``hpclab.reaper``) stops the cluster within about a second of the kernel's end.
4. ``session.close()`` on the shared cluster releases the claim (the namespace is emptied);
   the engines keep running for the next notebook. ``hpclab cluster stop`` stops the shared
   cluster and clusters left behind (``hpclab cluster status`` lists them).

``connect`` says what it found and what it did, waits for all ``n`` engines with
ipyparallel's progress bar until ``timeout``, removes stale cluster files (a cluster whose
processes were all killed) with a message, and replaces a dead private cluster. The
controller's and engines' output goes to files under ``<profile>/log`` (quiet notebooks);
errors quote it with its path.

**Engines from Slurm** (:mod:`hpclab.slurm`). A profile written by ``hpclab cluster init
--slurm`` starts a private cluster's engines as one Slurm job (its controller stays here);
``connect`` says which job, shows the job's state on the progress bar, waits long enough for
a queue, and, when the job ends first or is still queued at the deadline, stops with the job,
the cause, the fix and the job's log (the job is cancelled). ``session.close()`` cancels the
job. Engines of a batch job (``sbatch slurm/ipcluster_engines.sbatch``) are a shared cluster;
``connect`` names their job. Without a Slurm profile, engines are started on this machine only
where :func:`hpclab.slurm.login_node_guard` allows it: never on a login node.

A ``%%px`` cell that hangs (e.g. every rank in ``Recv`` before any ``Send``: the engines
ignore the interrupt) is recovered by interrupting the kernel and running
``session.restart()``; ``session.deadline(seconds)`` interrupts such cells by itself.
Errors in ``%%px`` cells are shown once for all ranks (``hpclab.px_cells``).

Starting engines goes through ``ipp.Cluster`` with the profile's own configuration;
:func:`launch_plan` decides whether and how engines may be started from here.
Engine ids are not MPI ranks (ipyparallel #238): the view is ordered by the ranks the
engines report.
"""
from __future__ import annotations

import atexit
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import ipyparallel as ipp
import psutil
from ipyparallel.cluster import launcher as ipp_launcher

from hpclab import engine_owner, profile_clusters, px_cells, slurm
from hpclab.profile_clusters import SHARED_ID, PRIVATE_PREFIX

_ENGINE_SETUP = (
    "import hpclab.backend as _hb, hpclab.device as _hd\n"
    "_hb.select()\n"
    "_hd.select_gpu()\n"
)
# Engines register on the controller's heartbeat; ipyparallel's 3 s period makes that ~6 s.
HEARTBEAT_MS = 1000
PROBE_S = 5          # an engine that does not answer a trivial request in this time is dead or stuck
LOCAL_TIMEOUT_S = 60  # waiting for local engines; a Slurm job's engines get longer (slurm.deadline: it may queue)
KILL_GRACE_S = 2     # restart: TERM, then KILL after this

_SESSIONS: dict[str, "Session"] = {}   # profile dir -> this process's open session


class ClusterError(RuntimeError):
    """Engines could not be started or used."""


def _say(message: str) -> None:
    print(f"hpclab: {message}", flush=True)


def _interactive() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


# --- starting engines --------------------------------------------------------------------------

def _profile_name(pdir: str) -> tuple[str, str]:
    """(profile name, IPython directory) of a profile directory."""
    return os.path.basename(pdir).removeprefix("profile_"), os.path.dirname(pdir)


def launch_plan(cluster: ipp.Cluster, n: int) -> str:
    """Decide whether and how this process may start ``n`` engines for ``cluster``;
    return how, in words, for the messages. Raise :class:`ClusterError` to refuse.

    The profile's own configuration wins: a Slurm profile (``hpclab cluster init --slurm``)
    submits the engines as one Slurm job; another ``c.Cluster.engine_launcher_class`` starts
    them through that launcher. Without one, engines are MPI processes on this machine under
    ``mpiexec``, unless this is a login node (:func:`hpclab.slurm.login_node_guard`).
    """
    profile, ipython_dir = _profile_name(cluster.profile_dir)
    if slurm.profile_is_slurm(profile, ipython_dir):
        return slurm.job_plan(profile, n, ipython_dir)
    if "engine_launcher_class" in cluster.config.get("Cluster", {}):
        name = ipp_launcher.abbreviate_launcher_class(cluster.engine_launcher_class)
        return f"{n} engines through the profile's {name!r} engine launcher"
    refusal = slurm.login_node_guard(profile, ipython_dir)
    if refusal:
        raise ClusterError(f"no engines were started: {refusal}")
    cluster.engine_launcher_class = "mpi"
    return f"{n} MPI engines on this machine (mpiexec)"


def _mpi_env() -> None:
    """Let Open MPI run where login nodes and containers need it; harmless for MPICH."""
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    # ipyparallel runs `mpiexec` from PATH: prefer the one beside this Python
    # (the mpich wheel in a virtual environment), as mpi4py here was built for it.
    here = os.path.dirname(sys.executable)
    if os.path.exists(os.path.join(here, "mpiexec")) and here not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = here + os.pathsep + os.environ.get("PATH", "")
    # The engines must be able to import hpclab even when it is not installed.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.environ.get("PYTHONPATH", "")
    if root not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = root + (os.pathsep + path if path else "")


def _new_cluster(pdir: str, cluster_id: str, n: int, log) -> ipp.Cluster:
    cluster = ipp.Cluster(profile_dir=pdir, cluster_id=cluster_id, n=n, log=log, shutdown_atexit=False)
    cluster.controller_args = [*cluster.controller_args, f"--HeartMonitor.period={HEARTBEAT_MS}"]
    return cluster


def _log_tail(cluster: ipp.Cluster, lines: int = 30) -> str:
    out = []
    for engine_set in cluster.engines.values():
        try:
            text = engine_set.get_output()
        except Exception:  # noqa: BLE001
            text = ""
        if isinstance(text, dict):
            text = "\n".join(str(v) for v in text.values())
        out.extend(str(text).splitlines()[-lines:])
    return "\n".join(out) or "(the engines wrote no output)"


def _exit_code(engine_sets) -> int | None:
    """The exit code of an engine set's launcher process (mpiexec) if it has ended."""
    for engine_set in engine_sets:
        process = getattr(engine_set, "process", None)
        if process is None:
            continue
        try:
            code = process.wait(timeout=0)
        except psutil.TimeoutExpired:
            if process.status() != psutil.STATUS_ZOMBIE:  # (a zombie that is not our child has exited)
                continue
            code = None
        except psutil.NoSuchProcess:  # already reaped by ipyparallel's watcher
            code = None
        return -1 if code is None else code
    return None


def _wait_for_engines(engine_sets, client: ipp.Client, n: int, timeout: float | None,
                      job: slurm.EngineJob | None = None) -> None:
    """Wait for n engines with ipyparallel's progress bar, but notice at once when the
    mpiexec of one of ``engine_sets`` has exited (the sync API only notices at the timeout),
    or when the Slurm ``job`` of the engines has ended (:class:`hpclab.slurm.JobEnded`).
    A job's state is the bar's text, and each change of it is said. ``timeout`` None: 60 s,
    for a job ``job.deadline_s`` (it may queue first)."""
    if timeout is None:
        timeout = job.deadline_s if job is not None else LOCAL_TIMEOUT_S
    bar = ipp.util.progress(widget=None, initial=len(client.ids), total=n, unit="engine",
                            disable=not _interactive() and not sys.stderr.isatty())
    deadline = time.monotonic() + timeout
    try:
        while len(client.ids) < n:
            code = _exit_code(engine_sets)
            if code is not None:
                raise ipp.error.EngineError(f"mpiexec exited with code {code} before the engines registered")
            changed = job.check() if job is not None else None
            if changed:
                _say(f"{changed}; {len(client.ids)} of {n} engines up")
                bar.set_description_str(job.text)
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(client.ids)} of {n} engines registered in {timeout:.0f} s")
            try:
                client.wait_for_engines(n, timeout=0.5, interactive=False)
            except TimeoutError:
                pass
            bar.update(len(client.ids) - bar.n)
    finally:
        bar.close()


def _launch(cluster: ipp.Cluster, n: int, timeout: float | None, log, started=None) -> ipp.Client:
    """Start the controller and n engines of ``cluster`` and wait for all of them;
    ``started(cluster)`` is called as soon as they are started (before the wait)."""
    _mpi_env()
    job = None
    try:
        cluster.start_controller_sync()
        cluster.start_engines_sync(n)
        if started is not None:
            started(cluster)
        job = slurm.EngineJob.of(cluster)
        if job is not None:
            _say(f"submitted Slurm job {job.job_id} for the engines; waiting up to "
                 f"{timeout or job.deadline_s:.0f} s for them (the job may queue first)")
        client = cluster.connect_client_sync()
        _wait_for_engines(list(cluster.engines.values()), client, n, timeout, job)
        if job is not None:
            _say(f"{n} of {n} engines up in {job.report()}")
    except subprocess.CalledProcessError as exc:  # the batch system's submit command refused the job
        why = slurm.submit_failure(cluster)
        profile_clusters.stop(cluster, log, polite=False)
        raise ClusterError(f"{n} engines did not start: {why}") from exc
    except slurm.JobEnded as exc:
        profile_clusters.stop(cluster, log, polite=False)
        raise ClusterError(f"{n} engines did not start: {exc}") from None
    except (ipp.error.EngineError, TimeoutError, OSError) as exc:
        if job is not None:  # asked before the job is cancelled, while Slurm still says why it waits
            why = job.at_deadline(str(exc))
            profile_clusters.stop(cluster, log, polite=False)
            raise ClusterError(f"{n} engines did not start: {why}") from None
        tail = _log_tail(cluster)
        profile_clusters.stop(cluster, log, polite=False)
        raise ClusterError(
            f"{n} MPI engines did not start ({exc}).\n--- engine log (last lines) ---\n{tail}\n---\n"
            f"Full log: {profile_clusters.log_path(cluster.profile_dir)}\n"
            "Check that `mpiexec -n 2 python -c 'from mpi4py import MPI'` works in this "
            "environment (install MPI with `pip install \"hpclab[mpi]\"` or `module load openmpi`), "
            "or start engines yourself: `hpclab cluster start -n 4` (or "
            "`ipcluster start --engines=MPI -n 4 --daemonize`)."
        ) from exc
    return client


def _start_reaper(cluster: ipp.Cluster) -> subprocess.Popen:
    me = profile_clusters.this_process()
    with open(os.devnull, "rb") as stdin, open(profile_clusters.log_path(cluster.profile_dir), "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "hpclab.reaper", str(me["pid"]), repr(me["started"]), cluster.cluster_file],
            stdin=stdin, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


# --- the shared cluster ------------------------------------------------------------------------

@dataclass
class SharedCluster:
    """The profile's shared cluster as ``start_shared`` left it; ``stop`` stops it only if
    ``start_shared`` started it."""

    cluster: ipp.Cluster
    started: bool

    def stop(self) -> None:
        if self.started:
            profile_clusters.stop(self.cluster, profile_clusters.quiet_log(self.cluster.profile_dir))
            self.started = False


def start_shared(n: int = 4, profile: str = "default", timeout: float | None = None) -> SharedCluster:
    """Start the profile's shared cluster, which notebooks claim one at a time and which
    outlives this process (``hpclab cluster start``); or find it already running. Waits up to
    ``timeout`` s for its engines (default 120; for a Slurm profile's job 600, it may queue)."""
    pdir = profile_clusters.profile_dir(profile)
    if timeout is None and not slurm.profile_is_slurm(*_profile_name(pdir)):
        timeout = 120
    log = profile_clusters.quiet_log(pdir)
    found = profile_clusters.load(pdir, SHARED_ID, log)
    if found.state == "stale":
        _say(found.message)
    elif found.state == "running":
        if found.engines_gone:
            raise ClusterError(f"the shared cluster of profile {profile!r} is running but its engines "
                               "have exited; stop it with `hpclab cluster stop`, then start it again")
        _say(f"the shared cluster of profile {profile!r} is already running "
             f"({found.expected or '?'} engines); `hpclab cluster stop` stops it")
        return SharedCluster(found.cluster, started=False)
    leftovers = [p for p in profile_clusters.connection_files(pdir, SHARED_ID) if os.path.exists(p)]
    for path in leftovers:  # a new controller must not be mistaken for the old one (ipyparallel reads these)
        os.remove(path)
        _say(f"removed {path}, left by a cluster that is no longer running")
    cluster = _new_cluster(pdir, SHARED_ID, n, log)
    how = launch_plan(cluster, n)
    client = _launch(cluster, n, timeout, log)
    infos = _describe(client, client.ids, timeout=30)
    profile_clusters.write_record(pdir, SHARED_ID, {"owner": None, "engines": _engine_table(infos)})
    client.close()
    _say(f"started the shared cluster of profile {profile!r}: {how}, {n} of {n} up. Notebooks claim "
         "it one at a time (others start their own engines); `hpclab cluster stop` stops it.")
    return SharedCluster(cluster, started=True)


def _describe(client: ipp.Client, ids: list[int], timeout: float) -> dict[int, dict]:
    """Each engine's rank, pid, host and owner; engines that do not answer in time are left out."""
    pending = {eid: client[eid].apply_async(engine_owner.describe) for eid in ids}
    deadline = time.monotonic() + timeout
    infos = {}
    for eid, result in pending.items():
        try:
            infos[eid] = result.get(timeout=max(0.1, deadline - time.monotonic()))
        except ipp.error.RemoteError as exc:
            if exc.ename in ("ImportError", "ModuleNotFoundError"):
                raise ClusterError(f"the engines cannot import mpi4py or hpclab ({exc.evalue}); install "
                                   "hpclab's environment where the engines run") from None
            raise
        except TimeoutError:
            client.abort(jobs=result.msg_ids, targets=[eid], block=False)
    return infos


def _mpi_size(client: ipp.Client, timeout: float) -> int:
    """How many engines an MPI job of engines has, from the first one to register (engines
    started by a batch job register one by one, and the cluster file may not say how many)."""
    client.wait_for_engines(1, timeout=timeout, interactive=False)
    first = _describe(client, client.ids[:1], timeout=PROBE_S)
    if not first:
        raise TimeoutError(f"its first engine did not answer within {PROBE_S} s")
    return next(iter(first.values()))["size"]


def _engine_table(infos: dict[int, dict]) -> dict[str, dict]:
    return {str(eid): {k: info[k] for k in ("rank", "pid", "host")} for eid, info in infos.items()}


def _one_mpi_job(infos: dict[int, dict]) -> bool:
    ranks = sorted(info["rank"] for info in infos.values())
    return ranks == list(range(len(infos))) and {info["size"] for info in infos.values()} == {len(infos)}


def _claim_shared(n: int, pdir: str, profile: str, record: dict, timeout: float | None, log):
    """Claim the profile's shared cluster if it is free and sound: (found, client, infos, job),
    or None after saying why not."""
    where = f"the shared cluster of profile {profile!r}"
    instead = "starting a private cluster for this notebook instead"
    found = profile_clusters.load(pdir, SHARED_ID, log)
    if found.state == "stale":
        _say(f"{found.message}; going on")
    if found.state != "running":
        _say(f"no shared cluster is running in profile {profile!r} (`hpclab cluster start` starts one)")
        return None
    job = slurm.EngineJob.of(found.cluster, found.raw)
    if job is not None:
        _say(f"found {where}: {job.report()}")
    prior = profile_clusters.read_record(pdir, SHARED_ID)
    holder = prior.get("owner")
    # asked before the engines, which may be busy with the holder's cell
    if holder and holder["token"] != record["token"] and profile_clusters.alive(holder) is not False:
        _say(f"{where} is in use by {profile_clusters.describe_owner(holder)}; {instead}")
        return None
    usable = _sound_engines(found, prior, timeout, job)
    if isinstance(usable, str):
        _say(f"{where} {usable}; {instead}")
        return None
    client, infos = usable
    others = {i["owner"]["token"]: i["owner"] for i in infos.values()
              if i["owner"] and i["owner"]["token"] != record["token"]}
    live = [o for o in others.values() if profile_clusters.alive(o) is not False]
    held = live[0] if live else _claim(client, infos, record, tuple(others))
    if held is not None:
        _say(f"{where} is in use by {profile_clusters.describe_owner(held)}; {instead}")
        client.close()
        return None
    for owner in others.values():
        _say(f"took over {where} from {profile_clusters.describe_owner(owner)}, which is gone")
    profile_clusters.write_record(pdir, SHARED_ID, {"owner": record, "engines": _engine_table(infos)})
    asked = "" if len(infos) == n else f" (asked for {n}; it has {len(infos)})"
    _say(f"claimed {where} for this notebook{asked}; its namespace starts empty")
    return found, client, infos, job


def _sound_engines(found: profile_clusters.Found, prior: dict, timeout: float | None, job):
    """(client, infos) when all the cluster's engines run, answer and are one MPI job;
    otherwise what is wrong, in words."""
    if found.engines_gone:
        return (f"cannot be used: {_dead_rank(found, prior)}. It is left as it is "
                "(`hpclab cluster stop` stops it)")
    try:
        client = found.connect(timeout=PROBE_S)
    except Exception as exc:  # noqa: BLE001 - e.g. "Hub connection request timed out"
        return f"does not answer ({exc}); stop it with `hpclab cluster stop`"
    try:
        problem, infos = _engines_problem(client, found, prior, timeout, job)
    except BaseException:
        client.close()
        raise
    if problem:
        client.close()
        return problem
    return client, infos


def _engines_problem(client: ipp.Client, found: profile_clusters.Found, prior: dict, timeout: float | None,
                     job):
    if not found.live_sets and not client.ids and job is None:
        return "has no engines running (`hpclab cluster stop` stops it)", {}
    expected = found.expected or _mpi_size(client, timeout or LOCAL_TIMEOUT_S)
    try:
        _wait_for_engines(found.live_sets, client, expected, timeout, job)
    except (TimeoutError, ipp.error.EngineError) as exc:
        return f"is not ready: {exc}" + (f" ({job.report()})" if job is not None else ""), {}
    except slurm.JobEnded as exc:
        return f"cannot be used: {exc}", {}
    infos = _describe(client, client.ids, timeout=PROBE_S)
    silent = [eid for eid in client.ids if eid not in infos]
    if silent:
        known = prior.get("engines", {})
        names = ", ".join(f"rank {known[str(e)]['rank']}" if str(e) in known else f"engine {e}" for e in silent)
        return f"cannot be used: {names} did not answer within {PROBE_S} s (dead, or stuck in a cell)", infos
    if not _one_mpi_job(infos):
        return (f"cannot be used: its engines are not one MPI job (ranks/sizes "
                f"{sorted((i['rank'], i['size']) for i in infos.values())})"), infos
    return None, infos


def _claim(client: ipp.Client, infos: dict[int, dict], record: dict, gone: tuple[str, ...]) -> dict | None:
    """Set ``record`` as owner on every engine, rank 0 first: whoever gets rank 0 gets all.
    Returns None when claimed, else the owner that holds them."""
    order = sorted(infos, key=lambda eid: infos[eid]["rank"])
    held = client[order[0]].apply_sync(engine_owner.claim, record, gone)
    if held is None and len(order) > 1:
        refused = [h for h in client[order[1:]].apply_sync(engine_owner.claim, record, gone) if h]
        if refused:
            client[order].apply_sync(engine_owner.release, record["token"])
            held = refused[0]
    return held


def _plural(word: str, items: list) -> str:
    return f"{word}{'s' if len(items) > 1 else ''} {', '.join(map(str, items))}"


def _read(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-20000:]
    except OSError:
        return ""


def _dead_rank(found: profile_clusters.Found, record: dict) -> str:
    """What ended the shared cluster's engines, with the logs that say so."""
    logs = found.engine_logs()
    controller_log = found.raw.get("controller", {}).get("state", {}).get("output_file", "")
    rank_of = {int(e): info["rank"] for e, info in record.get("engines", {}).items()}
    what = profile_clusters.dead_rank_note("\n".join(_read(p) for p in logs), _read(controller_log), rank_of)
    where = f"; log: {', '.join(logs)}" if logs else ""
    return (what or "its engines have exited") + where


# --- sessions ----------------------------------------------------------------------------------

@dataclass
class Session:
    """MPI engines held by this notebook. ``view`` is a DirectView in MPI-rank order."""

    client: ipp.Client
    view: ipp.DirectView
    ranks: list[int]
    kind: str                      # "shared" (claimed) or "private" (started for this notebook)
    cluster: ipp.Cluster | None
    profile: str
    record: dict                   # the owner record (host, pid, start time, token)
    requested: int
    backend: str = ""
    activated: bool = False
    reaper: subprocess.Popen | None = None
    timeout: float | None = None
    pids: dict[int, int] = field(default_factory=dict)   # engine id -> pid
    closed: bool = False
    job: str | None = None         # the Slurm job the engines run in, if they do
    engine_job: bool = False       # ... and its controller too (sbatch slurm/ipcluster_engines.sbatch)

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def started(self) -> bool:
        """Whether these engines were started for this notebook (a private cluster)."""
        return self.kind == "private"

    @property
    def profile_dir(self) -> str:
        return profile_clusters.profile_dir(self.profile)

    def on_ranks(self, fn, *args, **kwargs) -> list:
        """Run ``fn`` on every rank; results in rank order."""
        return self.view.apply_sync(fn, *args, **kwargs)

    def deadline(self, seconds: float | None) -> None:
        """Interrupt any later ``%%px`` cell that runs longer than ``seconds`` (None: never),
        with a hint about ranks waiting for each other and how to recover."""
        px_cells.set_deadline(seconds)

    def close(self, quiet: bool = False) -> None:
        """Give the engines back: release a claimed shared cluster (it keeps running), or
        stop this notebook's private cluster."""
        if self.closed:
            return
        self.closed = True
        _SESSIONS.pop(self.profile_dir, None)
        log = profile_clusters.quiet_log(self.profile_dir)
        if self.kind == "shared":
            try:
                registered = [e for e in self.view.targets if e in self.client.ids]
                if registered:  # (engines that have stopped hold no claim)
                    self.client[registered].apply_async(engine_owner.release, self.record["token"]).get(
                        timeout=PROBE_S)
                self._drop_claim()
                message = f"released the shared cluster's {self.n} engines; they keep running for the next notebook"
            except (TimeoutError, ipp.error.RemoteError, OSError) as exc:
                message = (f"could not release the shared cluster's engines ({type(exc).__name__}: they are "
                           "still busy with a cell?); they stay claimed by this notebook until its kernel "
                           "ends, then the next notebook takes them over")
            self.client.close()
        else:
            job = self.job
            self.client.close()
            self._stop_private(log, polite=True)
            message = f"stopped this notebook's {self.n} engines" + (f" (Slurm job {job} ended)" if job else "")
        if not quiet:
            _say(message)

    def _drop_claim(self) -> None:
        """Clear this notebook's name from the shared cluster's record."""
        shared = profile_clusters.read_record(self.profile_dir, SHARED_ID)
        if (shared.get("owner") or {}).get("token") == self.record["token"]:
            profile_clusters.write_record(self.profile_dir, SHARED_ID, {**shared, "owner": None})

    def _stop_private(self, log, polite: bool) -> None:
        if self.reaper is not None:
            self.reaper.terminate()
            try:
                self.reaper.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.reaper.kill()
            self.reaper = None
        if self.cluster is not None:
            profile_clusters.stop(self.cluster, log, grace=KILL_GRACE_S, polite=polite)

    def restart(self) -> None:
        """Kill the engines (SIGKILL after a short grace: engines stuck in MPI ignore
        interrupts), start fresh ones (same number, same ownership) and set them up.
        The way out of a ``%%px`` cell that hangs."""
        t0 = time.monotonic()
        log = profile_clusters.quiet_log(self.profile_dir)
        if self.kind == "private" and self.job:
            _say(f"restarting: cancelling Slurm job {self.job} with its {self.n} engines; a new job is "
                 "submitted (it may queue) ...")
        else:
            _say(f"restarting: stopping the {self.n} engines (SIGKILL after {KILL_GRACE_S} s) ...")
        replacement = None
        if self.kind == "shared":
            self._kill_engines(log)
            self.client.close()
            replacement = self._restart_shared(log)
            if replacement is None:
                self._drop_claim()
                _say("the shared cluster's engines cannot be started again from here; "
                     "starting a private cluster for this notebook instead")
        else:
            self.client.close()
            self._stop_private(log, polite=False)
        if replacement is None:
            try:
                replacement = _open_private(self.requested, self.profile, self.record, self.timeout, log)
            except ClusterError:
                self.closed = True  # nothing of the old engines is left to use
                _SESSIONS.pop(self.profile_dir, None)
                raise
        self._take(replacement)
        _say(f"restarted in {time.monotonic() - t0:.0f} s: {self.n} new MPI engines (ranks 0..{self.n - 1}). "
             "Everything the engines held is gone: run this section's cells again from its first %%px cell.")

    def _kill_engines(self, log) -> None:
        """TERM, then KILL, through each engine's nanny (works wherever the engines run)."""
        try:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                alive = [e for e in self.view.targets if e in self.client.ids]
                if alive:
                    self.client.send_signal(sig, targets=alive, block=True)
                end = time.monotonic() + KILL_GRACE_S
                while time.monotonic() < end and any(e in self.client.ids for e in alive):
                    time.sleep(0.2)
        except Exception as exc:  # noqa: BLE001 - nannies gone too: the engines are gone or unreachable
            log.warning("signalling the shared engines failed: %s", exc)

    def _restart_shared(self, log):
        """Start the shared cluster's engine sets again through its own launcher, and claim
        them. None if that cannot be done from here."""
        pdir = self.profile_dir
        if self.engine_job:
            _say(f"the engines were those of the engine job {self.job}, which ends with them: submit a new one "
                 "(`sbatch slurm/ipcluster_engines.sbatch`) and run connect() again")
            return None
        found = profile_clusters.load(pdir, SHARED_ID, log)
        if found.state != "running" or found.cluster is None or "engines" not in found.raw:
            return None
        try:
            profile_clusters.end_engine_sets(found.cluster, grace=KILL_GRACE_S)
            found.cluster.cluster_file = profile_clusters.cluster_file(pdir, SHARED_ID)  # records the new set
            found.cluster.start_engines_sync(self.n)
        except Exception as exc:  # noqa: BLE001 - e.g. a launcher that cannot run from here
            log.warning("restarting the shared engines failed: %s", exc)
            return None
        if self.job:
            _say(f"the shared cluster's Slurm job {self.job} ended with its engines; its launcher submitted a new one")
        return _open_shared(self.requested, self.profile, self.record, self.timeout, log)

    def _take(self, other: "Session") -> None:
        """Become ``other`` (so the notebook's ``session`` variable stays valid)."""
        activate = self.activated
        for name in ("client", "view", "ranks", "kind", "cluster", "backend", "reaper", "pids", "job", "engine_job"):
            setattr(self, name, getattr(other, name))
        self.closed = False
        _SESSIONS[self.profile_dir] = self
        if activate:
            self._activate()

    def _activate(self) -> None:
        from IPython import get_ipython

        shell = get_ipython()
        self.view.activate()
        # Outputs after the cell, not streamed: so a failure is one message for all ranks,
        # not one streamed traceback per rank (px_cells shows it).
        shell.run_line_magic("pxconfig", "--no-stream")
        px_cells.install(shell, {eid: rank for eid, rank in zip(self.view.targets, self.ranks)})
        self.activated = True

    def _problem(self) -> str | None:
        """Why these engines cannot be used any more, or None."""
        if self.job and not slurm.job_is_active(self.job):
            return slurm.diagnose(self.job)
        if self.kind == "private" and self.cluster is not None \
                and _exit_code(self.cluster.engines.values()) is not None:
            engines = "\n".join(s.get_output() or "" for s in self.cluster.engines.values())
            controller = _read(getattr(self.cluster.controller, "output_file", ""))
            note = profile_clusters.dead_rank_note(engines, controller, dict(zip(self.view.targets, self.ranks)))
            return note or "its engines have exited"
        ranks = dict(zip(self.view.targets, self.ranks))
        gone = [rank for e, rank in ranks.items() if e not in self.client.ids]
        if gone:
            return f"{_plural('rank', gone)} {'has' if len(gone) == 1 else 'have'} stopped"
        infos = _describe(self.client, list(ranks), timeout=PROBE_S)
        silent = [rank for e, rank in ranks.items() if e not in infos]
        if silent:
            return f"{_plural('rank', silent)} did not answer within {PROBE_S} s"
        if any((i["owner"] or {}).get("token") != self.record["token"] for i in infos.values()) \
                and self.kind == "shared":
            return "another notebook has taken the engines over"
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        origin = ("private cluster, started for this notebook" if self.kind == "private"
                  else "shared cluster, claimed by this notebook")
        origin += f", Slurm job {self.job}" if self.job else ""
        state = ", closed" if self.closed else ""
        return f"<hpclab Session: {self.n} MPI engines ({origin}{state}), backend {self.backend}>"


def _open_shared(n: int, profile: str, record: dict, timeout: float | None, log) -> Session | None:
    pdir = profile_clusters.profile_dir(profile)
    claimed = _claim_shared(n, pdir, profile, record, timeout, log)
    if claimed is None:
        return None
    found, client, infos, job = claimed
    session = _session("shared", None, client, infos, profile, record, n, timeout)
    session.job = job.job_id if job is not None else None
    session.engine_job = slurm.controller_job_id(found.raw) is not None
    return session


def _open_private(n: int, profile: str, record: dict, timeout: float | None, log) -> Session:
    pdir = profile_clusters.profile_dir(profile)
    # a new id each time: a killed cluster's connection files must never be read as this one's
    cluster = _new_cluster(pdir, f"{PRIVATE_PREFIX}{os.getpid()}-{secrets.token_hex(3)}", n, log)
    how = launch_plan(cluster, n)
    _say(f"starting a private cluster for this notebook: {how} (cluster id {cluster.cluster_id})")
    reapers = []

    # As soon as the engines are started, before the wait (a Slurm job may queue for minutes): the
    # cluster is this notebook's (`hpclab cluster stop` leaves it), and it is stopped if the kernel dies.
    def started(launched: ipp.Cluster) -> None:
        profile_clusters.write_record(pdir, launched.cluster_id, {"owner": record})
        reapers.append(_start_reaper(launched))

    try:
        client = _launch(cluster, n, timeout, log, started=started)
    except BaseException:
        for reaper in reapers:  # (it ends by itself once the cluster file is gone; do not leave it a zombie)
            reaper.terminate()
            reaper.wait()
        raise
    reaper = reapers[0]
    try:
        infos = _describe(client, client.ids, timeout=30)
        if len(infos) < n or not _one_mpi_job(infos):
            raise ClusterError(f"the {n} engines started are not one MPI job (ranks/sizes "
                               f"{sorted((i['rank'], i['size']) for i in infos.values())}); "
                               f"log: {profile_clusters.log_path(pdir)}")
        session = _session("private", cluster, client, infos, profile, record, n, timeout)
    except BaseException:
        reaper.terminate()
        client.close()
        profile_clusters.stop(cluster, log, polite=False)
        raise
    session.reaper = reaper
    session.job = slurm.cluster_job_id(cluster)
    profile_clusters.write_record(pdir, cluster.cluster_id, {"owner": record, "engines": _engine_table(infos)})
    return session


def _session(kind, cluster, client, infos, profile, record, n, timeout) -> Session:
    order = sorted(infos, key=lambda eid: infos[eid]["rank"])
    view = client[order]
    view.block = True
    try:
        view.execute(_ENGINE_SETUP, block=True)
        backend = view.apply_sync(lambda: __import__("hpclab.backend").backend.name())[0]
    except ipp.error.CompositeError as exc:
        raise ClusterError(f"setting up hpclab on the engines failed: {exc}") from exc
    return Session(client, view, [infos[e]["rank"] for e in order], kind, cluster, profile, record, n,
                   backend, timeout=timeout, pids={e: infos[e]["pid"] for e in order})


def connect(n: int = 4, profile: str = "default", timeout: float | None = None, activate: bool = True) -> Session:
    """Engines for this notebook: claim the profile's shared cluster if it is free,
    otherwise start a private cluster of ``n`` MPI engines (see the module docstring).

    Waits up to ``timeout`` seconds for all engines (default: 60, and for engines from a
    Slurm job 600, as the job may queue); raises :class:`ClusterError` with the cause, the
    log and a fix when engines cannot start.
    """
    if n < 1:
        raise ValueError(f"connect(n={n}): the number of engines must be at least 1")
    pdir = profile_clusters.profile_dir(profile)
    log = profile_clusters.quiet_log(pdir)
    activate = activate and _interactive()
    previous = _SESSIONS.get(pdir)
    if previous is not None:  # this notebook runs connect() again
        problem = previous._problem()
        if problem is None and previous.requested == n:
            previous.on_ranks(engine_owner.reset_namespace)
            previous.view.execute(_ENGINE_SETUP, block=True)
            if activate:
                previous._activate()
            _say(f"this notebook already holds {previous.n} engines: using them again, their namespace "
                 "emptied")
            return previous
        what = f"{previous.kind} cluster" + (f" {previous.cluster.cluster_id}" if previous.kind == "private" else "")
        _say(f"replacing this notebook's {what}: {problem or f'{n} engines asked for, it has {previous.n}'}")
        previous.close(quiet=True)
    for note in profile_clusters.sweep(pdir, log):
        _say(note)
    record = {**profile_clusters.this_process(), "token": secrets.token_hex(8), "since": time.time()}
    session = _open_shared(n, profile, record, timeout, log) or _open_private(n, profile, record, timeout, log)
    _SESSIONS[pdir] = session
    if activate:
        session._activate()
    _say(f"{session.n} of {session.n} MPI engines up (ranks 0..{session.n - 1}), backend: {session.backend}")
    return session


@atexit.register
def _close_at_exit() -> None:
    """At a normal exit: release claims and stop private clusters (the reaper covers kills)."""
    for session in list(_SESSIONS.values()):
        try:
            session.close(quiet=True)
        except Exception:  # noqa: BLE001 - the interpreter is going away; the reaper stops what is left
            pass
