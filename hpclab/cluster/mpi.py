"""Which ``srun --mpi=`` flavour starts this Python's MPI as one job, and the one srun line of every route.

Slurm and the MPI must speak the same PMI: the wrong one fails loudly (``--mpi=pmix`` with the PyPI mpich
wheel) or quietly (``--mpi=none``, a common default: N one-rank jobs); ipyparallel leaves srun to the site.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

from hpclab.cluster import jobs

FLAVOURS = ("pmi2", "pmix", "cray_shasta", "none")
SUPPORTED = {"mpich": ["pmi2"], "mpich-pmix": ["pmix"], "openmpi": ["pmix", "pmi2"], "intel": ["pmi2", "pmix"],
             "mvapich": ["pmi2"], "cray": ["cray_shasta", "pmi2"], "unknown": ["pmix", "pmi2"]}  # best first
# Asked in a child process with initialize=False: asking never starts MPI in the caller.
_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
          "from mpi4py import MPI; print(MPI.Get_library_version())")


@dataclass
class Choice:
    flavour: str
    reason: str

    def __str__(self) -> str:
        return f"srun --mpi={self.flavour} ({self.reason})"


def library_version() -> str:
    """``MPI_Get_library_version()`` of the MPI mpi4py loads (without initialising MPI)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cannot load MPI through mpi4py in {sys.executable}: {tail}")
    return proc.stdout.replace("\x00", "").strip()


def family(version: str) -> tuple[str, str]:
    """(family, one-line name) of an MPI from its library version text."""
    name = re.sub(r"\s+", " ", version.splitlines()[0].strip() if version else "unknown MPI")
    name = name.replace("MPICH Version: ", "MPICH ")
    for fam, mark in (("openmpi", "Open MPI"), ("intel", "Intel"), ("mvapich", "MVAPICH"), ("cray", "CRAY MPICH")):
        if mark in (version.upper() if fam == "cray" else version):
            return fam, name
    if "MPICH" not in version:
        return "unknown", name
    name += " (the PyPI mpich wheel)" if "pypi.org/p/mpich" in version else ""
    return ("mpich-pmix" if re.search(r"configure:.*pmix", version, re.IGNORECASE) else "mpich"), name


def srun_flavours() -> list[str] | str:
    """The MPI plugins ``srun --mpi=list`` offers, or why it cannot say (a str)."""
    code, text = jobs.run(["srun", "--mpi=list"], timeout=20)
    if code in (124, 127):
        return "srun is not on PATH here to confirm it" if code == 127 else f"`srun --mpi=list`: {text}"
    # 22.05+: "MPI plugin types are...\n\tpmix\n\tnone\n..."; older: "srun: mpi/pmi2" lines.
    found = [f for f in re.findall(r"^\s*(?:srun:\s*)?(?:mpi/)?([a-z_0-9]+)\s*$", text, re.MULTILINE)
             if f not in ("are", "types")]
    if any(f.startswith("pmix_") for f in found) and "pmix" not in found:
        found.append("pmix")  # older Slurm lists only the versioned pmix plugins
    return found or f"`srun --mpi=list` gave no list ({(text.strip().splitlines() or ['no output'])[-1][:120]})"


def choose(requested: str = "auto", version: str | None = None, offered: list[str] | str | bool = True) -> Choice:
    """The flavour to use, and why: ``requested`` (kept as given), or for "auto" from the MPI library
    ``version`` (default: ask mpi4py) and srun's list ``offered`` (True: ask srun)."""
    if requested != "auto":
        if requested not in FLAVOURS and not requested.startswith("pmix_"):
            raise ValueError(f"--mpi {requested!r}: choose auto, {', '.join(FLAVOURS)} (or pmix_vN)")
        return Choice(requested, "as asked")
    fam, name = family(library_version() if version is None else version)
    wanted = SUPPORTED[fam]
    offered = srun_flavours() if offered is True else offered
    if isinstance(offered, str):
        return Choice(wanted[0], f"{name} speaks {' or '.join(wanted)}; {offered}")
    usable = [f for f in wanted if f in offered]
    if not usable:
        raise ValueError(f"{name} speaks {' or '.join(wanted)}, but srun here offers only {', '.join(offered)}: ask "
                         "the site which MPI to load (module load ...) and install mpi4py against it, or pass --mpi "
                         "explicitly")
    return Choice(usable[0], f"{name} speaks {' or '.join(wanted)}; srun offers {', '.join(offered)}")


def srun_command(flavour: str | None = None) -> list[str]:
    """The launch line of every job's MPI program: ``srun --mpi=<flavour> --kill-on-bad-exit=1``
    (one rank that fails ends the job, rather than leaving the others waiting in a collective).
    The flavour: as given, else ``$HPCLAB_SRUN_MPI``, else chosen by :func:`choose`."""
    flavour = flavour or os.environ.get("HPCLAB_SRUN_MPI") or choose().flavour
    return ["srun", f"--mpi={flavour}", "--kill-on-bad-exit=1"]
