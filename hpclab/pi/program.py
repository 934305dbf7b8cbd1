"""What the four pi programs share (pi-midpoint, pi-mc, pi-nccl-node, pi-nccl-mpi): their
launch-shape and sample options, the check that the work fits a day, each rank's slice and its timed,
all-reduced sum, and the FINAL RESULTS of an estimate of pi (with the check of an all-reduced Monte
Carlo count, Exercises 3 and 4)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from hpclab import backend, budget
from hpclab.decomp import block_range
from hpclab.errors import step
from hpclab.mpi import MPI
from hpclab.options import count, seed
from hpclab.pi.check import estimate
from hpclab.pi.philox import SEED_LIMIT
from hpclab.runner import Report
from hpclab.timing import timed, wall

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


@dataclass(frozen=True)
class Work:
    """A pi program's size option, ``--samples`` or ``--bins``, and its defaults on a GPU and on the simulator."""

    unit: str
    gpu: int
    sim: int

    def of(self, args) -> int:
        """The size asked for, else the default on this backend."""
        return getattr(args, self.unit) or backend.auto_size(gpu=self.gpu, sim=self.sim)

    def check(self, args, launch, shares: int | None = None) -> None:
        """Every rank (or each of ``shares`` GPUs) gets at least one of the work, and the run ends within the day."""
        option, work, shares = f"--{self.unit}", self.of(args), shares or launch.ranks
        budget.require_share(option, work, shares, self.unit)
        rate = launch.fastest(self.unit)
        budget.refuse_long(option, work, work / (rate * shares),
                           f"{work:.3g} {self.unit} at under {rate:.0e} {self.unit}/s on each of {shares} "
                           f"{'GPU' if launch.backend == 'gpu' else 'simulated GPU'}(s)")


def my_share(comm, work: int, args) -> tuple[int, int, int, int]:
    """(start, stop, blocks, threads): this rank's slice of ``work`` and its launch shape."""
    from hpclab.launch import full_gpu    # loads numba.cuda: not needed to reject bad arguments

    with step(comm, "launch shape"):     # the input was checked for this launch (runner.checked)
        start, stop = block_range(work, comm.size, comm.rank)
        return (start, stop, *full_gpu(stop - start, args.blocks, args.threads))


def summed(comm, what: str, work) -> tuple:
    """``work()`` on every rank, timed, and its results added over the ranks: (this rank's result, the
    sum, this rank's time, the wall time of the slowest rank, the compute time of the slowest rank)."""
    def work_and_add():
        mine, compute = timed(work)
        return mine, compute, comm.allreduce(mine)

    with step(comm, what):
        (mine, compute, total), local, wall_s = wall(work_and_add, comm)
    return mine, total, local, wall_s, comm.allreduce(compute, op=MPI().MAX)


def rank_line(placement, unit: str, work: int, blocks: int, threads: int, result: str, seconds: float) -> str:
    return (f"{placement.label()} | {unit} = {work} | blocks = {blocks} | threads/block = {threads} "
            f"| total threads = {blocks * threads} | {result} | time = {seconds:.6f} s")


def error_rows(label: str, value: float, digits: int) -> list[tuple[str, str]]:
    """FINAL RESULTS' first rows: pi, the ``value`` computed, its absolute and relative error."""
    err = abs(value - math.pi)
    return [("Exact PI", f"{math.pi:.{digits}f}"), (label, f"{value:.{digits}f}"),
            ("Absolute error", f"{err:.8e}"), ("Relative error", f"{err / math.pi * 100:.8e} %")]


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
        *error_rows("Estimated PI", e["pi"], 8),
        ("Total hits", str(total)),
        ("Total samples", str(samples)),
        (time_label, f"{seconds:.6f} s"),
        ("5-sigma bound", f"|error| <= {5 * e['sigma']:.3e} ({'within' if e['within_5_sigma'] else 'OUTSIDE'})"),
    ]
    return Report(final=final, notes=notes, passed=not notes,
                  result={"pi": e["pi"], "hits": total, "samples": samples, "seed": seed,
                          "abs_error": e["abs_error"], "sigma": e["sigma"]})
