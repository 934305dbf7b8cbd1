"""Host-staged MPI: device -> (pinned) host -> MPI -> host -> device.

Works with any MPI and on the simulator; every message crosses PCIe twice,
which is what CUDA-aware MPI and NCCL avoid.
"""
from __future__ import annotations

import numpy as np

from hpclab.comm.mpi_common import MPIBackend


class HostStagedMPI(MPIBackend):
    name = "mpi-host"

    def __init__(self, comm=None):
        super().__init__(comm)
        self._pinned = {}

    def _host(self, shape, dtype, slot):
        # Reuse pinned buffers: page-locked allocation is slow, copies from it fast.
        key = (tuple(shape), np.dtype(dtype).str, slot)
        if key not in self._pinned:
            self._pinned[key] = self.cuda.pinned_array(shape, dtype=dtype)
        return self._pinned[key]

    def _outgoing(self, dbuf, slot="send", stream=0):
        host = self._host(dbuf.shape, dbuf.dtype, slot)
        # Behind the kernels of ``stream`` that wrote dbuf; complete before MPI sees it.
        dbuf.copy_to_host(host, stream=stream)
        if stream:
            stream.synchronize()
        return host

    def _incoming(self, shape, dtype, slot="recv", out=None):
        return self._host(shape, dtype, slot)

    def _arrived(self, recv, out=None, stream=0):
        if out is None:
            return self.cuda.to_device(recv)
        out.copy_to_device(recv, stream=stream)
        if stream:
            stream.synchronize()
        return out

    def release(self) -> None:
        self._pinned.clear()
