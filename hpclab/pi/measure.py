"""What notebook 02 measures of the pi kernels on a rank's GPU: their points on the roofline."""
from __future__ import annotations

from hpclab import backend
from hpclab.timing import median_time


def roofline_points(bins: int | None = None, repeats: int = 5) -> list:
    """Notebook 02's roofline: both midpoint kernels, float64. Operations as the loop is written
    ((i+1/2)*h, x*x+1, 4/d, acc+=: 6 a bin; ``fast``: 29 per 4 bins), a division counted as one; memory:
    one 8-byte atomic add per block."""
    from hpclab import roofline
    from hpclab.launch import full_gpu
    from hpclab.pi import fast, midpoint

    bins = bins or backend.auto_size(gpu=10**11, sim=4000)
    return [roofline.point(name, per_bin * bins, 8.0 * full_gpu(bins)[0],
                           median_time(lambda: mod.partial_sum(0, bins, bins), repeats),  # noqa: B023
                           f"{per_bin:g} FLOP a bin, 8 B a block", "02")
            for name, mod, per_bin in (("midpoint", midpoint, 6.0), ("fast", fast, 29 / 4))]
