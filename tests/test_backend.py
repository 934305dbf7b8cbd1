import os
import subprocess
import sys
import time

import pytest

from hpclab import backend

from .helpers import ROOT, env


@pytest.mark.requires_sim("checks the simulator's selection and sizes")
def test_simulator_selected_without_gpu():
    assert backend.select() == "sim"
    assert os.environ["NUMBA_ENABLE_CUDASIM"] == "1"
    assert backend.auto_size(gpu=10**9, sim=7) == 7
    assert "simulator" in backend.describe()


@pytest.mark.requires_gpu("checks the GPU's selection and sizes")
def test_gpu_selected_with_hpclab_backend_gpu():
    assert backend.select() == "gpu" and backend.count_gpus() >= 1
    assert os.environ["NUMBA_ENABLE_CUDASIM"] == "0"
    assert backend.auto_size(gpu=10**9, sim=7) == 10**9
    assert "real GPU" in backend.describe()


@pytest.mark.requires_gpu("the streams a GPU makes")
@pytest.mark.parametrize("first", ["compute", "edge", "comm"])
def test_every_stream_is_non_blocking_whichever_is_made_first(first):
    """In a fresh process, so that the first stream made is also the first CUDA call."""
    code = (f"from hpclab import streams\nstreams.{first}_stream()\n"
            "print('|'.join(getattr(streams, f'{s}_stream')()[1] for s in ('compute', 'edge', 'comm')))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env=env(HPCLAB_BACKEND="gpu"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() and all(how.startswith("non-blocking") for how in proc.stdout.strip().split("|")), \
        proc.stdout


def test_unknown_backend_name_is_a_clear_error():
    with pytest.raises(backend.BackendError, match="use one of auto, gpu, sim"):
        backend._decide("cuda")


@pytest.mark.skipif(backend.count_gpus() > 0, reason="needs a machine without a GPU")
def test_gpu_backend_without_gpu_fails_fast_with_the_fix():
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "hpclab", "run", "collectives"], capture_output=True,
                          text=True, timeout=60, env=env(HPCLAB_BACKEND="gpu"), cwd=ROOT)
    assert proc.returncode == 2
    assert "HPCLAB_BACKEND=gpu but no CUDA GPU" in proc.stderr
    assert "HPCLAB_BACKEND=sim" in proc.stderr        # names the fix
    assert time.monotonic() - t0 < 30


def test_numba_cuda_imported_first_is_detected():
    code = ("import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '0'\n"
            "import numba.cuda\n"
            "from hpclab import backend\n"
            "try:\n    backend.select('sim')\nexcept backend.BackendError as e:\n    print('ERR', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=env(), cwd=ROOT)
    assert "ERR numba.cuda was imported before hpclab chose the backend" in proc.stdout, proc.stderr


def test_a_login_node_process_takes_the_simulator_and_refuses_gpu_work_with_the_fix():
    """HPCLAB_LOGIN_NODE=1 (a notebook's kernel on a login node, as every nbval kernel here starts): imports work,
    whatever HPCLAB_BACKEND says; a kernel launched and a problem size chosen in a cell raise, naming %%px."""
    code = ("from hpclab import backend\nprint('BACKEND', backend.select())\ncuda = backend.cuda()\n"
            "@cuda.jit\ndef one(a):\n    a[0] = 1\n"
            "import numpy as np\nfor what, call in (('launch', lambda: one[1, 1](np.zeros(1))),\n"
            "                   ('size', lambda: backend.auto_size(gpu=10, sim=2))):\n"
            "    try:\n        call()\n        print(what, 'RAN')\n"
            "    except backend.BackendError as e:\n        print(what, 'REFUSED', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env=env(HPCLAB_LOGIN_NODE="1", HPCLAB_BACKEND="gpu", CUDA_VISIBLE_DEVICES=""))
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines.get("BACKEND") == "sim", proc.stdout + proc.stderr
    assert lines["launch"].startswith("REFUSED a kernel was launched in the notebook's own process")
    assert lines["size"].startswith("REFUSED a problem size was chosen (auto_size(gpu=10, sim=2))")
    assert all("Run it in a %%px cell" in lines[k] for k in ("launch", "size")), lines


def test_switching_backend_in_a_process_is_refused():
    other = "gpu" if backend.select() == "sim" else "sim"
    with pytest.raises(backend.BackendError, match="restart"):
        backend.select(other)


def test_info_reports_everything():
    proc = subprocess.run([sys.executable, "-m", "hpclab", "info"], capture_output=True, text=True,
                          timeout=60, env=env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    for key in ("backend", "GPUs (driver)", "MPI ", "CUDA-aware MPI", "NCCL", "ipyparallel",
                "ranks per GPU", "comm backend (auto)"):
        assert key in proc.stdout
