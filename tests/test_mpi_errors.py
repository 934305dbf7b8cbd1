import subprocess
import sys
import time

from .helpers import ROOT, env, launcher


def _mpi_script(n, name, timeout=60):
    cmd = [*launcher(), "-n", str(n), sys.executable, str(ROOT / "tests" / "mpi_scripts" / name)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


def test_exception_on_rank_1_of_3_is_raised_on_every_rank_within_seconds():
    t0 = time.monotonic()
    proc = _mpi_script(3, "raise_in_step.py")
    elapsed = time.monotonic() - t0
    assert proc.returncode != 0
    for rank in range(3):
        assert (f"rank {rank} caught: reading the input failed on rank 1 of 3: "
                "FileNotFoundError: input.dat is missing on rank 1") in proc.stdout, proc.stdout
    assert "went on" not in proc.stdout
    assert elapsed < 30


CRASHING_PROGRAM = """
import sys, types
from hpclab import runner

program = types.ModuleType("crash")
program.PROGRAM = runner.Program("crash", "tests")
program.HELP = "rank 1 crashes outside any step"
program.add_arguments = lambda parser: None

def run(args, ctx):
    if ctx.comm.rank == 1:
        raise RuntimeError("rank 1 crashed")
    ctx.comm.Barrier()          # ranks 0 and 2 would wait here forever without MPI_Abort

program.run = run
sys.exit(runner.main(program, []))
"""


def test_runner_aborts_all_ranks_on_an_unexpected_failure(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASHING_PROGRAM)
    t0 = time.monotonic()
    cmd = [*launcher(), "-n", "3", sys.executable, str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env(), cwd=ROOT)
    assert proc.returncode != 0
    assert "rank 1 crashed" in proc.stderr
    assert "aborting all ranks" in proc.stderr
    assert time.monotonic() - t0 < 30
