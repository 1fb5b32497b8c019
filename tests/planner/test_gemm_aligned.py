"""cost.gemm's alignment test without np.mod: the same as ``x % 8 == 0`` on every finite float
and every integer a dimension can be."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshplan.cost.gemm import _multiple_of_8


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False), min_size=1, max_size=50))
def test_floats_match_mod(values):
    x = np.array(values, dtype=float)
    np.testing.assert_array_equal(_multiple_of_8(x), np.mod(x, 8) == 0)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=-(2**53), max_value=2**53), min_size=1, max_size=50))
def test_integers_match_mod(values):
    x = np.array(values, dtype=np.int64)
    np.testing.assert_array_equal(_multiple_of_8(x), np.mod(x, 8) == 0)
    np.testing.assert_array_equal(_multiple_of_8(x.astype(float)), np.mod(x, 8) == 0)


def test_dimensions_and_fractions():
    # a head dimension split over tp (7168 / 3) and multiples of 8 of every size
    x = np.array([0.0, -0.0, 8.0, 7168.0, 7168.0 / 3, 4.0, 12.0, 2.0**60, 2.0**60 + 2.0**8, 5e-324, -16.0, 0.5])
    np.testing.assert_array_equal(_multiple_of_8(x), np.mod(x, 8) == 0)
    assert bool(_multiple_of_8(7168.0)) and not bool(_multiple_of_8(7169))
