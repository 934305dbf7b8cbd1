"""Philox4x32 in NumPy: the host twin of :mod:`hpclab.pi.mc`'s generator, its constants and its seeds, for the
kernels, the tests and the exercise checks (no Numba: the programs check their seeds before any kernel loads)."""
from __future__ import annotations

import numpy as np

SEED_LIMIT = 1 << 64         # seeds are 0 <= seed < 2^64: Philox's key is two 32-bit words
ROUNDS = 7                                            # the fewest rounds found Crush-resistant
# Philox4x32's constants (Random123, C++26 std::philox4x32). Held as 64-bit words so that
# c * M is the exact 64-bit product of a 32-bit word: its high and low halves are what
# Philox uses (and the simulator, which runs this code on NumPy scalars, never overflows).
PHILOX_M0, PHILOX_M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
PHILOX_W0, PHILOX_W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
S32 = np.uint64(32)
LOW32 = np.uint64(0xFFFFFFFF)
ZERO32 = np.uint32(0)
SHIFT = np.uint32(6)                                  # coordinates: the top 26 bits of a 32-bit word
RADIUS2 = float(1 << 52)                              # inside when x^2 + x + y^2 + y < 2^52


def check_seed(seed) -> None:
    if not isinstance(seed, (int, np.integer)) or not 0 <= int(seed) < SEED_LIMIT:
        raise ValueError(f"seed {seed!r} is out of range: use a whole number from 0 to 2^64 - 1")


def philox_reference(counter, key, rounds: int = ROUNDS) -> tuple:
    """Philox4x32-``rounds`` in NumPy: counter = 4 arrays of 32-bit words, key = 2 words."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.uint64(k) for k in key)
    for _ in range(rounds):
        p0, p1 = c0 * PHILOX_M0, c2 * PHILOX_M1             # exact: both factors < 2^32
        c0, c1, c2, c3 = (p1 >> S32) ^ c1 ^ k0, p1 & LOW32, (p0 >> S32) ^ c3 ^ k1, p0 & LOW32
        k0, k1 = (k0 + PHILOX_W0) & LOW32, (k1 + PHILOX_W1) & LOW32
    return c0, c1, c2, c3


def sample_words(start: int, count: int, seed: int, rounds: int = ROUNDS) -> tuple[np.ndarray, np.ndarray]:
    """The two 32-bit words (x, y) of samples [start, start + count), in NumPy."""
    i = np.arange(start, start + count, dtype=np.uint64)
    p = i >> np.uint64(1)
    seed = int(seed)
    x0, x1, x2, x3 = philox_reference((p & LOW32, p >> S32, 0 * p, 0 * p),
                                      (seed & 0xFFFFFFFF, seed >> 32), rounds)
    odd = (i & np.uint64(1)).astype(bool)
    return np.where(odd, x2, x0), np.where(odd, x3, x1)


def count_hits_reference(start: int, count: int, seed: int, rounds: int = ROUNDS) -> int:
    """The hit count in exact integer arithmetic: (2x+1)^2 + (2y+1)^2 < 2^54 on 26-bit x, y."""
    check_seed(seed)
    x, y = (w >> np.uint64(int(SHIFT)) for w in sample_words(start, count, seed, rounds))
    x, y = x.astype(object), y.astype(object)
    return int(np.count_nonzero((2 * x + 1) ** 2 + (2 * y + 1) ** 2 < 1 << 54))
