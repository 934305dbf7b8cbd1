"""``hpclab doctor [--engines [-n 4]] [--backend nccl]``: a pre-flight of what the notebooks need,
here (under mpiexec: every rank) or on every engine a notebook would use (``--site``: what the site's
Slurm offers a workshop's room, hpclab/cli/site.py). One line per requirement:
PASS, WARN, FAIL or SKIP, what was found and the fix; exit status 1 on a FAIL. On the simulator (a
supported place to run the workbook) the GPU lines say SKIP and why. Also ``hpclab info``: the facts
alone (backend, GPUs and which ranks use them, MPI, NCCL, versions)."""
from __future__ import annotations

import argparse
import ctypes
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import distributions

import numpy as np

from hpclab import backend, mpi
from hpclab.cli import site
from hpclab.cli.line import Line
from hpclab.comm.nccl import available as nccl_available, version_string
from hpclab.comm.select import BACKENDS
from hpclab.device import describe_sharing, identity, select_gpu, sharing
from hpclab.errors import RankError, step
from hpclab.runner import env_rank
from hpclab.cluster.mpi import choose as srun_mpi, family as mpi_family, srun_flavours  # Slurm helpers

STACK = {12: "cu12", 13: "cu13"}    # CUDA major -> the extra with its stack (tools/gpu_stack.py)
SETUP = "make setup (it installs the stack that matches the driver)"


def _version(dist: str) -> str | None:
    return next((d.version for d in distributions(name=dist)), None)


def _first(exc: Exception) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:160]}"


def driver_cuda() -> tuple[int, int] | None:
    """The CUDA version the NVIDIA driver supports, asked from libcuda (None: no driver)."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            found = ctypes.c_int(0)
            if ctypes.CDLL(name).cuDriverGetVersion(ctypes.byref(found)) == 0:
                return found.value // 1000, found.value % 1000 // 10
        except OSError:
            continue
    return None


def _cupy_for(driver) -> str:
    return f"cupy-cuda{driver[0]}x" if driver and driver[0] in STACK else "cupy-cuda12x (cupy-cuda13x for CUDA 13)"


def backend_line() -> Line:    # each requirement's line is a function of what was found (tests feed it facts)
    try:
        if backend.select() == "gpu":
            return Line("PASS", "backend", f"real GPUs ({backend.count_gpus()} visible to this process)")
    except backend.BackendError as exc:
        return Line("FAIL", "backend", str(exc), "run on a GPU node, or unset HPCLAB_BACKEND")
    why = "HPCLAB_BACKEND=sim" if os.environ.get("HPCLAB_BACKEND", "").lower() == "sim" else "no GPU is visible"
    return Line("WARN", "backend", f"Numba CUDA simulator ({why}): right answers, tiny sizes, no speed",
                "for real GPUs, run on a GPU node")


def driver_line(driver, simulator: bool) -> Line:
    if driver is None:
        return Line("SKIP" if simulator else "FAIL", "NVIDIA driver", "none here (no libcuda)",
                    "" if simulator else "run on a node with NVIDIA GPUs")
    if driver[0] < min(STACK):
        return Line("FAIL", "NVIDIA driver", f"supports CUDA {driver[0]}.{driver[1]}; numba-cuda 0.30 "
                    "needs CUDA 12 or 13", "a node with a newer NVIDIA driver")
    return Line("PASS", "NVIDIA driver", f"supports CUDA {driver[0]}.{driver[1]}")


def numpy_line(found: str) -> Line:
    if tuple(int(p) for p in re.findall(r"\d+", found)[:2]) >= (2, 5):
        return Line("FAIL", "numpy", f"{found}: numba-cuda 0.30 cannot compile kernels with numpy 2.5 "
                    "(it has no numpy.row_stack)", "pip install 'numpy<2.5'")
    return Line("PASS", "numpy", f"{found} (below 2.5, as numba-cuda 0.30 needs)")


def kernel_line(driver, simulator: bool) -> Line:
    """numba-cuda's compiler (NVVM) and CUDA bindings: one small kernel compiled, run and checked."""
    if simulator:
        return Line("SKIP", "numba-cuda kernel", "the simulator compiles nothing (kernels run as Python)")
    try:
        cuda = backend.cuda()

        @cuda.jit
        def add_one(a):
            a[cuda.grid(1)] += 1

        out = cuda.to_device(np.arange(64))
        add_one[1, 64](out)                       # exactly one thread per element
        if not np.array_equal(out.copy_to_host(), np.arange(1, 65)):
            raise RuntimeError("the kernel ran but computed a wrong result")
    except Exception as exc:  # noqa: BLE001 - a failure to compile or launch is the finding
        return Line("FAIL", "numba-cuda kernel", _first(exc), (f"pip install 'numba-cuda[{STACK[driver[0]]}]' "
                    f"(the CUDA {driver[0]} toolkit), or {SETUP}") if driver and driver[0] in STACK else SETUP)
    return Line("PASS", "numba-cuda kernel", f"numba-cuda {_version('numba-cuda')} (cuda-bindings "
                f"{_version('cuda-bindings')}) compiled and ran a kernel on {cuda.get_current_device().name}")


