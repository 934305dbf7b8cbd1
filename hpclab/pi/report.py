"""What the pi programs share: launch-shape options, and what the Monte Carlo ones print and check."""
from __future__ import annotations

import math

from hpclab import budget
from hpclab.options import count

MAX_BLOCKS = (1 << 31) - 1                 # CUDA's limit on gridDim.x
THREADS = tuple(1 << k for k in range(11))  # powers of two up to 1024, CUDA's block limit


def add_launch_arguments(parser) -> None:
    """--blocks and --threads, whose defaults come from ``hpclab.pi.kernels.launch_shape``."""
    parser.add_argument("--blocks", type=count(1, MAX_BLOCKS), default=None,
                        help="blocks per launch (default: 2 per SM on a GPU, fewer for little work)")
    parser.add_argument("--threads", type=count(1, 1024), choices=THREADS, default=None, metavar="THREADS",
                        help="threads per block, a power of two up to 1024 (default 1024 on a GPU)")


def check_work(option: str, work: int, unit: str, shares: int, launch) -> None:
    """Every rank (or GPU) gets at least one of ``work``, and the run ends within the day."""
    budget.require_share(option, work, shares, unit)
    rate = launch.fastest(unit)
    budget.refuse_long(option, work, work / (rate * shares),
                       f"{work:.3g} {unit} at under {rate:.0e} {unit}/s on each of {shares} "
                       f"{'GPU' if launch.backend == 'gpu' else 'simulated GPU'}(s)")


def estimate(hits: int, samples: int) -> dict:
    """pi = 4 hits / samples, its error, and the binomial standard deviation.

    A hit has probability p = pi/4, so 4*hits/samples has standard deviation
    4 sqrt(p(1-p)/samples); a correct counter misses pi by more than five of
    those with probability below 1e-6.
    """
    pi_hat = 4.0 * hits / samples
    p = math.pi / 4
    sigma = 4.0 * math.sqrt(p * (1 - p) / samples)
    error = abs(pi_hat - math.pi)
    return {"pi": pi_hat, "abs_error": error, "sigma": sigma, "within_5_sigma": error <= 5 * sigma}


def final_lines(hits: int, samples: int, time_label: str, seconds: float) -> list[tuple[str, str]]:
    e = estimate(hits, samples)
    return [
        ("Exact PI", f"{math.pi:.8f}"),
        ("Estimated PI", f"{e['pi']:.8f}"),
        ("Absolute error", f"{e['abs_error']:.8e}"),
        ("Relative error", f"{100 * e['abs_error'] / math.pi:.8e} %"),
        ("Total hits", str(hits)),
        ("Total samples", str(samples)),
        (time_label, f"{seconds:.6f} s"),
        ("5-sigma bound", f"|error| <= {5 * e['sigma']:.3e} ({'within' if e['within_5_sigma'] else 'OUTSIDE'})"),
    ]
