"""MPI engines as a batch job: what ``slurm/ipcluster_engines.sbatch`` runs.

    python -m hpclab.slurm engines [--profile default] [--mpi auto] [-n $SLURM_NTASKS]

Inside the job it

1. looks at the cluster file left in the profile (``security/cluster-.json``): one
   whose Slurm job has ended, or whose controller no longer answers, is *stale* and
   removed (with its connection files); one that is alive (another engine job, or
   engines someone started on the login node) stops this job with a message naming it;
2. starts the controller here, listening on every interface, registered in the
   profile with this job's id (:class:`hpclab.slurm.launchers.JobControllerLauncher`,
   so the login node sees it as running while the job runs and ``ipcluster stop``
   there cancels the job);
3. starts the engines as one MPI job, ``srun --mpi=<flavour> --kill-on-bad-exit=1
   python -m ipyparallel.engine --mpi``, their output in the job's log;
4. exits with the engines' exit code when they end (non-zero when they die), after
   stopping the controller and removing the cluster file; ``scancel`` stops it all.

The notebook on the login node then connects with ``hpclab.cluster.connect()``
(same profile, shared home directory).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpclab.slurm import jobs
from hpclab.slurm import mpi as mpi_choice


def profile_path(profile: str) -> Path:
    from IPython.core.profiledir import ProfileDir
    from IPython.paths import get_ipython_dir

    return Path(ProfileDir.create_profile_dir_by_name(get_ipython_dir(), profile).location)


def cluster_files(pdir: Path, cluster_id: str = "") -> list[Path]:
    """The cluster file and the controller's connection files of ``cluster_id`` in a profile."""
    sec = pdir / "security"
    prefix = f"ipcontroller-{cluster_id}" if cluster_id else "ipcontroller"
    return [sec / f"cluster-{cluster_id}.json", sec / f"{prefix}-client.json", sec / f"{prefix}-engine.json"]


def recorded_job(cluster_file: Path) -> str:
    """The Slurm job id a cluster file records for its controller ('' if none)."""
    try:
        data = json.loads(cluster_file.read_text())
    except (OSError, ValueError):
        return ""
    state = (data.get("controller") or {}).get("state") or {}
    return str(state.get("job_id") or "")


def _controller_answers(pdir: Path, cluster_id: str, timeout: float) -> bool:
    import ipyparallel as ipp

    client_file = cluster_files(pdir, cluster_id)[1]
    if not client_file.exists():
        return False
    try:
        client = ipp.Client(str(client_file), timeout=timeout)
    except Exception:  # noqa: BLE001 - any failure to reach it means it is not serving
        return False
    client.close()
    return True


def check_profile(pdir: Path, cluster_id: str = "", own_job: str = "", timeout: float = 5) -> tuple[str, str]:
    """('none' | 'stale' | 'live', what was found) for the cluster file of ``cluster_id``."""
    cfile = cluster_files(pdir, cluster_id)[0]
    if not cfile.exists():
        return "none", ""
    job = recorded_job(cfile)
    if job and job != own_job:
        info = jobs.job_info(job)
        if info is not None and info.active:
            return "live", (f"the engines of job {job} are still running in {pdir} "
                            f"({info.state}{' on ' + info.nodes if info.nodes else ''})")
        return "stale", f"{cfile} was left by Slurm job {job} ({info.state if info else 'no longer known'})"
    if job == own_job and job:
        return "stale", f"{cfile} was left by an earlier run of this job ({job}, requeued)"
    if _controller_answers(pdir, cluster_id, timeout):
        return "live", f"a controller started outside Slurm still answers for {cfile}"
    return "stale", f"{cfile} names a controller that no longer answers"


def clear(pdir: Path, cluster_id: str = "") -> list[Path]:
    removed = []
    for path in cluster_files(pdir, cluster_id):
        try:
            path.unlink()
            removed.append(path)
        except FileNotFoundError:
            pass
    return removed


def say(text: str) -> None:
    print(f"hpclab engines: {text}", flush=True)


class _Stop(Exception):
    pass


