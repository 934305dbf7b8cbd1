"""``python -m benchmarks matmul`` on this backend: every kernel's product checked, and a transposed layout's rows
recorded under their own key (on the simulator the times say nothing; the checks and the record's shape do)."""
import json

from benchmarks.__main__ import main


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
