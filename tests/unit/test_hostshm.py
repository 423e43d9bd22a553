"""hpccoll._hostshm, the host backend's shared-memory Allreduce, in one process: the extension is
built (CI must prove it builds), and segments of 2 and 3 "ranks" mapping one file, driven by one
thread each, return ops.reduce_in_rank_order's bits for every dtype and op it runs, NaN payloads,
signed zeros, infinities and wrapping integers included; a missing rank is a timeout, not a hang;
bad arguments are refused.  (tests/mpi/test_host_shm.py runs it across MPI ranks.)"""
from __future__ import annotations

import math
import os
import signal
import tempfile
import threading
import time

import numpy as np
import pytest
from conftest import UINT, special_values

from hpccoll._abi import DTYPE_CODES, OP_CODES
from hpccoll.backends import host
from hpccoll.ops import OPS, reduce_in_rank_order

ALLOW_MISSING = os.environ.get("HPCCOLL_TEST_ALLOW_NO_EXTENSION", "") == "1"
SLOT = host.SHM_SLOT_BYTES
DTYPES = ("float32", "float64", "int32", "int64")


def test_the_extension_is_built():
    """Fails where hpccoll was installed without its extension (set HPCCOLL_TEST_ALLOW_NO_EXTENSION=1
    where that is meant: the host backend then runs every Allreduce through MPI)."""
    if ALLOW_MISSING and host._hostshm is None:
        pytest.skip(f"allowed to be missing: {host.hostshm_unavailable_reason()}")
    assert host._hostshm is not None, host.hostshm_unavailable_reason()
    assert host.hostshm_unavailable_reason() is None


needs_ext = pytest.mark.skipif(host._hostshm is None, reason="hpccoll._hostshm is not built")


def _segments(n: int, timeout: float = 10.0):
    """n Segments (ranks 0..n-1) over one fresh shared file, unlinked at once."""
    ext = host._hostshm
    fd, path = tempfile.mkstemp(dir=host.SHM_DIR if os.path.isdir(host.SHM_DIR) else None)
    try:
        os.ftruncate(fd, ext.segment_bytes(n, SLOT))
        return [ext.Segment(fd, r, n, SLOT, timeout) for r in range(n)]
    finally:
        os.close(fd)
        os.unlink(path)


