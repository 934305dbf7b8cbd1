"""The scaling harness drives programs other than pi through their own size option."""
import csv
import subprocess
import sys

from .helpers import ROOT, env


def test_distributed_gemm_strong_scaling_through_the_harness(tmp_path):
    # --n is matmul's own option: it must reach the program, not be taken for --no-progress.
    proc = subprocess.run(
        [sys.executable, "-m", "hpclab", "scaling", "matmul", "--ranks", "1,2", "--work-arg=--n",
         "--n", "24", "--trials", "1", "--out", str(tmp_path), "--no-progress"],
        capture_output=True, text=True, timeout=300, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = list(csv.DictReader(open(tmp_path / "matmul_strong.csv")))
    assert sorted({int(r["ranks"]) for r in rows}) == [1, 2]
    assert all(r["work"] == "24" for r in rows)
    assert (tmp_path / "matmul_strong.png").stat().st_size > 1000
