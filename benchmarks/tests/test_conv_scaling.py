"""``python -m benchmarks conv scaling``: its input, made band by band on the device."""
import numpy as np

from hpclab.halo.bands import hash_values

from benchmarks.conv import hash_fill


def test_seeded_bands_are_the_same_on_host_and_device():
    full = hash_values((2, 3, 10, 4), seed=7)
    np.testing.assert_array_equal(hash_fill((2, 3, 4, 4), 7, row0=5, height=10).copy_to_host(), full[:, :, 5:9])
    np.testing.assert_array_equal(hash_fill((2, 3, 10, 4), 7, 0, 10).copy_to_host(), full)