def _allreduce_threads(segs, inputs, outputs, dtype, op):
    """Every segment's call in its own thread (the waits release the GIL); every call's result."""
    late = [None] * len(segs)

    def run(r):
        late[r] = segs[r].allreduce(inputs[r], outputs[r], DTYPE_CODES[dtype], OP_CODES[op])

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(segs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return late




def _bits(a):
    return a.view(UINT[a.itemsize])


@needs_ext
@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_order_bits(ranks, dtype, op):
    segs = _segments(ranks)
    itemsize = np.dtype(dtype).itemsize
    for it, n in enumerate((1, 2, 7, 33, 1000, SLOT // itemsize, SLOT // itemsize - 3)):
        rng = np.random.default_rng([ranks, it, DTYPE_CODES[dtype], OP_CODES[op]])
        inputs = [special_values(rng, dtype, n) for _ in range(ranks)]
        kept = [x.copy() for x in inputs]
        outputs = [np.full(n, 7, dtype) for _ in range(ranks)]
        assert _allreduce_threads(segs, inputs, outputs, dtype, op) == [-1] * ranks
        want = reduce_in_rank_order(OPS[op], kept)
        for r in range(ranks):
            assert np.array_equal(_bits(outputs[r]), _bits(want)), f"{dtype} {op} n={n}: rank {r} differs"
            assert np.array_equal(_bits(inputs[r]), _bits(kept[r])), "the input was written"
    assert [s.seq for s in segs] == [7] * ranks


@needs_ext
def test_in_place():
    segs = _segments(2)
    rng = np.random.default_rng(5)
    for _ in range(3):  # both parities and back
        bufs = [special_values(rng, "float64", 100) for _ in range(2)]
        want = reduce_in_rank_order(OPS["SUM"], [b.copy() for b in bufs])
        assert _allreduce_threads(segs, bufs, bufs, "float64", "SUM") == [-1, -1]
        assert all(np.array_equal(_bits(b), _bits(want)) for b in bufs)


@needs_ext
def test_a_missing_rank_is_a_timeout_not_a_hang():
    seg0, seg1 = _segments(2, timeout=0.3)
    x, y = np.ones(4, np.float32), np.empty(4, np.float32)
    assert seg0.allreduce(x, y, DTYPE_CODES["float32"], OP_CODES["SUM"]) == 1  # rank 1 never came
    assert seg0.broken and seg0.seq == 1 and not seg1.broken


@needs_ext
@pytest.mark.parametrize("timeout", [1e10, 1e300, math.inf])
def test_a_timeout_beyond_the_clocks_range_waits_for_a_late_rank(timeout):
    """A deadline of more than 2^63 - 1 ns from now saturates (it must not wrap into the past and
    time out at once): rank 1 posting 0.5 s late is waited for."""
    seg0, seg1 = _segments(2, timeout=timeout)
    xs = [np.full(4, r + 1, np.float64) for r in range(2)]
    outs = [np.empty(4) for _ in range(2)]
    late = [None, None]

    def rank1():
        time.sleep(0.5)
        late[1] = seg1.allreduce(xs[1], outs[1], DTYPE_CODES["float64"], OP_CODES["SUM"])

    t = threading.Thread(target=rank1)
    t.start()
    late[0] = seg0.allreduce(xs[0], outs[0], DTYPE_CODES["float64"], OP_CODES["SUM"])
    t.join(30)
    assert late == [-1, -1] and all(np.all(o == 3.0) for o in outs)


@needs_ext
def test_a_signal_interrupts_a_wait():
    """A signal handler that raises (Ctrl-C's KeyboardInterrupt, here a RuntimeError) ends a wait
    long before the timeout, and leaves the segment broken."""
    seg0, _seg1 = _segments(2, timeout=30.0)
    x, y = np.ones(4, np.float32), np.empty(4, np.float32)

    def handler(signum, frame):
        raise RuntimeError("interrupted")

    old = signal.signal(signal.SIGUSR1, handler)
    timer = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        timer.start()
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="interrupted"):
            seg0.allreduce(x, y, DTYPE_CODES["float32"], OP_CODES["SUM"])
        assert time.monotonic() - t0 < 5
    finally:
        timer.cancel()
        signal.signal(signal.SIGUSR1, old)
    assert seg0.broken


@needs_ext
def test_plan_launch_and_its_failures():
    seg0, seg1 = _segments(2, timeout=0.3)
    x, y = np.ones(4, np.int64), np.empty(4, np.int64)
    failures = []

    def on_fail(code):
        failures.append(code)
        raise RuntimeError(f"failed {code}")

    plan = host._hostshm.Plan(seg0, x, y, DTYPE_CODES["int64"], OP_CODES["SUM"], on_fail)
    with pytest.raises(RuntimeError, match="failed 1"):
        plan.launch(None)  # rank 1 never came
    with pytest.raises(RuntimeError, match="failed -1"):
        plan.launch()  # broken: refused before it posts anything
    assert failures == [1, -1] and seg0.seq == 1
    seg1.close()
    plan1 = host._hostshm.Plan(seg1, x, y, DTYPE_CODES["int64"], OP_CODES["SUM"], on_fail)
    with pytest.raises(RuntimeError, match="failed -1"):
        plan1.launch()  # closed


@needs_ext
def test_bad_arguments_are_refused():
    seg, _peer = _segments(2)
    f32, code = np.ones(4, np.float32), DTYPE_CODES["float32"]
    with pytest.raises(ValueError, match="differ in size"):
        seg.allreduce(f32, np.empty(5, np.float32), code, OP_CODES["SUM"])
    big = np.ones(SLOT // 4 + 1, np.float32)
    with pytest.raises(ValueError, match="larger than a slot"):
        seg.allreduce(big, np.empty_like(big), code, OP_CODES["SUM"])
    with pytest.raises(ValueError, match="dtype code"):
        seg.allreduce(f32, np.empty_like(f32), DTYPE_CODES["float16"], OP_CODES["SUM"])
    with pytest.raises((BufferError, ValueError), match="contiguous"):
        seg.allreduce(f32, np.empty(8, np.float32)[::2], code, OP_CODES["SUM"])
    ro = np.empty(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises((BufferError, ValueError), match="read-only|writ"):
        seg.allreduce(f32, ro, code, OP_CODES["SUM"])
    assert seg.seq == 0, "a refused call must not count"
    seg.close()
    with pytest.raises(ValueError, match="closed"):
        seg.allreduce(f32, np.empty_like(f32), code, OP_CODES["SUM"])
