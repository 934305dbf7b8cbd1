"""``python -m benchmarks pi``: how fast the pi kernels run on this rank's GPU.

Monte Carlo samples/s with the counter-based generator (``fast.count_hits``, Philox4x32-7; and
Philox4x32-10, its authors' default, for comparison) and with xoroshiro128+ (its host-side state
set-up timed apart); midpoint bins/s with four bins per division (``fast``) and with one division
per bin (``midpoint``); a few launch shapes for each fast kernel. Each figure is the median of
several runs after a warm-up, at a size calibrated to take about ``--seconds``. On the simulator
the sizes are tiny and the rates mean nothing: it only shows that everything runs.
"""
from __future__ import annotations

import datetime
import json
import sys
import time

from hpclab import backend
from hpclab.device import identity
from hpclab.options import Parser, count, real
from hpclab.pi.check import MAX_BINS
from hpclab.results.recorded import figure
from hpclab.timing import median_time

TARGETS = {"mc_counter_samples_per_s": 8e11, "midpoint_bins_per_s": 1e12}
A100_WORKSHOP_MC = 1e13 / 45.212765        # the workshop's CUDA C code on one A100 (samples/s)


def _rate(make, first: int, limit: int, seconds: float, repeats: int) -> tuple[float, int]:
    """(items/s, items) for ``make(n)`` at a size taking about ``seconds`` (median of repeats)."""
    make(min(first, 1 << 20))                # warm-up: compiles
    n = first
    t = median_time(lambda: make(n), 1, warmup=0)
    if t < seconds:
        n = int(min(limit, max(n, n * seconds / max(t, 1e-6))))
    return n / median_time(lambda: make(n), repeats, warmup=0), n


def init_seconds(n_states: int, seed: int = 0) -> float:
    """Host-side seconds to create ``n_states`` xoroshiro128+ states (jump-ahead on the CPU)."""
    from hpclab.launch import cuda
    from hpclab.pi import xoroshiro

    t0 = time.perf_counter()
    made = xoroshiro.states(n_states, seed)
    cuda.synchronize()
    del made
    return time.perf_counter() - t0


