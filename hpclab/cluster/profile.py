"""``hpclab cluster init --slurm``: an ipyparallel profile whose engines are one Slurm job.

``ipcluster_config.py`` is in ipyparallel's terms (``SlurmEngineSetLauncher``'s batch_template, queue,
account, qos, timelimit), so ``ipcluster start`` uses it too; ``hpclab_slurm.json`` beside it keeps what
connect() says and the idle period. ipyparallel's template lacks one task and one GPU per engine, the
site's options, the environment's activation and the srun line of :func:`.mpi.srun_command`.
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

SETTINGS_FILE, CONFIG_FILE, MARK = "hpclab_slurm.json", "ipcluster_config.py", "# hpclab cluster init --slurm"
SITE_OPTIONS = ("reservation", "qos", "constraint", "account")   # passed through to sbatch as they are


def settings(pdir: str) -> dict | None:
    """What ``hpclab cluster init --slurm`` wrote into the profile, or None."""
    try:
        return json.loads((Path(pdir) / SETTINGS_FILE).read_text())
    except (OSError, ValueError):
        return None


def activation() -> list[str]:
    """Shell lines that make the job use this Python's environment (venv or conda) and this checkout."""
    lines = [f"source {sys.prefix}/bin/activate"] if os.path.exists(f"{sys.prefix}/bin/activate") and \
        sys.prefix != sys.base_prefix else [f"export CONDA_PREFIX={sys.prefix}", f"export PATH={sys.prefix}/bin:$PATH"] \
        if os.path.isdir(f"{sys.prefix}/conda-meta") else []   # (conda's activate hooks need conda: PATH is enough)
    root = Path(__file__).resolve().parents[2]
    return lines + ([f"export PYTHONPATH={root}:$PYTHONPATH"] if (root / "pyproject.toml").exists() else [])


def batch_template(s: dict) -> str:
    """The engines job's script, as ipyparallel formats it ({n}, {queue}, ... filled in by its launcher)."""
    for line in s["setup"]:  # ipyparallel formats the template: a literal brace would break it
        if "{" in line or "}" in line:
            raise ValueError(f"--setup {line!r}: write $VAR, not ${{VAR}} (the line goes through ipyparallel's "
                             "template formatting)")
    options = [f"--nodes={s['nodes']}"] * bool(s["nodes"]) + [f"--ntasks-per-node={s['gpus_per_node']}",
                                                               f"--gpus-per-node={s['gpus_per_node']}"]
    options += [f"--cpus-per-task={s['cpus_per_task']}"] * bool(s["cpus_per_task"])
    options += [f"--{k}={s[k]}" for k in ("reservation", "constraint") if s[k]]
    options += [f"--{k}={{{k}}}" for k in ("account", "qos") if s[k]]  # (ipyparallel's own traits)
    srun = shlex.join(s["srun"])
    return "\n".join(["#!/bin/bash", f"{MARK}: MPI engines, one per GPU (profile {s['profile']})",
                      "#SBATCH --job-name=hpclab-engines", "#SBATCH --partition={queue}", "#SBATCH --time={timelimit}",
                      "#SBATCH --ntasks={n}", "#SBATCH --output={output_file}", "#SBATCH --export=ALL",
                      *(f"#SBATCH {option}" for option in options), *s["setup"], *activation(),
                      f'echo "hpclab engines: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, {srun}"',
                      f"{srun} {{program_and_args}}", ""])


