"""A notebook's MPI engines: claim the profile's shared cluster, or start a private one.

ipyparallel starts, restarts and connects to clusters; it has no owner for a shared cluster (one notebook
at a time, its namespace emptied on claim and release), no wait that watches a Slurm job, and no errors
that name the cause and the fix.
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

from hpclab.cluster import files, jobs, owner, px, reaper, routes
from hpclab.cluster.files import PRIVATE_PREFIX, SHARED_ID
from hpclab.cluster.routes import ClusterError

# An engine never stands for a login node, even where it inherits the variable from the notebook that started it
# (sbatch exports the submitter's environment): that is the notebook's own process.
ENGINE_SETUP = ("import os\nos.environ.pop('HPCLAB_LOGIN_NODE', None)\n"
                "import hpclab.backend as _hb, hpclab.device as _hd\n_hb.select()\n_hd.select_gpu()\n")
HEARTBEAT_MS = 1000   # engines register on the controller's heartbeat: 1 s rather than ipyparallel's 3 s
PROBE_S = 5           # an engine that does not answer a trivial request in this time is dead or stuck
LOCAL_TIMEOUT_S = 60  # for local engines; a Slurm job's get jobs.QUEUE_WAIT_S (it may queue)
_SESSIONS: dict[str, Session] = {}   # profile dir -> this process's open session


def say(message: str) -> None:
    print(f"hpclab: {message}", flush=True)


def _interactive() -> bool:
    from IPython import get_ipython

    return get_ipython() is not None


def _mpi_env() -> None:
    """Open MPI as login nodes and containers need it (harmless for MPICH); the mpiexec beside this
    Python first (mpi4py here was built for it); hpclab importable by the engines."""
    os.environ.setdefault("OMPI_MCA_rmaps_base_oversubscribe", "1")
    if os.geteuid() == 0:
        os.environ.update({k: os.environ.get(k, "1") for k in ("OMPI_ALLOW_RUN_AS_ROOT", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")})
    here, root = os.path.dirname(sys.executable), os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    for var, path in (("PATH", here), ("PYTHONPATH", os.path.abspath(root))):
        if path not in os.environ.get(var, "").split(os.pathsep) and (var == "PYTHONPATH" or
                                                                     os.path.exists(os.path.join(here, "mpiexec"))):
            os.environ[var] = os.pathsep.join(filter(None, [path, os.environ.get(var)]))


def _wait(client: ipp.Client, n: int, timeout: float | None, job: jobs.EngineJob | None = None, sets=()) -> None:
    """Wait for n engines with a progress bar; EngineError once the local engine ``sets`` have all exited,
    JobEnded once the Slurm ``job`` has (whose state changes are said)."""
    timeout = timeout or (job.deadline_s if job else LOCAL_TIMEOUT_S)
    end = time.monotonic() + timeout
    with ipp.util.progress(widget=None, initial=len(client.ids), total=n, unit="engine",
                           disable=not _interactive() and not sys.stderr.isatty()) as bar:
        while len(client.ids) < n:
            changed = job.check() if job else None
            if changed:
                say(f"{changed}; {len(client.ids)} of {n} engines up")
                bar.set_description_str(job.text)
            if sets and not any(map(files.running, sets)):
                raise ipp.error.EngineError("its engines have exited")
            if time.monotonic() > end:
                raise TimeoutError(f"only {len(client.ids)} of {n} engines registered in {timeout:.0f} s")
            try:
                client.wait_for_engines(n, timeout=1, interactive=False)
            except TimeoutError:
                pass
            bar.update(len(client.ids) - bar.n)


def _launch(cluster: ipp.Cluster, n: int, timeout: float | None, log, started) -> ipp.Client:
    """Start ``cluster`` with n engines and wait for them; ``started(cluster)`` runs once they are started
    (a Slurm job may queue for minutes before its engines register)."""
    _mpi_env()
    job = None
    try:
        if not issubclass(cluster.engine_launcher_class, ipp.cluster.launcher.BatchSystemLauncher):
            cluster.engine_timeout = int(timeout or LOCAL_TIMEOUT_S)  # ipyparallel: EngineError once mpiexec fails
            client = cluster.start_and_connect_sync(n)
            started(cluster)
            return client
        cluster.start_cluster_sync(n)
        started(cluster)
        job = jobs.EngineJob.of(cluster)
        say(f"submitted Slurm job {job.job_id} for the engines; waiting up to {timeout or job.deadline_s:.0f} s "
            "for them (the job may queue first)")
        client = cluster.connect_client_sync()
        _wait(client, n, timeout, job)
        return client
    except (subprocess.CalledProcessError, jobs.JobEnded, ipp.error.EngineError, TimeoutError, OSError) as exc:
        why = jobs.submit_failure(cluster) if isinstance(exc, subprocess.CalledProcessError) else \
            job.at_deadline(str(exc)) if job and not isinstance(exc, jobs.JobEnded) else str(exc)  # (job still there)
        tail = "\n".join(line for s in cluster.engines.values() for line in  # (a job's log stays: remove=False)
                         str(s.get_output(remove=False)).splitlines()[-30:])
        files.stop(cluster, log, polite=False)
        if job is not None or isinstance(exc, (subprocess.CalledProcessError, jobs.JobEnded)):
            raise ClusterError(f"{n} engines did not start: {why}") from None
    raise ClusterError(
        f"{n} MPI engines did not start ({why}).\n--- engine log (last lines) ---\n{tail or '(no output)'}\n---\n"
        f"Full log: {files.log_path(cluster.profile_dir)}\nCheck that `mpiexec -n 2 python -c 'from mpi4py import "
        "MPI'` works in this environment (install MPI with `pip install \"hpclab[mpi]\"` or `module load openmpi`), "
        "or start engines yourself: `hpclab cluster start -n 4` (or `ipcluster start --engines=MPI -n 4 --daemonize`).")


def _new_cluster(pdir: str, cluster_id: str, n: int, log) -> ipp.Cluster:
    cluster = ipp.Cluster(profile_dir=pdir, cluster_id=cluster_id, n=n, log=log, shutdown_atexit=False, delay=0)
    cluster.controller_args = [*cluster.controller_args, f"--HeartMonitor.period={HEARTBEAT_MS}"]
    return cluster


def _describe(client: ipp.Client, ids: list[int], timeout: float) -> dict[int, dict]:
    """Each engine's rank, size, pid, host and owner; engines that do not answer in time are left out."""
    pending = {eid: client[eid].apply_async(owner.describe) for eid in ids}
    end, infos = time.monotonic() + timeout, {}
    for eid, result in pending.items():
        try:
            infos[eid] = result.get(timeout=max(0.1, end - time.monotonic()))
        except ipp.error.RemoteError as exc:
            if exc.ename not in ("ImportError", "ModuleNotFoundError"):
                raise
            raise ClusterError(f"the engines cannot import mpi4py or hpclab ({exc.evalue}); install hpclab's "
                               "environment where the engines run") from None
        except TimeoutError:
            client.abort(jobs=result.msg_ids, targets=[eid], block=False)
    return infos


