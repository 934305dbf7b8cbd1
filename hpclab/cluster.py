"""Connect a notebook to MPI engines (ipyparallel), or start them.

    session = hpclab.cluster.connect(n=4)   # in a notebook
    %%px                                    # cells now run on every MPI rank
    ...
    session.close()                         # stops the engines only if it started them

``connect`` first looks for a cluster already running in the IPython profile
(someone ran ``ipcluster start --engines=MPI -n 4 --daemonize``); otherwise it
starts MPI engines itself. Engine ids are not MPI ranks (ipyparallel #238), so
the view it returns is ordered by the rank each engine reports.
"""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field

import ipyparallel as ipp

_ENGINE_SETUP = (
    "import hpclab.backend as _hb, hpclab.device as _hd\n"
    "_hb.select()\n"
    "_hd.select_gpu()\n"
)


class ClusterError(RuntimeError):
    """Engines could not be started or used."""


@dataclass
class Session:
    """Connected MPI engines. ``view`` is a DirectView in MPI-rank order."""

    client: ipp.Client
    view: ipp.DirectView
    ranks: list[int]
    started: bool
    cluster: ipp.Cluster | None = None
    backend: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.ranks)

    def on_ranks(self, fn, *args, **kwargs) -> list:
        """Run ``fn`` on every rank; results in rank order."""
        return self.view.apply_sync(fn, *args, **kwargs)

    def close(self) -> None:
        """Disconnect; stop the engines and controller only if this session started them."""
        if self.started and self.cluster is not None:
            try:
                self.cluster.stop_cluster_sync()
            except Exception as exc:  # noqa: BLE001 - shutdown can block (ipyparallel #571)
                print(f"hpclab: stopping the engines failed ({exc}); "
                      "run `ipcluster stop` if any remain", file=sys.stderr)
            self.started = False
        self.client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        origin = "started here" if self.started else "already running"
        return f"<hpclab Session: {self.n} MPI engines ({origin}), backend {self.backend}>"


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


def _running(profile: str, timeout: float) -> ipp.Client | None:
    """A client of the cluster already running in ``profile``, if any answers."""
    try:
        cluster = ipp.Cluster.from_file(profile=profile, cluster_id="")
    except (FileNotFoundError, OSError, ValueError):
        return None
    try:
        return cluster.connect_client_sync(timeout=timeout)
    except Exception:  # noqa: BLE001 - a stale file of a controller that died
        return None


def _interactive() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    return get_ipython() is not None


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


def _exit_code(cluster: ipp.Cluster) -> int | None:
    """The exit code of an engine set's launcher process (mpiexec) if it has ended."""
    import psutil  # ipyparallel's own dependency; its launchers hold psutil.Process objects

    for engine_set in cluster.engines.values():
        process = getattr(engine_set, "process", None)
        if process is None:
            continue
        try:
            code = process.wait(timeout=0)
        except psutil.TimeoutExpired:
            continue
        except psutil.NoSuchProcess:  # already reaped by ipyparallel's watcher
            return -1
        return -1 if code is None else code
    return None


def _wait_for_engines(cluster: ipp.Cluster, client: ipp.Client, n: int, timeout: float) -> None:
    """Wait for n engines with ipyparallel's progress bar, but notice at once when
    mpiexec has exited (the sync API only notices at the timeout)."""
    bar = ipp.util.progress(widget=None, initial=len(client.ids), total=n, unit="engine",
                            disable=not _interactive() and not sys.stderr.isatty())
    deadline = time.monotonic() + timeout
    try:
        while len(client.ids) < n:
            code = _exit_code(cluster)
            if code is not None:
                raise ipp.error.EngineError(f"mpiexec exited with code {code} before the engines registered")
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(client.ids)} of {n} engines registered in {timeout:.0f} s")
            try:
                client.wait_for_engines(n, timeout=0.5, interactive=False)
            except TimeoutError:
                pass
            bar.update(len(client.ids) - bar.n)
    finally:
        bar.close()


