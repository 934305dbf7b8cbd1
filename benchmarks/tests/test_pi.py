"""``python -m benchmarks pi``: what it times besides the library's kernels."""
from benchmarks.pi import init_seconds


def test_xoroshiro_state_set_up_is_timed():
    assert init_seconds(16) > 0