def _table(infos: dict[int, dict]) -> dict[str, dict]:
    return {str(eid): {k: info[k] for k in ("rank", "pid", "host")} for eid, info in infos.items()}


def _answers(client: ipp.Client, ids: list[int], timeout: float, rank_of: dict[int, int]) -> tuple[dict, str]:
    """(infos, problem): each engine's description (:func:`_describe`), and "" when all of them answered
    and they are one MPI job, else why not (``rank_of``: engine id -> rank, as last known)."""
    infos = _describe(client, ids, timeout)
    silent = [f"rank {rank_of[e]}" if e in rank_of else f"engine {e}" for e in ids if e not in infos]
    if silent:
        return infos, f"{', '.join(silent)} did not answer within {timeout:g} s (dead, or stuck in a cell)"
    ranks = sorted((i["rank"], i["size"]) for i in infos.values())
    one_job = ranks == [(r, len(infos)) for r in range(len(infos))]
    return infos, "" if one_job else f"the engines are not one MPI job (ranks/sizes {ranks})"


# --- the shared cluster -----------------------------------------------------------------------------

@dataclass
class SharedCluster:
    """The shared cluster as ``start_shared`` left it; ``stop`` stops it only if ``start_shared`` started it."""

    cluster: ipp.Cluster | None
    started: bool

    def stop(self) -> None:
        if self.started:
            files.stop(self.cluster, files.quiet_log(self.cluster.profile_dir))
            self.started = False


