"""Which GPU stack `make setup` installs: the pyproject extra that matches the NVIDIA driver.

    python3 tools/gpu_stack.py [auto|cu12|cu13|none] [--record FILE]

prints the extra (cu12, cu13, or nothing) on stdout and what it chose and why on stderr.
``auto`` reads the CUDA version the driver supports from ``nvidia-smi`` ("CUDA Version: 12.4"):
CUDA 12 drivers get numba-cuda's CUDA 12 toolkit and cupy-cuda12x, CUDA 13 drivers the CUDA 13
ones; a machine without a driver gets neither and runs the workbook on Numba's CUDA simulator.
On a login node without GPUs whose engines will run on GPU nodes, name the nodes' stack.
``--record FILE`` writes ",EXTRA" (or nothing) to FILE, only when it changed, so that make
reinstalls on a change; a change of stack removes the other stack's CuPy (two CuPy wheels
overwrite each other's files).

Runs with a bare python3 (standard library only): it decides before anything is installed.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys

STACKS = {12: "cu12", 13: "cu13"}   # the CUDA versions numba-cuda 0.30 supports (its extras)
SIMULATOR = "the workbook runs on Numba's CUDA simulator"


def driver_report(timeout: float = 30) -> str | None:
    """What ``nvidia-smi`` prints (its error text if it fails), or None where there is none."""
    try:
        proc = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        return None
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi did not answer ({type(exc).__name__})"
    return proc.stdout + proc.stderr


def choose(report: str | None, asked: str = "auto") -> tuple[str, str]:
    """(extra or "", why) from ``nvidia-smi``'s report (None: not installed) and GPU_STACK."""
    asked = (asked or "auto").strip().lower()
    if asked in STACKS.values():
        return asked, f"as asked (GPU_STACK={asked}): {_parts(asked)}"
    if asked == "none":
        return "", f"as asked (GPU_STACK=none); {SIMULATOR}"
    if asked != "auto":
        raise ValueError(f"GPU_STACK={asked!r}: choose auto, {', '.join(STACKS.values())} or none")
    if report is None:
        return "", (f"no NVIDIA driver here (no nvidia-smi), so {SIMULATOR}; for engines on GPU nodes, "
                    "name their stack: make setup GPU_STACK=cu12 (or cu13)")
    found = re.search(r"CUDA Version\s*:\s*(\d+)\.(\d+)", report)
    if not found:
        first = next((ln.strip() for ln in report.splitlines() if ln.strip()), "no output")
        return "", (f"nvidia-smi reports no CUDA version ({first[:100]}), so {SIMULATOR}; "
                    "to choose a stack: make setup GPU_STACK=cu12 (or cu13)")
    major, minor = int(found[1]), int(found[2])
    if major < min(STACKS):
        return "", (f"the NVIDIA driver supports CUDA {major}.{minor}, older than the CUDA 12 that "
                    f"numba-cuda 0.30 needs, so {SIMULATOR} (a newer driver fixes it)")
    stack = STACKS.get(major, STACKS[max(STACKS)])   # a newer driver runs the newest stack we know
    return stack, f"the NVIDIA driver supports CUDA {major}.{minor}: {_parts(stack)}"


def _parts(stack: str) -> str:
    return f"numba-cuda[{stack}] (the CUDA {stack[2:]} compiler) and cupy-cuda{stack[2:]}x (NCCL)"


def record(path: str, stack: str) -> None:
    """Write ',stack' to ``path`` if it changed; on a change of stack, uninstall the old CuPy."""
    text = f",{stack}" if stack else ""
    old = open(path).read() if os.path.exists(path) else None
    if old == text:
        return
    gone = [f"cupy-cuda{s[2:]}x" for s in STACKS.values() if old and s in old and s != stack]
    if gone:
        python = os.path.join(os.path.dirname(os.path.abspath(path)), "bin", "python")
        subprocess.run([python, "-m", "pip", "uninstall", "-q", "-y", *gone], check=False)
    with open(path, "w") as f:
        f.write(text)


def main(argv: list[str]) -> int:
    args = [a for a in argv if a != "--record"]
    target = argv[argv.index("--record") + 1] if "--record" in argv else None
    if target:
        args.remove(target)
    try:
        stack, why = choose(driver_report(), args[0] if args else "auto")
    except ValueError as exc:
        print(f"hpclab setup: {exc}", file=sys.stderr)
        return 2
    print(f"hpclab setup: {f'GPU stack {stack}' if stack else 'no GPU stack'}: {why}", file=sys.stderr)
    if target:
        record(target, stack)
    else:
        print(stack)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
