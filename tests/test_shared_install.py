"""One hpclab for a room (``make install-shared PREFIX=DIR``, tools/install_shared.sh): two learners each get their
own exercises and templates, the shared tree stays as it was, JupyterLab serves a learner's work folder, and the
module file and the learner's commands (hpclab-lab, hpclab doctor, hpclab cluster init) work from the shared environment."""
from __future__ import annotations

import hashlib
import os
import secrets
import stat
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

import pytest

from .helpers import ROOT
from .test_lab import _free_port, _get


def _tree(path: Path) -> str:
    digest = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        digest.update(str(p.relative_to(path)).encode())
        if p.is_file():
            digest.update(p.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Path:
    """A shared install on this test environment (--venv: nothing downloaded)."""
    if not (Path(sys.prefix) / "bin" / "hpclab").exists():
        pytest.skip(f"hpclab is not installed in {sys.prefix} (no bin/hpclab: run from a checkout by PYTHONPATH, "
                    "as on a GPU node without network), so it cannot stand for a shared install's environment")
    prefix = tmp_path_factory.mktemp("shared") / "hpclab"
    proc = subprocess.run(["bash", str(ROOT / "tools" / "install_shared.sh"), str(prefix), "--venv", sys.prefix],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return prefix


def _learner(home: Path, *args: str) -> subprocess.CompletedProcess:
    """A command as a learner whose home is ``home`` runs it."""
    env = {k: v for k, v in os.environ.items() if k not in ("HPCLAB_WORK", "HPCLAB_FIGURES", "IPYTHONDIR")}
    return subprocess.run(list(args), capture_output=True, text=True, timeout=120, env={**env, "HOME": str(home)})


def test_each_learner_gets_their_own_work_and_the_shared_tree_is_left_alone(shared, tmp_path):
    lab = str(shared / "bin" / "hpclab-lab")
    before = _tree(shared / "workbook")
    assert not os.stat(shared / "workbook" / "notebooks").st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    homes = [tmp_path / "ada", tmp_path / "ben"]
    for home in homes:
        proc = _learner(home, lab, "--setup-only")
        assert proc.returncode == 0 and f"your work folder is {home}/hpclab-work" in proc.stdout, proc.stderr
        work = home / "hpclab-work"
        assert sorted(p.name for p in (work / "my-work").glob("*.ipynb")) == \
            sorted(p.name for p in (ROOT / "exercises").glob("*.ipynb"))
        assert (work / "notebooks").resolve() == (shared / "workbook" / "notebooks").resolve()
        assert (work / "slurm" / "common.sh").is_file() and os.access(work / "slurm" / "logs", os.W_OK)
    mine = homes[0] / "hpclab-work" / "my-work" / "01_collectives.ipynb"
    mine.write_text("ada's answer")
    assert _learner(homes[0], lab, "--setup-only").returncode == 0
    assert mine.read_text() == "ada's answer"                                      # never overwritten
    assert (homes[1] / "hpclab-work" / "my-work" / "01_collectives.ipynb").read_text() != "ada's answer"
    assert _tree(shared / "workbook") == before


def test_the_learners_commands_run_from_the_shared_environment(shared, tmp_path):
    module = next((shared / "modulefiles" / "hpclab").glob("*.lua")).read_text()
    assert f'prepend_path("PATH", "{shared}/bin")' in module and f'setenv("HPCLAB_ENV", "{shared}/venv")' in module
    home = tmp_path / "cleo"
    home.mkdir()
    doctor = _learner(home, str(shared / "venv" / "bin" / "python"), "-m", "hpclab", "doctor")
    assert "PASS  MPI" in doctor.stdout and "Traceback" not in doctor.stdout + doctor.stderr, doctor.stdout
    init = _learner(home, str(shared / "venv" / "bin" / "hpclab"), "cluster", "init", "--slurm", "--partition", "gpu",
                    "--gpus-per-node", "4")                  # the README's route 1, from the module's PATH
    config = home / ".ipython" / "profile_default" / "ipcluster_config.py"
    assert init.returncode == 0 and config.is_file(), init.stdout + init.stderr
    venv = next(ln.split()[1] for ln in config.read_text().splitlines() if ln.startswith("source "))
    assert Path(venv).resolve() == (shared / "venv" / "bin" / "activate").resolve(), venv   # the job uses it too
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "HOME": str(home), "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
           "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        server = subprocess.Popen([str(shared / "bin" / "hpclab-lab"), "--no-browser", f"--port={port}",
                                   "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
                                   *(["--allow-root"] if os.geteuid() == 0 else [])],
                                  env=env, stdout=subprocess.DEVNULL, stderr=out)
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                top = {item["name"] for item in _get(f"http://127.0.0.1:{port}/api/contents", token)["content"]}
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"hpclab-lab did not serve: {log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.5)
        assert {"my-work", "notebooks", "solutions", "slurm"} <= top, top
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
