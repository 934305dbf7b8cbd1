import json
import subprocess
import sys

from .helpers import ROOT, env, mpiexec

TABLE = """
import json
from hpclab import device
rows = device.table()
from hpclab.mpi import world
if world().rank == 0:
    print(json.dumps(rows))
"""


def test_local_rank_and_gpu_table_under_three_ranks():
    proc = subprocess.run([mpiexec(), "-n", "3", sys.executable, "-c", TABLE], capture_output=True,
                          text=True, timeout=60, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [r["rank"] for r in rows] == [0, 1, 2]
    assert [r["local_rank"] for r in rows] == [0, 1, 2]          # one node
    assert all(r["local_size"] == 3 for r in rows)
    assert all(r["gpu"] == r["local_rank"] % r["node_gpus"] for r in rows)
    assert all(r["gpu_name"] == "simulator" for r in rows)
