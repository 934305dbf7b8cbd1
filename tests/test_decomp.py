import pytest

from hpclab.decomp import block_counts, block_range, require_at_least


@pytest.mark.parametrize("n", [1, 4, 7, 10, 1001])
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_blocks_cover_range_exactly_and_evenly(n, size):
    if n < size:
        return
    spans = [block_range(n, size, r) for r in range(size)]
    assert spans[0][0] == 0 and spans[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    counts = block_counts(n, size)
    assert sum(counts) == n and max(counts) - min(counts) <= 1


def test_fewer_items_than_ranks_names_the_fix():
    with pytest.raises(ValueError, match=r"3 bins cannot be shared among 4 ranks.*mpiexec -n 3"):
        require_at_least(3, 4, "bins")


def test_rank_outside_communicator():
    with pytest.raises(ValueError, match="not in a communicator"):
        block_range(10, 2, 2)
