"""Ring all-reduce by hand: reduce-scatter, then all-gather, with Sendrecv.

Each of the N ranks sends 2(N-1) chunks of size/N elements, so the bytes a rank sends are 2(N-1)/N x the buffer
size, independent of N for large N: this is why ring all-reduce (NCCL's default for large messages) scales.
"""
from __future__ import annotations

import numpy as np

from hpclab.decomp import block_range


def ring_allreduce(data: np.ndarray, comm) -> tuple[np.ndarray, int]:
    """Sum ``data`` (1-D) over all ranks. Returns (result, bytes this rank sent)."""
    data = np.array(data, copy=True).ravel()
    n, rank = comm.size, comm.rank
    if n == 1:
        return data, 0
    right, left = (rank + 1) % n, (rank - 1) % n
    chunk = [slice(*block_range(data.size, n, i)) for i in range(n)]
    recv = np.empty(max(s.stop - s.start for s in chunk), dtype=data.dtype)
    sent = 0
    # Steps 0..N-2 reduce-scatter (then rank r holds the full sum of chunk (r+1) % N); steps N-1..2N-3
    # all-gather, passing the finished chunks around the ring. Step s sends chunk r - s, receives r - s - 1.
    for step in range(2 * (n - 1)):
        out, into = chunk[(rank - step) % n], chunk[(rank - step - 1) % n]
        length = into.stop - into.start
        comm.Sendrecv(data[out], dest=right, recvbuf=recv[:length], source=left)
        if step < n - 1:
            data[into] += recv[:length]
        else:
            data[into] = recv[:length]
        sent += data[out].nbytes
    return data, sent


def ring_bytes_per_rank(nbytes: int, ranks: int) -> float:
    """The textbook figure: 2(N-1)/N x size."""
    return 2 * (ranks - 1) / ranks * nbytes