def write(s: dict, pdir: str, force: bool = False) -> Path:
    """Write the profile's ipcluster_config.py and settings; a config not written here is kept."""
    config = Path(pdir) / CONFIG_FILE
    if config.exists() and MARK not in config.read_text(errors="replace") and not force:
        raise FileExistsError(f"{config} exists and was not written by hpclab cluster init; move it away, "
                              "choose another --profile, or pass --force to replace it")
    slurm, batch = "c.SlurmEngineSetLauncher", os.path.join(pdir, "log", "slurm_engines_")
    location = f"c.Cluster.controller_location = {s['controller_location']!r}" if s["controller_location"] else \
        f"# engines reach the controller at this host's name ({socket.gethostname()})"
    config.write_text("\n".join([
        f"{MARK} (written {datetime.now():%Y-%m-%d %H:%M}; run it again to change these settings)",
        f"# {shlex.join(s['srun'])}: {s['mpi_reason']}",
        "c = get_config()  # noqa: F821 - provided by IPython when it loads this file",
        'c.Cluster.engine_launcher_class = "slurm"', f"c.Cluster.n = {s['engines']}",
        'c.Cluster.controller_ip = "*"  # the controller runs with the notebook (login node): the nodes must reach it',
        location, "c.Cluster.engine_timeout = 600  # a job's engines register once it runs: wait, do not fail early",
        *(f"{slurm}.{trait} = {s[key]!r}" for trait, key in (("queue", "partition"), ("timelimit", "time"),
                                                             ("account", "account"), ("qos", "qos"))),
        f"{slurm}.batch_file_name = {batch!r} + str(__import__('os').getpid()) + '.sbatch'  # beside its log",
        f'{slurm}.engine_args = ["--mpi"]  # each engine\'s id is its MPI rank',
        f"{slurm}.batch_template = '''\\\n{batch_template(s)}'''", ""]))
    (Path(pdir) / SETTINGS_FILE).write_text(json.dumps(s, indent=1) + "\n")
    return config


def init(args, pdir: str) -> int:
    """``hpclab cluster init --slurm ...``: check the options, write the profile, say what was chosen."""
    engines = args.engines or (args.nodes or 1) * (args.gpus_per_node or 1)
    try:
        if not args.slurm:
            raise ValueError("only --slurm profiles are written (local MPI engines need no profile: connect() "
                             "starts them)")
        if args.partition is None or args.gpus_per_node is None:
            raise ValueError("--partition and --gpus-per-node are required (sinfo -o '%P %G' lists partitions and "
                             "their GPUs)")
        if args.nodes and engines > args.nodes * args.gpus_per_node:
            raise ValueError(f"--engines {engines} do not fit on --nodes {args.nodes} with --gpus-per-node "
                             f"{args.gpus_per_node} (one engine per GPU: at most {args.nodes * args.gpus_per_node})")
        choice = mpi.choose(args.mpi)
        s = {k: getattr(args, k) for k in ("partition", "gpus_per_node", "nodes", "time", "cpus_per_task", "setup",
                                          "controller_location", "profile", "idle", *SITE_OPTIONS)}
        s.update(engines=engines, srun=mpi.srun_command(choice.flavour), mpi_reason=choice.reason, profile_dir=pdir)
        config = write(s, pdir, force=args.force)
    except (ValueError, RuntimeError, FileExistsError) as exc:
        print(f"hpclab cluster init: {exc}", file=sys.stderr)
        return 2
    site = "".join(f", {k} {s[k]}" for k in SITE_OPTIONS if s[k])
    prof = "" if s["profile"] == "default" else f" --profile {s['profile']}"
    print(f"wrote {config}\n  MPI launch: {choice}\n  environment: {'; '.join(activation()) or sys.executable}\n"
          f"  engines reach the controller at {s['controller_location'] or socket.gethostname()}\n"
          f"  job: partition {s['partition']}, {engines} engines ({s['gpus_per_node']} per node), {s['gpus_per_node']} "
          f"GPUs per node, time {s['time']}{site}; its log goes to {pdir}/log/; it ends after {s['idle']} min "
          f"without a notebook\nin a notebook: session = hpclab.cluster.connect(n={engines}"
          + ("" if not prof else f", profile={s['profile']!r}") + ") starts the engines job on first use; later "
          f"notebooks claim it in turn. hpclab cluster status{prof} shows it, hpclab cluster stop{prof} ends it")
    return 0
