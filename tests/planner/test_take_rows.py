"""cell_survivors.take_rows and _any_column: the same values as numpy's two-index fancy indexing
and ``any(axis=1)`` (C-contiguous or not, with or without trailing axes)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.search.cell_survivors import _any_column, take_rows


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 6), st.integers(1, 6), st.integers(0, 4), st.integers(0, 30), st.booleans(),
       st.integers(0, 2**31 - 1))
def test_take_rows_is_fancy_indexing(n, m, c, rows, transposed, seed):
    rng = np.random.default_rng(seed)
    shape = (n, m) if c == 0 else (n, m, c)
    values = rng.normal(size=shape)
    if transposed:  # a non-contiguous array of the same shape
        values = np.asfortranarray(values)
    i, j = rng.integers(0, n, rows), rng.integers(0, m, rows)
    out = take_rows(values, i, j)
    assert out.shape == values[i, j].shape
    np.testing.assert_array_equal(out, values[i, j])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 40), st.integers(0, 12), st.integers(0, 2**31 - 1))
def test_any_column_is_any(rows, cols, seed):
    values = np.random.default_rng(seed).random((rows, cols)) < 0.2
    np.testing.assert_array_equal(_any_column(values), values.any(axis=1))
