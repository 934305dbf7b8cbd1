"""Placement: node-local rank -> GPU, and which ranks share a GPU (device UUIDs)."""
import json
import subprocess
import sys

from .helpers import ROOT, env, gpus, launcher, run_mpi

TABLE = """
import json
from hpclab import device
rows = device.table()
from hpclab.mpi import world
if world().rank == 0:
    print(json.dumps(rows))
    print(device.format_table(rows))
"""


def test_local_rank_and_gpu_table_under_three_ranks():
    proc = subprocess.run([*launcher(), "-n", "3", sys.executable, "-c", TABLE], capture_output=True,
                          text=True, timeout=60, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.strip().splitlines()[0])
    assert [r["rank"] for r in rows] == [0, 1, 2]
    assert [r["local_rank"] for r in rows] == [0, 1, 2]          # one node
    assert all(r["local_size"] == 3 for r in rows)
    assert all(r["gpu"] == r["local_rank"] % r["node_gpus"] for r in rows)
    # Ranks share a GPU exactly when they report the same device UUID.
    for r in rows:
        assert r["shared_with"] == [q["rank"] for q in rows if q["gpu_uuid"] == r["gpu_uuid"]]
    if rows[0]["gpu_uuid"].startswith("sim-"):                  # one simulated device per node
        assert all(r["gpu_name"] == "simulator" and r["shared_with"] == [0, 1, 2] for r in rows)
    table = proc.stdout.strip().splitlines()[1:]
    assert "shared with" in table[0]
    shared = rows[0]["shared_with"][1:]
    assert (f"ranks {','.join(map(str, shared))}" if shared else " - ") in table[2]


def test_shared_groups_with_injected_uuids():
    """2 GPUs, 4 ranks: ranks 0 and 2 on one, 1 and 3 on the other (local rank mod GPUs)."""
    from hpclab.device import shared_groups

    assert shared_groups(["GPU-a", "GPU-b", "GPU-a", "GPU-b"]) == [[0, 2], [1, 3]]
    assert shared_groups(["GPU-a", "GPU-b", "GPU-c"]) == []                  # one GPU per rank
    assert shared_groups(["sim-n1", "sim-n1", "sim-n2", "sim-n2"]) == [[0, 1], [2, 3]]  # two nodes
    assert shared_groups(["GPU-a"]) == []


def test_info_under_mpiexec_counts_ranks_per_gpu():
    proc = run_mpi(2, "info", timeout=90)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("ranks per GPU"))
    if gpus() >= 2 and "real GPU" in proc.stdout:
        assert "one rank per GPU" in line
    else:
        assert "up to 2 ranks per GPU" in line and "(2 ranks share it)" in proc.stdout
    assert sum(ln.startswith("ranks per GPU") for ln in proc.stdout.splitlines()) == 1   # rank 0 prints
