"""Pi kernels against NumPy references, the programs under mpiexec, the scaling harness."""
from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from hpclab.decomp import block_range
from hpclab.pi import check, fast, mc, midpoint, xoroshiro
from .helpers import gpus, last_json, run_hpclab, run_mpi

cuda = mc.cuda          # kernels below use the module's name, which the simulator replaces

# On the simulator xoroshiro128+ runs on NumPy scalars, which warn when their
# uint64 arithmetic wraps (on purpose); its module's own filters do not outlive pytest's.
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                                        "ignore::numba.core.errors.NumbaWarning")


# ---------------------------------------------------------------- midpoint kernels

@pytest.mark.parametrize("partial_sum", [midpoint.partial_sum, fast.partial_sum], ids=["plain", "fast"])
@pytest.mark.parametrize("start, stop, n, blocks, threads", [
    (0, 1000, 1000, None, None),
    (17, 777, 1000, 3, 16),        # uneven slice, grid smaller than the work
    (0, 5, 5, 4, 64),              # more threads than bins
    (123, 124, 1000, 1, 1),        # one bin, one thread
])
def test_midpoint_partial_sum_matches_numpy(partial_sum, start, stop, n, blocks, threads):
    got = partial_sum(start, stop, n, blocks, threads)
    assert got == pytest.approx(midpoint.reference(start, stop, n), rel=1e-13, abs=1e-16)


def test_midpoint_rank_slices_add_up_to_the_whole():
    n = 1001                                   # not divisible by 3
    parts = [fast.partial_sum(*block_range(n, 3, r), n) for r in range(3)]
    assert sum(parts) == pytest.approx(midpoint.reference(0, n, n), rel=1e-14)


@pytest.mark.parametrize("n", [10, 100, 1000])
def test_midpoint_error_follows_the_h2_law(n):
    err = midpoint.partial_sum(0, n, n) - math.pi
    h2 = 1.0 / n**2
    assert abs(err) <= check.truncation_bound(n)
    # leading term of the midpoint error for 4/(1+x^2): -(h^2/24)(f'(1) - f'(0)) = h^2/12
    assert abs(err) == pytest.approx(h2 / 12, rel=0.02)


def test_midpoint_rejects_bad_ranges_and_shapes():
    with pytest.raises(ValueError, match="not inside"):
        midpoint.partial_sum(5, 3, 10)
    with pytest.raises(ValueError, match="power of two"):
        fast.partial_sum(0, 10, 10, 1, 48)
    with pytest.raises(ValueError, match="2\\^52"):
        midpoint.partial_sum(0, 10, 1 << 52)


def test_block_sum_adds_floats_and_counts_over_any_power_of_two_block():
    from hpclab.pi.reduce import block_sum

    @cuda.jit
    def add_indices(out):
        block_sum(cuda.grid(1), out)

    for dtype in (np.float64, np.uint64):
        for blocks, threads in [(1, 1), (3, 16), (2, 64)]:
            out = cuda.to_device(np.zeros(1, dtype=dtype))
            add_indices[blocks, threads](out)
            n = blocks * threads
            assert out.copy_to_host()[0] == n * (n - 1) // 2


# ---------------------------------------------------------------- counter-based Monte Carlo

