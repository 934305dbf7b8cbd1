"""The three routes on a real Slurm whose GRES are this machine's real GPUs (run on a GPU machine by
``benchmarks/slurm_gpu.sh``, which installs Debian's Slurm there offline; elsewhere skipped, saying why).

The local Slurm of ``tests/slurm_local.py`` with ``gpus=N``: node1 has all N GPUs, node2 (another namespace of
the same machine) has the second half of them again, so a job of two nodes of N/2 GPUs gets distinct GPUs.
Route 1: a notebook outside any job (its kernel with no GPU, as on a login node) on engines that its Slurm
profile starts as one job; route 2: a notebook inside a batch job, on engines in that job, and ``hpclab doctor
--engines`` there; route 3: the batch templates, Exercise 4 on one node and on two; and the engines job
cancelled under a running cell.
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import nbformat
import pytest

from . import slurm_local
from .helpers import ROOT
from .test_slurm import TEMPLATES, TWO_GPUS, completed, init_profile, job_env, last_json, log_of, submit
from .test_slurm_engines import assert_one_message_then_a_fresh_job, run_through_a_fault
from .test_slurm import no_job_outlives_its_test  # noqa: F401 - the same autouse fixture here

# HPCLAB_SLURM_GPU_DRYRUN=1 runs the same tests on the simulator with fake GPUs, to try them without a GPU.
DRY = os.environ.get("HPCLAB_SLURM_GPU_DRYRUN") == "1"
pytestmark = [pytest.mark.slurm] + ([] if DRY else [pytest.mark.requires_gpu("Slurm's GRES here are the machine's GPUs")])
GPU = {"HPCLAB_BACKEND": "sim" if DRY else "gpu"}
ENGINES, COMM = ("sim", "mpi-host") if DRY else ("gpu", "nccl")


@pytest.fixture(scope="module")
def slurm():
    gpus = 8 if DRY else slurm_local.real_gpus()
    reason = slurm_local.unavailable() or (None if gpus >= 2 else f"needs 2 or more GPUs (this machine has {gpus})")
    if reason:
        pytest.skip(reason)
    s = slurm_local.LocalSlurm.create(gpus=0 if DRY else gpus)
    s.start()
    print(f"{s.run(['sinfo', '-V']).stdout.strip()} with {gpus} GPUs as GRES, up in {s.root}"
          + (f"; one node only: {s.two_nodes_why}" if s.host else "; node1 and node2 in network namespaces"))
    try:
        yield s
    finally:
        s.stop()


def test_route3_every_template_runs_on_the_gpus(slurm, tmp_path):
    jobs = {name: submit(slurm, name, tmp_path, *opts, **{**env, **GPU}) for name, (opts, env, _) in TEMPLATES.items()}
    for name, job in jobs.items():
        info = slurm.wait(job, timeout=400)
        assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", f"{name}: {completed(info)}"
        record = last_json(log_of(info))
        print(name, json.dumps({k: record.get(k) for k in ("exercise", "ranks", "backend", "passed", "timings")}))
        assert record["passed"] is True and record["backend"] == ENGINES, (name, record)


@pytest.mark.parametrize("where", [("--partition=gpu", "--nodes=1", "--ntasks-per-node=4", "--gpus-per-node=4",
                                    "--cpus-per-task=1"), ("--partition=two", "--nodes=2", *TWO_GPUS)],
                         ids=["one-node", "two-nodes"])
def test_route3_exercise4_adds_its_hits_with_nccl_on_one_and_on_two_nodes(slurm, tmp_path, where):
    if not DRY and slurm.gpus < 4:
        pytest.skip(f"needs 4 GPUs (two nodes of two); this machine has {slurm.gpus}")
    if "two" in where[0] and slurm.host:
        pytest.skip(f"one node only: {slurm.two_nodes_why}")
    info = slurm.wait(submit(slurm, "ex4_pi_nccl_mpi.sbatch", tmp_path, *where, **GPU), timeout=240)
    text = log_of(info)
    assert info["JobState"] == "COMPLETED", completed(info)
    record = last_json(text)
    print(info["NodeList"], json.dumps(record["result"]), re.findall(r"^(rank \d+ on \S+.*)$", text, re.M))
    assert record["passed"] is True and record["ranks"] == 4 and record["backend"] == ENGINES, record


PROBE = ["from hpclab import backend, cluster\nsession = cluster.connect(n={n}, timeout=300)",
         "%%px\nimport os\nfrom hpclab import device\nfrom hpclab.mpi import world\nrows = device.table(world())\n"
         "job_id = os.environ.get('SLURM_JOB_ID')",
         "%%px\nfrom hpclab import comm as hcomm\nfrom hpclab.collectives.kernels import fill\n"
         "be = hcomm.get('auto', world())\ntotal = be.allreduce(fill(4, world().rank + 1.0)).copy_to_host().tolist()\n"
         "name = be.name",
         "import json, os\nprint('PROBE', json.dumps({'kernel_gpus': os.environ.get('CUDA_VISIBLE_DEVICES'), "
         "'kernel_backend': backend.name(), 'engines': session.backend, 'job': session.job, "
         "'rows': session.view.pull('rows')[0], 'comm': session.view.pull('name'), 'engine_jobs': session.view.pull('job_id'), "
         "'total': session.view.pull('total')}))\nsession.close()"]


def _probe(text: str, n: int) -> dict:
    found = json.loads(re.search(r"^PROBE (.*)$", text, re.M).group(1))
    assert found["engines"] == ENGINES and found["total"] == [[n * (n + 1) / 2] * 4] * n, found
    assert DRY or len({r["gpu_uuid"] for r in found["rows"]}) == n, found["rows"]       # one GPU per rank
    assert found["comm"] == [COMM] * n, found["comm"]
    return found


INSIDE = """#!/bin/bash
#SBATCH --ntasks={n}
#SBATCH --gpus-per-node={n}
#SBATCH --job-name=lab
cd {root}
{python} -c "$RUNNER" {nb} {out} {root}
{python} -m hpclab doctor --engines -n {n} --backend {comm}
"""


def test_route2_a_notebook_inside_an_allocation_and_the_doctor_on_its_engines(slurm, tmp_path):
    from .test_cluster import RUNNER, _text

    n = 4 if DRY else min(slurm.gpus, 4)
    nb, out = tmp_path / "probe.ipynb", tmp_path / "probe.out.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.replace("{n}", str(n))) for c in PROBE]), nb)
    script = tmp_path / "lab.sbatch"
    script.write_text(INSIDE.format(n=n, root=ROOT, python=sys.executable, nb=nb, out=out, comm="auto" if DRY else "nccl"))
    job = slurm.sbatch([f"--output={tmp_path}/lab.out", str(script)],
                       env=job_env(slurm, tmp_path, RUNNER=RUNNER, HPCLAB_BACKEND="auto"), cwd=tmp_path)
    info = slurm.wait(job, timeout=600)
    log = (tmp_path / "lab.out").read_text(errors="replace")
    assert info["JobState"] == "COMPLETED" and out.exists(), f"{completed(info)}\n{log[-3000:]}"
    found = _probe("\n".join(_text(c) for c in nbformat.read(out, as_version=4).cells), n)
    assert found["engine_jobs"] == [job] * n and found["job"] is None, found   # the engines run in this job
    print(log[-2500:])
    assert re.search(r"^PASS ", log, re.M) and (DRY or not re.search(r"^FAIL ", log, re.M)), log[-3000:]


def test_the_engines_job_cancelled_under_a_cell_on_gpus(slurm, tmp_path, monkeypatch):
    monkeypatch.setenv("HPCLAB_SLURM_BACKEND", "sim" if DRY else "auto")
    job, seconds, _, texts = run_through_a_fault(slurm, tmp_path, lambda job: slurm.run(["scancel", job]))
    assert seconds < 20, (seconds, texts[1])
    assert_one_message_then_a_fresh_job(slurm, tmp_path, job, texts, "CANCELLED")


def test_route1_a_notebook_without_a_gpu_drives_engines_in_one_job_with_a_gpu_each(slurm, tmp_path):
    from .test_cluster import RUNNER, _text

    n = 4 if DRY else min(slurm.gpus, 4)
    init_profile(slurm, tmp_path, "--gpus-per-node", str(n), "--engines", str(n))
    nb, out = tmp_path / "probe.ipynb", tmp_path / "probe.out.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c.replace("{n}", str(n))) for c in PROBE]), nb)
    kernel = job_env(slurm, tmp_path, HPCLAB_BACKEND="auto", CUDA_VISIBLE_DEVICES="", HPCLAB_LOGIN_NODE="1")
    proc = slurm.run([sys.executable, "-c", RUNNER, str(nb), str(out), str(tmp_path)], env=kernel, timeout=600, cwd=ROOT)
    text = "\n".join(_text(c) for c in nbformat.read(out, as_version=4).cells) if out.exists() else proc.stderr
    found = _probe(text, n)
    assert found["kernel_gpus"] == "" and found["kernel_backend"] == "sim", found   # the kernel as on a login node
    assert found["job"] and slurm.job(found["job"])["JobName"] == "hpclab-engines", found
    assert found["engine_jobs"] == [found["job"]] * n, found                # one job for all the engines
    # the workbook's own notebooks, the same way (nbval starts their kernels as on a login node)
    for name in ("00_setup.ipynb", "05_gpu_communication.ipynb"):
        run = slurm.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                         "--nbval-cell-timeout=300", str(ROOT / "notebooks" / name)],
                        env=job_env(slurm, tmp_path, HPCLAB_BACKEND="auto", HPCLAB_ENGINES=str(n)), timeout=600, cwd=ROOT)
        assert run.returncode == 0, run.stdout[-4000:]


def test_route3_exercise4_scales_strong_and_weak_on_one_node_and_on_two(slurm, tmp_path):
    """Exercise 4's table from slurm/scaling.sbatch: strong (4e11 samples in all) and weak (1e11 a rank) on 1, 2
    and 4 GPUs of one node, and on 2 and 4 GPUs spread over two nodes (a machine of 2 GPUs: 1 and 2 GPUs of one
    node, 2 over two nodes of one). HPCLAB_SCALING_OUT keeps the CSVs."""
    g = 4 if DRY or slurm.gpus >= 4 else 2          # GPUs of the one-node runs (two nodes take half each)
    out = Path(os.environ.get("HPCLAB_SCALING_OUT", tmp_path))
    places = [("one-node", ("--partition=gpu", "--nodes=1", f"--ntasks-per-node={g}", f"--gpus-per-node={g}"),
               ",".join(str(r) for r in (1, 2, 4) if r <= g)),
              ("two-nodes", ("--partition=two", "--nodes=2", f"--ntasks-per-node={g // 2}", f"--gpus-per-node={g // 2}",
                             "--cpus-per-task=1"), ",".join(str(r) for r in (2, 4) if r <= g))]
    for where, opts, ranks in places[:1] if slurm.host else places:
        for mode, samples in (("strong", "4096" if DRY else "4e11"), ("weak", "1024" if DRY else "1e11")):
            folder = out / f"ex4-{where}-{mode}"
            job = submit(slurm, "scaling.sbatch", tmp_path, *opts, "--cpus-per-task=1", PROGRAM="pi-nccl-mpi",
                         PROGRAM_ARGS=f"--samples {samples} --seed 7", RANKS=ranks, TRIALS="2",
                         WEAK="1" if mode == "weak" else "0", HPCLAB_OUT=str(folder), **GPU)
            info = slurm.wait(job, timeout=400)
            log = log_of(info)
            assert info["JobState"] == "COMPLETED", completed(info)
            print(f"--- Exercise 4, {mode} scaling, {where} ({info['NodeList']}):\n"
                  + "\n".join(ln for ln in log.splitlines() if re.match(r"\s*(ranks|\d+\s)|serial fraction", ln)))
            assert list(folder.glob("pi-nccl-mpi_*.csv")), log[-2000:]
