"""``hpclab info``: backend, GPUs and which ranks use them, MPI, NCCL, package versions."""
from __future__ import annotations

import sys

from hpclab.device import identity
from hpclab.runner import env_rank


def info() -> int:
    """``hpclab info``: one line per fact, on rank 0; exit status 2 when no backend can be chosen."""
    from hpclab import backend

    rows = []
    problem = None
    try:
        choice = backend.select()
        rows.append(("backend", backend.describe(choice)))
    except backend.BackendError as exc:
        rows.append(("backend", f"ERROR: {exc}"))
        choice, problem = None, f"hpclab info: error: {exc}"
    rows.append(("GPUs (driver)", str(backend.count_gpus())))
    if choice == "gpu":
        cuda = backend.cuda()
        for i, gpu in enumerate(cuda.gpus):
            with gpu:
                dev, (name, uuid) = cuda.get_current_device(), identity()
                cc = ".".join(map(str, dev.compute_capability))
                rows.append((f"  GPU {i}", f"{name} (compute {cc}, {dev.MULTIPROCESSOR_COUNT} SMs) {uuid}"))
    comm = None
    try:
        from hpclab import mpi

        comm = mpi.world()
        rows.append(("MPI", mpi.library()))
        rows.append(("MPI ranks", str(comm.size)))
        aware, how = mpi.cuda_aware()
        rows.append(("CUDA-aware MPI", f"{'yes' if aware else 'no'} ({how})"))
    except Exception as exc:  # noqa: BLE001 - info reports, it does not fail
        rows.append(("MPI", f"not available: {exc}"))
    if comm is not None and choice is not None:
        rows += _placement_rows(comm)
    rows.append(("NCCL", _nccl_status()))
    for pkg in ("numba", "numba_cuda", "numpy", "mpi4py", "ipyparallel"):
        rows.append((pkg, _version(pkg)))
    width = max(len(k) for k, _ in rows)
    if env_rank() == 0:
        for k, v in rows:
            print(f"{k:<{width}}  {v}")
        if problem:
            print(problem, file=sys.stderr)
    return 2 if problem else 0


def _placement_rows(comm) -> list[tuple[str, str]]:
    """Which ranks use which GPU (under mpiexec: how many share each) and what ``auto`` picks.

    Collective: every rank of the job runs ``hpclab info``; a failure on one rank is
    reported by all (no rank left waiting).
    """
    from hpclab.errors import RankError, step
    from hpclab.comm import choose
    from hpclab.device import select_gpu

    try:
        with step(comm, "GPU selection"):
            select_gpu(comm)
        everyone = comm.allgather(select_gpu(comm))
        choice, why = choose(comm)
    except RankError as exc:
        return [("GPU placement", f"ERROR: {exc}")]
    devices: dict[str, list] = {}
    for p in everyone:
        devices.setdefault(p.gpu_uuid, []).append(p)
    rows = []
    for ps in devices.values():
        p = ps[0]
        ident = "simulated device" if p.gpu_uuid.startswith("sim-") else f"{p.gpu_name}, {p.gpu_uuid}"
        ranks = ", ".join(str(q.rank) for q in ps)
        share = f" ({len(ps)} ranks share it)" if len(ps) > 1 else ""
        rows.append((f"  {p.host} GPU {p.gpu}", f"rank{'s' if len(ps) > 1 else ''} {ranks}{share}; {ident}"))
    most = max(len(ps) for ps in devices.values())
    head = (f"{len(devices)} GPU(s) used by {comm.size} rank(s)"
            + (f", up to {most} ranks per GPU" if most > 1 else ", one rank per GPU"))
    return [("ranks per GPU", head), *rows, ("comm backend (auto)", f"{choice}: {why}")]


def _nccl_status() -> str:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001 - ImportError or a CUDA library missing
        return f"not importable (cupy.cuda.nccl: {type(exc).__name__}); pip install 'hpclab[gpu]'"
    try:
        v = nccl.get_version()
        return f"cupy.cuda.nccl, NCCL {v // 10000}.{v // 100 % 100}.{v % 100}"
    except Exception:  # noqa: BLE001
        return "cupy.cuda.nccl importable"


def _version(pkg: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(pkg.replace("_", "-"))
    except PackageNotFoundError:
        return "not installed"
