"""Which ``srun --mpi=`` flavour starts this Python's MPI as one job.

The PMI interface a job's ranks use to find each other must be one that both
Slurm (``srun --mpi=list``) and the MPI library speak. Picking the wrong one
fails loudly (``--mpi=pmix`` with the PyPI ``mpich`` wheel: "unsupported PMI
version PMIx", exit 16) or, worse, quietly (``--mpi=none``, a common site
default: N separate one-rank jobs). So the flavour is chosen from the MPI that
mpi4py loads, not hard-coded:

    MPICH (the mpich wheel, or any MPICH without PMIx)   pmi2
    MPICH configured with PMIx                           pmix
    Open MPI                                             pmix (else pmi2)
    Intel MPI, MVAPICH                                   pmi2 (else pmix)
    Cray MPICH                                           cray_shasta (else pmi2)

and intersected with what ``srun --mpi=list`` offers when srun is here.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

FLAVOURS = ("pmi2", "pmix", "cray_shasta", "none")

# mpi4py is imported in a child process with initialize=False, so asking never starts MPI
# in the caller (a notebook kernel that imports mpi4py later must still get MPI_Init).
_PROBE = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
          "from mpi4py import MPI; print(MPI.Get_library_version())")


@dataclass
class Choice:
    flavour: str
    reason: str
    library: str = ""

    def __str__(self) -> str:
        return f"srun --mpi={self.flavour} ({self.reason})"


def library_version(python: str | None = None) -> str:
    """``MPI_Get_library_version()`` of the MPI mpi4py loads (without initialising MPI)."""
    proc = subprocess.run([python or sys.executable, "-c", _PROBE], capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cannot load MPI through mpi4py in {python or sys.executable}: {tail}")
    return proc.stdout.replace("\x00", "").strip()


def family(version: str) -> tuple[str, str]:
    """(family, one-line name) of an MPI from its library version text."""
    first = version.splitlines()[0].strip() if version else "unknown MPI"
    first = re.sub(r"\s+", " ", first).replace("MPICH Version: ", "MPICH ")
    if "Open MPI" in version:
        return "openmpi", first
    if "Intel(R) MPI" in version or "Intel MPI" in version:
        return "intel", first
    if "MVAPICH" in version:
        return "mvapich", first
    if "CRAY MPICH" in version.upper():
        return "cray", first
    if "MPICH" in version:
        name = first
        if "pypi.org/p/mpich" in version:
            name = f"{first} (the PyPI mpich wheel)"
        if re.search(r"configure:.*pmix", version, re.IGNORECASE):
            return "mpich-pmix", name
        return "mpich", name
    return "unknown", first


# The flavours each family can use, best first.
SUPPORTED = {
    "mpich": ["pmi2"],
    "mpich-pmix": ["pmix"],
    "openmpi": ["pmix", "pmi2"],
    "intel": ["pmi2", "pmix"],
    "mvapich": ["pmi2"],
    "cray": ["cray_shasta", "pmi2"],
    "unknown": ["pmix", "pmi2"],
}


def srun_flavours(timeout: float = 20) -> list[str] | str:
    """The MPI plugins ``srun --mpi=list`` offers, or why it cannot say (a str)."""
    if not shutil.which("srun"):
        return "srun is not on PATH here to confirm it"
    try:
        proc = subprocess.run(["srun", "--mpi=list"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`srun --mpi=list` did not answer ({type(exc).__name__})"
    text = proc.stdout + proc.stderr
    # 22.05+: "MPI plugin types are...\n\tpmix\n\tnone\n..."; older: "srun: mpi/pmi2" lines.
    found = re.findall(r"^\s*(?:srun:\s*)?(?:mpi/)?([a-z_0-9]+)\s*$", text, re.MULTILINE)
    found = [f for f in found if f not in ("are", "types")]
    if any(f.startswith("pmix_") for f in found) and "pmix" not in found:
        found.append("pmix")  # older Slurm lists only the versioned pmix plugins
    if not found:
        tail = (text.strip().splitlines() or ["no output"])[-1]
        return f"`srun --mpi=list` gave no list ({tail[:120]})"
    return found


def choose(requested: str = "auto", version: str | None = None,
           offered: list[str] | str | bool = True) -> Choice:
    """The flavour to use, and why. ``requested`` is auto or a flavour name (kept as given).

    ``version`` is the MPI library text (default: ask mpi4py); ``offered`` is srun's list
    (True: ask srun; a str: why srun's list is not known).
    """
    if requested != "auto":
        if requested not in FLAVOURS and not requested.startswith("pmix_"):
            raise ValueError(f"--mpi {requested!r}: choose auto, {', '.join(FLAVOURS)} (or pmix_vN)")
        return Choice(requested, "as asked")
    version = library_version() if version is None else version
    fam, name = family(version)
    wanted = SUPPORTED[fam]
    if offered is True:
        offered = srun_flavours()
    if isinstance(offered, str):
        return Choice(wanted[0], f"{name} speaks {' or '.join(wanted)}; {offered}", name)
    usable = [f for f in wanted if f in offered]
    if not usable:
        raise ValueError(f"{name} speaks {' or '.join(wanted)}, but srun here offers only "
                         f"{', '.join(offered)}: ask the site which MPI to load (module load ...) "
                         "and install mpi4py against it, or pass --mpi explicitly")
    return Choice(usable[0], f"{name} speaks {' or '.join(wanted)}; srun offers {', '.join(offered)}", name)


def main(argv: list[str] | None = None) -> int:
    """``python -m hpclab.slurm mpi [auto|FLAVOUR]``: print the flavour (stdout) and why (stderr)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        choice = choose(argv[0] if argv else "auto")
    except (ValueError, RuntimeError) as exc:
        print(f"hpclab: {exc}", file=sys.stderr)
        return 2
    print(choice.flavour)
    print(f"hpclab: srun --mpi={choice.flavour}: {choice.reason}", file=sys.stderr)
    return 0

