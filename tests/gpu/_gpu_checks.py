"""Helpers shared by the GPU test files (pytest puts this folder on sys.path)."""
import numpy as np


def assert_close(got, ref, rtol, atol, err_msg=""):
    """np.testing.assert_allclose without numpy.testing (whose import failed on a GPU machine)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    ok = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise AssertionError(f"{err_msg}: {bad.size} of {ok.size} elements differ beyond rtol={rtol}, "
                             f"atol={atol}; first {bad[:5]}: got {got.ravel()[bad[:5]]}, want {ref.ravel()[bad[:5]]}")