def measure(seconds: float = 1.0, repeats: int = 3, shapes: bool = True) -> dict:
    from hpclab.launch import cuda, full_gpu       # loads numba.cuda: after the backend choice
    from hpclab.pi import fast, midpoint, mc, xoroshiro

    sim = backend.is_simulator()
    first = backend.auto_size(gpu=10**10, sim=2_000)
    limit_mc = backend.auto_size(gpu=10**14, sim=4_000)
    limit_mid = backend.auto_size(gpu=MAX_BINS, sim=4_000)
    seconds = seconds if not sim else 0.0
    blocks, threads = full_gpu(1 << 40)
    out: dict = {"backend": backend.name(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
                 "device": identity()[0], "sms": 1 if sim else cuda.get_current_device().MULTIPROCESSOR_COUNT,
                 "launch": {"blocks": blocks, "threads": threads}}

    states = xoroshiro.states(blocks * threads, 123)
    out["xoroshiro_states"] = blocks * threads
    out["xoroshiro_init_s"] = init_seconds(blocks * threads, 123)
    out["mc_counter_generator"] = f"Philox4x32-{mc.ROUNDS}"
    for name, make, start, limit, secs in (
            ("mc_counter_samples", lambda m: fast.count_hits(0, m, 123), first, limit_mc, seconds),
            ("mc_philox10_samples", lambda m: fast.count_hits(0, m, 123, rounds=10), first, limit_mc, seconds / 2),
            ("mc_xoroshiro_samples", lambda m: xoroshiro.count_hits(m, 123, 0, blocks, threads, states), first // 4,
             limit_mc, seconds),
            ("midpoint_bins", lambda m: fast.partial_sum(0, m, m), first, limit_mid, seconds),
            ("midpoint_plain_bins", lambda m: midpoint.partial_sum(0, m, m), first, limit_mid, seconds)):
        out[f"{name}_per_s"], out[name] = _rate(make, start, limit, secs, repeats)

    if shapes and not sim:
        sms = out["sms"]
        scan = [(4 * sms, 256), (8 * sms, 256), (16 * sms, 256), (4 * sms, 512), (2 * sms, 1024), (16 * sms, 128)]
        n_mc, n_mid = out["mc_counter_samples"] // 2, out["midpoint_bins"] // 2
        out["shapes"] = [{
            "blocks": b, "threads": t,
            "mc_counter_samples_per_s": n_mc / median_time(lambda: fast.count_hits(0, n_mc, 123, b, t), 2, warmup=0),
            "midpoint_bins_per_s": n_mid / median_time(lambda: fast.partial_sum(0, n_mid, n_mid, b, t), 2, warmup=0),
        } for b, t in scan]
    out["targets"] = {name: {"target": goal, "measured": out[name], "met": out[name] >= goal}
                      for name, goal in TARGETS.items()}
    out.update(topic="pi", device_name=out["device"], note=f"counter-based generator {out['mc_counter_generator']}",
               figures=figures(out))
    return out


def figures(d: dict) -> list[dict]:
    """The run's figures: the counter-based generator against numba.cuda.random's xoroshiro128+, the
    4-bins-per-division midpoint kernel against one division per bin (the launch-shape scan is not kept)."""
    xoro, plain = d["mc_xoroshiro_samples_per_s"], d["midpoint_plain_bins_per_s"]
    rows = [figure("pi-mc", variant, 1, "", "", "rate", d[key], "samples/s", "bench-xoroshiro128p", xoro)
            for key, variant in (("mc_counter_samples_per_s", "bench"),
                                 ("mc_philox10_samples_per_s", "bench-philox10"))]
    return rows + [figure("pi-mc", "bench-xoroshiro128p", 1, "", "", "rate", xoro, "samples/s"),
                   figure("pi-mc", "bench-xoroshiro128p", 1, d["xoroshiro_states"], "states", "init_s",
                          d["xoroshiro_init_s"], "s"),
                   figure("pi-midpoint", "bench", 1, "", "", "rate", d["midpoint_bins_per_s"], "bins/s", "bench-plain",
                          plain),
                   figure("pi-midpoint", "bench-plain", 1, "", "", "rate", plain, "bins/s")]


def format_table(r: dict) -> str:
    lines = [f"pi kernels on {r['device']} ({r['backend']}, {r['sms']} SMs), {r['date']}",
             f"  launch: {r['launch']['blocks']} blocks x {r['launch']['threads']} threads",
             f"  Monte Carlo, counter (Philox4x32-7) {r['mc_counter_samples_per_s']:.3e} samples/s "
             f"(target 8e11; workshop A100 {A100_WORKSHOP_MC:.2e})",
             f"  Monte Carlo, Philox4x32-10          {r['mc_philox10_samples_per_s']:.3e} samples/s "
             f"(the authors' default rounds, for comparison)",
             f"  Monte Carlo, xoroshiro128+          {r['mc_xoroshiro_samples_per_s']:.3e} samples/s "
             f"(counter is {r['mc_counter_samples_per_s'] / r['mc_xoroshiro_samples_per_s']:.2f}x)",
             f"  xoroshiro128+ state init            {r['xoroshiro_init_s']:.3f} s for "
             f"{r['xoroshiro_states']} states (host side)",
             f"  midpoint, 4 bins per division       {r['midpoint_bins_per_s']:.3e} bins/s (target 1e12)",
             f"  midpoint, 1 division per bin        {r['midpoint_plain_bins_per_s']:.3e} bins/s "
             f"(4-bin version is {r['midpoint_bins_per_s'] / r['midpoint_plain_bins_per_s']:.2f}x)"]
    for s in r.get("shapes", []):
        lines.append(f"  shape {s['blocks']:>6} x {s['threads']:<5} MC {s['mc_counter_samples_per_s']:.3e}/s  "
                     f"midpoint {s['midpoint_bins_per_s']:.3e}/s")
    for name, t in r["targets"].items():
        lines.append(f"  target {name} >= {t['target']:.0e}: {'MET' if t['met'] else 'NOT MET'} "
                     f"({t['measured'] / t['target']:.2f}x)")
    if r["backend"] == "sim":
        lines.append("  (simulator: tiny sizes, the rates say nothing about a GPU)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m benchmarks pi", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    parser.add_argument("--seconds", type=real(0, 3600, lo_open=True), default=1.0,
                        help="target seconds per timed run (default 1)")
    parser.add_argument("--repeats", type=count(1, 1000), default=3,
                        help="timed runs per figure; the median counts")
    parser.add_argument("--no-shapes", action="store_true", help="skip the launch-shape scan")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    backend.select()
    result = measure(args.seconds, args.repeats, shapes=not args.no_shapes)
    print(format_table(result))
    if args.json:
        print(json.dumps(result))
    return 0
