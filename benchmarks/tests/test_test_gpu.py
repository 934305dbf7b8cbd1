"""``benchmarks/test_gpu.sh`` (make test-gpu) in parts: every test file in exactly one part, the notebooks in
part 1, a bad part named. Run here with a stand-in nvidia-smi (one GPU) and a stand-in Python that records
the pytest runs it is asked for instead of running them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FAKE_PYTHON = """#!/bin/bash
# pytest: note what it was asked to run and answer as pytest does; '-': the summary script, run for real.
if [ "$1" = "-m" ] && [ "$2" = "pytest" ]; then
    for arg in "$@"; do case "$arg" in notebooks|tests/*.py) echo "$arg" >> "$RAN";; esac; done
    echo "1 passed in 0.01s"; exit 0
fi
[ "$1" = "-" ] && exec "$REAL_PYTHON" "$@"
exit 0     # hpclab info, exercises check
"""


def run(tmp_path, shard):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    (bin_dir / "python").write_text(FAKE_PYTHON)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    ran = tmp_path / f"ran-{shard.replace('/', '-')}.txt"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON_RUN": str(bin_dir / "python"),
           "REAL_PYTHON": sys.executable, "RAN": str(ran), "HPCLAB_GPU_SHARD": shard, "TMPDIR": str(tmp_path)}
    for name in ("CUDA_VISIBLE_DEVICES", "HPCLAB_TEST_PATHS"):   # (either would change what runs)
        env.pop(name, None)
    proc = subprocess.run(["bash", "benchmarks/test_gpu.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    return proc, (ran.read_text().split() if ran.exists() else [])


def test_the_parts_run_every_test_file_once_and_the_notebooks_in_part_one(tmp_path):
    whole, everything = run(tmp_path, "1/1")
    assert whole.returncode == 0, whole.stderr
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py"))
    assert sorted(everything) == sorted(files + ["notebooks"])
    parts = [run(tmp_path, f"{i}/3") for i in (1, 2, 3)]
    for i, (proc, ran) in enumerate(parts, 1):
        assert proc.returncode == 0, proc.stderr
        assert f"make test-gpu (part {i}/3): " in proc.stdout
        assert ("notebooks" in ran) == (i == 1)
        assert ran, f"part {i} of 3 ran nothing"
    assert sorted(sum((ran for _, ran in parts), [])) == sorted(everything)


@pytest.mark.parametrize("shard", ["0/2", "3/2", "two", "1/"])
def test_a_part_that_does_not_exist_is_named(tmp_path, shard):
    proc, ran = run(tmp_path, shard)
    assert proc.returncode == 2 and not ran
    assert f"HPCLAB_GPU_SHARD must be i/n with 1 <= i <= n (e.g. 1/2, then 2/2); got '{shard}'" in proc.stderr
