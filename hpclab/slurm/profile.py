"""``hpclab cluster init --slurm``: an ipyparallel profile whose engines are a Slurm job.

    hpclab cluster init --slurm --partition gpu --gpus-per-node 4 [--nodes 2] [--engines 8]
                        [--account A] [--time 02:00:00] [--mpi auto|pmi2|pmix] [--profile default]

writes ``<IPYTHONDIR>/profile_<name>/ipcluster_config.py`` with

* ``c.Cluster.engine_launcher_class = "slurm"`` and a ``SlurmEngineSetLauncher.batch_template``
  that asks for the partition, one task per GPU (``--ntasks={n}``, ``--ntasks-per-node`` and
  ``--gpus-per-node`` = GPUs per node), the time, the account, activates the Python
  environment that ran this command, and starts the engines with ``srun --mpi=<flavour>``
  (chosen from the MPI in use, see :mod:`hpclab.slurm.mpi`) so they are one MPI job;
* the job's output in the profile's ``log/`` folder (``{output_file}``) and the generated
  batch script there too, never in the working directory;
* ``c.Cluster.controller_ip = "*"``: the controller (on the login node, where the notebook
  runs) listens on every interface, and engines reach it at the login node's host name
  (``--controller-location`` to give another name or address);

and ``hpclab_slurm.json`` beside it (the settings, read by :func:`hpclab.slurm.slurm_settings`).
``hpclab.cluster.connect(profile=NAME)`` (a notebook's own job), ``hpclab cluster start --profile NAME``
(one job that notebooks claim in turn), ``ipcluster start --profile NAME`` and ``ipp.Cluster(profile=NAME)``
then submit the job.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path

from hpclab.slurm import mpi as mpi_choice

SETTINGS_FILE = "hpclab_slurm.json"
CONFIG_FILE = "ipcluster_config.py"
MARK = "# hpclab cluster init --slurm"


@dataclass
class SlurmSettings:
    partition: str
    gpus_per_node: int
    engines: int
    mpi: str
    mpi_reason: str = ""
    nodes: int | None = None
    account: str = ""
    time: str = "01:00:00"
    cpus_per_task: int | None = None
    setup: list[str] = field(default_factory=list)
    activate: list[str] = field(default_factory=list)
    controller_location: str = ""
    profile: str = "default"
    profile_dir: str = ""
    python: str = ""


def ipython_dir() -> str:
    from IPython.paths import get_ipython_dir

    return get_ipython_dir()


def profile_dir(profile: str = "default", ipython_dir_: str | None = None) -> Path:
    """Where profile ``profile`` lives (it may not exist)."""
    return Path(ipython_dir_ or ipython_dir()) / f"profile_{profile}"


def environment_activation(prefix: str = sys.prefix, base: str = sys.base_prefix) -> list[str]:
    """Shell lines that make the job use this Python's environment (venv or conda), if any."""
    lines = []
    if prefix != base and os.path.exists(os.path.join(prefix, "bin", "activate")):
        lines.append(f"source {prefix}/bin/activate")
    elif os.path.isdir(os.path.join(prefix, "conda-meta")):
        # conda's activate hooks need conda itself; PATH alone is enough to find this Python and mpiexec.
        lines += [f"export CONDA_PREFIX={prefix}", f"export PATH={prefix}/bin:$PATH"]
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        distribution("hpclab")
    except PackageNotFoundError:  # run from a checkout that is not installed: let the engines import it
        root = Path(__file__).resolve().parents[2]
        lines.append(f"export PYTHONPATH={root}:$PYTHONPATH")
    return lines


def batch_template(s: SlurmSettings) -> str:
    """The engine job's batch script, as ipyparallel's template ({n}, {output_file}, {program_and_args})."""
    lines = ["#!/bin/bash",
             f"{MARK}: MPI engines, one per GPU (profile {s.profile})",
             "#SBATCH --job-name=hpclab-engines",
             f"#SBATCH --partition={s.partition}"]
    if s.account:
        lines.append(f"#SBATCH --account={s.account}")
    if s.nodes:
        lines.append(f"#SBATCH --nodes={s.nodes}")
    lines += ["#SBATCH --ntasks={n}",
              f"#SBATCH --ntasks-per-node={s.gpus_per_node}",
              f"#SBATCH --gpus-per-node={s.gpus_per_node}"]
    if s.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={s.cpus_per_task}")
    lines += [f"#SBATCH --time={s.time}",
              "#SBATCH --output={output_file}",
              "#SBATCH --export=ALL",
              *s.setup,
              *s.activate,
              f'echo "hpclab engines: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, srun --mpi={s.mpi}"',
              f"srun --mpi={s.mpi} --kill-on-bad-exit=1 {{program_and_args}}"]
    for line in lines:  # ipyparallel formats the template: a literal brace would break it
        if ("{" in line or "}" in line) and not any(k in line for k in ("{n}", "{output_file}", "{program_and_args}")):
            raise ValueError(f"braces are not allowed in the batch template: {line!r}")
    return "\n".join(lines) + "\n"


