"""The host backend's shared-memory Allreduce (hpccoll/_hostshm.c) across MPI ranks (2 and 3):

- every dtype and op it runs gives ops.reduce_in_rank_order's bits of the gathered inputs, the
  same on every rank, by default and deterministic, in place or not, on the first call, the fast
  path and the prepared (C) call, for sizes from 1 to the largest that fits a slot; one element
  more takes the MPI path, with the same promises;
- prepared calls, persistent requests and one-off calls share one call counter, interleaved with
  other collectives and other communicators;
- the path is really taken (the segment's call counter moves) and HPCCOLL_HOST_SHM=0 gives the
  same bits through MPI;
- a rank that skips a call makes the others raise CollectiveTimeout naming it, never hang."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from conftest import UINT, special_values
from mpi4py import MPI

import hpccoll
from hpccoll import CollectiveTimeout
from hpccoll.backends import host
from hpccoll.ops import OPS, reduce_in_rank_order

pytestmark = pytest.mark.mpi(min_size=2)
WORLD = MPI.COMM_WORLD
SLOT = host.SHM_SLOT_BYTES
DTYPES = ("float32", "float64", "int32", "int64")


@pytest.fixture(scope="module")
def comm():
    """A host Communicator whose Allreduce takes the shared-memory path (skipped where the
    extension is allowed to be missing; tests/unit/test_hostshm.py fails where it is not)."""
    c = hpccoll.Communicator(backend="host", check=False)
    if c._host.shm is None:
        c.Free()
        if os.environ.get("HPCCOLL_TEST_ALLOW_NO_EXTENSION", "") == "1":
            pytest.skip(f"no shared-memory path: {host.hostshm_unavailable_reason()}")
        pytest.fail(f"the shared-memory path is off on a single-node host communicator: {c._host.shm_off}")
    yield c
    c.Free()


def _rng(*salt):
    return np.random.default_rng([WORLD.rank, *(zlib.crc32(str(s).encode()) for s in salt)])




def _bits(a):
    return np.ascontiguousarray(a).view(UINT[a.itemsize])


def _check(out, inputs_here, op, what):
    """out is the rank-order reduction of every rank's input, in bits, and the same on every rank."""
    every = WORLD.allgather(inputs_here)
    want = reduce_in_rank_order(OPS[op] if isinstance(op, str) else op, every)
    if not np.array_equal(_bits(out), _bits(want)):
        bad = np.flatnonzero(_bits(out) != _bits(want))
        pytest.fail(f"{what}: {bad.size} of {out.size} elements differ from the rank-order reduction on rank "
                    f"{WORLD.rank}; first at [{bad[0]}]: got {out[bad[0]]!r}, want {want[bad[0]]!r}")
    outs = WORLD.allgather(out.tobytes())
    assert len(set(outs)) == 1, f"{what}: ranks hold different bits"


def _sizes(dtype):
    fit = SLOT // np.dtype(dtype).itemsize
    return (1, 7, 1023, fit, fit + 1)


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("det", [False, True], ids=["default", "deterministic"])
@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_rank_order_bits(comm, dtype, op, det, in_place):
    """The same arrays called 4 times with fresh data: the full path, the fast path, then the
    prepared C call twice (both parities)."""
    seg = comm._host.shm
    for n in _sizes(dtype):
        x = np.empty(n, dtype)
        out = np.empty(n, dtype)
        for it in range(4):
            x[...] = special_values(_rng("bits", dtype, op, det, in_place, n, it), dtype, n)
            kept = x.copy()
            before = seg.seq
            if in_place:
                out[...] = x
                comm.Allreduce(hpccoll.IN_PLACE, out, op=OPS[op], deterministic=det)
            else:
                out.fill(7)  # stale bits the call must overwrite
                comm.Allreduce(x, out, op=OPS[op], deterministic=det)
            what = f"{dtype} {op} det={det} in_place={in_place} n={n} call {it}"
            assert seg.seq - before == (1 if n * x.itemsize <= SLOT else 0), f"{what}: wrong path"
            _check(out, kept, op, what)
            if not in_place:
                assert np.array_equal(_bits(x), _bits(kept)), f"{what}: the input was written"


