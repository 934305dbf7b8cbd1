"""``python -m benchmarks allreduce``: every backend's rows verified, what runs where, bad sizes refused, and
hpclab's NCCL against raw NCCL."""
import pytest

from tests.helpers import last_json, run_benchmark, run_mpi


@pytest.mark.requires_sim("NCCL's refusal on a machine without a GPU")
def test_nccl_without_gpu_fails_fast_naming_nccl():
    proc = run_mpi(2, "allreduce", "--backend", "nccl", "--sizes", "1K", timeout=30, module="benchmarks")
    assert proc.returncode != 0
    assert proc.stderr.count("error: NCCL backend failed on rank 0, 1 of 2") == 2, proc.stderr
    assert proc.stderr.count("NCCL needs real NVIDIA GPUs") == 2 and "mpi-host" in proc.stderr


def test_size_list_parsing():
    from hpclab.options import UsageError

    from benchmarks.allreduce import parse_sizes

    assert parse_sizes("4,1K,1M,256M,1G", 4) == [4, 1024, 1 << 20, 256 << 20, 1 << 30]
    with pytest.raises(UsageError):
        parse_sizes("4", 8)  # 4 bytes hold no float64


def test_bench_rejects_bad_sizes():
    proc = run_benchmark("allreduce", "--sizes", "4,12X", timeout=30)
    assert proc.returncode == 2 and "'12X' is not a message size" in proc.stderr
    proc = run_benchmark("allreduce", "--sizes", "6", timeout=30)
    assert proc.returncode == 2 and "multiple of the element size (4 B)" in proc.stderr


# -- the benchmark ------------------------------------------------------------------------
def test_bench_rows_verified():
    proc = run_mpi(3, "allreduce", "--sizes", "1K,64K", "--json", timeout=60, module="benchmarks")
    assert proc.returncode == 0, proc.stderr
    out = last_json(proc)
    assert out["passed"] is True and out["ranks"] == 3
    chosen = next(n for n in out["notes"] if n.startswith("auto chose ")).split()[2].rstrip(":")
    assert chosen == "mpi-host" or out["device"] == "gpu"
    # One row per size for the chosen backend; where it is NCCL (3 ranks on 3 or more GPUs) the raw-NCCL
    # baseline is measured beside it, one row per size too, and nothing else.
    by_backend = {}
    for r in out["rows"]:
        by_backend.setdefault(r["backend"], []).append(r["size_bytes"])
    assert by_backend == {chosen: [1024, 65536], **({"raw-nccl": [1024, 65536]} if chosen == "nccl" else {})}
    for r in out["rows"]:
        assert r["verified"] is True
        assert r["count"] == r["size_bytes"] // 4
        assert r["algbw_GBps"] == pytest.approx(r["size_bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"] * 2 * 2 / 3)


@pytest.mark.requires_sim("what the simulator can run")
def test_bench_all_on_the_simulator_is_mpi_host_only():
    proc = run_mpi(2, "allreduce", "--backend", "all", "--sizes", "8,256", "--dtype",
                   "float64", "--json", timeout=60, module="benchmarks")
    out = last_json(proc)
    assert proc.returncode == 0 and out["passed"], proc.stderr
    assert {r["backend"] for r in out["rows"]} == {"mpi-host"}
    assert [r["count"] for r in out["rows"]] == [1, 32]
    assert all(r["busbw_GBps"] == pytest.approx(r["algbw_GBps"]) for r in out["rows"])  # n = 2
    assert any("only mpi-host" in n for n in out["notes"])


@pytest.mark.requires_gpu("the backends a GPU offers")
@pytest.mark.requires_shared_gpu(2)
def test_bench_all_on_a_shared_gpu_skips_nccl_saying_why():
    proc = run_mpi(2, "allreduce", "--backend", "all", "--sizes", "1K", "--json", timeout=120, module="benchmarks")
    out = last_json(proc)
    assert proc.returncode == 0 and out["passed"], proc.stderr
    assert {r["backend"] for r in out["rows"]} <= {"mpi-host", "mpi-cuda"}        # no nccl, no raw-nccl
    assert any(n.startswith("nccl skipped: ranks 0, 1 share GPU 0") for n in out["notes"]), out["notes"]


def test_ratios_and_targets():
    from benchmarks.allreduce import ratios, targets

    rows = [{"backend": b, "size_bytes": s, "time_us": t, "busbw_GBps": bw}
            for b, s, t, bw in [("nccl", 4, 18.0, 1e-4), ("raw-nccl", 4, 15.0, 1.2e-4),
                                ("nccl", 256 << 20, 950.0, 282.0), ("raw-nccl", 256 << 20, 910.0, 296.0),
                                ("mpi-host", 256 << 20, 324000.0, 0.8)]]
    rat = ratios(rows)
    assert [r["size_bytes"] for r in rat] == [4, 256 << 20]
    assert rat[0]["time_ratio"] == pytest.approx(1.2)
    tg = targets(rat)
    assert tg["busbw_ratio_large"]["ratio"] == pytest.approx(282 / 296)
    assert tg["busbw_ratio_large"]["met"] is True and tg["latency_ratio_small"]["met"] is True
    rows[0]["time_us"] = 30.0
    assert targets(ratios(rows))["latency_ratio_small"]["met"] is False