# Known-answer vectors of Random123's kat_vectors file: (rounds, counter, key, output).
PHILOX_KAT = [
    (7, [0, 0, 0, 0], [0, 0], [0x5F6FB709, 0x0D893F64, 0x4F121F81, 0x4F730A48]),
    (7, [0xFFFFFFFF] * 4, [0xFFFFFFFF] * 2, [0x5207DDC2, 0x45165E59, 0x4D8EE751, 0x8C52F662]),
    (7, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0x4DFCCABA, 0x190A87F0, 0xC47362BA, 0xB6B5242A]),
    (10, [0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    (10, [0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("rounds, counter, key, expected", PHILOX_KAT)
def test_philox_reference_is_the_published_generator(rounds, counter, key, expected):
    got = mc.philox_reference([[c] for c in counter], key, rounds)
    assert [int(w[0]) for w in got] == expected


@pytest.mark.parametrize("rounds, counter, key, expected", PHILOX_KAT)
def test_philox_device_function_is_the_published_generator(rounds, counter, key, expected):
    @cuda.jit
    def run(counter, key, out, rounds):
        out[0], out[1], out[2], out[3] = mc.philox4x32(counter[0], counter[1], counter[2], counter[3],
                                                       key[0], key[1], rounds)

    out = np.zeros(4, dtype=np.uint32)
    run[1, 1](np.array(counter, dtype=np.uint32), np.array(key, dtype=np.uint32), out, rounds)
    assert [int(v) for v in out] == expected


@pytest.mark.parametrize("start, count, seed", [
    (0, 3000, 7),
    (12345, 1001, 2**64 - 1),      # odd start and odd stop: lone samples at both ends
    (2**40 + 1, 700, 123),
    (2**33 - 9, 40, 5),            # the calls cross a multiple of 2^32: two launches, two high words
    (6, 1, 3), (7, 2, 3),          # no whole call inside
])
def test_fast_count_hits_matches_exact_reference(start, count, seed):
    assert fast.count_hits(start, count, seed) == mc.count_hits_reference(start, count, seed)


@pytest.mark.parametrize("start, count, seed", [(0, 3000, 7), (12345, 1001, 2**64 - 1), (2**40 + 1, 700, 123)])
def test_plain_count_hits_matches_exact_reference(start, count, seed):
    assert mc.count_hits(start, count, seed) == mc.count_hits_reference(start, count, seed)


def test_count_hits_reference_is_the_exact_integer_test():
    x, y = (w >> 6 for w in mc.sample_words(100, 50, 11))
    exact = sum(int(a) * (int(a) + 1) + int(b) * (int(b) + 1) < 2**52 for a, b in zip(x, y))
    assert mc.count_hits_reference(100, 50, 11) == exact


@pytest.mark.parametrize("count_hits", [mc.count_hits, fast.count_hits], ids=["plain", "fast"])
def test_count_hits_identical_for_any_launch_shape_and_split(count_hits):
    whole = mc.count_hits_reference(0, 2000, 99)
    for blocks, threads in [(1, 1), (3, 16), (4, 64), (1, 32)]:
        assert count_hits(0, 2000, 99, blocks, threads) == whole
    pieces = [(0, 333), (333, 1000), (1000, 1001), (1001, 2000)]
    assert sum(count_hits(a, b - a, 99) for a, b in pieces) == whole


def test_fast_count_hits_loops_over_launches(monkeypatch):
    expected = mc.count_hits_reference(0, 1501, 5)
    monkeypatch.setattr(fast, "LAUNCH_PAIRS", 320)          # three launches, the last one partial
    assert fast.count_hits(0, 1501, 5) == expected


def test_sample_inside_agrees_with_the_reference():
    @cuda.jit
    def run(start, count, seed, out):
        i = cuda.grid(1)
        if i < count:
            out[i] = mc.sample_inside(seed, start + i)

    out = np.zeros(64, dtype=np.uint8)
    run[2, 32](np.int64(2**35 + 3), np.int64(64), np.uint64(77), out)
    assert int(out.sum()) == mc.count_hits_reference(2**35 + 3, 64, 77)


@pytest.mark.parametrize("count_hits", [mc.count_hits, fast.count_hits], ids=["plain", "fast"])
def test_count_hits_rejects_bad_seeds_and_ranges(count_hits):
    for seed in (-1, 2**64, 1.5):
        with pytest.raises(ValueError, match="seed"):
            count_hits(0, 10, seed)
    with pytest.raises(ValueError, match="sample indices"):
        count_hits(-1, 10, 1)


def test_counter_estimate_is_within_five_standard_errors():
    n = 4000
    e = check.estimate(fast.count_hits(0, n, 2024), n)
    assert e["within_5_sigma"] and e["sigma"] == check.standard_error(n)


# ---------------------------------------------------------------- xoroshiro128+ comparison

def test_xoroshiro_counts_are_plausible_and_rank_dependent():
    n = 160
    a = xoroshiro.count_hits(n, 7, rank=0, blocks=1, threads=16)
    assert a == xoroshiro.count_hits(n, 7, rank=0, blocks=1, threads=16)   # reproducible
    assert abs(4 * a / n - math.pi) <= 5 * check.standard_error(n)
    assert xoroshiro.count_hits(n, 7, rank=1, blocks=1, threads=16) != a   # another subsequence


# ---------------------------------------------------------------- harness pieces

def test_serial_fraction_recovers_amdahl_and_gustafson():
    from hpclab import scaling

    ranks = [1, 2, 4, 8]
    assert scaling.serial_fraction(ranks, [scaling.amdahl_speedup(n, 0.05) for n in ranks]) == pytest.approx(0.05)
    assert scaling.serial_fraction(ranks, [n - 0.1 * (n - 1) for n in ranks], "weak") == pytest.approx(0.1)
    assert scaling.serial_fraction(ranks, ranks) == 0.0


def test_sweep_summary_uses_medians():
    from hpclab.scaling import Sweep

    recs = [{"ranks": n, "trial": t, "work": 100, "wall_s": w, "passed": True, "backend": "sim"}
            for n, ws in {1: [4.0, 9.0, 4.2], 2: [2.1, 2.0, 50.0]}.items() for t, w in enumerate(ws)]
    rows = Sweep("pi-mc", "strong", recs).summary()
    assert [r["median_wall_s"] for r in rows] == [4.2, 2.1]
    assert rows[1]["speedup"] == pytest.approx(2.0) and rows[1]["efficiency"] == pytest.approx(1.0)


def test_weak_sweep_scales_the_work_option():
    from hpclab.pi import run_mc
    from hpclab.scaling import _work_plan

    plan = _work_plan(run_mc, ["--samples", "1e3", "--seed", "3"], [1, 2, 4], True, None)
    assert plan[4] == (["--samples", "4000", "--seed", "3"], 4000)
    with pytest.raises(ValueError, match="weak sweep"):
        _work_plan(run_mc, ["--seed", "3"], [1, 2], True, None)


def test_weak_sweep_on_the_engines_fixes_the_work_per_rank(monkeypatch):
    """sweep_engines(weak=True), as notebook 03 runs it: each run's samples are the per-rank samples times its
    rank count, the sweep is weak (E(n) = T(1)/T(n), scaled speedup n E(n)), and its live curve counts the
    work per rank. The engines are stood in for: what they return is a record per trial."""
    import ipyparallel.client.asyncresult as asyncresult

    from hpclab import scaling
    from hpclab.pi import run_mc
    from hpclab.results import recorded
    from hpclab.speedup import serial_fraction

    class Queued:                                   # AsyncResult over every trial: nothing to wait for here
        def __init__(self, *args, **kwargs):
            pass

        def wait_interactive(self):
            pass

        def get(self):
            return None

    class Trial:
        def __init__(self, argv, ranks):
            self._children, self.ranks = [], ranks

        def get(self):                              # rank 0's record, None from the other engines
            return [{"exercise": "pi-mc", "ranks": self.ranks, "backend": "sim", "passed": True, "result": {},
                     "timings": {"wall_s": 2.0 * (1 + 0.1 * (self.ranks - 1))}, "ranks_per_gpu": 1}] + \
                [None] * (self.ranks - 1)

    class View:
        targets, client, sent = [0, 1, 2, 3], None, []

        def apply_async(self, fn, module, argv, ranks):
            self.sent.append((module, argv, ranks))
            return Trial(argv, ranks)

    monkeypatch.setattr(asyncresult, "AsyncResult", Queued)
    view = View()
    sweep = scaling.sweep_engines(view, run_mc, "--samples 1000 --seed 3", trials=2, weak=True)
    assert sweep.mode == "weak"
    assert [(a[a.index("--samples") + 1], n) for _, a, n in view.sent] == [
        ("1000", 1), ("1000", 1), ("2000", 2), ("2000", 2), ("4000", 4), ("4000", 4)]
    assert {m for m, _, _ in view.sent} == {"hpclab.pi.run_mc"}
    rows = {r["ranks"]: r for r in sweep.summary()}
    assert rows[4]["work"] == 4000 and rows[4]["efficiency"] == pytest.approx(1 / 1.3)
    assert rows[4]["speedup"] == pytest.approx(4 / 1.3)                          # Gustafson's scaled speedup
    assert sweep.serial_fraction == pytest.approx(serial_fraction([2, 4], [2 / 1.1, 4 / 1.3], "weak"))
    curve = recorded.from_sweep(sweep, "samples")
    assert "1,000 samples per rank" in curve.label
    assert {p["ranks"]: p["rate"] for p in curve.points}[4] == pytest.approx(4000 / 2.6)
    from hpclab.results import plot                 # its note: a weak sweep's answers differ run to run
    note = plot.machine_note(sweep.records, weak=True)
    assert "every run checked" in note and "same answers" not in note and "recorded" not in note
    assert "same answers on 1, 2 and 4 ranks" in plot.machine_note(sweep.records)
    plain = scaling.sweep_engines(View(), run_mc, "--samples 1000 --seed 3", trials=1)
    assert plain.mode == "strong" and {r["work"] for r in plain.records} == {1000}


def test_a100_table_ships_with_its_source():
    from hpclab.results import recorded

    curve = recorded.a100("pi-mc")
    assert [p["ranks"] for p in curve.points] == [1, 2, 4]
    assert dict(curve.efficiencies())[4] == pytest.approx(45.212765 / 11.409895 / 4)


def test_plot_save_writes_into_hpclab_figures(tmp_path, monkeypatch):
    from hpclab.results import plot, recorded

    monkeypatch.setenv("HPCLAB_FIGURES", str(tmp_path / "new" / "figs"))
    path = plot.save(plot.beside_recorded(None, recorded.curves("pi-mc")), "compare")
    assert path == tmp_path / "new" / "figs" / "compare.png" and path.stat().st_size > 1000


# ---------------------------------------------------------------- programs under mpiexec

def test_mpi_pi_mc_same_estimate_on_1_2_3_ranks():
    results = []
    for n in (1, 2, 3):
        proc = run_mpi(n, "run", "pi-mc", "--samples", "200000", "--seed", "7", "--json", timeout=120)
        assert proc.returncode == 0, proc.stderr
        results.append(last_json(proc)["result"])
    assert len({r["pi"] for r in results}) == 1
    assert results[0]["hits"] == mc.count_hits_reference(0, 200000, 7)


@pytest.mark.parametrize("ranks", [2, 3])
def test_mpi_pi_midpoint_uneven_bins(ranks):
    proc = run_mpi(ranks, "run", "pi-midpoint", "--bins", "1001", "--json", timeout=90)
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc)
    assert out["passed"] and out["ranks"] == ranks
    assert out["result"]["pi"] == pytest.approx(midpoint.reference(0, 1001, 1001), rel=1e-14)
    assert proc.stdout.count("| bins = ") == ranks


@pytest.mark.parametrize("program, args, message", [
    ("pi-mc", ["--samples", "1"], "--samples 1: 1 samples cannot be shared among 2 ranks"),
    ("pi-mc", ["--samples", "0"], "argument --samples: 0 is out of range; give a whole number from 1"),
    ("pi-mc", ["--samples", "-5"], "argument --samples: -5 is out of range"),
    ("pi-mc", ["--samples", "lots"], "argument --samples: 'lots' is not a number"),
    ("pi-mc", ["--seed", "-1"], "argument --seed: -1 is out of range"),
    ("pi-mc", ["--seed", str(2**64)], "argument --seed: 18446744073709551616 is out of range"),
    ("pi-mc", ["--seed", "abc"], "argument --seed: 'abc' is not a number"),
    ("pi-midpoint", ["--bins", "1"], "--bins 1: 1 bins cannot be shared among 2 ranks"),
    ("pi-midpoint", ["--bins", "1e17"], "2^52"),
])
def test_mpi_bad_input_fails_on_every_rank(program, args, message):
    proc = run_mpi(2, "run", program, *args, timeout=60)
    assert proc.returncode == 2               # every rank exits; the ranks agreed first
    assert proc.stderr.count(message) == 1, proc.stderr     # said once, by rank 0


def test_mpi_scaling_command_writes_csv_and_png(tmp_path):
    proc = run_hpclab("scaling", "pi-mc", "--ranks", "1,2", "--samples", "100000", "--trials", "1",
                      "--out", str(tmp_path), "--no-progress", timeout=180)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(open(tmp_path / "pi-mc_strong.csv")))
    assert [int(r["ranks"]) for r in rows] == [1, 2]
    assert float(rows[0]["speedup"]) == 1.0 and all(r["passed"] == "True" for r in rows)
    assert (tmp_path / "pi-mc_strong.png").stat().st_size > 1000
    # Two ranks share a GPU (the simulated one, or a machine's only GPU): the records and the
    # table say that this measured time sharing, not scaling.
    shared = rows[1]["ranks_per_gpu"] == "2"
    assert [r["shared_gpu"] for r in rows] == ["False", str(shared)]
    assert shared == (not (rows[0]["backend"] == "gpu" and gpus() >= 2))
    assert ("time sharing, not scaling" in proc.stdout) == shared
