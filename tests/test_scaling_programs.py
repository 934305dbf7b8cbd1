"""The scaling harness drives programs other than pi through their own size option."""
import csv
import json
import subprocess
import sys

from .helpers import ROOT, env, launcher


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


ENGINE_TRIAL = """
import json
from hpclab import backend, scaling
from hpclab.errors import RankError
from hpclab.mpi import world

backend.select()
comm = world()
mine = []
for argv in (["--samples", "1"], ["--samples", "1e18"], ["--samples", "2000"]):
    try:
        record = scaling.engine_trial("hpclab.pi.run_mc", argv, comm.size)
        mine.append(f"ran: {record and record['passed']}")
    except RankError as exc:
        mine.append(f"refused: {exc}")
everyone = comm.gather(mine)
if comm.rank == 0:
    print(json.dumps(everyone))
"""


def test_the_notebook_route_checks_input_as_hpclab_run_does(tmp_path):
    """scaling.engine_trial (what sweep_engines runs on the engines) refuses, on every rank of the sweep,
    what `hpclab run` refuses for that launch: too little work to share, and work that cannot end in a day."""
    script = tmp_path / "trial.py"
    script.write_text(ENGINE_TRIAL)
    proc = subprocess.run([*launcher(), "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (few, many, fine), (few1, many1, fine1) = json.loads(proc.stdout.strip().splitlines()[-1])
    assert few == few1 and "1 samples cannot be shared among 2 ranks" in few, few
    assert many == many1 and "--samples 1e+18 would run for at least" in many and "the limit is 1 day" in many
    assert (fine, fine1) == ("ran: True", "ran: None")        # rank 0 returns the record, the others None