def cupy_packages() -> dict[str, str]:
    """Installed CuPy distributions, name -> version (two of them overwrite each other)."""
    return {d.metadata["Name"].lower(): d.version for d in distributions()
            if re.fullmatch(r"cupy(-cuda\d+x)?", (d.metadata["Name"] or "").lower())}


def cupy_line(found: dict[str, str], driver, simulator: bool) -> Line:
    if not found:
        return (Line("SKIP", "CuPy", "not installed; not needed on the simulator") if simulator else
                Line("FAIL", "CuPy", "not installed, so no NCCL (notebooks 05-07, exercises 3-4)",
                     f"pip install {_cupy_for(driver)}, or {SETUP}"))
    if len(found) > 1:
        return Line("FAIL", "CuPy", f"{' and '.join(found)} are installed and overwrite each other",
                    f"pip uninstall -y {' '.join(n for n in found if n != _cupy_for(driver))}")
    name, ver = next(iter(found.items()))
    built = re.search(r"cuda(\d+)x", name)
    text = f"{name} {ver}" + (f", built for CUDA {built[1]}" if built else "")
    if simulator:
        return Line("SKIP", "CuPy", f"{text}; not used on the simulator")
    if built and driver and int(built[1]) > driver[0]:
        return Line("FAIL", "CuPy", f"{text}, but the driver supports {driver[0]}.{driver[1]}",
                    f"pip uninstall -y {name} && pip install {_cupy_for(driver)}")
    return Line("PASS", "CuPy", text + (f"; the driver supports {driver[0]}.{driver[1]}" if driver else ""))


def nccl_line(simulator: bool, asked: bool, driver) -> Line:
    """NCCL through CuPy: it imports, and on a GPU a one-rank communicator all-reduces Numba memory."""
    cu = driver[0] if driver and driver[0] in STACK else "12"
    install = f"pip install cupy-cuda{cu}x nvidia-nccl-cu{cu}{'' if driver else ' (13: CUDA 13)'}, or {SETUP}"
    try:
        from cupy.cuda import nccl, runtime
        if not getattr(nccl, "available", True):
            raise ImportError("CuPy found no NCCL library")
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA library that does not load
        if simulator and not asked:
            return Line("SKIP", "NCCL", f"cupy.cuda.nccl does not import ({_first(exc)}); not used on the simulator")
        return Line("FAIL", "NCCL", f"cupy.cuda.nccl does not import ({_first(exc)})", install)
    if simulator:
        return Line("FAIL" if asked else "SKIP", "NCCL", "needs real GPUs; the simulator stages device data "
                    "through host memory", "--backend auto (or mpi-host) here; nccl on a GPU node" if asked else "")
    try:
        cuda = backend.cuda()
        runtime.setDevice(cuda.get_current_device().id)   # NCCL's communicator goes to the runtime's device
        data = cuda.to_device(np.arange(1.0, 5.0))
        ptr = data.__cuda_array_interface__["data"][0]
        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        comm.allReduce(ptr, ptr, 4, nccl.NCCL_FLOAT64, nccl.NCCL_SUM, 0)
        cuda.synchronize()
        if not np.array_equal(data.copy_to_host(), np.arange(1.0, 5.0)):
            raise RuntimeError("a one-rank all-reduce changed the data")
        v = version_string(nccl)
    except Exception as exc:  # noqa: BLE001
        return Line("FAIL", "NCCL", _first(exc), install)
    return Line("PASS", "NCCL", f"NCCL {v} through cupy.cuda.nccl all-reduced on this rank's GPU")


def mpi_line(library: str, launcher: str | None, launcher_version: str) -> Line:
    family, name = mpi_family(library)
    text = f"mpi4py {_version('mpi4py')} on {name}; mpiexec: {launcher or 'none on PATH'}"
    if launcher is None:
        return Line("WARN", "MPI", text + " (notebooks cannot start engines here)",
                    "pip install mpich (make setup does), or module load the site's MPI")
    # Open MPI's mpiexec starts Open MPI; Hydra (the mpiexec of MPICH, Intel MPI, MVAPICH) the others
    orte, hydra = re.search(r"Open ?MPI|OpenRTE", launcher_version), "HYDRA" in launcher_version
    if (orte and family not in ("openmpi", "unknown", "cray")) or (hydra and family == "openmpi"):
        return Line("FAIL", "MPI", f"{text}, which is another MPI's: every rank would be a world of one",
                    "put the mpiexec of the MPI that mpi4py uses first on PATH")
    return Line("PASS", "MPI", text)


