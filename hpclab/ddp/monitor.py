"""GPU memory and utilisation while training, and the slides' memory estimate.

Utilisation needs NVML: through ``pynvml`` (PyPI ``nvidia-ml-py``) when it is
importable, else by reading ``nvidia-smi --query-gpu=utilization.gpu,memory.used
--format=csv -lms ...`` (the multi-node training guide's command) as it
streams; when neither exists the monitor says so and records nothing.
Memory in use on the device also comes from the CUDA driver (cuMemGetInfo),
which needs no NVML.
"""
from __future__ import annotations

import shutil
import subprocess
import threading
import time

from hpclab import backend


def memory_estimate_bytes(n_params: int) -> int:
    """The workshop's rule: bf16 weights (2 B) + fp32 master, momentum, variance (3 x 4 B).

    MEM = 2 P + 3 P x 4 = 14 P bytes; it leaves out gradients, activations,
    workspace and the CUDA context, so real training needs more.
    """
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
        self._stop = threading.Event()
        self._thread = None
        self._proc = None

    def start(self) -> "GPUMonitor":
        if backend.is_simulator():
            self.why = "the simulator has no GPU to monitor"
            return self
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByUUID(self.uuid)
            self.source = "nvml (pynvml)"
            self._thread = threading.Thread(target=self._nvml_loop, args=(pynvml, handle), daemon=True)
        except Exception as exc:  # noqa: BLE001 - ImportError, or NVML refusing
            smi = shutil.which("nvidia-smi")
            if smi is None:
                self.why = (f"pynvml is not usable ({type(exc).__name__}: {exc}) and nvidia-smi is not "
                            "on PATH: no utilisation samples (pip install nvidia-ml-py)")
                return self
            self.source = f"nvidia-smi (pynvml not usable: {type(exc).__name__})"
            self._proc = subprocess.Popen(
                [smi, f"--id={self.uuid}", "--query-gpu=utilization.gpu,memory.used",
                 "--format=csv,noheader,nounits", f"-lms={max(50, int(self.interval * 1000))}"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            self._thread = threading.Thread(target=self._smi_loop, daemon=True)
        self._thread.start()
        return self

    def _nvml_loop(self, pynvml, handle) -> None:
        while not self._stop.is_set():
            util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle).used
            self.samples.append((time.perf_counter(), float(util), float(mem)))
            self._stop.wait(self.interval)

    def _smi_loop(self) -> None:
        for line in self._proc.stdout:
            try:
                util, mem_mib = (float(v) for v in line.split(","))
            except ValueError:
                continue
            self.samples.append((time.perf_counter(), util, mem_mib * 2 ** 20))
            if self._stop.is_set():
                break

    def stop(self) -> dict:
        self._stop.set()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        if self._thread is not None:
            self._thread.join(timeout=5)
        return self.summary()

    def summary(self) -> dict:
        if not self.samples:
            return {"source": self.source, "samples": 0,
                    "note": self.why or "no samples (the run was shorter than one interval)"}
        utils = [u for _, u, _ in self.samples]
        return {"source": self.source, "samples": len(self.samples),
                "util_mean_pct": sum(utils) / len(utils), "util_max_pct": max(utils),
                "memory_used_max_bytes": max(m for _, _, m in self.samples)}