def render_config(s: SlurmSettings) -> str:
    log_dir = os.path.join(s.profile_dir, "log")
    location = (f"c.Cluster.controller_location = {s.controller_location!r}\n" if s.controller_location else
                f"# engines reach the controller at this host's name ({socket.gethostname()}); "
                "set c.Cluster.controller_location to change it\n")
    return (
        f"{MARK} (written {datetime.now():%Y-%m-%d %H:%M}; run it again to change these settings)\n"
        f"# mpi: srun --mpi={s.mpi}: {s.mpi_reason}\n"
        "import os\n\n"
        "c = get_config()  # noqa: F821 - provided by IPython when it loads this file\n"
        'c.Cluster.engine_launcher_class = "slurm"\n'
        f"c.Cluster.n = {s.engines}\n"
        "# The controller runs where the notebook runs (the login node) and must be reachable from the nodes.\n"
        'c.Cluster.controller_ip = "*"\n'
        f"{location}"
        "# Engines of a job register one by one (and only once the job starts): wait, do not fail early.\n"
        "c.Cluster.engine_timeout = 600\n"
        "# The generated batch script goes beside the job's log, never into the working directory.\n"
        f"c.SlurmEngineSetLauncher.batch_file_name = os.path.join({log_dir!r}, "
        'f"slurm_engines_{os.getpid()}.sbatch")\n'
        "# --mpi: each engine's id is its MPI rank, and mpi4py is imported in its namespace.\n"
        'c.SlurmEngineSetLauncher.engine_args = ["--mpi"]\n'
        f"c.SlurmEngineSetLauncher.batch_template = '''\\\n{batch_template(s)}'''\n")


def write_profile(s: SlurmSettings, force: bool = False) -> Path:
    """Write the profile's ipcluster_config.py and settings; refuses to replace a config not written here."""
    pdir = Path(s.profile_dir)
    config = pdir / CONFIG_FILE
    if config.exists() and MARK not in config.read_text(errors="replace") and not force:
        raise FileExistsError(f"{config} exists and was not written by hpclab cluster init; move it away, "
                              "choose another --profile, or pass --force to replace it")
    (pdir / "log").mkdir(parents=True, exist_ok=True)
    (pdir / "security").mkdir(exist_ok=True)
    config.write_text(render_config(s))
    (pdir / SETTINGS_FILE).write_text(json.dumps(asdict(s), indent=1) + "\n")
    return config


def read_settings(profile: str = "default", ipython_dir_: str | None = None) -> SlurmSettings | None:
    path = profile_dir(profile, ipython_dir_) / SETTINGS_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    known = SlurmSettings.__dataclass_fields__
    return SlurmSettings(**{k: v for k, v in data.items() if k in known})


# ---------------------------------------------------------------- the command

def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return value


