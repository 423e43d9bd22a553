"""The repeated call's fast path (hpccoll._fastpath.FastCall), without a GPU: a repeat is
recognised only for the very same live array objects with the dtype, shape and strides they had
(a CuPy array's address, size and dtype are read-only; a numpy array's dtype, shape, strides and
writeable flag can be reassigned) and the same op / root / algorithm / policy; anything else
must take the validated path."""
import gc
import warnings

import numpy as np

import hpccoll
from hpccoll._fastpath import FastCall


class _Mem:
    def __init__(self, ptr):
        self.ptr = ptr


class _Arr:
    """Stands in for a CuPy array: .data.ptr, .size, .dtype, weak-referenceable."""

    def __init__(self, ptr, size=16, dtype=np.float32):
        self.data, self.size, self.dtype = _Mem(ptr), size, np.dtype(dtype)
        self.shape, self.strides = (size,), (self.dtype.itemsize,)


def _fc(send, recv, op=hpccoll.SUM, root=None, algo="auto", det=False):
    return FastCall(object(), object(), send, recv, op, root, algo, det)


def test_same_call_matches():
    x, y = _Arr(0x1000), _Arr(0x2000)
    assert _fc(x, y).matches(x, y, hpccoll.SUM, None, "auto", False)


def test_any_argument_change_is_a_miss():
    x, y = _Arr(0x1000), _Arr(0x2000)
    f = _fc(x, y)
    assert not f.matches(y, x, hpccoll.SUM, None, "auto", False)          # swapped buffers
    assert not f.matches(x, y, hpccoll.MAX, None, "auto", False)          # op
    assert not f.matches(x, y, hpccoll.SUM, 0, "auto", False)             # root
    assert not f.matches(x, y, hpccoll.SUM, None, "oneshot_ll", False)    # algorithm
    assert not f.matches(x, y, hpccoll.SUM, None, "auto", True)           # policy
    assert not f.matches(_Arr(0x1000), y, hpccoll.SUM, None, "auto", False)  # new object, same address
    assert not f.matches(hpccoll.IN_PLACE, y, hpccoll.SUM, None, "auto", False)


def test_views_of_the_same_memory_are_misses():
    """A view, a slice or a reshape of a matched array is a new object: the full path (which
    validates its size and dtype) runs for it."""
    x, y = _Arr(0x1000), _Arr(0x2000)
    f = _fc(x, y)
    assert not f.matches(x, _Arr(0x2000, dtype=np.int32), hpccoll.SUM, None, "auto", False)  # dtype view
    assert not f.matches(x, _Arr(0x2000, size=8), hpccoll.SUM, None, "auto", False)  # slice
    assert not f.matches(_Arr(0x1000), y, hpccoll.SUM, None, "auto", False)  # reshape of the input
    assert f.matches(x, y, hpccoll.SUM, None, "auto", False)


def test_in_place_and_bcast_forms():
    y = _Arr(0x2000)
    f = _fc(hpccoll.IN_PLACE, y)
    assert f.matches(hpccoll.IN_PLACE, y, hpccoll.SUM, None, "auto", False)
    assert not f.matches(_Arr(0x2000), y, hpccoll.SUM, None, "auto", False)
    b = _fc(None, y, op=None, root=1)
    assert b.matches(None, y, None, 1, "auto", False)
    assert not b.matches(None, y, None, 0, "auto", False)


def test_freed_arrays_never_match_a_newcomer():
    x, y = _Arr(0x1000), _Arr(0x2000)
    f = _fc(x, y)
    del x
    gc.collect()
    x2 = _Arr(0x1000)  # same address handed out again
    assert not f.matches(x2, y, hpccoll.SUM, None, "auto", False)


def test_a_numpy_array_whose_dtype_or_shape_was_reassigned_misses():
    x, y = np.zeros(16, np.float32), np.zeros(16, np.float32)
    f = _fc(x, y)
    assert f.matches(x, y, hpccoll.SUM, None, "auto", False)
    y.dtype = np.int32  # the same memory, another element type: validation must see it
    assert not f.matches(x, y, hpccoll.SUM, None, "auto", False)
    y.dtype = np.float32
    assert f.matches(x, y, hpccoll.SUM, None, "auto", False)
    x.shape = (4, 4)
    assert not f.matches(x, y, hpccoll.SUM, None, "auto", False)


def test_a_numpy_array_made_read_only_or_restrided_misses():
    x, y = np.zeros(16, np.float32), np.zeros(16, np.float32)
    f = _fc(x, y)
    y.flags.writeable = False  # validation must refuse it: the fast path would write it
    assert not f.matches(x, y, hpccoll.SUM, None, "auto", False)
    y.flags.writeable = True
    assert f.matches(x, y, hpccoll.SUM, None, "auto", False)
    x.flags.writeable = False  # an input may be read-only
    assert f.matches(x, y, hpccoll.SUM, None, "auto", False)
    raw = np.zeros(32, np.float32)
    z = raw[:16]
    g = _fc(x, z)
    with warnings.catch_warnings():  # (assigning strides is deprecated in numpy)
        warnings.simplefilter("ignore", DeprecationWarning)
        z.strides = (8,)  # the same object, every other element
    assert not g.matches(x, z, hpccoll.SUM, None, "auto", False)