def start_shared(n: int = 4, profile: str = "default", timeout: float | None = None) -> SharedCluster:
    """Start the profile's shared cluster, which notebooks claim one at a time and which outlives this
    process (``hpclab cluster start``), or find it running. Waits up to ``timeout`` s (default 120; for a
    Slurm job 600, it may queue); a Slurm job also ends after the profile's idle period."""
    pdir, where = files.profile_dir(profile), f"the shared cluster of profile {profile!r}"
    log = files.quiet_log(pdir)
    found = files.load(pdir, SHARED_ID, log)
    if found.cluster is not None:
        if found.engines_gone:
            raise ClusterError(f"{where} is running but its engines have exited; stop it with `hpclab cluster "
                               "stop`, then start it again")
        say(f"{where} is already running ({found.expected or '?'} engines); `hpclab cluster stop` stops it")
        return SharedCluster(found.cluster, started=False)
    if found.message:
        say(found.message)
    files.remove(files.connection_files(pdir, SHARED_ID))  # a new controller must not be taken for an old one
    cluster = _new_cluster(pdir, SHARED_ID, n, log)
    say(f"starting {where}: {routes.plan(cluster, n)}")
    idle = (routes.profile.settings(pdir) or {}).get("idle") if routes.profile_is_slurm(pdir) else None
    files.write_record(pdir, SHARED_ID, {"owner": None, "starting": files.this_process()})  # not idle while it waits
    client = _launch(cluster, n, timeout or (None if idle else 120), log,
                     lambda c: idle and reaper.start(c.cluster_file, idle_s=idle * 60))
    files.write_record(pdir, SHARED_ID, {"owner": None, "engines": _table(_describe(client, client.ids, 30))})
    client.close()
    job = jobs.job_of(cluster)
    say(f"started {where}: {n} of {n} up" + (f" in Slurm job {job} (it ends at its time limit, after {idle:g} min "
        "without a notebook, or at `hpclab cluster stop`)" if job else "") + ". Notebooks claim it one at a time "
        "(others start their own engines); `hpclab cluster stop` stops it.")
    return SharedCluster(cluster, started=True)