def _on_signal(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hpclab.slurm engines", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", default=os.environ.get("HPCLAB_PROFILE") or "default")
    parser.add_argument("--mpi", default=os.environ.get("HPCLAB_SRUN_MPI") or "auto",
                        help="srun --mpi flavour (default: HPCLAB_SRUN_MPI, else auto)")
    parser.add_argument("-n", type=int, default=int(os.environ.get("SLURM_NTASKS", "0") or 0),
                        help="engines (default: SLURM_NTASKS)")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds for all engines to register (default 300)")
    args = parser.parse_args(argv)
    job_id = os.environ.get("SLURM_JOB_ID", "")
    if not job_id or args.n < 1:
        say("run this inside a Slurm job with tasks: sbatch slurm/ipcluster_engines.sbatch")
        return 2

    pdir = profile_path(args.profile)
    status, found = check_profile(pdir, own_job=job_id)
    if status == "live":
        say(f"{found}. This job stops: scancel that job (or `ipcluster stop --profile {args.profile}`), "
            "or submit with --export=ALL,HPCLAB_PROFILE=<another profile>.")
        return 3
    if status == "stale":
        clear(pdir)
        say(f"{found}: stale, removed")

    try:
        choice = mpi_choice.choose(args.mpi)
    except (ValueError, RuntimeError) as exc:
        say(str(exc))
        return 2

    import ipyparallel as ipp

    from hpclab.slurm.launchers import JobControllerLauncher

    host = socket.gethostname()
    cluster = ipp.Cluster(profile_dir=str(pdir), cluster_id="", n=args.n, load_profile=False,
                          controller_launcher_class=JobControllerLauncher, controller_ip="*",
                          controller_location=host, shutdown_atexit=False)
    engines = None
    code = 1
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _on_signal)
    try:
        cluster.start_controller_sync()
        say(f"controller on {host} (job {job_id}), profile {pdir}")
        cmd = ["srun", f"--mpi={choice.flavour}", "--kill-on-bad-exit=1", "-n", str(args.n),
               sys.executable, "-m", "ipyparallel.engine", "--mpi", f"--profile-dir={pdir}", "--cluster-id="]
        say(f"{args.n} engines: srun --mpi={choice.flavour} ({choice.reason})")
        engines = subprocess.Popen(cmd)
        code = _watch(cluster, engines, args.n, args.timeout, args.profile)
    except _Stop as stop:
        say(f"{stop}: stopping the engines and the controller")
        code = 0
    except Exception as exc:  # noqa: BLE001 - the job log must say what failed, then the job fails
        say(f"starting the cluster failed: {type(exc).__name__}: {exc}")
        code = 1
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        if engines is not None and engines.poll() is None:
            engines.terminate()
            try:
                engines.wait(timeout=20)
            except subprocess.TimeoutExpired:
                engines.kill()
        try:
            cluster.stop_controller_sync()
        except Exception as exc:  # noqa: BLE001 - the job ends anyway; say so
            say(f"stopping the controller failed: {exc}")
        clear(pdir)
    return code


def _watch(cluster, engines: subprocess.Popen, n: int, timeout: float, profile: str) -> int:
    """Wait for the engines to register, then until they end; their exit code."""
    client = cluster.connect_client_sync()
    deadline = time.monotonic() + timeout
    up = 0
    try:
        while engines.poll() is None:
            if up < n:
                up = len(client.ids)
                if up == n:
                    where = "" if profile == "default" else f"profile={profile!r}"
                    say(f"{n} engines up; connect from the login node: hpclab.cluster.connect({where})")
                elif time.monotonic() > deadline:
                    say(f"only {up} of {n} engines registered in {timeout:.0f} s: stopping")
                    return 1
            time.sleep(1)
    finally:
        client.close()
    code = engines.returncode
    if code == 0:
        say("the engines were shut down; the job ends")
        return 0
    say(f"the engines ended with exit code {code}: "
        + ("they were not started" if up == 0 else f"{up} had registered") + " (their output is above)")
    return code if code > 0 else 1

