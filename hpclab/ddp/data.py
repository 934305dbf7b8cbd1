"""The two data sets: the workshop's synthetic regression data and scikit-learn's digits."""
from __future__ import annotations

import numpy as np


def synthetic(n: int = 1024, features: int = 6, outputs: int = 2, seed: int = 0):
    """Exercise 5's data: n samples of N(0, 1) inputs, the same on every rank. The workshop's targets are
    pure noise, so its loss cannot fall; ours are a fixed random linear map of the inputs plus a little
    noise, so training visibly makes progress."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features))
    teacher = rng.standard_normal((features, outputs)) / np.sqrt(features)
    y = x @ teacher + 0.1 * rng.standard_normal((n, outputs))
    return x, y


DIGITS = 1797          # images in scikit-learn's digits


def digits(seed: int = 0, subset: int | None = None, val_fraction: float = 0.15, test_fraction: float = 0.15):
    """{part: (float32 features, (n, 1) int32 labels)} of scikit-learn's bundled 8x8 digits (no download),
    split train / validation / test with every digit in the same proportion in each (``subset``: that many
    images first, stratified too), standardised with the training part's mean and standard deviation."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    if subset is not None and subset < len(y):
        x, _, y, _ = train_test_split(x, y, train_size=subset, stratify=y, random_state=seed)
    x_rest, x_test, y_rest, y_test = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed)
    x_train, x_val, y_train, y_val = train_test_split(x_rest, y_rest, test_size=val_fraction / (1 - test_fraction),
                                                      stratify=y_rest, random_state=seed)
    mean = x_train.mean(axis=0)
    std = x_train.std(axis=0)
    std[std == 0] = 1.0  # pixels that are always blank in the training part
    parts = {"train": (x_train, y_train), "val": (x_val, y_val), "test": (x_test, y_test)}
    return {name: (((xs - mean) / std).astype(np.float32), ys.astype(np.int32).reshape(-1, 1))
            for name, (xs, ys) in parts.items()}