def _claim_shared(n: int, pdir: str, profile: str, record: dict, timeout: float | None, log):
    """(client, infos, job) once the shared cluster is claimed; None, after saying why, when it is not
    free or not sound. On a Slurm profile, the first connect() starts it: one engines job per learner."""
    where, instead = f"the shared cluster of profile {profile!r}", "starting a private cluster for this notebook instead"
    found = files.load(pdir, SHARED_ID, log)
    job = jobs.EngineJob.of(found.cluster) if found.cluster is not None else None
    if job is not None and found.engines_gone:  # its job has ended (time limit, scancel): stop what is left
        say(f"{where} has ended: {jobs.diagnose(job.job_id)} Stopping its controller")
        files.stop(found.cluster, log, polite=False)
        found = files.Found()
    if found.cluster is None:
        say(found.message + "; going on" if found.message else f"no shared cluster is running in profile {profile!r}")
        if not routes.profile_is_slurm(pdir) or routes.job_gpus():
            return None
        say(f"no engines job is running for profile {profile!r}: starting one that this notebook and the next ones "
            "claim in turn")
        start_shared(n, profile, timeout)
        return _claim_shared(n, pdir, profile, record, timeout, log)
    if job is not None:
        say(f"found {where}: {jobs.report(job.job_id)}")
    prior = files.read_record(pdir, SHARED_ID)
    holder = prior.get("owner")  # asked before the engines, which may be busy with the holder's cell
    if holder and holder["token"] != record["token"] and files.alive(holder) is not False:
        return say(f"{where} is in use by {files.describe_owner(holder)}; {instead}")
    problem, client, infos = _sound(found, prior, timeout, job)
    if problem:
        return say(f"{where} {problem}; {instead}")
    others = {i["owner"]["token"]: i["owner"] for i in infos.values() if (i["owner"] or record)["token"] != record["token"]}
    live = [o for o in others.values() if files.alive(o) is not False]
    held = live[0] if live else _claim(client, infos, record, tuple(others))
    if held is not None:
        client.close()
        return say(f"{where} is in use by {files.describe_owner(held)}; {instead}")
    for gone in others.values():
        say(f"took over {where} from {files.describe_owner(gone)}, which is gone")
    files.write_record(pdir, SHARED_ID, {**prior, "owner": record, "engines": _table(infos)})
    say(f"claimed {where} for this notebook" + ("" if len(infos) == n else f" (asked for {n}; it has {len(infos)})")
        + "; its namespace starts empty")
    return client, infos, job


def _sound(found: files.Found, prior: dict, timeout: float | None, job):
    """(problem, client, infos): problem "" when every engine runs, answers, and they are one MPI job."""
    rank_of = {int(e): i["rank"] for e, i in prior.get("engines", {}).items()}
    if found.engines_gone:
        why = files.dead_rank(found.cluster.profile_dir, SHARED_ID, rank_of) or "its engines have exited"
        return f"cannot be used: {why}. It is left as it is (`hpclab cluster stop` stops it)", None, {}
    try:
        client = found.cluster.connect_client_sync(timeout=PROBE_S)
    except Exception as exc:  # noqa: BLE001 - e.g. "Hub connection request timed out"
        return f"does not answer ({exc}); stop it with `hpclab cluster stop`", None, {}
    problem, infos = "", {}
    try:
        local = [s for s in found.engine_sets if not getattr(s, "job_id", "")]
        _wait(client, found.expected or len(client.ids) or 1, timeout, job, local)
        infos, why = _answers(client, client.ids, PROBE_S, rank_of)
        problem = f"cannot be used: {why}" if why else ""
    except (TimeoutError, ipp.error.EngineError) as exc:
        problem = f"is not ready: {exc}" + (f" ({jobs.report(job.job_id)})" if job else "")
    except jobs.JobEnded as exc:
        problem = f"cannot be used: {exc}"
    if problem:
        client.close()
    return problem, client, infos


def _claim(client: ipp.Client, infos: dict[int, dict], record: dict, gone: tuple[str, ...]) -> dict | None:
    """Set ``record`` as owner on every engine, rank 0 first: whoever gets rank 0 gets all.
    None when claimed, else the owner that holds them."""
    order = sorted(infos, key=lambda eid: infos[eid]["rank"])
    held = client[order[0]].apply_sync(owner.claim, record, gone)
    rest = order[1:] if held is None else []   # (an empty view would fail in ipyparallel: one engine)
    refused = [h for h in client[rest].apply_sync(owner.claim, record, gone) if h] if rest else []
    if refused:
        client[order].apply_sync(owner.release, record["token"])
    return held or (refused[0] if refused else None)


# --- sessions ---------------------------------------------------------------------------------------

