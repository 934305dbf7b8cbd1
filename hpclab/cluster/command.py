"""``hpclab cluster init|start|status|stop``: the subcommands hpclab's command line adds."""
from __future__ import annotations

import argparse
import sys

from hpclab.cluster import files, jobs, profile, session
from hpclab.cluster.files import PRIVATE_PREFIX, SHARED_ID

HELP = "start, list or stop the MPI engines of an IPython profile; init --slurm: engines from Slurm"


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1 (a whole number)")
    return int(text)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="hpclab cluster", description=HELP)
    actions = top.add_subparsers(dest="action", required=True)
    start = actions.add_parser("start", help="start the shared cluster that notebooks claim one at a time")
    start.add_argument("-n", "--engines", type=_positive, default=4, help="number of MPI engines (default 4)")
    start.add_argument("--timeout", type=float, help="seconds to wait for the engines (default 120; Slurm job: 600)")
    status = actions.add_parser("status", help="list the profile's clusters, their engines, owners and jobs")
    stop = actions.add_parser("stop", help="stop the shared cluster and clusters left by notebooks that are gone")
    stop.add_argument("--all", action="store_true", help="also stop private clusters of notebooks still open")
    init = actions.add_parser("init", help="write an ipyparallel profile whose engines are a Slurm job (--slurm)",
                              description="Write a profile whose MPI engines are one Slurm job, one engine per GPU: "
                              "the first notebook's connect() starts it, the next ones claim it in turn.")
    init.add_argument("--slurm", action="store_true", help="engines from Slurm (the only kind)")
    init.add_argument("--partition", "-p", help="the GPU partition (sinfo lists them)")
    init.add_argument("--gpus-per-node", type=_positive, help="GPUs per node to use; one engine per GPU")
    init.add_argument("--nodes", "-N", type=_positive, help="nodes (default: as many as the engines need)")
    init.add_argument("--engines", "--ntasks", "-n", type=_positive, help="engines in all (default: nodes x GPUs)")
    init.add_argument("--time", "-t", default="01:00:00", help="time limit of the engines job (default 01:00:00)")
    for option in profile.SITE_OPTIONS:
        init.add_argument(f"--{option}", default="", help=f"sbatch --{option} for the engines job")
    init.add_argument("--idle", type=_positive, default=90, help="minutes without a notebook after which the "
                      "engines job ends (default 90: it outlives a lunch break)")
    init.add_argument("--cpus-per-task", type=_positive, help="CPU cores per engine")
    init.add_argument("--mpi", default="auto", help="srun --mpi flavour: auto (from the MPI in use), pmi2, pmix, ...")
    init.add_argument("--setup", action="append", default=[], help="a shell line the job runs first, e.g. "
                      "'module load cuda' (repeatable)")
    init.add_argument("--controller-location", default="", help="the name or address at which the nodes reach this "
                      "machine (default: its host name)")
    init.add_argument("--force", action="store_true", help="replace an ipcluster_config.py not written by hpclab")
    for action in (start, status, stop, init):
        action.add_argument("--profile", default="default", help="IPython profile (default: default)")
    return top


def status_lines(pdir: str, log) -> list[str]:
    lines = []
    for cluster_id in files.cluster_ids(pdir):
        found = files.load(pdir, cluster_id, log)
        name = "shared cluster (id '')" if cluster_id == SHARED_ID else f"private cluster {cluster_id}"
        if found.cluster is None:
            lines.append(f"{name}: {found.message}")
            continue
        try:
            client = found.cluster.connect_client_sync(timeout=3)
            up = str(len(client.ids))
            client.close()
        except Exception:  # noqa: BLE001 - e.g. "Hub connection request timed out"
            up = "? (the controller does not answer)"
        holder = files.read_record(pdir, cluster_id).get("owner")
        who = ("free" if cluster_id == SHARED_ID else "no owner recorded") if holder is None else \
            f"{'claimed by' if cluster_id == SHARED_ID else 'started by'} {files.describe_owner(holder)}" + \
            {True: "", False: " - gone: an orphan", None: " (on another host)"}[files.alive(holder)]
        job = jobs.job_of(found.cluster)
        left = (jobs.info(job) or jobs.JobInfo(job, "")).left() if job else ""
        lines.append(f"{name}: {up} of {found.expected or '?'} engines up; {who}"
                     + (f"; {jobs.report(job)}" + (f" ({left})" if left else "") if job else ""))
    return lines or [f"no clusters in {pdir}"]


def stop_lines(pdir: str, log, everything: bool = False) -> list[str]:
    """Stop the shared cluster and every orphan; private clusters of open notebooks only with ``everything``."""
    lines = []
    for cluster_id in files.cluster_ids(pdir):
        holder = files.read_record(pdir, cluster_id).get("owner")
        if cluster_id.startswith(PRIVATE_PREFIX) and holder and files.alive(holder) is not False and not everything:
            lines.append(f"left private cluster {cluster_id}: it belongs to {files.describe_owner(holder)}, which is "
                         "still open (close it there, or use --all)")
            continue
        found = files.load(pdir, cluster_id, log)
        if found.cluster is not None:
            job = jobs.job_of(found.cluster)
            files.stop(found.cluster, log)
            lines.append(f"stopped {'the shared cluster' if cluster_id == SHARED_ID else cluster_id}"
                         + (f" (cancelled Slurm job {job})" if job else ""))
        elif found.message:
            lines.append(found.message)
    return lines or [f"no clusters in {pdir}"]


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    pdir = files.profile_dir(args.profile)
    if args.action == "init":
        return profile.init(args, pdir)
    if args.action == "start":
        try:
            session.start_shared(args.engines, args.profile, args.timeout)
        except session.ClusterError as exc:
            print(f"hpclab cluster start: {exc}", file=sys.stderr)
            return 1
        return 0
    log = files.quiet_log(pdir)
    lines = status_lines(pdir, log) if args.action == "status" else stop_lines(pdir, log, everything=args.all)
    print(f"profile {args.profile!r} ({pdir}):\n" + "\n".join(f"  {line}" for line in lines))
    return 0
