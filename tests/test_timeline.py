"""Timelines: spans recorded on the streams of a DDP step and a halo layer, ordered, named, gathered.

On the simulator a mark is the host's clock once the work before it has run (streams are
synchronous there), so the order of the spans is the order of the work."""
from __future__ import annotations

import numpy as np
import pytest

from hpclab import backend, timeline as T
from hpclab.results import plot
from hpclab.mpi import world
from .helpers import env, launcher, ROOT


def by_name(spans):
    return {s["name"]: s for s in spans}


def test_spans_and_cuts_are_recorded_in_order():
    tl = T.Timeline()
    tl.start(world())
    tl.cut("a")
    with tl.span("inner", "comm", 0, "other"):
        pass
    tl.cut("b", "copy")
    tl.cut(None)
    tl.cut("never closed")
    spans = tl.spans()
    assert [(s["name"], s["kind"], s["lane"]) for s in spans] == [
        ("inner", "comm", "other"), ("a", "compute", "default stream"), ("b", "copy", "default stream")]
    s = by_name(spans)
    assert 0 <= s["a"]["start_ms"] <= s["inner"]["start_ms"] <= s["inner"]["end_ms"] <= s["a"]["end_ms"]
    assert s["a"]["end_ms"] == s["b"]["start_ms"] <= s["b"]["end_ms"]


@pytest.mark.parametrize("overlap", [True, False])
def test_ddp_step_spans_each_layer_and_each_bucket(overlap):
    from hpclab.ddp.trainer import timeline_step

    spans = timeline_step(world(), overlap, sizes=[6, 4, 4, 2], per_rank=8)
    compute = [s for s in spans if s["lane"] == "default stream" and s["kind"] == "compute"]
    assert [s["name"] for s in compute] == ["forward, layer 2 gradients", "layer 1 gradients",
                                            "layer 0 gradients", "update"]
    assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(compute, compute[1:]))
    s = by_name(spans)
    if overlap:     # each layer's bucket is all-reduced on the comm stream once its gradients are written
        for layer in (2, 1, 0):
            done = s["forward, layer 2 gradients" if layer == 2 else f"layer {layer} gradients"]["end_ms"]
            reduce = s[f"all-reduce layer {layer}"]
            assert reduce["lane"] == "comm stream" and done <= reduce["start_ms"] <= reduce["end_ms"]
        assert len(spans) == 7
    else:
        reduce = s["all-reduce, whole model"]
        assert s["layer 0 gradients"]["end_ms"] <= reduce["start_ms"] <= reduce["end_ms"] <= s["update"]["start_ms"]
        assert len(spans) == 5


def test_a_timeline_changes_no_number_of_the_training():
    from hpclab.ddp import mlp as K
    from hpclab.ddp.model import MLP, init_parameters
    from hpclab.ddp.trainer import DDPTrainer

    rng = np.random.default_rng(0)
    x = K.cuda.to_device(rng.standard_normal((8, 6)).astype(np.float32))
    y = K.cuda.to_device(rng.integers(0, 2, (8, 1)).astype(np.int32))
    idx = K.cuda.to_device(np.arange(8, dtype=np.int32))
    weights = []
    for timed in (False, True):
        model = MLP([6, 4, 2])
        model.load(init_parameters([6, 4, 2], seed=0))
        trainer = DDPTrainer(model, world(), "mpi-host", lr=0.1, overlap=True, bucket_mb=1e-6)
        if timed:
            trainer.timeline = T.Timeline()
            trainer.timeline.start(world())
        trainer.step(x, y, idx, 8)
        weights.append(model.parameters_host())
    np.testing.assert_array_equal(*weights)


@pytest.mark.parametrize("overlap", [True, False])
def test_halo_layer_spans_follow_the_exchange(overlap):
    from hpclab.halo.versions import timeline_layer

    comm = world()
    s = by_name(timeline_layer(comm, overlap, rows_per_rank=6))
    # A band with a halo is copied into a working buffer first; one rank reads its band in place.
    assert ("own rows" in s) == (comm.size > 1)
    assert s.get("own rows", {"lane": "compute stream"})["lane"] == "compute stream"
    assert s["pack"]["lane"] == "edge stream"
    order = ["pack", "halo exchange", "unpack"] + (["boundary rows"] if overlap else ["all rows"])
    assert all(s[a]["end_ms"] <= s[b]["start_ms"] for a, b in zip(order, order[1:]))
    if overlap and backend.is_simulator():   # the interior before the exchange: the simulator runs streams in turn
        first = s["own rows"]["end_ms"] if "own rows" in s else 0.0
        assert first <= s["interior rows"]["start_ms"] <= s["interior rows"]["end_ms"] <= s["halo exchange"]["start_ms"]
    assert {x["kind"] for x in s.values()} == {"compute", "comm", "copy"}


def test_two_ranks_gathered_on_rank_0(tmp_path):
    """The command that records the GPU timelines, on two ranks: every run has both ranks'
    spans under the same names, and no rank leaves an all-reduce before the other has entered it."""
    import subprocess
    import sys

    out = tmp_path / "timeline.csv"
    proc = subprocess.run([*launcher(), "-n", "2", sys.executable, "benchmarks/perf_record.py", "timeline", str(out)],
                          capture_output=True, text=True, timeout=180, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    runs = T.read(out.read_text())
    assert list(runs) == ["DDP step, overlapped", "DDP step, not overlapped", "halo layer, overlapped",
                          "halo layer, not overlapped"]
    for name, spans in runs.items():
        names = [sorted(s["name"] for s in spans if s["rank"] == r) for r in (0, 1)]
        assert names[0] == names[1] and names[0], name
    reduce = [s for s in runs["DDP step, not overlapped"] if s["kind"] == "comm"]
    assert len(reduce) == 2 and min(s["end_ms"] for s in reduce) >= max(s["start_ms"] for s in reduce) - 1.0
    fig = T.figure(runs, "two ranks", "simulator")
    assert len(fig.axes) == 4 and plot.png(fig)[:4] == b"\x89PNG"