@dataclass
class Session:
    """MPI engines held by this notebook. ``view`` is a DirectView in MPI-rank order."""

    client: ipp.Client
    kind: str                      # "shared" (claimed) or "private" (started for this notebook)
    cluster: ipp.Cluster | None    # a private cluster's
    profile_dir: str
    record: dict                   # the owner record (host, pid, start time, token)
    requested: int
    timeout: float | None = None
    view: ipp.DirectView | None = None
    ranks: list[int] = field(default_factory=list)
    backend: str = ""
    pids: dict[int, int] = field(default_factory=dict)   # engine id -> pid
    reaper: subprocess.Popen | None = None
    job: str | None = None         # the Slurm job the engines run in, if they do
    activated: bool = False

    @property
    def n(self) -> int:
        return len(self.ranks)

    def on_ranks(self, fn, *args, **kwargs) -> list:
        """Run ``fn`` on every rank; results in rank order."""
        return self.view.apply_sync(fn, *args, **kwargs)

    def deadline(self, seconds: float | None) -> None:
        """Interrupt any later ``%%px`` cell that runs longer than ``seconds`` (None: never), saying why such
        cells hang (ranks waiting for each other) and how to recover."""
        px.State.deadline = seconds

    def close(self, quiet: bool = False) -> None:
        """Give the engines back: release a claimed shared cluster (it keeps running), or stop this
        notebook's private cluster."""
        if _SESSIONS.get(self.profile_dir) is not self:  # closed already, or after a failed restart
            return
        del _SESSIONS[self.profile_dir]
        if self.kind == "shared":
            try:
                registered = [e for e in self.view.targets if e in self.client.ids]  # (stopped engines hold no claim)
                if registered:
                    self.client[registered].apply_async(owner.release, self.record["token"]).get(PROBE_S)
                shared = files.read_record(self.profile_dir, SHARED_ID)
                if (shared.get("owner") or {}).get("token") == self.record["token"]:
                    files.write_record(self.profile_dir, SHARED_ID, {**shared, "owner": None, "released": time.time()})
                message = f"released the shared cluster's {self.n} engines; they keep running for the next notebook"
            except (TimeoutError, ipp.error.RemoteError, OSError) as exc:
                message = (f"could not release the shared cluster's engines ({type(exc).__name__}: still busy with a "
                           "cell?); they stay claimed by this notebook until its kernel ends, then the next notebook "
                           "takes them over")
        self.client.close()
        if self.kind == "private":
            if self.reaper is not None:
                self.reaper.terminate()
                self.reaper.wait()
            files.stop(self.cluster, files.quiet_log(self.profile_dir))
            message = f"stopped this notebook's {self.n} engines" + (f" (Slurm job {self.job} ended)" if self.job else "")
        if not quiet:
            say(message)

    def restart(self) -> None:
        """Kill the engines (SIGKILL after a short grace: engines stuck in MPI ignore interrupts) and start
        as many again through the cluster's own launcher (for a Slurm job: a new job), set up and, for the
        shared cluster, claimed. The way out of a ``%%px`` cell that hangs."""
        t0, log, grace = time.monotonic(), files.quiet_log(self.profile_dir), files.KILL_GRACE_S
        say(f"restarting: cancelling Slurm job {self.job} with its {self.n} engines; a new job is submitted (it may "
            "queue) ..." if self.job else f"restarting: stopping the {self.n} engines (SIGKILL after {grace} s)")
        cluster = self.cluster or files.load(self.profile_dir, SHARED_ID, log).cluster
        if cluster is None:
            raise ClusterError("the shared cluster is gone: run connect() again")
        cluster.cluster_file = files.cluster_file(self.profile_dir, cluster.cluster_id)  # records the new engine set
        old = list(self.client.ids)
        # After SIGKILL, wait until the hub has dropped the old engines, or the wait below would count them among
        # the new ones: where a rank's death ends its job step's nannies too, that takes 10 missed heartbeats.
        for sig, wait_s in ((signal.SIGTERM, grace), (signal.SIGKILL, grace + 11 * HEARTBEAT_MS / 1000)):
            try:
                alive = [e for e in old if e in self.client.ids]
                # not block=True: it waits without a limit for every nanny's reply, and a rank's death can
                # take its job step's other nannies with it before they answer
                self.client.send_signal(sig, targets=alive, block=False) if alive else None
            except Exception as exc:  # noqa: BLE001 - nannies gone too: the engines are gone
                log.info("signalling the engines: %s", exc)
            end = time.monotonic() + wait_s
            while time.monotonic() < end and any(e in self.client.ids for e in old):
                time.sleep(0.2)
        for engine_set in cluster.engines.values():
            engine_set.stop_seconds_until_kill = grace
        try:
            cluster.restart_engines_sync()
            _wait(self.client, self.requested, self.timeout, jobs.EngineJob.of(cluster))
            infos = _describe(self.client, self.client.ids, timeout=30)
            if self.kind == "shared" and _claim(self.client, infos, self.record, ()) is not None:
                raise ClusterError("another notebook claimed the new engines first")
        except (ipp.error.EngineError, TimeoutError, jobs.JobEnded, OSError, ClusterError) as exc:
            _SESSIONS.pop(self.profile_dir, None)
            raise ClusterError(f"restarting the engines failed: {exc}") from None
        self.job = jobs.job_of(cluster)
        self._set_up(infos)  # this same object: the notebook's ``session`` variable stays valid
        files.write_record(self.profile_dir, cluster.cluster_id,
                           {**files.read_record(self.profile_dir, cluster.cluster_id), "engines": _table(infos)})
        say(f"restarted in {time.monotonic() - t0:.0f} s: {self.n} new MPI engines (ranks 0..{self.n - 1}). Everything "
            "the engines held is gone: run this section's cells again from its first %%px cell.")

    def _set_up(self, infos: dict[int, dict]) -> None:
        """Take the engines of ``infos`` in rank order and set hpclab up on them."""
        order = sorted(infos, key=lambda eid: infos[eid]["rank"])
        self.view, self.ranks = self.client[order], [infos[e]["rank"] for e in order]
        self.pids, self.view.block = {e: infos[e]["pid"] for e in order}, True
        try:
            self.view.execute(ENGINE_SETUP, block=True)
            self.backend = self.view.apply_sync(lambda: __import__("hpclab.backend").backend.name())[0]
        except ipp.error.CompositeError as exc:
            raise ClusterError(f"setting up hpclab on the engines failed: {exc}") from exc
        if self.activated:
            self._activate()

    def _activate(self) -> None:
        from IPython import get_ipython

        self.view.activate()
        # outputs after the cell, not streamed: a failure is one message for all ranks (px), not one per rank
        get_ipython().run_line_magic("pxconfig", "--no-stream")
        px.install(get_ipython(), dict(zip(self.view.targets, self.ranks)), self.job)
        self.activated = True

    def _problem(self) -> str | None:
        """Why these engines cannot be used any more, or None."""
        if self.job and not jobs.active(self.job):
            return jobs.diagnose(self.job)
        ranks = dict(zip(self.view.targets, self.ranks))
        gone = [rank for e, rank in ranks.items() if e not in self.client.ids]
        if gone or (self.kind == "private" and not self.job and not any(map(files.running, self.cluster.engines.values()))):
            cluster_id = self.cluster.cluster_id if self.kind == "private" else SHARED_ID
            return files.dead_rank(self.profile_dir, cluster_id, ranks) or (
                f"rank{'s' * (len(gone) > 1)} {', '.join(map(str, gone))} {'has' if len(gone) == 1 else 'have'} "
                "stopped" if gone else "its engines have exited")
        infos, why = _answers(self.client, list(ranks), PROBE_S, ranks)
        if why:
            return why
        if self.kind == "shared" and any((i["owner"] or {}).get("token") != self.record["token"] for i in infos.values()):
            return "another notebook has taken the engines over"
        return None


