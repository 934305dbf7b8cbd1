"""GPU memory and utilisation while training, and the slides' memory estimate.

Utilisation is sampled by ``nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -lms ...``
(the multi-node training guide's command; it reads NVML) as it streams; memory in use on the device
comes from the CUDA driver (cuMemGetInfo).
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time

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
    """Samples one GPU's utilisation (%) and memory used (bytes) in a background thread."""

    def __init__(self, uuid: str | None, interval_s: float = 0.05):
        self.uuid, self.interval = uuid, interval_s
        self.samples: list[tuple[float, float, float]] = []   # (t, util %, memory bytes)
        self.source, self.why = None, ""
        self._proc = self._thread = None

    def start(self) -> "GPUMonitor":
        smi = shutil.which("nvidia-smi")
        if backend.is_simulator() or smi is None:
            self.why = ("the simulator has no GPU to monitor" if backend.is_simulator() else
                        "nvidia-smi is not on PATH: no utilisation samples")
            return self
        self.source = "nvidia-smi"
        self._proc = subprocess.Popen(
            [smi, f"--id={self.uuid}", "--query-gpu=utilization.gpu,memory.used",
             "--format=csv,noheader,nounits", f"-lms={max(50, int(self.interval * 1000))}"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:           # until stop() ends nvidia-smi
            try:
                util, mem_mib = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.perf_counter(), util, mem_mib * 2 ** 20))

    def stop(self) -> dict:
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._thread.join(timeout=5)
        if not self.samples:
            return {"source": self.source, "samples": 0,
                    "note": self.why or "no samples (the run was shorter than one interval)"}
        utils = [u for _, u, _ in self.samples]
        return {"source": self.source, "samples": len(self.samples),
                "util_mean_pct": sum(utils) / len(utils), "util_max_pct": max(utils),
                "memory_used_max_bytes": max(m for _, _, m in self.samples)}
