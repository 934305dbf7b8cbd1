"""GPU memory and utilisation while training, and the slides' memory estimate.

Utilisation is sampled by ``nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -lms ...`` (the
multi-node training guide's command; it reads NVML); memory in use comes from the driver (cuMemGetInfo).
"""
from __future__ import annotations

import shutil
import subprocess
import tempfile

from hpclab import backend


def memory_estimate_bytes(n_params: int) -> int:
    """The workshop's rule: bf16 weights (2 B) + fp32 master, momentum, variance (3 x 4 B) = 14 P bytes;
    it leaves out gradients, activations, workspace and the CUDA context, so real training needs more."""
    return 14 * n_params


def device_memory_used() -> int | None:
    """Bytes in use on this rank's GPU (whole device), or None on the simulator."""
    if backend.is_simulator():
        return None
    free, total = backend.cuda().current_context().get_memory_info()
    return int(total - free)


class GPUMonitor:
    """Samples one GPU's utilisation (%) and memory used (MiB) every 50 ms from :meth:`start` on: nvidia-smi writes
    its lines into a temporary file, read at :meth:`stop` (no reader thread, and no pipe to fill up during a long
    run)."""

    def __init__(self, uuid: str | None):
        self.uuid, self._proc = uuid, None

    def start(self) -> "GPUMonitor":
        smi = shutil.which("nvidia-smi")
        if not backend.is_simulator() and smi is not None:
            self._lines = tempfile.TemporaryFile("w+")
            self._proc = subprocess.Popen(
                [smi, f"--id={self.uuid}", "--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits",
                 "-lms=50"], stdout=self._lines, stderr=subprocess.DEVNULL, text=True)
        return self

    def stop(self) -> dict:
        if self._proc is None:
            return {"source": None, "samples": 0, "note": "the simulator has no GPU to monitor"
                    if backend.is_simulator() else "nvidia-smi is not on PATH: no utilisation samples"}
        self._proc.terminate()
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        self._lines.seek(0)
        samples = []                             # (util %, memory MiB)
        for line in self._lines:
            try:
                util, mem_mib = (float(v) for v in line.split(","))
            except ValueError:
                continue
            samples.append((util, mem_mib))
        if not samples:
            return {"source": "nvidia-smi", "samples": 0, "note": "no samples (the run was shorter than one interval)"}
        utils = [u for u, _ in samples]
        return {"source": "nvidia-smi", "samples": len(samples), "util_mean_pct": sum(utils) / len(utils),
                "util_max_pct": max(utils), "memory_used_max_bytes": max(m for _, m in samples) * 2 ** 20}