def _mpiexec() -> tuple[str | None, str]:
    """The mpiexec that starts engines (the one beside this Python first) and its --version."""
    found = shutil.which("mpiexec", path=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
    try:
        return found, subprocess.run([found, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, TypeError, subprocess.TimeoutExpired):
        return found, ""


def srun_line(library: str, offered) -> Line:
    """The ``srun --mpi`` flavour for this MPI against what ``srun --mpi=list`` offers (None: no srun)."""
    if offered is None:
        return Line("SKIP", "srun --mpi", "no Slurm here (srun is not on PATH)")
    if isinstance(offered, str):
        return Line("WARN", "srun --mpi", f"srun is here but {offered}", "check that Slurm works: srun --mpi=list")
    try:
        return Line("PASS", "srun --mpi", str(srun_mpi("auto", version=library, offered=offered)))
    except ValueError as exc:
        return Line("FAIL", "srun --mpi", str(exc).split(": ask")[0],
                    "load the site's MPI (module load ...) and reinstall mpi4py against it")


def aware_line(aware: bool, how: str, simulator: bool, asked: str) -> Line:
    if simulator or aware:
        return Line("PASS", "CUDA-aware MPI", f"yes ({how})") if aware else Line(
            "SKIP", "CUDA-aware MPI", "the simulator stages device data through host memory")
    strict = asked == "mpi-cuda"
    return Line("FAIL" if strict else "WARN", "CUDA-aware MPI", f"no ({how}): device data is staged through "
                "host memory", ("--backend auto, or " if strict else "") + "a CUDA-aware MPI build saves the copies")


def sharing_line(shared, size: int, simulator: bool, asked: str) -> Line:
    if not shared:
        return Line("PASS", "GPUs per rank", f"one GPU for each of the {size} ranks")
    what = describe_sharing(shared)
    if asked == "nccl":
        return Line("FAIL", "GPUs per rank", f"{what}; NCCL refuses two ranks of one communicator on one GPU",
                    "one engine per GPU (connect(n=GPUs); srun --gpus-per-task=1), or --backend auto")
    if simulator:
        return Line("SKIP", "GPUs per rank", "the simulator: the ranks of a node share its one simulated device")
    return Line("WARN", "GPUs per rank", f"{what}: they take turns on it (time sharing, not scaling) "
                "and NCCL cannot run between them", "one engine per GPU: connect(n=GPUs)")


def checks(asked: str = "auto") -> list[Line]:
    """Every requirement, in this process. Collective over MPI's world when it has several ranks:
    they meet in the same steps whatever each found, so none is left waiting."""
    lines, simulator, driver = [backend_line()], backend.selected() != "gpu", driver_cuda()   # selects first
    lines += [driver_line(driver, simulator), numpy_line(_version("numpy") or "0"),
              kernel_line(driver, simulator),
              cupy_line(cupy_packages(), driver, simulator), nccl_line(simulator, asked == "nccl", driver)]
    try:
        comm, library = mpi.world(), mpi.MPI().Get_library_version().replace("\x00", "").strip()
    except Exception as exc:  # noqa: BLE001 - MPIUnavailable, or an MPI library that does not load
        return lines + [Line("FAIL", "MPI", _first(exc), "pip install mpich mpi4py (make setup does)")]
    lines += [mpi_line(library, *_mpiexec()),
              srun_line(library, srun_flavours() if shutil.which("srun") else None),
              aware_line(*(mpi.cuda_aware() if not simulator else (False, "")), simulator, asked)]
    if comm.size > 1:
        try:
            with step(comm, "GPU selection"):
                select_gpu(comm)
            lines.append(sharing_line(sharing(comm), comm.size, simulator, asked))
        except RankError as exc:
            lines.append(Line("FAIL", "GPUs per rank", str(exc), "hpclab info under mpiexec shows each rank's GPU"))
    return lines


def merge(per_rank: list[list[Line]]) -> list[str]:
    """One line per requirement where every rank found the same, else one per group of ranks."""
    out = []
    for i in range(len(per_rank[0])):
        groups: dict[str, list[int]] = {}
        for rank, lines in enumerate(per_rank):
            groups.setdefault(str(lines[i]), []).append(rank)
        out += [text if len(groups) == 1 else f"{text}  [rank{'s' * (len(ranks) > 1)} {', '.join(map(str, ranks))}]"
                for text, ranks in groups.items()]
    return out


def report(session=None, asked: str = "auto", per_rank=None) -> int:
    """Print the lines of every engine of a notebook's session (or ``per_rank``'s); 1 on a FAIL, else 0."""
    if session is not None:
        print(f"hpclab doctor on {session.n} engines; a line that holds for some ranks only names them:")
    lines = merge(per_rank or session.on_ranks(checks, asked))
    print("\n".join(lines), flush=True)
    return 1 if any(line.startswith("FAIL") for line in lines) else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="hpclab doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", action="store_true", help="check every engine a notebook would use")
    parser.add_argument("-n", type=int, default=4, help="with --engines: how many (default 4)")
    parser.add_argument("--profile", default="default", help="with --engines: the IPython profile")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="what you will ask for")
    parser.add_argument("--site", action="store_true", help="what the site's Slurm offers a workshop's room")
    site.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.site:
        if not args.partition:
            parser.error("--site needs --partition (sinfo -o '%P %G %l' lists them)")
        return report(per_rank=[site.checks(args)])
    if args.engines:
        from hpclab import cluster

        try:
            session = cluster.connect(n=args.n, profile=args.profile, activate=False)
        except cluster.ClusterError as exc:     # no engines: that is the finding
            return report(per_rank=[[Line("FAIL", "engines", str(exc))]])
        try:
            return report(session, args.backend)
        finally:
            session.close()
    mine = checks(args.backend)
    try:
        everyone = mpi.world().gather(mine)
    except Exception:  # noqa: BLE001 - no MPI: this process alone (its MPI line says why)
        everyone = [mine]
    return 0 if everyone is None else report(per_rank=everyone)   # under mpiexec rank 0 speaks


