"""Bad input, table by table: every command and every kind of option ends within seconds with
one line that names the option, the value and what is allowed, exit status 2 and no traceback.

Refusals made while parsing are the same on every rank, so most cases run here, in this
process, through the ``hpclab`` command's own entry point (fast). The cases whose point is a
real launch run under mpiexec: ranks that disagree at start-up, values that would run for
ages on two ranks, a crash under --json.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import time

import pytest

from hpclab import backend, cli

from .helpers import ROOT, env, mpiexec
from .test_mpi_errors import CRASHING_PROGRAM

# Cases that fail only because the simulator has no NCCL, or is slow enough to refuse the work.
sim_only = pytest.mark.skipif(backend.name() != "sim", reason="refused on the simulator only")

# (arguments of `hpclab`, words the one-line message must contain)
RUN = [
    # counts: not finite, too large to compute, not whole, not a number, out of range
    (["pi-midpoint", "--bins", "inf"], "argument --bins: 'inf' is not a finite number; give a whole number from 1"),
    (["pi-midpoint", "--bins", "1e400"], "argument --bins: 1e400 is out of range; give a whole number from 1 to"),
    (["pi-midpoint", "--bins", "2**1024"], "argument --bins: 2**1024 is out of range"),
    (["pi-midpoint", "--bins", "2.5"], "argument --bins: '2.5' is not a whole number"),
    (["pi-midpoint", "--bins", "0"], "argument --bins: 0 is out of range"),
    (["pi-mc", "--samples", "nan"], "argument --samples: 'nan' is not a finite number"),
    (["pi-mc", "--samples", "abc"], "argument --samples: 'abc' is not a number"),
    (["pi-mc", "--blocks", "1e30"], "argument --blocks: 1e30 is out of range; give a whole number from 1 to 2147483647"),
    (["pi-mc", "--threads", "48"], "argument --threads: invalid choice: 48 (choose from 1, 2, 4,"),
    (["pi-mc", "--threads", "2048"], "argument --threads: 2048 is out of range"),
    (["matmul", "--n", "1e30"], "argument --n: 1e30 is out of range"),
    (["matmul", "--repeats", "0"], "argument --repeats: 0 is out of range"),
    (["matmul-reduce", "--n", "1e30"], "argument --n: 1e30 is out of range"),
    (["conv-halo", "--height", "1e30"], "argument --height: 1e30 is out of range"),
    (["conv-halo", "--batch", "0"], "argument --batch: 0 is out of range"),
    (["collectives", "--count", "1e30"], "argument --count: 1e30 is out of range"),
    (["pi-nccl-mpi", "--samples", "0"], "argument --samples: 0 is out of range"),
    (["pi-nccl-node", "--gpus", "0"], "argument --gpus: 0 is out of range"),
    (["ddp-digits", "--subset", "5000"], "argument --subset: 5000 is out of range; give a whole number from 100 to 1797"),
    # seeds: negative, beyond the generator's words
    (["pi-mc", "--seed", "-1"], "argument --seed: -1 is out of range; give a whole number from 0 to"),
    (["pi-mc", "--seed", "2**64"], "argument --seed: 18446744073709551616 is out of range"),
    (["matmul", "--seed", "-3"], "argument --seed: -3 is out of range"),
    (["conv-halo", "--seed", "-1"], "argument --seed: -1 is out of range"),
    (["pi-nccl-node", "--seed", "-5"], "argument --seed: -5 is out of range"),
    (["ddp-digits", "--seed", "2**40"], "argument --seed: 1099511627776 is out of range; give a whole number from 0 to 4294967295"),
    # real numbers: not finite, outside their range
    (["matmul-reduce", "--lr", "nan"], "argument --lr: 'nan' is not a finite number"),
    (["matmul-reduce", "--lr", "-1"], "argument --lr: -1 is out of range; give a finite number of at least 0"),
    (["ddp-mlp", "--momentum", "nan"], "argument --momentum: 'nan' is not a finite number"),
    (["ddp-mlp", "--momentum", "-0.5"], "argument --momentum: -0.5 is out of range; give a finite number with 0 <= value < 1"),
    (["ddp-mlp", "--momentum", "1.5"], "argument --momentum: 1.5 is out of range"),
    (["ddp-mlp", "--lr", "inf"], "argument --lr: 'inf' is not a finite number"),
    (["ddp-digits", "--threshold", "-1"], "argument --threshold: -1 is out of range; give a finite number with 0 < value <= 1"),
    (["ddp-digits", "--threshold", "1.5"], "argument --threshold: 1.5 is out of range"),
    (["ddp-digits", "--lr", "0"], "argument --lr: 0 is out of range; give a finite number above 0"),
    # choices and comma lists (empty items, unknown names)
    (["conv-halo", "--version", "v1,"], "argument --version: 'v1,' has an empty item"),
    (["conv-halo", "--version", "v9"], "argument --version: unknown version v9; give all, or a comma list of v1"),
    (["conv-halo", "--layer", "c9"], "argument --layer: invalid choice: 'c9'"),
    (["conv-halo", "--comm", "bogus"], "argument --comm: invalid choice: 'bogus'"),
    (["ddp-digits", "--hidden", "16,"], "argument --hidden: '16,' has an empty item"),
    (["ddp-mlp", "--comm", "bogus"], "argument --comm: invalid choice: 'bogus'"),
    (["collectives", "--backend", "bogus"], "argument --backend: invalid choice: 'bogus'"),
    (["pi-nccl-mpi", "--backend", "bogus"], "argument --backend: invalid choice: 'bogus'"),
    (["matmul", "--kernel", "bogus"], "argument --kernel: invalid choice: 'bogus'"),
    (["pi-mc", "--generator", "foo"], "argument --generator: invalid choice: 'foo'"),
    # options that exclude each other
    (["conv-halo", "--height", "40", "--rows-per-rank", "4"], "argument --rows-per-rank: not allowed with argument --height"),
    (["ddp-mlp", "--global-batch", "8", "--per-rank-batch", "4"],
     "argument --per-rank-batch: not allowed with argument --global-batch"),
    # values that fit their type but not the run: an estimate and the limit
    pytest.param(["pi-midpoint", "--bins", "4e15"], "--bins 4e+15 would run for at least", marks=sim_only),
    (["pi-mc", "--samples", "1e18"], "--samples 1e+18 would run for at least"),
    (["matmul-reduce", "--iterations", "1e30"], "--iterations 1e+30 would run for at least"),
    (["ddp-mlp", "--epochs", "1e30"], "--epochs 1e+30 would run for at least"),
    (["matmul", "--n", "1e6"], "--n 1000000 needs about"),
    (["conv-halo", "--rows-per-rank", "1e9"], "--rows-per-rank 1e+09 needs about"),
    (["ddp-digits", "--subset", "1790"], "--subset 1790 leaves fewer than 10 images out"),
    (["ddp-mlp", "--global-batch", "2048"], "global batch 2048 is larger than the data set (1024 samples)"),
    # names that are not there
    (["nosuch"], "unknown program 'nosuch'; choose one of: collectives"),
    (["pi-mc", "--bogus", "1"], "unrecognized arguments: --bogus 1"),
]

OTHERS = [
    (["scaling", "pi-mc", "--timeout", "nan"], "argument --timeout: 'nan' is not a finite number"),
    (["scaling", "pi-mc", "--ranks", "1,"], "argument --ranks: '1,' has an empty item"),
    (["scaling", "pi-mc", "--ranks", "0,1"], "argument --ranks: in '0,1': 0 is out of range"),
    (["scaling", "pi-mc", "--trials", "0"], "argument --trials: 0 is out of range"),
    (["scaling", "nosuch"], "unknown program 'nosuch'"),
    (["scaling", "pi-mc", "--ranks", "1", "--mpiexec", "nosuch-launcher"],
     "--mpiexec 'nosuch-launcher': no program 'nosuch-launcher' found"),
    (["workbook", "--engines", "0"], "argument --engines: 0 is out of range"),
    (["info", "--bogus"], "unrecognized arguments: --bogus"),
    (["exercises", "check", "--root", "/nonexistent"], "--root /nonexistent: no such folder"),
    (["exercises", "build", "--root", "/nonexistent"], "--root /nonexistent: no such folder"),
]


def call(argv: list[str]) -> tuple[int, str, str, float]:
    """``hpclab ARGV`` in this process: (exit status, stdout, stderr, seconds)."""
    out, err = io.StringIO(), io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue(), time.monotonic() - t0


def refused(code, out, err, seconds, words, status=2):
    assert code == status, (code, out, err)
    assert "Traceback" not in out + err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1, err                     # one line, not a usage block
    assert words in lines[0], lines[0]
    assert seconds < 30                             # includes the first import of a program's kernels


def _ids(table):
    return [" ".join((case.values if hasattr(case, "values") else case)[0]) for case in table]


@pytest.mark.parametrize("argv, words", RUN, ids=_ids(RUN))
def test_run_refuses(argv, words):
    refused(*call(["run", *argv]), words)


@pytest.mark.parametrize("argv, words", OTHERS, ids=_ids(OTHERS))
def test_command_refuses(argv, words):
    refused(*call(argv), words)


def test_run_under_json_still_ends_with_a_json_line():
    code, out, err, _ = call(["run", "pi-mc", "--samples", "abc", "--json"])
    assert code == 2 and "argument --samples" in err
    record = json.loads(out.strip().splitlines()[-1])
    assert record["passed"] is False and "argument --samples: 'abc'" in record["error"]


# -- scaling: its output folder, its work option and the launcher, before any run ------------
@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


def test_scaling_output_that_is_a_file_or_under_one_or_unwritable(a_file):
    base = ["scaling", "pi-mc", "--ranks", "1", "--samples", "1000", "--no-progress"]
    refused(*call([*base, "--out", str(a_file)]), f"--out {a_file} is a file; give a folder")
    refused(*call([*base, "--out", str(a_file / "sub")]), f"lies under {a_file}, which is a file")
    refused(*call([*base, "--out", "/proc/hpclab-scaling"]), "--out /proc/hpclab-scaling: cannot write there")


def test_scaling_work_option_is_checked_before_any_run(tmp_path):
    base = ["scaling", "pi-mc", "--ranks", "1,2", "--out", str(tmp_path), "--no-progress"]
    refused(*call([*base, "--weak", "--samples", "abc"]), "argument --samples: 'abc' is not a number")
    refused(*call([*base, "--samples", "abc"]), "argument --samples: 'abc' is not a number")
    refused(*call([*base, "--samples", "1"]), "--samples 1: 1 samples cannot be shared among 2 ranks")
    assert list(tmp_path.iterdir()) == []           # nothing was run, nothing written


def test_scaling_without_any_mpiexec_says_how_to_get_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))   # no mpiexec beside it
    monkeypatch.setenv("PATH", str(tmp_path))                                 # nor on PATH
    monkeypatch.delenv("HPCLAB_MPIEXEC", raising=False)                       # nor named (make test-gpu names one)
    refused(*call(["scaling", "pi-mc", "--ranks", "1", "--out", str(tmp_path / "out")]),
            "no mpiexec beside this Python or on PATH")


@sim_only
def test_scaling_of_a_failing_program_gives_the_programs_message(tmp_path):
    code, out, err, seconds = call(["scaling", "pi-nccl-mpi", "--backend", "nccl", "--ranks", "1",
                                    "--trials", "1", "--out", str(tmp_path), "--no-progress"])
    assert code == 1 and "Traceback" not in out + err
    assert "pi-nccl-mpi on 1 rank(s) failed" in err and "NCCL needs real NVIDIA GPUs" in err, err
    assert seconds < 60


# -- exercises: a corrupt solution, an output folder that is a file -------------------------
def _project(tmp_path, notebook_text=None):
    root = tmp_path / "project"
    (root / "solutions").mkdir(parents=True)
    source = sorted((ROOT / "solutions").glob("*.ipynb"))[0]
    (root / "solutions" / source.name).write_text(notebook_text or source.read_text())
    return root, source.name


def test_exercises_on_a_corrupt_notebook_name_the_file(tmp_path):
    root, name = _project(tmp_path, "{ this is not json")
    for action in ("build", "check"):
        refused(*call(["exercises", action, "--root", str(root)]), f"{name} is not a readable notebook",
                status=1)


def test_exercises_output_folder_that_is_a_file(tmp_path):
    root, _ = _project(tmp_path)
    (root / "exercises").write_text("a file")
    refused(*call(["exercises", "build", "--root", str(root)]), "is a file, but exercises are written into",
            status=1)


def test_exercises_root_without_solutions(tmp_path):
    refused(*call(["exercises", "check", "--root", str(tmp_path)]), "has no solutions/ folder")


# -- real launches: the environment, ranks that disagree, absurd values on two ranks, crashes ---
def launch(cmd: list[str], timeout: float = 60, **extra) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(**extra), cwd=ROOT)
    return proc, time.monotonic() - t0


HPCLAB = [sys.executable, "-m", "hpclab"]


def _json_error(proc) -> dict:
    records = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert records, proc.stdout + proc.stderr
    assert records[-1]["passed"] is False and records[-1]["error"], records[-1]
    return records[-1]


def test_unknown_backend_stops_info_and_run():
    proc, _ = launch([*HPCLAB, "info"], HPCLAB_BACKEND="bogus")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "hpclab info: error: HPCLAB_BACKEND='bogus' is not a backend; use one of auto, gpu, sim" in proc.stderr
    proc, _ = launch([*HPCLAB, "run", "pi-mc", "--json"], HPCLAB_BACKEND="bogus")
    assert proc.returncode == 2 and "HPCLAB_BACKEND='bogus'" in proc.stderr
    assert "HPCLAB_BACKEND='bogus'" in _json_error(proc)["error"]


@pytest.mark.parametrize("first, second, words", [
    # the backend reaches one rank only: rank 1 fails its check, rank 0 is fine
    (["run", "pi-mc"], ["env", "HPCLAB_BACKEND=bogus", *HPCLAB, "run", "pi-mc"],
     "HPCLAB_BACKEND='bogus' is not a backend; use one of auto, gpu, sim. (on rank 1 of 2)"),
    # the arguments differ: rank 0 refuses them, rank 1 would have run
    (["run", "pi-mc", "--samples", "abc"], [*HPCLAB, "run", "pi-mc"],
     "argument --samples: 'abc' is not a number"),
], ids=["backend on one rank", "arguments on one rank"])
def test_ranks_that_disagree_at_start_up_all_stop_within_seconds(first, second, words):
    cmd = [mpiexec(), "-n", "1", *HPCLAB, *first, ":", "-n", "1", *second]
    proc, seconds = launch(cmd)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and proc.stderr.count("error:") == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert seconds < 30


def test_absurd_iterations_on_two_ranks_are_refused_with_the_estimate():
    proc, seconds = launch([mpiexec(), "-n", "2", *HPCLAB, "run", "matmul-reduce", "--iterations", "1e30",
                            "--json"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--iterations 1e+30 would run for at least" in proc.stderr and "the limit is 1 day" in proc.stderr
    assert "--iterations" in _json_error(proc)["error"]
    assert seconds < 30


@sim_only
def test_a_failure_during_the_run_under_json_still_ends_with_a_json_line():
    proc, seconds = launch([mpiexec(), "-n", "2", *HPCLAB, "run", "pi-nccl-mpi", "--backend", "nccl",
                            "--samples", "100", "--json"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "NCCL needs real NVIDIA GPUs" in _json_error(proc)["error"]
    assert seconds < 30


# test_mpi_errors' crashing program, run with --json
CRASH = CRASHING_PROGRAM.replace("runner.main(program, [])", 'runner.main(program, ["--json"])')
assert CRASH != CRASHING_PROGRAM


def test_a_crash_on_one_rank_under_json_leaves_a_json_line_and_stops_the_job(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text(CRASH)
    proc, seconds = launch([mpiexec(), "-n", "2", sys.executable, str(script)])
    assert proc.returncode != 0
    record = _json_error(proc)
    assert record["rank"] == 1 and "rank 1 crashed" in record["error"]
    assert seconds < 30
