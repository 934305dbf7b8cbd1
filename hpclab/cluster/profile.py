"""``hpclab cluster init --slurm``: an ipyparallel profile whose engines are one Slurm job.

It writes ``ipcluster_config.py`` in ipyparallel's own terms (``c.Cluster.engine_launcher_class =
"slurm"``, ``SlurmEngineSetLauncher``'s ``batch_template``, ``queue``, ``account``, ``qos``,
``timelimit``), so ``ipcluster start`` and ``ipp.Cluster(profile=...)`` use it too, and
``hpclab_slurm.json`` beside it (what connect() says, and the idle period of the shared job). Kept
here, as ipyparallel lacks it: one task and one GPU per engine, the site's options (reservation,
constraint), the environment's activation in the job, and ``srun --mpi=<flavour>`` (:mod:`.mpi`).
"""
from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from datetime import datetime
from pathlib import Path

from hpclab.cluster import mpi

SETTINGS_FILE = "hpclab_slurm.json"
CONFIG_FILE = "ipcluster_config.py"
MARK = "# hpclab cluster init --slurm"
SITE_OPTIONS = ("reservation", "qos", "constraint", "account")   # passed through to sbatch as they are


def settings(pdir: str) -> dict | None:
    """What ``hpclab cluster init --slurm`` wrote into the profile, or None."""
    try:
        return json.loads((Path(pdir) / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return None


def activation() -> list[str]:
    """Shell lines that make the job use this Python's environment (venv or conda) and this checkout."""
    lines = []
    if sys.prefix != sys.base_prefix and os.path.exists(os.path.join(sys.prefix, "bin", "activate")):
        lines.append(f"source {sys.prefix}/bin/activate")
    elif os.path.isdir(os.path.join(sys.prefix, "conda-meta")):  # conda's hooks need conda: PATH is enough
        lines += [f"export CONDA_PREFIX={sys.prefix}", f"export PATH={sys.prefix}/bin:$PATH"]
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").exists():  # a checkout: the engines import hpclab from it
        lines.append(f"export PYTHONPATH={root}:$PYTHONPATH")
    return lines


def batch_template(s: dict) -> str:
    """The engine job's script, as ipyparallel formats it ({n}, {queue}, ... filled in by the launcher)."""
    lines = ["#!/bin/bash", f"{MARK}: MPI engines, one per GPU (profile {s['profile']})",
             "#SBATCH --job-name=hpclab-engines", "#SBATCH --partition={queue}", "#SBATCH --time={timelimit}",
             "#SBATCH --ntasks={n}", "#SBATCH --output={output_file}", "#SBATCH --export=ALL"]
    lines += ["#SBATCH --account={account}"] * bool(s["account"]) + ["#SBATCH --qos={qos}"] * bool(s["qos"])
    lines += [f"#SBATCH {option}" for option in options(s)] + [*s["setup"], *activation(),
              f'echo "hpclab engines: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, {shlex.join(s["srun"])}"',
              f"{shlex.join(s['srun'])} {{program_and_args}}"]
    for line in s["setup"]:  # ipyparallel formats the template: a literal brace would break it
        if "{" in line or "}" in line:
            raise ValueError(f"--setup {line!r}: write $VAR, not ${{VAR}} (the line goes through ipyparallel's "
                             "template formatting)")
    return "\n".join(lines) + "\n"


def options(s: dict) -> list[str]:
    """sbatch options beyond ipyparallel's own traits: layout, GPUs and the site's options."""
    opts = [f"--nodes={s['nodes']}"] * bool(s["nodes"]) + [f"--ntasks-per-node={s['gpus_per_node']}",
                                                            f"--gpus-per-node={s['gpus_per_node']}"]
    opts += [f"--cpus-per-task={s['cpus_per_task']}"] * bool(s["cpus_per_task"])
    return opts + [f"--{k}={s[k]}" for k in ("reservation", "constraint") if s[k]]


def write(s: dict, pdir: str, force: bool = False) -> Path:
    """Write the profile's ipcluster_config.py and settings; a config not written here is kept."""
    config = Path(pdir) / CONFIG_FILE
    if config.exists() and MARK not in config.read_text(errors="replace") and not force:
        raise FileExistsError(f"{config} exists and was not written by hpclab cluster init; move it away, "
                              "choose another --profile, or pass --force to replace it")
    launcher = "c.SlurmEngineSetLauncher"
    location = s["controller_location"]
    config.write_text("\n".join([
        f"{MARK} (written {datetime.now():%Y-%m-%d %H:%M}; run it again to change these settings)",
        f"# {shlex.join(s['srun'])}: {s['mpi_reason']}",
        "c = get_config()  # noqa: F821 - provided by IPython when it loads this file",
        'c.Cluster.engine_launcher_class = "slurm"', f"c.Cluster.n = {s['engines']}",
        "# The controller runs where the notebook runs (the login node): the nodes must reach it.",
        'c.Cluster.controller_ip = "*"',
        f"c.Cluster.controller_location = {location!r}" if location else
        f"# engines reach the controller at this host's name ({socket.gethostname()})",
        "c.Cluster.engine_timeout = 600  # a job's engines register once it runs: wait, do not fail early",
        f"{launcher}.queue = {s['partition']!r}", f"{launcher}.timelimit = {s['time']!r}",
        f"{launcher}.account = {s['account']!r}", f"{launcher}.qos = {s['qos']!r}",
        "# the batch script beside the job's log, never in the working directory",
        f"{launcher}.batch_file_name = {os.path.join(pdir, 'log', 'slurm_engines_')!r} + str(__import__('os').getpid()) "
        "+ '.sbatch'",
        f'{launcher}.engine_args = ["--mpi"]  # each engine\'s id is its MPI rank',
        f"{launcher}.batch_template = '''\\\n{batch_template(s)}'''", ""]))
    (Path(pdir) / SETTINGS_FILE).write_text(json.dumps(s, indent=1) + "\n")
    return config


def init(args, pdir: str) -> int:
    """``hpclab cluster init --slurm ...``: check the options, write the profile, say what was chosen."""
    def fail(why: str) -> int:
        print(f"hpclab cluster init: {why}", file=sys.stderr)
        return 2
    if not args.slurm:
        return fail("only --slurm profiles are written (local MPI engines need no profile: connect() starts them)")
    if args.partition is None or args.gpus_per_node is None:
        return fail("--partition and --gpus-per-node are required (sinfo -o '%P %G' lists partitions and their GPUs)")
    engines = args.engines or (args.nodes or 1) * args.gpus_per_node
    if args.nodes and engines > args.nodes * args.gpus_per_node:
        return fail(f"--engines {engines} do not fit on --nodes {args.nodes} with --gpus-per-node "
                    f"{args.gpus_per_node} (one engine per GPU: at most {args.nodes * args.gpus_per_node})")
    try:
        choice = mpi.choose(args.mpi)
        s = {k: getattr(args, k) for k in ("partition", "gpus_per_node", "nodes", "time", "cpus_per_task", "setup",
                                          "controller_location", "profile", "idle", *SITE_OPTIONS)}
        s.update(engines=engines, srun=mpi.srun_command(choice.flavour), mpi_reason=choice.reason, profile_dir=pdir)
        config = write(s, pdir, force=args.force)
    except (ValueError, RuntimeError, FileExistsError) as exc:
        return fail(str(exc))
    site = ", ".join(f"{k} {s[k]}" for k in SITE_OPTIONS if s[k])
    print(f"wrote {config}\n  MPI launch: {choice}\n  environment: {'; '.join(activation()) or sys.executable}\n"
          f"  engines reach the controller at {s['controller_location'] or socket.gethostname()}\n"
          f"  job: partition {s['partition']}, {engines} engines ({s['gpus_per_node']} per node), "
          f"{s['gpus_per_node']} GPUs per node, time {s['time']}" + (f", {site}" if site else "") +
          f"; its log goes to {pdir}/log/; it ends after {s['idle']} min without a notebook")
    prof = "" if s["profile"] == "default" else f" --profile {s['profile']}"
    print(f"in a notebook: session = hpclab.cluster.connect(n={engines}"
          + ("" if s["profile"] == "default" else f", profile={s['profile']!r}") + ") starts the engines job on "
          f"first use; later notebooks claim it in turn. hpclab cluster status{prof} shows it, "
          f"hpclab cluster stop{prof} ends it")
    return 0
