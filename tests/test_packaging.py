"""pyproject.toml (pip route) and environment.yml (conda route) list the same packages."""
import re
import sys

import pytest

from .helpers import ROOT

if sys.version_info < (3, 11):
    pytest.skip("tomllib needs Python 3.11", allow_module_level=True)
import tomllib

# pip name -> conda-forge name, where they differ
CONDA_NAME = {"cupy-cuda12x": "cupy", "cupy-cuda13x": "cupy", "nvidia-nccl-cu12": "nccl",
              "nvidia-nccl-cu13": "nccl"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[;]", spec.strip(), maxsplit=1)[0].lower()


def _pip_packages() -> dict[str, str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(meta["dependencies"])
    for extra in meta["optional-dependencies"].values():
        specs += extra
    return {CONDA_NAME.get(_name(s), _name(s)): s for s in specs if _name(s) != "hpclab"}


def _conda_packages() -> dict[str, str]:
    text = (ROOT / "environment.yml").read_text()
    deps = text.split("dependencies:", 1)[1]
    found = {}
    for line in deps.splitlines():
        m = re.match(r"^  - ([A-Za-z0-9_.\-]+)(.*?)(\s+#.*)?$", line)
        if m and m.group(1) not in ("python", "pip"):
            found[m.group(1).lower()] = m.group(1) + m.group(2).strip()
    return found


def test_same_packages_in_both_routes():
    pip, conda = _pip_packages(), _conda_packages()
    assert sorted(pip) == sorted(conda)


def test_same_version_bounds_in_both_routes():
    pip, conda = _pip_packages(), _conda_packages()
    for name in pip:
        assert re.sub(r"^[^<>=!~]*", "", pip[name].replace(" ", "")) == \
            re.sub(r"^[^<>=!~]*", "", conda[name].replace(" ", "")), name


def test_numpy_kept_below_2_5():
    assert "<2.5" in _pip_packages()["numpy"] and "<2.5" in _conda_packages()["numpy"]


def test_lab_extra_lets_a_learner_check_notebooks():
    """make setup / make lab install the lab extra: JupyterLab, and pytest with nbval to check one's work."""
    lab = {_name(s) for s in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
           ["optional-dependencies"]["lab"]}
    assert {"jupyterlab", "pytest", "nbval"} <= lab
