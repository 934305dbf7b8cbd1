"""``benchmarks/perf_record.py``: what it writes, the library reads back (data/roofline.csv, data/timeline.csv)."""
import io

import pytest

from hpclab import roofline as R, timeline as T

from benchmarks.perf_record import write_roofline, write_timeline


def test_roofline_csv_round_trip():
    points = R.measure_roofs(repeats=1) + [R.point("k", 1.0, 2.0, 3.0, "model", "04")]
    buf = io.StringIO()
    write_roofline(points, buf)
    again = R.read(buf.getvalue())
    assert [(p.kernel, p.notebook, p.count, p.device) for p in again] == \
        [(p.kernel, p.notebook, p.count, p.device) for p in points]
    assert [p.seconds for p in again] == pytest.approx([p.seconds for p in points], rel=1e-6)


def test_timeline_csv_round_trip():
    spans = [{"rank": r, "lane": "edge stream", "kind": kind, "name": name, "start_ms": 0.25 * i, "end_ms": 0.25 * i + 0.1}
             for r in (0, 1) for i, (kind, name) in enumerate([("copy", "pack"), ("comm", "halo exchange")])]
    buf = io.StringIO()
    write_timeline({"x": spans}, "dev", buf)
    again = T.read(buf.getvalue())["x"]
    assert [(s["rank"], s["name"], s["device"]) for s in again] == [(s["rank"], s["name"], "dev") for s in spans]
    assert [s["end_ms"] for s in again] == pytest.approx([s["end_ms"] for s in spans])