def _open_private(n: int, pdir: str, record: dict, timeout: float | None, log) -> Session:
    # a new id each time: a killed cluster's connection files must never be read as this one's
    cluster = _new_cluster(pdir, f"{PRIVATE_PREFIX}{os.getpid()}-{secrets.token_hex(3)}", n, log)
    say(f"starting a private cluster for this notebook: {routes.plan(cluster, n)} (cluster id {cluster.cluster_id})")
    reapers = []

    def started(launched: ipp.Cluster) -> None:  # this notebook's from now on, and stopped if its kernel dies
        files.write_record(pdir, launched.cluster_id, {"owner": record})
        reapers.append(reaper.start(launched.cluster_file, kernel=record))

    try:
        client = _launch(cluster, n, timeout, log, started)
        infos, why = _answers(client, client.ids, 30, {})
        if why:
            raise ClusterError(f"{n} engines started, but {why}; log: {files.log_path(pdir)}")
        session = Session(client, "private", cluster, pdir, record, n, timeout)
        session._set_up(infos)
    except BaseException:
        for process in reapers:  # (it ends by itself once the cluster file is gone; no zombie left)
            process.terminate()
            process.wait()
        files.stop(cluster, log, polite=False)
        raise
    session.reaper, session.job = reapers[0], jobs.job_of(cluster)
    return session


