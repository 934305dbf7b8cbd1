"""The GPU stack `make setup` installs, chosen from what a (fake) nvidia-smi reports."""
import os
import shutil
import subprocess
import sys

import pytest

from .helpers import ROOT

SCRIPT = ROOT / "tools" / "gpu_stack.py"
SMI = "| NVIDIA-SMI 550.54.15    Driver Version: 550.54.15    CUDA Version: {} |\n"
BROKEN = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
          "Make sure that the latest NVIDIA driver is installed and running.\n")


def _path_with(tmp_path, report: str | None) -> str:
    """A PATH whose only nvidia-smi prints ``report`` (exit 9 for the driver-less text), or none."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("cat", "touch"):           # what the Makefile's recipes run
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(shutil.which(tool))
    smi = bin_dir / "nvidia-smi"
    smi.unlink(missing_ok=True)
    if report is not None:
        (tmp_path / "report.txt").write_text(report)
        smi.write_text(f"#!/bin/sh\ncat {tmp_path / 'report.txt'}\nexit {9 if 'failed' in report else 0}\n")
        smi.chmod(0o755)
    return str(bin_dir)


def _choose(tmp_path, report, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": _path_with(tmp_path, report)})


@pytest.mark.parametrize("report, stack, said", [
    (SMI.format("12.4"), "cu12", "the NVIDIA driver supports CUDA 12.4: numba-cuda[cu12]"),
    (SMI.format("12.0"), "cu12", "supports CUDA 12.0"),
    (SMI.format("13.0"), "cu13", "supports CUDA 13.0: numba-cuda[cu13] (the CUDA 13 compiler) and cupy-cuda13x"),
    (SMI.format("14.1"), "cu13", "supports CUDA 14.1"),   # a newer driver runs the newest stack
    (SMI.format("11.8"), "", "older than the CUDA 12 that numba-cuda 0.30 needs"),
    (None, "", "no NVIDIA driver here (no nvidia-smi), so the workbook runs on Numba's CUDA simulator"),
    (BROKEN, "", "nvidia-smi reports no CUDA version (NVIDIA-SMI has failed"),
    ("garbage\nCUDA Version: twelve\n", "", "reports no CUDA version (garbage)"),
])
def test_the_stack_follows_the_drivers_cuda_version(tmp_path, report, stack, said):
    proc = _choose(tmp_path, report)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == stack
    assert said in proc.stderr
    assert (f"hpclab setup: GPU stack {stack}: " if stack else "hpclab setup: no GPU stack: ") in proc.stderr


def test_an_override_wins_over_the_driver_and_a_wrong_one_is_refused(tmp_path):
    """A login node without GPUs installs the GPU nodes' stack; none keeps a GPU node on the simulator."""
    assert _choose(tmp_path, None, "cu12").stdout.strip() == "cu12"
    assert _choose(tmp_path, SMI.format("13.0"), "cu12").stdout.strip() == "cu12"
    proc = _choose(tmp_path, SMI.format("13.0"), "none")
    assert proc.stdout.strip() == "" and "GPU_STACK=none" in proc.stderr
    proc = _choose(tmp_path, None, "cu11")
    assert proc.returncode == 2 and "GPU_STACK='cu11': choose auto, cu12, cu13 or none" in proc.stderr


def _fake_venv(tmp_path):
    """A venv whose python only logs its arguments: make's pip lines, without installing anything."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f"#!/bin/sh\necho \"$*\" >> {tmp_path / 'pip.log'}\n")
    (venv / "bin" / "python").chmod(0o755)
    return venv


def _make_setup(tmp_path, venv, report, *args) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("make"), "-C", str(ROOT), f"VENV={venv}", f"PYTHON={sys.executable}",
                           "setup", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": _path_with(tmp_path, report)})


def _pip_log(tmp_path) -> list[str]:
    log = tmp_path / "pip.log"
    return log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(not shutil.which("make"), reason="needs make")
def test_make_setup_installs_the_chosen_stack_and_reinstalls_only_when_the_choice_changes(tmp_path):
    venv = _fake_venv(tmp_path)
    proc = _make_setup(tmp_path, venv, None)
    assert proc.returncode == 0, proc.stderr
    assert "no GPU stack: no NVIDIA driver here" in proc.stderr and "Numba's CUDA simulator" in proc.stderr
    first = _pip_log(tmp_path)
    assert len(first) == 1 and "install -q -e .[lab" in first[0] and "cu1" not in first[0]
    assert _make_setup(tmp_path, venv, None).returncode == 0
    assert _pip_log(tmp_path) == first                         # nothing changed: no reinstall
    proc = _make_setup(tmp_path, venv, SMI.format("12.4"))
    assert "GPU stack cu12: the NVIDIA driver supports CUDA 12.4" in proc.stderr
    assert _pip_log(tmp_path)[-1].endswith(",cu12]")
    proc = _make_setup(tmp_path, venv, SMI.format("12.4"), "GPU_STACK=cu13")
    assert proc.returncode == 0, proc.stderr
    # the other stack's CuPy goes first: two CuPy wheels overwrite each other's files
    assert _pip_log(tmp_path)[-2:] == ["-m pip uninstall -q -y cupy-cuda12x",
                                       _pip_log(tmp_path)[-1]] and _pip_log(tmp_path)[-1].endswith(",cu13]")