def test_prepared_calls_requests_and_others_interleaved(comm):
    """Prepared repeats, a persistent request, one-off calls (new arrays every time), MPI-path
    Allreduce calls, other collectives and a second communicator, interleaved for many rounds:
    every result is the reference's, and the call counter counts exactly the shared-memory calls."""
    other = comm.Dup()
    seg, seg2 = comm._host.shm, other._host.shm
    assert seg is not seg2
    a, b = np.empty(100, np.float32), np.empty(100, np.float32)
    req = comm.Allreduce_init(a, b, op=hpccoll.SUM)
    m, mo = np.empty(33, np.float64), np.empty(33, np.float64)
    big = np.empty(SLOT // 4 + 5, np.float32)
    big_out = np.empty_like(big)
    p, q = np.empty(9, np.int64), np.empty(9, np.int64)
    bc = np.empty(17, np.float64)
    start, start2 = seg.seq, seg2.seq
    rounds = 60
    for it in range(rounds):
        rng = _rng("interleaved", it)
        a[...] = special_values(rng, "float32", a.size)
        req.Start()
        req.Wait()
        _check(b, a.copy(), "SUM", f"request, round {it}")

        m[...] = special_values(rng, "float64", m.size)
        comm.Allreduce(m, mo, op=hpccoll.MAX, deterministic=it % 2 == 0)
        _check(mo, m.copy(), "MAX", f"prepared MAX, round {it}")

        bc[...] = rng.standard_normal(bc.size) if WORLD.rank == it % WORLD.size else 0.0
        comm.Bcast(bc, root=it % WORLD.size)
        assert len(set(WORLD.allgather(bc.tobytes()))) == 1

        big[...] = special_values(rng, "float32", big.size)
        comm.Allreduce(big, big_out, op=hpccoll.MIN)  # one element past a slot: the MPI path
        _check(big_out, big.copy(), "MIN", f"MPI-path MIN, round {it}")

        p[...] = special_values(rng, "int64", p.size)
        other.Allreduce(p, q, op=hpccoll.PROD, deterministic=True)
        _check(q, p.copy(), "PROD", f"second communicator, round {it}")

        fresh = special_values(rng, "int32", 1 + it % 50)  # new arrays: the full path every time
        kept = fresh.copy()
        comm.Allreduce(hpccoll.IN_PLACE, fresh, op=hpccoll.SUM)
        _check(fresh, kept, "SUM", f"one-off in place, round {it}")

        g = np.empty(WORLD.size * 3, np.int32)
        comm.Allgather(np.full(3, WORLD.rank, np.int32), g)
        assert np.array_equal(g, np.repeat(np.arange(WORLD.size, dtype=np.int32), 3))
    assert seg.seq - start == 3 * rounds and seg2.seq - start2 == rounds
    req.Free()
    other.Free()
    assert seg2.closed and not seg.closed


@pytest.fixture(scope="module")
def mpi_comm():
    """A host Communicator with the shared-memory path switched off (HPCCOLL_HOST_SHM=0, on every rank)."""
    old = os.environ.get("HPCCOLL_HOST_SHM")
    os.environ["HPCCOLL_HOST_SHM"] = "0"
    try:
        c = hpccoll.Communicator(backend="host", check=False)
    finally:
        if old is None:
            del os.environ["HPCCOLL_HOST_SHM"]
        else:
            os.environ["HPCCOLL_HOST_SHM"] = old
    yield c
    c.Free()


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_switched_off_gives_the_same_bits_through_mpi(comm, mpi_comm, dtype, op):
    """Where both promise bits (deterministic; MAX / MIN and integers by default too; at 2 ranks,
    where one addition or product has no order, everything) the MPI path and the shared-memory path
    agree bit for bit; default float SUM / PROD of 3 ranks through MPI stay within the rounding of
    another order."""
    assert mpi_comm._host.shm is None and mpi_comm._host.shm_off == "HPCCOLL_HOST_SHM=0"
    exact_by_default = op in ("MAX", "MIN") or dtype.startswith("int") or WORLD.size == 2
    for n in (1, 7, 1023):
        for it in range(3):  # first call, fast path, prepared call
            x = special_values(_rng("off", dtype, op, n, it), dtype, n)
            mild = _rng("mild", dtype, op, n, it).uniform(0.5, 2.0, n).astype(dtype)
            for det in (True, False):
                bitwise = det or exact_by_default
                data = x if bitwise else mild
                via_shm, via_mpi = np.empty_like(data), np.empty_like(data)
                comm.Allreduce(data, via_shm, op=OPS[op], deterministic=det)
                mpi_comm.Allreduce(data, via_mpi, op=OPS[op], deterministic=det)
                what = f"{dtype} {op} det={det} n={n}"
                if bitwise:
                    assert np.array_equal(_bits(via_shm), _bits(via_mpi)), f"{what}: the paths differ in bits"
                else:  # values in [0.5, 2): any order's sum or product within a few roundings
                    np.testing.assert_allclose(via_mpi, via_shm, rtol=4 * WORLD.size * np.finfo(data.dtype).eps,
                                               err_msg=what)


def test_other_dtypes_and_large_messages_take_mpi(comm):
    seg = comm._host.shm
    before = seg.seq
    for x in (np.ones(8, np.float16), np.ones(SLOT // 8 + 1, np.float64), np.ones(SLOT // 4 + 1, np.int32)):
        out = np.empty_like(x)
        comm.Allreduce(x, out)
        assert np.all(out == WORLD.size)
    assert seg.seq == before
    x = np.ones(SLOT // 8, np.float64)
    comm.Allreduce(hpccoll.IN_PLACE, x)
    assert seg.seq == before + 1 and np.all(x == WORLD.size)


def test_one_rank_without_the_extension_turns_it_off_everywhere(monkeypatch):
    """Every rank takes the same path: where one rank cannot run the shared-memory Allreduce (here
    rank 1 pretends its extension is missing), every rank runs Allreduce through MPI, and says why."""
    if WORLD.rank == 1:
        monkeypatch.setattr(host, "_HOSTSHM_ERROR", "the extension hpccoll._hostshm is not importable (test)")
    c = hpccoll.Communicator(backend="host", check=False)
    assert c._host.shm is None
    assert c._host.shm_off == "rank 1: the extension hpccoll._hostshm is not importable (test)"
    x = special_values(_rng("no extension"), "float64", 100)
    out = np.empty_like(x)
    c.Allreduce(x, out, deterministic=True)
    _check(out, x.copy(), "SUM", "without the extension")
    c.Free()


def test_no_room_for_the_segment_means_mpi_and_no_file_left(monkeypatch, tmp_path):
    """Rank 0 cannot reserve the file's bytes (a full /dev/shm): every rank runs through MPI,
    says why, and the half-made file is gone."""
    folder = WORLD.bcast(str(tmp_path), root=0)
    monkeypatch.setattr(host, "SHM_DIR", folder)
    if WORLD.rank == 0:
        def full(fd, offset, length):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "posix_fallocate", full)
    c = hpccoll.Communicator(backend="host", check=False)
    assert c._host.shm is None and c._host.shm_off.startswith("rank 0 could not reserve"), c._host.shm_off
    WORLD.Barrier()
    assert os.listdir(folder) == []
    x = np.arange(5, dtype=np.int32)
    out = np.empty_like(x)
    c.Allreduce(x, out)
    assert np.array_equal(out, WORLD.size * x)
    c.Free()


@pytest.mark.parametrize("prepared", [False, True], ids=["first_call", "prepared_call"])
def test_a_rank_that_skips_the_call_makes_the_others_time_out(prepared):
    """The last rank skips an Allreduce; every other rank raises CollectiveTimeout naming the call
    and that rank within the timeout, and the communicator stays unusable (the prepared call and
    the full path both refuse)."""
    c = hpccoll.Communicator(backend="host", check=False, timeout=1.0)
    assert c._host.shm is not None
    x, out = np.ones(16, np.float32), np.empty(16, np.float32)
    if prepared:
        for _ in range(3):  # the full path, the fast path, then the C plan is in place
            c.Allreduce(x, out)
            assert np.all(out == WORLD.size)
    skipper = WORLD.size - 1
    if WORLD.rank != skipper:
        with pytest.raises(CollectiveTimeout, match=f"Allreduce: rank {WORLD.rank} waited 1 s .*\\(rank {skipper} "
                                                    "never posted its input\\)") as info:
            c.Allreduce(x, out)
        assert info.value.collective == "Allreduce" and info.value.peer == skipper
        with pytest.raises(CollectiveTimeout, match="timed out earlier and is unusable"):
            c.Allreduce(x, out)  # the same arrays: the prepared call
        with pytest.raises(CollectiveTimeout, match="timed out earlier and is unusable"):
            c.Allreduce(np.ones(3), np.empty(3))  # the full path
    WORLD.Barrier()
    # Not freed: the ranks disagree about the calls made on it (the job's end frees the MPI side).


def test_back_to_back_calls_reuse_slots_and_flags_safely():
    """Thousands of prepared calls of a full slot with nothing between them but a fill: a slot or
    a flag reused before every peer is done with it shows as a wrong value or a timeout."""
    c = hpccoll.Communicator(backend="host", check=False, timeout=10.0)
    n = SLOT // 8
    x, out = np.empty(n), np.empty(n)
    wrong = []
    for it in range(3000):
        x.fill(it * WORLD.size + WORLD.rank)
        c.Allreduce(x, out)
        want = it * WORLD.size ** 2 + WORLD.size * (WORLD.size - 1) // 2
        if out[0] != want or out[n // 2] != want or out[-1] != want:
            wrong.append(it)
    assert not wrong, f"calls {wrong[:10]} returned another call's data"
    c.Free()
