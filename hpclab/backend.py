"""GPU or simulator: decided once per process, before ``numba.cuda`` is imported.

Numba reads ``NUMBA_ENABLE_CUDASIM`` when ``numba.cuda`` is first imported (numba #3075), so every entry
point calls :func:`select` before any kernel module loads, and kernel modules get ``numba.cuda`` from
:func:`cuda`. ``HPCLAB_BACKEND=auto|gpu|sim`` overrides the automatic choice.
"""
from __future__ import annotations

import ctypes
import os
import sys
import warnings

CHOICES = ("auto", "gpu", "sim")
LOGIN_NODE = "HPCLAB_LOGIN_NODE"
_selected: str | None = None
_announced = False


class BackendError(RuntimeError):
    """The requested backend cannot run here."""


def count_gpus() -> int:
    """CUDA devices the driver reports (0 without a driver), asked from ``libcuda`` so that nothing of
    Numba is imported yet; honours ``CUDA_VISIBLE_DEVICES``."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return 0
    count = ctypes.c_int(0)
    if lib.cuInit(0) != 0 or lib.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return 0
    return count.value


def _decide(requested: str) -> str:
    if requested not in CHOICES:
        raise BackendError(
            f"HPCLAB_BACKEND={requested!r} is not a backend; use one of {', '.join(CHOICES)}."
        )
    if requested == "sim":
        return "sim"
    gpus = count_gpus()
    if requested == "gpu" and gpus == 0:
        raise BackendError(
            "HPCLAB_BACKEND=gpu but no CUDA GPU is visible to this process "
            "(no NVIDIA driver, or CUDA_VISIBLE_DEVICES hides every device). "
            "Run on a GPU node (e.g. salloc -p gpu --gpus=1), or set "
            "HPCLAB_BACKEND=sim (or auto) to use Numba's CUDA simulator."
        )
    return "gpu" if gpus > 0 else "sim"


def select(requested: str | None = None) -> str:
    """Choose the backend for this process, ``"gpu"`` or ``"sim"``, and prepare Numba for it; asking for
    another one after ``numba.cuda`` has loaded is an error (Numba cannot switch once imported)."""
    global _selected
    requested = (requested or os.environ.get("HPCLAB_BACKEND") or "auto").strip().lower()
    if login_node():      # a login node's process only imports (its engines have the GPUs): the simulator
        requested = "sim"
    if _selected is not None:
        if requested not in ("auto", _selected):
            raise BackendError(
                f"the {describe(_selected)} backend is already in use in this process; "
                f"restart the kernel (or process) to switch to {requested!r}."
            )
        return _selected
    choice = _decide(requested)
    sim_flag = os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"
    if "numba.cuda" in sys.modules and sim_flag != (choice == "sim"):
        raise BackendError(
            "numba.cuda was imported before hpclab chose the backend; "
            "import hpclab (or call hpclab.backend.select()) before numba.cuda, "
            "or restart the kernel."
        )
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if choice == "sim" else "0"
    # Numba's message colouring goes through colorama, which writes a terminal
    # reset to stdout at exit: under mpirun it lands in the middle of other ranks' lines.
    os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")
    # Teaching kernels launch tiny grids on purpose (one block per rank in Exercise 0).
    os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
    if choice == "sim":
        # The simulator compiles nothing, so Numba's performance hints about grid sizes and
        # object mode (e.g. from create_xoroshiro128p_states) are noise.
        from numba.core.errors import NumbaWarning

        warnings.filterwarnings("ignore", category=NumbaWarning)
    _selected = choice
    return choice


def selected() -> str | None:
    """The backend chosen so far in this process, or None (never selects one)."""
    return _selected


def name() -> str:
    """The selected backend, ``"gpu"`` or ``"sim"`` (selecting it if needed)."""
    return _selected or select()


def is_simulator() -> bool:
    return name() == "sim"


def describe(choice: str | None = None) -> str:
    choice = choice or name()
    return "real GPU (CUDA)" if choice == "gpu" else "Numba CUDA simulator (no GPU; tiny problem sizes)"


def login_node() -> bool:
    """Whether this process stands for a login node: no GPU work here (``HPCLAB_LOGIN_NODE=1``)."""
    return os.environ.get(LOGIN_NODE, "") not in ("", "0")


def no_gpu_work_here(what: str) -> BackendError:
    return BackendError(
        f"{what} in the notebook's own process, which has no GPU on a login node ({LOGIN_NODE}=1): GPU work "
        "belongs on the engines. Run it in a %%px cell (on rank 0 alone: `if comm.rank == 0:`) and pull "
        "the result with session.view.pull(...), or run the program on the engines.")


def cuda():
    """The ``numba.cuda`` module, imported after the backend is decided."""
    if select() == "sim":
        from hpclab import cudasim

        cudasim.install()            # shared arrays that every thread of a block agrees on
        if login_node():
            cudasim.forbid_launches(no_gpu_work_here("a kernel was launched"))
    from numba import cuda as numba_cuda

    return numba_cuda


def banner(rank: int = 0) -> None:
    """Say once per process, on rank 0 only, which backend runs."""
    global _announced
    if not _announced and rank == 0:
        print(f"hpclab backend: {describe()}", file=sys.stderr, flush=True)
    _announced = True


def auto_size(gpu: int, sim: int) -> int:
    """Full problem size on a GPU, a tiny one on the simulator."""
    if login_node() and sys._getframe(1).f_globals.get("__name__") == "__main__":   # a notebook cell's own call
        raise no_gpu_work_here(f"a problem size was chosen (auto_size(gpu={gpu}, sim={sim}))")
    return gpu if name() == "gpu" else sim
