"""The Open OnDemand app in ood/: its ERB files rendered with Ruby's erb, as the dashboard renders them, with a
form's values (the Slurm tier runs the rendered script as a job: tests/test_slurm_engines.py)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
import yaml

from .helpers import ROOT

OOD = ROOT / "ood"
FORM = {"bc_queue": "gpu", "bc_account": "proj42", "reservation": "workshop", "qos": "", "gpus": "2",
        "bc_num_hours": "6", "workbook": "/shared/hpclab", "setup": "module load cuda/12.4"}


def ruby_erb() -> str | None:
    """Why Ruby cannot render here, or None (it installs Debian's ruby, as root with apt-get, when missing)."""
    if shutil.which("ruby"):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return "needs Ruby (Debian package ruby) to render ERB, and cannot install it here"
    proc = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "ruby"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600)
        proc = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "ruby"],
                              capture_output=True, text=True, timeout=600,
                              env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
    return None if shutil.which("ruby") else f"apt-get install ruby failed: {proc.stderr.strip()[-200:]}"


def render(name: str, values: dict) -> str:
    reason = ruby_erb()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(["ruby", str(ROOT / "tests" / "ood_render.rb"), str(OOD / name), json.dumps(values)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_the_app_is_a_basic_batch_connect_app_with_the_forms_fields():
    manifest, form = (yaml.safe_load((OOD / f).read_text()) for f in ("manifest.yml", "form.yml"))
    assert manifest["role"] == "batch_connect" and manifest["category"] == "Interactive Apps"
    assert set(form["form"]) == set(FORM) and form["attributes"]["gpus"]["widget"] == "number_field"


def test_submit_asks_slurm_for_one_node_a_task_and_a_gpu_per_engine():
    submit = yaml.safe_load(render("submit.yml.erb", FORM))
    assert submit["batch_connect"]["template"] == "basic"
    assert submit["script"]["native"] == ["--nodes=1", "--ntasks=2", "--gpus-per-node=2", "--reservation=workshop"]
    plain = yaml.safe_load(render("submit.yml.erb", {**FORM, "reservation": " ", "qos": "debug", "gpus": "4"}))
    assert plain["script"]["native"] == ["--nodes=1", "--ntasks=4", "--gpus-per-node=4", "--qos=debug"]


def test_the_script_starts_jupyterlab_on_the_workbook_behind_the_dashboards_proxy():
    script = render("template/script.sh.erb", FORM)
    assert script.splitlines()[3] == "module load cuda/12.4"                      # the setup line, first
    assert 'WORKBOOK="/shared/hpclab"' in script and "hpclab-lab" in script       # a shared install, else a checkout
    for part in ("jupyter lab --no-browser --ip=0.0.0.0 --port=\"${port}\"", '--ServerApp.base_url="/node/${host}/${port}/"',
                 '--IdentityProvider.token="${password}"'):
        assert part in script, part
    assert "module load" not in render("template/script.sh.erb", {**FORM, "setup": ""})
    before = render("template/before.sh.erb", FORM)
    assert 'port=$(find_port "${host}")' in before and 'password="$(create_passwd 16)"' in before
    view = render("view.html.erb", {"host": "node7", "port": 8123, "password": "s3cret"})
    assert 'action="/node/node7/8123/login"' in view and 'value="s3cret"' in view