def connect(n: int = 4, profile: str = "default", timeout: float | None = None, activate: bool = True) -> Session:
    """Engines for this notebook: claim the profile's shared cluster if it is free, otherwise start a
    private cluster of ``n`` MPI engines (on a Slurm profile: start the shared engines job first).

    Waits up to ``timeout`` seconds for all engines (default 60; for a Slurm job 600, as it may queue);
    raises :class:`ClusterError` with the cause, the log and a fix when they cannot start.
    """
    if n < 1:
        raise ValueError(f"connect(n={n}): the number of engines must be at least 1")
    pdir = files.profile_dir(profile)
    log = files.quiet_log(pdir)
    activate = activate and _interactive()
    previous = _SESSIONS.get(pdir)
    if previous is not None:  # this notebook runs connect() again
        problem = previous._problem()
        if problem is None and previous.requested == n:
            previous.on_ranks(owner.reset_namespace)
            previous.view.execute(ENGINE_SETUP, block=True)
            previous._activate() if activate else None
            say(f"this notebook already holds {previous.n} engines: using them again, their namespace emptied")
            return previous
        what = f"{previous.kind} cluster" + (f" {previous.cluster.cluster_id}" if previous.kind == "private" else "")
        say(f"replacing this notebook's {what}: {problem or f'{n} engines asked for, it has {previous.n}'}")
        previous.close(quiet=True)
    for cluster_id in files.cluster_ids(pdir):  # private clusters whose notebook is gone
        gone = files.orphaned(pdir, cluster_id)
        found = files.load(pdir, cluster_id, log) if gone else files.Found()
        if found.cluster is not None:
            files.stop(found.cluster, log, polite=False)
            say(f"stopped cluster {cluster_id}, left running by a notebook that is gone (kernel pid {gone.get('pid')})")
        elif found.message:
            say(found.message)
    record = {**files.this_process(), "token": secrets.token_hex(8), "since": time.time()}
    claimed = _claim_shared(n, pdir, profile, record, timeout, log)
    if claimed is None:
        session = _open_private(n, pdir, record, timeout, log)
    else:
        session = Session(claimed[0], "shared", None, pdir, record, n, timeout)
        session.job = claimed[2].job_id if claimed[2] else None
        session._set_up(claimed[1])
    _SESSIONS[pdir] = session
    session._activate() if activate else None
    say(f"{session.n} of {session.n} MPI engines up (ranks 0..{session.n - 1}), backend: {session.backend}")
    return session


@atexit.register
def _close_at_exit() -> None:
    """At a normal exit: release claims and stop private clusters (the reaper covers kills)."""
    for session in list(_SESSIONS.values()):
        try:
            session.close(quiet=True)
        except Exception:  # noqa: BLE001 - the interpreter is going away; the reaper stops what is left
            pass
