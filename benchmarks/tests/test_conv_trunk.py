"""``python -m benchmarks conv trunk``: AlexNet's trunk forward by our kernels, checked against float64 and timed
against cuDNN where PyTorch is; its figures and PyTorch's LRN arguments."""
import json

import numpy as np
import pytest

from hpclab.halo import reference as ref
from hpclab.halo.versions import max_rel_error

RNG = np.random.default_rng(0)


def _trunk_bench(capsys, *argv):
    """``python -m benchmarks conv trunk ARGV`` in this process: (exit status, its JSON line, stderr)."""
    from benchmarks import conv

    code = conv.main(["trunk", *argv])
    out, err = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    return code, json.loads(lines[0]), err


def test_trunk_bench_checks_ours_against_float64_and_gives_figures(capsys):
    """Ours matches the float64 trunk; without PyTorch (here) cuDNN's absence is said, not fatal."""
    from hpclab.results.recorded import FIELDS

    code, d, err = _trunk_bench(capsys, "--batch", "2", "--repeats", "1")
    assert code == 0 and d["passed"] is True, err
    assert d["shape"][:2] == [2, 3] and d["checked_images"] == 2 and d["topic"] == "conv"
    ours = d["ours"]
    assert ours["ok"] and 0 < ours["max_rel_error_vs_float64"] <= d["tolerance"] == 1e-4
    assert ours["seconds"] > 0 and ours["images_per_s"] == pytest.approx(2 / ours["seconds"])
    assert [row["layer"] for row in d["layers"]][:3] == ["c1", "pool1", "c2"]
    assert all(row["ours_seconds"] > 0 for row in d["layers"])
    figures = d["figures"]
    assert figures and all(list(f) == FIELDS and f["program"] == "conv-trunk" and f["size"] == 2 for f in figures)
    variants = {f["variant"] for f in figures}
    if "cudnn_error" in d:                      # no PyTorch: ours alone, no ratio, no target
        assert variants == {f"ours-{d['method']}"} and "target_met" not in d
        assert "cuDNN FP32       not run:" in err
    else:                                       # a GPU with PyTorch: cuDNN checked the same way
        assert d["cudnn_fp32"]["ok"] and d["cudnn_fp32"]["max_rel_error_vs_ours"] <= 1e-4
        assert isinstance(d["target_met"], bool) and "cudnn-fp32" in variants
    assert "ours (auto)" in err and "per layer" in err


def test_trunk_bench_fails_when_ours_differs_from_the_reference(capsys, monkeypatch):
    """The check can fail: a reference from a copy of the weights with one filter changed gives exit status 1."""
    import copy

    from benchmarks import conv_trunk as trunk_bench

    reference = trunk_bench.trunk_float64

    def corrupted(ops, x):
        ops = copy.deepcopy(ops)
        ops[0].w[0] *= 2                       # C1's first filter
        return reference(ops, x)

    monkeypatch.setattr(trunk_bench, "trunk_float64", corrupted)
    code, d, err = _trunk_bench(capsys, "--batch", "1", "--repeats", "1")
    assert code == 1 and d["passed"] is False and d["ours"]["ok"] is False
    assert d["ours"]["max_rel_error_vs_float64"] > d["tolerance"]
    assert "ABOVE 0.0001" in err


def test_torch_lrn_arguments_compute_alexnets_lrn():
    """PyTorch's local_response_norm, transcribed (the mean of the squares over ``size`` channels, zeros past
    the edges), with the mapped arguments is reference.lrn; with AlexNet's alpha as it stands it is not."""
    from hpclab.halo.layers import LRN
    from benchmarks.conv_trunk import torch_lrn_args

    def torch_lrn(x, size, alpha, beta, k):
        sq = np.pad(x.astype(np.float64) ** 2, ((0, 0), (size // 2, (size - 1) // 2), (0, 0), (0, 0)))
        mean = np.stack([sq[:, c:c + size].mean(axis=1) for c in range(x.shape[1])], axis=1)
        return x / (k + alpha * mean) ** beta

    y = RNG.uniform(-40, 40, (2, 7, 3, 4)).astype(np.float32)     # large enough for LRN to matter
    op = LRN("lrn2")
    np.testing.assert_allclose(torch_lrn(y, *torch_lrn_args(op)), ref.lrn(y), rtol=1e-5)
    assert max_rel_error(torch_lrn(y, op.size, op.alpha, op.beta, op.k), ref.lrn(y)) > 1e-2
    with pytest.raises(ValueError, match="even size"):
        torch_lrn_args(LRN("lrn", size=4))


def test_trunk_figures_ratio_is_cudnn_seconds_over_ours():
    from benchmarks.conv_trunk import trunk_figures

    run = lambda s, lat, err: {"seconds": s, "latency_seconds": lat, "images_per_s": 4 / s,  # noqa: E731
                               "latency_images_per_s": 4 / lat, "max_rel_error_vs_float64": err}
    layers = [{"layer": "c1", "ours_seconds": 1.5, "cudnn_fp32_seconds": 0.5}, {"layer": "pool1", "ours_seconds": 0.5}]
    rows = trunk_figures({"shape": [4, 3, 227, 227], "method": "gemm", "ours": run(2.0, 3.0, 1e-6),
                          "cudnn_fp32": run(1.0, 1.2, 2e-7), "layers": layers})
    ratios = {(r["variant"], r["metric"]): r["ratio"] for r in rows}
    assert ratios[("ours-gemm", "images_per_s")] == pytest.approx(1.0 / 2.0)      # the target's ratio
    assert ratios[("ours-gemm", "latency_images_per_s")] == pytest.approx(1.2 / 3.0)
    assert ratios[("ours-gemm", "seconds")] == "" and ratios[("cudnn-fp32", "images_per_s")] == ""
    per_layer = {(r["variant"], r["metric"]): r["value"] for r in rows if r["metric"].startswith(("c1", "pool1"))}
    assert per_layer == {("ours-gemm", "c1_seconds"): 1.5, ("ours-gemm", "pool1_seconds"): 0.5,
                         ("cudnn-fp32", "c1_seconds"): 0.5}       # each layer's, where it was timed
    assert len(rows) == 13
