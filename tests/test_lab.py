"""`make lab` serves the whole workbook: its JupyterLab, asked through the server's REST API, lists exercises/."""
from __future__ import annotations

import importlib.util
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lab_command(extra: str) -> list[str]:
    """The command `make lab` runs (make -n prints it without running anything)."""
    dry = subprocess.run(["make", "-n", "-s", "lab", f"LAB_ARGS={extra}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    line = next(ln for ln in reversed(dry.stdout.splitlines()) if "jupyter lab" in ln)
    argv = shlex.split(line)
    if (ROOT / argv[0]).exists():                # .venv/bin/jupyter, relative to the repository
        argv[0] = str(ROOT / argv[0])
    else:                                        # the suite may run from another environment than .venv
        argv[:1] = [sys.executable, "-m", "jupyter"]
    return argv


def _get(url: str, token: str):
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make (to read the recipe of `make lab`)")
@pytest.mark.skipif(importlib.util.find_spec("jupyterlab") is None,
                    reason="needs JupyterLab (the lab extra; GPU nodes without network may lack it)")
def test_make_lab_serves_notebooks_exercises_and_solutions(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    argv = _lab_command(f"--no-browser --port={port} --ServerApp.port_retries=0 --IdentityProvider.token={token}")
    assert "--ServerApp.root_dir=" + str(ROOT) in argv       # rooted at the repository, no engines started
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    log = tmp_path / "lab.log"        # a file, not a pipe: a pipe nobody reads can fill and stall the server
    with open(log, "wb") as out:
        server = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=out)
    base = f"http://127.0.0.1:{port}/api/contents"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                listing = _get(f"{base}/exercises", token)
                break
            except (urllib.error.URLError, ConnectionError):
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer on port {port}: {log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.5)
        assert listing["type"] == "directory"
        names = {item["name"] for item in listing["content"]}
        assert {p.name for p in (ROOT / "exercises").glob("*.ipynb")} <= names
        top = {item["name"] for item in _get(base, token)["content"]}
        assert {"notebooks", "exercises", "solutions"} <= top
        with pytest.raises(urllib.error.HTTPError) as refused:         # the token is required
            _get(f"{base}/exercises", "wrong-token")
        assert refused.value.code in (401, 403)
    finally:
        server.terminate()                                            # by its PID; SIGTERM stops the server
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