def add_cluster_init(subparsers) -> argparse.ArgumentParser:
    """Add ``init`` to the ``hpclab cluster`` subcommands."""
    p = subparsers.add_parser(
        "init", help="write an ipyparallel profile whose engines are a Slurm job (--slurm)",
        description="Write an ipyparallel profile whose MPI engines run as one Slurm job on GPU nodes, one "
                    "engine per GPU, so that a notebook on the login node gets them with "
                    "hpclab.cluster.connect() or `ipcluster start --profile NAME`.")
    p.add_argument("--slurm", action="store_true", help="engines from Slurm (the only kind for now)")
    p.add_argument("--partition", "-p", help="the GPU partition (sinfo lists them)")
    p.add_argument("--gpus-per-node", type=_positive, help="GPUs per node to use; one engine per GPU")
    p.add_argument("--nodes", "-N", type=_positive, default=None, help="nodes (default: as many as the engines need)")
    p.add_argument("--engines", "--ntasks", "-n", dest="engines", type=_positive, default=None,
                   help="engines (MPI ranks) in all (default: nodes x GPUs per node)")
    p.add_argument("--account", "-A", default="", help="Slurm account to charge")
    p.add_argument("--time", "-t", default="01:00:00", help="time limit of the engine job (default 01:00:00)")
    p.add_argument("--cpus-per-task", type=_positive, default=None, help="CPU cores per engine")
    p.add_argument("--mpi", default="auto",
                   help="srun --mpi flavour: auto (from the MPI in use and srun --mpi=list), pmi2, pmix, ...")
    p.add_argument("--setup", action="append", default=[],
                   help="a shell line run in the job before the engines, e.g. 'module load openmpi' (repeatable)")
    p.add_argument("--controller-location", default="",
                   help="host name or address at which the nodes reach this machine (default: its host name)")
    p.add_argument("--profile", default="default", help="IPython profile to write (default: default)")
    p.add_argument("--force", action="store_true", help="replace an ipcluster_config.py not written by hpclab")
    p.set_defaults(func=init_command)
    return p


def settings_from_args(args) -> tuple[SlurmSettings, list[str]]:
    """Settings from the command line, and lines that say what was decided and why."""
    notes = []
    if args.partition is None or args.gpus_per_node is None:
        raise ValueError("--partition and --gpus-per-node are required (sinfo -o '%P %G' lists partitions "
                         "and their GPUs)")
    engines = args.engines or (args.nodes or 1) * args.gpus_per_node
    if args.nodes and engines > args.nodes * args.gpus_per_node:
        raise ValueError(f"--engines {engines} do not fit on --nodes {args.nodes} with --gpus-per-node "
                         f"{args.gpus_per_node} (one engine per GPU: at most {args.nodes * args.gpus_per_node})")
    for line in args.setup:
        if "{" in line or "}" in line:
            raise ValueError(f"--setup {line!r}: write $VAR, not ${{VAR}} (the line goes through ipyparallel's "
                             "template formatting)")
    choice = mpi_choice.choose(args.mpi)
    notes.append(f"MPI launch: srun --mpi={choice.flavour} ({choice.reason})")
    activate = environment_activation()
    notes.append("environment: " + ("; ".join(activate) if activate else
                                     f"none to activate ({sys.executable} is used as it is)"))
    location = args.controller_location
    notes.append(f"engines reach the controller at {location or socket.gethostname()}"
                 + ("" if location else " (this host's name; --controller-location to change)"))
    pdir = profile_dir(args.profile)
    s = SlurmSettings(partition=args.partition, gpus_per_node=args.gpus_per_node, engines=engines,
                      mpi=choice.flavour, mpi_reason=choice.reason, nodes=args.nodes, account=args.account,
                      time=args.time, cpus_per_task=args.cpus_per_task, setup=list(args.setup),
                      activate=activate, controller_location=location, profile=args.profile,
                      profile_dir=str(pdir), python=sys.executable)
    return s, notes


def init_command(args) -> int:
    if not args.slurm:
        print("hpclab cluster init: only --slurm profiles are written (local MPI engines need no profile: "
              "connect() starts them)", file=sys.stderr)
        return 2
    try:
        settings, notes = settings_from_args(args)
        config = write_profile(settings, force=args.force)
    except (ValueError, RuntimeError, FileExistsError) as exc:
        print(f"hpclab cluster init: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {config}")
    for note in notes:
        print(f"  {note}")
    nodes = f"{settings.nodes} node(s)" if settings.nodes else "nodes as needed"
    print(f"  job: partition {settings.partition}, {settings.engines} engines ({settings.gpus_per_node} per node, "
          f"{nodes}), {settings.gpus_per_node} GPUs per node, time {settings.time}"
          + (f", account {settings.account}" if settings.account else "")
          + f"; its log goes to {settings.profile_dir}/log/")
    prof = "" if settings.profile == "default" else f" --profile {settings.profile}"
    arg = "" if settings.profile == "default" else f", profile={settings.profile!r}"
    print(f"in a notebook: session = hpclab.cluster.connect(n={settings.engines}{arg}) submits the engine job "
          "(session.close() cancels it)\n"
          f"one job that notebooks claim in turn: hpclab cluster start -n {settings.engines}{prof}   "
          f"(stop: hpclab cluster stop{prof})")
    return 0
