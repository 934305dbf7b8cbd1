"""Height-wise domain decomposition of windowed layers, with halo exchange: the same on every rank.

Every rank owns a contiguous band of OUTPUT rows of a layer (``block_range``). Output rows [o0, o1) of a
layer with kernel height R, stride s and padding p read input rows [o0*s - p, (o1 - 1)*s - p + R),
clipped to the image [0, H) (rows outside are zero padding). The input is split the same way, so the rows
a rank reads but does not own, its halo, live on other ranks and are exchanged; rows far enough from the
band's edge (the interior) need only own rows and are computed while the halo is in flight.

A method that computes output rows in tiles (Winograd: ``tile`` rows at a time) gets bands and an interior
that start and end on whole tiles of the whole image (all but the image's last), so that every tile is the
one the whole image would compute, from the same input rows: the same bits whatever the number of ranks.
A layer's input rows are owned as the layer before cut its output (``in_tile``; the first layer's input as
``block_range`` cuts it).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from hpclab.decomp import block_range
from hpclab.halo.reference import output_size


@dataclass(frozen=True)
class Transfer:
    """Input rows [start, stop) that rank ``src`` sends to rank ``dst``: one message of a halo exchange."""
    src: int
    dst: int
    start: int
    stop: int

    rows = property(lambda self: self.stop - self.start)


@dataclass(frozen=True)
class BandPlan:
    rank: int
    out_height: int
    out_rows: tuple[int, int]      # [o0, o1): output rows this rank computes
    own: tuple[int, int]           # input rows this rank owns
    need: tuple[int, int]          # input rows the band reads, before clipping to the image
    have: tuple[int, int]          # ... clipped: the rows of the working buffer
    above: tuple[Transfer, ...]    # halo rows from ranks above (lower rows)
    below: tuple[Transfer, ...]    # halo rows from ranks below (higher rows)
    interior: tuple[int, int]      # output rows computable from own rows alone

    pad_top = property(lambda self: self.have[0] - self.need[0])     # zero rows (padding) above the buffer
    halo_above = property(lambda self: sum(s.rows for s in self.above))
    halo_below = property(lambda self: sum(s.rows for s in self.below))

    @property
    def local(self) -> tuple[int, int]:
        """Own rows that the band reads (copied into the working buffer)."""
        return max(self.have[0], self.own[0]), min(self.have[1], self.own[1])

    @property
    def boundary(self) -> list[tuple[int, int]]:
        """Output rows that need halo rows: computed after the exchange."""
        (o0, o1), (j0, j1) = self.out_rows, self.interior
        return [r for r in ((o0, j0), (j1, o1)) if r[1] > r[0]]


def check_ranks(out_height: int, size: int, what: str, fix: str = "", tile: int = 1) -> None:
    """More ranks than output rows (rows of ``tile``-row tiles): an error that names the rows, ranks and fix."""
    units = -(-out_height // tile)
    if units < size:
        rows = f"{out_height} output row{'s' if out_height != 1 else ''}"
        if tile > 1:
            rows += f" in {units} row{'s' if units != 1 else ''} of Winograd tiles ({tile} rows each)"
            fix = f", or --method gemm (method='gemm'), which splits by single rows{fix}"
        raise ValueError(
            f"{what} has {rows} but {size} ranks were started: every rank needs at least one "
            f"{'row of tiles' if tile > 1 else 'output row'} of the height-wise decomposition. Run with at most "
            f"{units} rank{'s' if units != 1 else ''} (mpiexec -n {max(units, 1)}){fix}.")


def min_input_height(rows: int, kernel: int, stride: int, pad: int) -> int:
    """Smallest input height giving at least ``rows`` output rows."""
    return max(kernel - 2 * pad, (rows - 1) * stride + kernel - 2 * pad, 1)


def tile_block(rows: int, size: int, rank: int, tile: int = 1) -> tuple[int, int]:
    """Rank ``rank``'s block of ``rows`` rows cut into whole ``tile``-row tiles (the last may end inside one)."""
    u0, u1 = block_range(-(-rows // tile), size, rank)
    return u0 * tile, min(u1 * tile, rows)


def _split(start: int, stop: int, height: int, size: int, rank: int, in_tile: int) -> tuple[Transfer, ...]:
    """Rows [start, stop) that ``rank`` receives, cut where the input band owners change."""
    bands = [tile_block(height, size, r, in_tile) for r in range(size)]
    cut = [Transfer(r, rank, max(start, a), min(stop, b)) for r, (a, b) in enumerate(bands)]
    return tuple(s for s in cut if s.rows > 0)


def plan_band(height: int, kernel: int, stride: int, pad: int, size: int, rank: int, tile: int = 1,
              in_tile: int = 1) -> BandPlan:
    """Rank ``rank``'s band: output rows, own/needed input rows, halo and its owners (bands of whole tiles of
    ``tile`` rows; the input owned in tiles of ``in_tile``)."""
    ho = output_size(height, kernel, stride, pad)
    o0, o1 = tile_block(ho, size, rank, tile)
    own = tile_block(height, size, rank, in_tile)
    lo, hi = o0 * stride - pad, (o1 - 1) * stride - pad + kernel
    have = (max(lo, 0), min(hi, height))
    above = _split(have[0], min(have[1], own[0]), height, size, rank, in_tile)
    below = _split(max(have[0], own[1]), have[1], height, size, rank, in_tile)

    # Interior: output rows oh whose input rows [oh*stride - pad, oh*stride - pad + kernel),
    # clipped to the image, lie in own rows. Both bounds are monotone in oh, so the
    # interior is one range; an image edge needs no halo.
    first = o0 if own[0] == 0 else max(o0, -(-(own[0] + pad) // stride))
    last = o1 if own[1] == height else min(o1, (own[1] + pad - kernel) // stride + 1)
    if tile > 1:            # whole tiles: the first rounded up, the last down unless it ends the band
        first = o0 + -(-(first - o0) // tile) * tile
        last = last if last == o1 else o0 + (last - o0) // tile * tile
    interior = (first, last) if last > first else (o1, o1)
    return BandPlan(rank, ho, (o0, o1), own, (lo, hi), have, above, below, interior)


@lru_cache(maxsize=256)
def plan_bands(height: int, kernel: int, stride: int, pad: int, size: int, tile: int = 1,
               in_tile: int = 1) -> tuple[BandPlan, ...]:
    """Every rank's band (the same on every rank; cached: a layer asks for it on every call); an error on
    every rank where a rank would get no rows."""
    check_ranks(output_size(height, kernel, stride, pad), size, f"a layer ({kernel}x{kernel}/{stride} pad {pad}, "
                f"input height {height})", tile=tile)
    return tuple(plan_band(height, kernel, stride, pad, size, r, tile, in_tile) for r in range(size))


def transfers(plans: list[BandPlan]) -> list[Transfer]:
    """Every message of one layer's halo exchange (the same list on every rank)."""
    return [t for p in plans for t in (*p.above, *p.below)]


def schedule(moves: list[Transfer], size: int):
    """Rounds of paired exchanges that cannot deadlock: (offset, {rank: (send | None, recv | None)}). In round d
    every rank sends to rank + d and receives from rank - d, so every Sendrecv has its partner in the same
    round; offsets run +1, -1, +2, -2, ... as far as the farthest message (1 unless bands are thinner than the halo)."""
    reach = max((abs(t.dst - t.src) for t in moves), default=0)
    by_pair = {(t.src, t.dst): t for t in moves}
    for d in range(1, reach + 1):
        for offset in (d, -d):
            pairs = {r: (by_pair.get((r, r + offset)), by_pair.get((r - offset, r))) for r in range(size)}
            if any(s or v for s, v in pairs.values()):
                yield offset, pairs


def brute_force_band(height: int, kernel: int, stride: int, pad: int, size: int, rank: int, tile: int = 1,
                     in_tile: int = 1) -> dict:
    """The same facts by enumerating every (output row, kernel row) pair: a check of :func:`plan_band` (the
    interior: the rows of the tiles whose every row reads own rows only; rows owned as whole tiles listed)."""
    def whole(n, t):            # each row goes with its tile, each tile to the rank whose block_range holds it
        return [[i for i in range(n) if i // t in range(*block_range(-(-n // t), size, r))] for r in range(size)]

    ho = output_size(height, kernel, stride, pad)
    mine = whole(ho, tile)[rank]
    o0, o1 = (mine[0], mine[-1] + 1) if mine else (ho, ho)
    owned = whole(height, in_tile)
    own = set(owned[rank])
    read = {oh * stride - pad + r for oh in range(o0, o1) for r in range(kernel)}
    real = {i for i in read if 0 <= i < height}
    owners = {i: next(r for r in range(size) if i in owned[r]) for i in real - own}
    inside = lambda oh: {oh * stride - pad + r for r in range(kernel)} & set(range(height)) <= own  # noqa: E731
    tile_of = lambda oh: range(oh - (oh - o0) % tile, min(oh - (oh - o0) % tile + tile, o1))  # noqa: E731
    interior = [oh for oh in range(o0, o1) if all(inside(t) for t in tile_of(oh))]
    return {"out_rows": (o0, o1), "real": real, "pad_rows": len(read - real), "owners": owners, "interior": interior,
            "own": own}
