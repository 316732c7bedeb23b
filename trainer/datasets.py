"""Small data sets that ship with installed packages, so every workload runs offline."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np


def digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits (1797 images): pixel values 0..16 and labels.

    Read straight from the CSV that scikit-learn ships, without importing scikit-learn (about a
    second of every rank's start-up); ``sklearn.datasets.load_digits`` is the fallback.
    """
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            with gzip.open(path, "rt") as f:
                data = np.loadtxt(f, delimiter=",")
            return data[:, :-1], data[:, -1].astype(np.int64)
    from sklearn.datasets import load_digits  # noqa: PLC0415 - the fallback: scikit-learn costs a rank about a second

    x, y = load_digits(return_X_y=True)
    return x, y
