"""``python -m benchmarks matmul`` on this backend: every kernel's product checked, and a transposed layout's rows
recorded under their own key (on the simulator the times say nothing; the checks and the record's shape do)."""
import json

from benchmarks.__main__ import main
from benchmarks.matmul import RANDOM_RANGE, random_shapes
from hpclab import backend


def test_matmul_bench_times_and_checks_each_layout(tmp_path, capsys):
    out = tmp_path / "mm.json"
    assert main(["matmul", "--sizes", "33x20x17", "--layouts", "nn,tn,nt", "--no-sweep", "--repeats", "1",
                 "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["all_correct"] and set(record["shapes"]) == {"33x20x17", "33x20x17-tn", "33x20x17-nt"}
    for key in ("33x20x17-tn", "33x20x17-nt"):
        rows = record["shapes"][key]["rows"]
        assert {r["kernel"] for r in rows} >= {"fast", "warp"} and all(r["correct"] for r in rows if "correct" in r)
    variants = {f["variant"] for f in record["figures"]}
    assert {"warp-at-33x20x17-tn", "fast-at-33x20x17-nt"} <= variants
    assert "33x20x17-tn" in capsys.readouterr().out


def test_random_shapes_are_reproducible_and_within_the_range():
    lo, hi, least, most = RANDOM_RANGE["gpu"]
    shapes = random_shapes(50, 7, lo, hi, least, most)
    assert shapes == random_shapes(50, 7, lo, hi, least, most) != random_shapes(50, 8, lo, hi, least, most)
    assert all(lo <= side <= hi for shape in shapes for side in shape)
    assert all(least <= m * n * k <= most for m, n, k in shapes)
    assert min(min(s) for s in shapes) < 64 < max(max(s) for s in shapes)     # narrow sides are drawn too


def test_matmul_bench_times_random_shapes(tmp_path):
    out = tmp_path / "mm.json"
    assert main(["matmul", "--random", "2", "--seed", "3", "--no-sweep", "--repeats", "1", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    drawn = ["x".join(map(str, s)) for s in random_shapes(2, 3, *RANDOM_RANGE[backend.name()])]
    assert record["random_shapes"] == drawn and record["all_correct"]
    assert set(drawn) <= set(record["shapes"]) | set(record["sizes"])
