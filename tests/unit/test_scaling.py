"""scaling.max_abs: max |M| in any memory order and dtype, NaN where M holds one, without a
temporary the size of M (the checks of A, B and X in every solve); on the GPU too where CuPy is
installed with a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from hpccoll_eigensolver.linalg import scaling
from hpccoll_eigensolver.linalg._xp import gpu_available


def _modules():
    mods = [np]
    if gpu_available():
        import cupy
        mods.append(cupy)
    return mods


def _expect(M: np.ndarray) -> float:
    return float(np.abs(M.astype(np.float64)).max()) if M.size else 0.0


@pytest.mark.parametrize("xp", _modules(), ids=lambda m: m.__name__)
@pytest.mark.parametrize("order", ["F", "C"])
def test_max_abs_is_the_largest_magnitude_in_any_order_and_view(xp, order):
    rng = np.random.default_rng()
    for _ in range(20):
        m, n = rng.integers(1, 40, size=2)
        M = np.asarray(rng.standard_normal((m, n)) * 10.0 ** rng.integers(-5, 5), order=order)
        k = rng.integers(0, m * n)
        M.flat[k] = -3.0 * np.abs(M).max() if rng.integers(2) else 3.0 * np.abs(M).max()   # the extreme: either sign
        for view in (M, M[1:, :], M[:, 1:], M[::2, ::3], M.T):
            if view.size:
                got = float(scaling.max_abs(xp.asarray(view) if xp is not np else view, xp))
                assert got == _expect(view)


@pytest.mark.parametrize("xp", _modules(), ids=lambda m: m.__name__)
def test_max_abs_sees_nan_and_inf_anywhere_and_takes_integers_and_empty(xp):
    rng = np.random.default_rng()
    for bad in (np.nan, np.inf, -np.inf):
        for _ in range(5):
            M = np.asfortranarray(rng.standard_normal((rng.integers(1, 30), rng.integers(1, 30))))
            M.flat[rng.integers(0, M.size)] = bad
            got = float(scaling.max_abs(xp.asarray(M), xp))
            assert np.isnan(got) if np.isnan(bad) else got == np.inf
    for dtype in (np.int8, np.uint16, np.int64, bool):
        M = np.asarray(rng.integers(-100 if dtype is not np.uint16 else 0, 100, size=(7, 5))).astype(dtype)
        assert float(scaling.max_abs(xp.asarray(M), xp)) == _expect(M)
    assert np.iinfo(np.int8).min == -128
    assert float(scaling.max_abs(xp.asarray(np.full((3, 2), -128, dtype=np.int8)), xp)) == 128.0
    for shape in ((0, 4), (4, 0)):
        assert float(scaling.max_abs(xp.zeros(shape), xp)) == 0.0
