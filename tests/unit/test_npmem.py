"""hpccoll_eigensolver._npmem, the count of NumPy's array memory behind the eigensolver's host
memory figures: it is built (as hpccoll._hostshm, HPCCOLL_TEST_ALLOW_NO_EXTENSION=1 allows it to
be missing), it counts exactly the data bytes of arrays made while it runs (malloc, calloc,
realloc, free), not those made before, and stop() gives NumPy its previous handler back."""
from __future__ import annotations

import os

import numpy as np
import pytest

from hpccoll_eigensolver import runinfo

ALLOW_MISSING = os.environ.get("HPCCOLL_TEST_ALLOW_NO_EXTENSION", "") == "1"
npmem = runinfo._npmem
needs_ext = pytest.mark.skipif(npmem is None, reason="hpccoll_eigensolver._npmem is not built")


def _handler_name() -> str:
    try:
        from numpy._core.multiarray import get_handler_name
    except ImportError:  # NumPy 1.x
        from numpy.core.multiarray import get_handler_name
    return get_handler_name()


def test_the_extension_is_built():
    if ALLOW_MISSING and npmem is None:
        pytest.skip("allowed to be missing")
    assert npmem is not None, "hpccoll_eigensolver._npmem was not built: reinstall with a C compiler"


@needs_ext
def test_counts_exactly_the_arrays_made_while_it_runs():
    rng = np.random.default_rng()
    before = np.ones(int(rng.integers(1000, 100_000)))  # made before start: never counted
    default = _handler_name()
    npmem.start()
    try:
        assert _handler_name() == "hpccoll_eigensolver_counting"
        base = npmem.current()
        n = int(rng.integers(1, 1 << 20))
        a = np.empty(n)                                   # malloc
        assert npmem.current() - base == 8 * n
        m = int(rng.integers(1, 1 << 18))
        b = np.zeros(m, np.float32)                       # calloc
        assert npmem.current() - base == 8 * n + 4 * m
        assert npmem.peak() >= npmem.current()
        del a
        assert npmem.current() - base == 4 * m
        high = npmem.peak()
        assert high - base >= 8 * n + 4 * m
        npmem.reset_peak()
        assert npmem.peak() == npmem.current()
        k = int(rng.integers(2, 1000))
        c = np.arange(k, dtype=np.int64)
        c.resize(3 * k, refcheck=False)                   # realloc
        assert npmem.current() - base == 4 * m + 24 * k
        del before                                        # freed by NumPy's own handler: not counted
        assert npmem.current() - base == 4 * m + 24 * k
        del b, c
        assert npmem.current() == base
        with pytest.raises(RuntimeError, match="already started"):
            npmem.start()
    finally:
        npmem.stop()
    assert _handler_name() == default
    npmem.stop()  # a second stop is a no-op


@needs_ext
def test_an_array_made_while_counting_is_freed_after_stop():
    npmem.start()
    a = np.ones(1000)
    npmem.stop()
    assert _handler_name() != "hpccoll_eigensolver_counting"
    a[...] = 2.0
    assert a.sum() == 2000.0
    del a  # freed through the handler it was made with (NumPy keeps it on the array)


def test_memory_meter_reports_the_numpy_peak():
    """The solve's meter: the NumPy data peak of its stretch (the extension), else tracemalloc's."""
    meter = runinfo.MemoryMeter(np, trace=True)
    meter.start()
    a = np.ones(3 << 20)  # 24 MiB
    del a
    rec = meter.stop()
    if npmem is not None:
        assert 24 << 20 <= rec["numpy_peak_bytes"] < 26 << 20 and rec["tracemalloc_peak_bytes"] is None
    else:
        assert rec["numpy_peak_bytes"] is None and rec["tracemalloc_peak_bytes"] >= 24 << 20
    assert rec["peak_rss_bytes"] > 0
