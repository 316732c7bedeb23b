"""The offline data sets read without importing their packages are the same data."""

from __future__ import annotations

import numpy as np

from trainer.datasets import digits_arrays


def test_digits_match_scikit_learns_loader() -> None:
    from sklearn.datasets import load_digits  # noqa: PLC0415 - scikit-learn (about 2 s) here, not in every worker's collection

    x, y = digits_arrays()
    expected_x, expected_y = load_digits(return_X_y=True)
    assert x.shape == (1797, 64) and np.array_equal(x, expected_x) and np.array_equal(y, expected_y)
