"""What the four pi programs share (pi-midpoint, pi-mc, pi-nccl-node, pi-nccl-mpi): their
launch-shape and sample options, the check that the work fits a day, and the check and FINAL
RESULTS of an all-reduced Monte Carlo count (Exercises 3 and 4)."""
from __future__ import annotations

import math

from hpclab import budget
from hpclab.options import count, seed
from hpclab.pi.check import estimate
from hpclab.pi.philox import SEED_LIMIT
from hpclab.runner import Report

MAX_BLOCKS = (1 << 31) - 1                 # CUDA's limit on gridDim.x
THREADS = tuple(1 << k for k in range(11))  # powers of two up to 1024, CUDA's block limit
MAX_SAMPLES = (1 << 63) - 1                 # sample indices are 64-bit signed integers


def add_launch_arguments(parser) -> None:
    """--blocks and --threads, whose defaults come from ``hpclab.launch.full_gpu``."""
    parser.add_argument("--blocks", type=count(1, MAX_BLOCKS), default=None,
                        help="blocks per launch (default: 2 per SM on a GPU, fewer for little work)")
    parser.add_argument("--threads", type=count(1, 1024), choices=THREADS, default=None, metavar="THREADS",
                        help="threads per block, a power of two up to 1024 (default 1024 on a GPU)")


def add_sample_arguments(parser, default_seed: int, samples_help: str) -> None:
    """--samples and --seed of the Monte Carlo programs."""
    parser.add_argument("--samples", type=count(1, MAX_SAMPLES), default=None, help=samples_help)
    parser.add_argument("--seed", type=seed(SEED_LIMIT - 1), default=default_seed,
                        help=f"generator seed, 0 to 2^64-1 (default {default_seed})")


def check_work(option: str, work: int, unit: str, shares: int, launch) -> None:
    """Every rank (or GPU) gets at least one of ``work``, and the run ends within the day."""
    budget.require_share(option, work, shares, unit)
    rate = launch.fastest(unit)
    budget.refuse_long(option, work, work / (rate * shares),
                       f"{work:.3g} {unit} at under {rate:.0e} {unit}/s on each of {shares} "
                       f"{'GPU' if launch.backend == 'gpu' else 'simulated GPU'}(s)")


def rate_line(work: int, seconds: float, placement) -> str:
    """The whole job's rate and each rank's share of it: per GPU only when no GPU is shared."""
    rate = work / seconds
    share = "per GPU" if placement.max_ranks_per_gpu == 1 else "per rank; ranks share a GPU"
    return f"{rate:.3e} ({rate / placement.size:.3e} {share})"


def combined(totals: list[int], hits: list[int], samples: int, seed: int, how: str, time_label: str,
             seconds: float) -> Report:
    """Rank 0's report of Exercises 3 and 4: ``totals``, what each rank (or GPU) got from ``how`` adding
    the local ``hits``. It passes when every total is their sum (else the reduction is wrong) and pi is
    within 5 sigma (else the hit counter is)."""
    total, e, notes = totals[0], estimate(totals[0], samples), []
    if any(t != sum(hits) for t in totals):
        notes.append(f"{how} gave {totals} but the local hits sum to {sum(hits)}: the reduction is wrong")
    if not e["within_5_sigma"]:
        notes.append(f"pi estimate {e['pi']:.8f} is more than 5 sigma ({5 * e['sigma']:.2e}) "
                     "from pi: the hit counter is wrong")
    final = [
        ("Exact PI", f"{math.pi:.8f}"),
        ("Estimated PI", f"{e['pi']:.8f}"),
        ("Absolute error", f"{e['abs_error']:.8e}"),
        ("Relative error", f"{100 * e['abs_error'] / math.pi:.8e} %"),
        ("Total hits", str(total)),
        ("Total samples", str(samples)),
        (time_label, f"{seconds:.6f} s"),
        ("5-sigma bound", f"|error| <= {5 * e['sigma']:.3e} ({'within' if e['within_5_sigma'] else 'OUTSIDE'})"),
    ]
    return Report(final=final, notes=notes, passed=not notes,
                  result={"pi": e["pi"], "hits": total, "samples": samples, "seed": seed,
                          "abs_error": e["abs_error"], "sigma": e["sigma"]})