# ---------------------------------------------------------------- hpclab info

def info() -> int:
    """``hpclab info``: one line per fact, on rank 0; exit status 2 when no backend can be chosen."""
    rows, problem, choice, comm = [], None, None, None
    try:
        choice = backend.select()
        rows.append(("backend", backend.describe(choice)))
    except backend.BackendError as exc:
        rows.append(("backend", f"ERROR: {exc}"))
        problem = f"hpclab info: error: {exc}"
    rows.append(("GPUs (driver)", str(backend.count_gpus())))
    if choice == "gpu":
        cuda = backend.cuda()
        for i, gpu in enumerate(cuda.gpus):
            with gpu:
                dev, (name, uuid) = cuda.get_current_device(), identity()
                cc = ".".join(map(str, dev.compute_capability))
                rows.append((f"  GPU {i}", f"{name} (compute {cc}, {dev.MULTIPROCESSOR_COUNT} SMs) {uuid}"))
    try:
        comm = mpi.world()
        rows += [("MPI", mpi.library()), ("MPI ranks", str(comm.size))]
        aware, how = mpi.cuda_aware()
        rows.append(("CUDA-aware MPI", f"{'yes' if aware else 'no'} ({how})"))
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        rows.append(("MPI", f"not available: {exc}"))
    if comm is not None and choice is not None:
        rows += _placement_rows(comm)
    nccl_ok, nccl_why = nccl_available()          # NCCL x.y.z, or why not and the fix
    rows.append(("NCCL", f"cupy.cuda.nccl, {nccl_why}" if nccl_ok else nccl_why))
    rows += [(pkg, _version(pkg) or "not installed") for pkg in ("numba", "numba_cuda", "numpy", "mpi4py",
                                                                 "ipyparallel")]
    width = max(len(k) for k, _ in rows)
    if env_rank() == 0:
        print("\n".join(f"{k:<{width}}  {v}" for k, v in rows))
        if problem:
            print(problem, file=sys.stderr)
    return 2 if problem else 0


def _placement_rows(comm) -> list[tuple[str, str]]:
    """Which ranks use which GPU (how many share each) and what ``auto`` picks. Collective: a failure on
    one rank is reported by all."""
    from hpclab.comm import choose

    try:
        with step(comm, "GPU selection"):
            select_gpu(comm)
        everyone = comm.allgather(select_gpu(comm))
        choice, why = choose(comm)
    except RankError as exc:
        return [("GPU placement", f"ERROR: {exc}")]
    devices = dict.fromkeys(tuple(p.shared_with) for p in everyone)     # each GPU's ranks, in rank order
    rows = []
    for ranks in devices:
        p = everyone[ranks[0]]
        ident = "simulated device" if p.gpu_uuid.startswith("sim-") else f"{p.gpu_name}, {p.gpu_uuid}"
        share = f" ({len(ranks)} ranks share it)" if len(ranks) > 1 else ""
        rows.append((f"  {p.host} GPU {p.gpu}", f"rank{'s' if len(ranks) > 1 else ''} "
                     f"{', '.join(map(str, ranks))}{share}; {ident}"))
    most = max(len(ranks) for ranks in devices)
    head = (f"{len(devices)} GPU(s) used by {comm.size} rank(s)"
            + (f", up to {most} ranks per GPU" if most > 1 else ", one rank per GPU"))
    return [("ranks per GPU", head), *rows, ("comm backend (auto)", f"{choice}: {why}")]
