"""Checks for the halo-exchange exercise: halo extents and the exchange itself."""
from __future__ import annotations

import numpy as np

from hpclab.halo.geometry import plan_band
from hpclab.verdict import Verdict, say as _say

# (height, kernel, stride, pad): AlexNet's C1, C2, C3 and pooling, and odd ones.
GEOMETRIES = [(227, 11, 4, 0), (27, 5, 1, 2), (13, 3, 1, 1), (55, 3, 2, 0), (20, 4, 3, 1), (9, 3, 1, 0)]


def halo_extents(fn, quiet: bool = False) -> Verdict:
    """``fn(height, kernel, stride, pad, size, rank)`` must return (o0, o1, lo, hi): the output rows [o0, o1)
    of the rank's band and the input rows [lo, hi) they read, clipped to the image."""
    cases = [(geometry, size, rank) for geometry in GEOMETRIES for size in range(1, 6) for rank in range(size)]
    for (height, kernel, stride, pad), size, rank in cases:
        p = plan_band(height, kernel, stride, pad, size, rank)
        want = (*p.out_rows, *p.have)
        where = f"height {height}, kernel {kernel}, stride {stride}, pad {pad}, rank {rank} of {size}"
        try:
            got = tuple(int(v) for v in fn(height, kernel, stride, pad, size, rank))
        except Exception as exc:  # noqa: BLE001 - report the learner's error in words
            return _say(Verdict(False, f"your function raised {type(exc).__name__}: {exc} for {where}"), quiet)
        if got == want:
            continue
        if got[:2] != want[:2]:
            hint = ("the output rows are hcomm.block_range(output height, size, rank), with "
                    "output height (H + 2 pad - R) // stride + 1")
        elif (got[2], got[3]) == (p.need[0], p.need[1]):
            hint = "rows outside [0, H) are zero padding, not data: clip [lo, hi) to the image"
        else:
            hint = ("output row i reads input rows i*stride - pad ... i*stride - pad + R - 1, "
                    "so the band reads [o0*stride - pad, (o1-1)*stride - pad + R)")
        return _say(Verdict(False, f"for {where} the band is output rows [{want[0]}, {want[1]}) reading input "
                                   f"rows [{want[2]}, {want[3]}), you gave {list(got)}: {hint}"), quiet)
    return _say(Verdict(True, f"halo extents right on {len(cases)} bands (strides 1-4, with and without padding)"),
                quiet)


def exchange(work, full, height: int, kernel: int, stride: int, pad: int, size: int, rank: int,
             quiet: bool = False) -> Verdict:
    """``work`` must hold input rows [lo, hi) of ``full`` (the whole input) for this rank's band."""
    p = plan_band(height, kernel, stride, pad, size, rank)
    want = np.asarray(full)[:, :, p.have[0]:p.have[1]]
    work = np.asarray(work)
    if work.shape != want.shape:
        return _say(Verdict(False, f"rank {rank}: the working buffer has shape {work.shape}, it should be "
                                   f"{want.shape} (input rows [{p.have[0]}, {p.have[1]}))"), quiet)
    bad = [p.have[0] + i for i in range(want.shape[2]) if not np.array_equal(work[:, :, i], want[:, :, i])]
    if not bad:
        return _say(Verdict(True, f"rank {rank}: rows [{p.have[0]}, {p.have[1]}) in place, "
                                  f"{p.halo_above} received from above and {p.halo_below} from below"), quiet)
    own = [r for r in bad if p.own[0] <= r < p.own[1]]
    part = ("its own rows" if own else "rows above its band (from rank "
            f"{rank - 1})" if bad[0] < p.own[0] else f"rows below its band (from rank {rank + 1})")
    return _say(Verdict(False, f"rank {rank}: input rows {bad[:6]}{'...' if len(bad) > 6 else ''} are wrong — "
                               f"{part}; check which rows each neighbour sends and where they land"), quiet)
