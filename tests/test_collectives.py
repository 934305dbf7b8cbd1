import numpy as np
import pytest

from hpclab import backend
from hpclab.collectives import check
from hpclab.collectives.ring import ring_bytes_per_rank

from .helpers import last_json, run_mpi


@pytest.mark.parametrize("n", [2, 3])
def test_collectives_program_passes_under_mpiexec(n):
    proc = run_mpi(n, "run", "collectives", "--json")
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc)
    assert out["passed"] is True and out["ranks"] == n and out["exercise"] == "collectives"
    assert out["backend"] == backend.name()
    total = n * (n + 1) / 2
    ex0 = out["result"]["exercise0"]
    assert ex0["allreduce"] == [[total]] * n
    assert ex0["reduce"][0] == [total] and ex0["reduce"][1:] == [[r + 1.0] for r in range(1, n)]
    assert ex0["allgather"] == [[float(r + 1) for r in range(n)]] * n
    assert out["result"]["ring_matches_mpi"] is True
    # rank lines in rank order, then the FINAL RESULTS block
    lines = proc.stdout.splitlines()
    assert [ln.split("/")[0] for ln in lines[:n]] == [f"rank {r}" for r in range(n)]
    assert "===== FINAL RESULTS =====" in proc.stdout


def test_ring_bytes_follow_the_formula_with_uneven_chunks():
    proc = run_mpi(3, "run", "collectives", "--count", "1001", "--json")
    res = last_json(proc)["result"]
    assert abs(res["ring_bytes_sent"] - ring_bytes_per_rank(1001 * 8, 3)) <= 2 * 2 * 8


def test_too_few_elements_for_the_ranks_is_refused_on_every_rank():
    proc = run_mpi(3, "run", "collectives", "--count", "2")
    assert proc.returncode == 2              # every rank exits; the ranks agreed, rank 0 says it once
    assert proc.stderr.count("--count 2: 2 elements cannot be shared among 3 ranks") == 1, proc.stderr


def test_non_numeric_count_is_a_usage_error():
    proc = run_mpi(2, "run", "collectives", "--count", "lots")
    assert proc.returncode == 2
    assert "'lots' is not a number" in proc.stderr


def test_slides_answers_for_four_gpus():
    ans = check.exercise0_expected(4)
    assert check.format_gpus(ans["reduce"]) == "GPU0 = [ 10 ], GPU1 = [ 2 ], GPU2 = [ 3 ], GPU3 = [ 4 ]"
    assert check.format_gpus(ans["allreduce"]) == "GPU0 = [ 10 ], GPU1 = [ 10 ], GPU2 = [ 10 ], GPU3 = [ 10 ]"
    assert ans["allgather"] == [[1.0, 2.0, 3.0, 4.0]] * 4


def test_a_wrong_answer_is_explained():
    verdict = check.collective("reduce", [[10], [10], [10], [10]], quiet=True)
    assert not verdict
    assert "GPU1 holds [10.0] but should hold [2.0]" in verdict.message


def test_ring_check_explains_wrong_traffic():
    ref = np.arange(8.0)
    assert check.allreduce(ref, ref, bytes_sent=48, nbytes=64, ranks=4, quiet=True)
    bad = check.allreduce(ref, ref, bytes_sent=256, nbytes=64, ranks=4, quiet=True)
    assert not bad and "2(N-1)/N" in bad.message
    wrong = check.allreduce(ref + 1, ref, quiet=True)
    assert not wrong and "element 0" in wrong.message