def _start(n: int, profile: str, timeout: float) -> tuple[ipp.Cluster, ipp.Client]:
    _mpi_env()
    cluster = ipp.Cluster(engines="mpi", n=n, profile=profile, cluster_id="")
    try:
        cluster.start_controller_sync()
        cluster.start_engines_sync(n)
        client = cluster.connect_client_sync()
        _wait_for_engines(cluster, client, n, timeout)
    except (ipp.error.EngineError, TimeoutError, OSError) as exc:
        tail = _log_tail(cluster)
        try:
            cluster.stop_cluster_sync()
        except Exception:  # noqa: BLE001
            pass
        raise ClusterError(
            f"{n} MPI engines did not start ({exc}).\n--- engine log (last lines) ---\n{tail}\n---\n"
            "Check that `mpiexec -n 2 python -c 'from mpi4py import MPI'` works in this "
            "environment (install MPI with `pip install \"hpclab[mpi]\"` or `module load openmpi`), "
            "or start engines yourself: `ipcluster start --engines=MPI -n 4 --daemonize`."
        ) from exc
    return cluster, client


def _engine_ranks() -> tuple[int, int]:
    from mpi4py import MPI

    return MPI.COMM_WORLD.rank, MPI.COMM_WORLD.size


def connect(n: int = 4, profile: str = "default", timeout: float = 60,
            activate: bool = True) -> Session:
    """Use the running MPI engines of ``profile``, or start ``n`` of them.

    Raises :class:`ClusterError` within about ``timeout`` seconds, with the
    tail of the engine log, when engines cannot start.
    """
    client, cluster, started = _running(profile, timeout=5), None, False
    notes = []
    if client is not None:
        try:
            client.wait_for_engines(1, timeout=timeout, interactive=_interactive())
        except TimeoutError:
            client.close()
            raise ClusterError(
                f"a cluster is running in profile {profile!r} but no engine registered within "
                f"{timeout:.0f} s; see `ipcluster` output, or `ipcluster stop` and start again "
                "with `ipcluster start --engines=MPI -n 4 --daemonize`.") from None
        time.sleep(0.5)  # let the rest of a just-started engine set register
        if len(client.ids) != n:
            notes.append(f"using the {len(client.ids)} engines already running "
                         f"(asked for {n})")
    else:
        cluster, client = _start(n, profile, timeout)
        started = True
    try:
        ranks = client[:].apply_sync(_engine_ranks)
    except ImportError as exc:
        raise ClusterError(f"the engines cannot import mpi4py ({exc}); install hpclab's "
                           "environment where the engines run") from exc
    sizes = {size for _, size in ranks}
    if sizes != {len(ranks)} or sorted(r for r, _ in ranks) != list(range(len(ranks))):
        if started:
            cluster.stop_cluster_sync()
        raise ClusterError(
            f"the {len(ranks)} engines are not one MPI job (their MPI ranks/sizes are {ranks}); "
            "start them with `ipcluster start --engines=MPI -n 4 --daemonize`.")
    order = [eid for eid, _ in sorted(zip(client.ids, ranks), key=lambda p: p[1][0])]
    view = client[order]
    view.block = True
    try:
        view.execute(_ENGINE_SETUP, block=True)
        backend = view.apply_sync(lambda: __import__("hpclab.backend").backend.name())[0]
    except ipp.error.CompositeError as exc:
        if started:
            cluster.stop_cluster_sync()
        raise ClusterError(f"setting up hpclab on the engines failed: {exc}") from exc
    if activate and _interactive():
        view.activate()
    session = Session(client, view, [r for r, _ in sorted(r for r in ranks)], started, cluster,
                      backend, notes)
    origin = "started" if started else "connected to running"
    print(f"hpclab: {origin} {session.n} MPI engines (ranks 0..{session.n - 1}), "
          f"backend: {backend}" + "".join(f"; {x}" for x in notes))
    return session
