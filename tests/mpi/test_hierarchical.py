"""Hierarchical (multi-node) collectives on simulated nodes: HPCCOLL_NODE_SIZE=k makes
consecutive groups of k ranks separate nodes.  Runs at every rank count tests/run uses
(2, 3, 4, 6): every node size d < size that divides it, d = 1 included.

Deterministic results must equal, bit for bit, the documented hierarchical order (per node in
local-rank order, then over nodes in node order) on every rank and in every run.  Allreduce runs
that order in two variants, "ar" (node Allreduce, inter-node Allreduce) and "rsag" (node
Reduce_scatter, inter-node Allreduce of a shard, node Allgather), picked by size against
HPCCOLL_HIER_RSAG_BYTES; the rsag tests set it low and check which variant ran."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import HpccollError
from hpccoll.config import Config
from hpccoll.ops import BFLOAT16, OPS, reduce_in_rank_order

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
NODE_SIZES = [d for d in range(1, WORLD.Get_size()) if WORLD.Get_size() % d == 0]
#: layouts where "rsag" can run (more than one rank per node); none at 2 or 3 ranks
RSAG_NODE_SIZES = [d for d in NODE_SIZES if d > 1]
#: every dtype the host backend reduces
ALL_DTYPES = ["float64", "float32", "float16", "int32", "int64"] + (["bfloat16"] if BFLOAT16 is not None else [])


@pytest.fixture(params=NODE_SIZES, ids=lambda d: f"node_size{d}")
def hc(request, monkeypatch):
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", str(request.param))
    c = hpccoll.Communicator(backend="host")
    yield c
    c.Free()


def _hier_ref(op, xs, layout):
    return reduce_in_rank_order(op, [reduce_in_rank_order(op, [xs[r] for r in row]) for row in layout.rank_of])


def _data(rng, dtype, n):
    if np.dtype(dtype).kind == "i":
        return rng.integers(-1000, 1000, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def test_layout(hc):
    L = hc._backend.layout
    k = int(__import__("os").environ["HPCCOLL_NODE_SIZE"])
    assert (L.nodes, L.per_node) == (WORLD.Get_size() // k, k)
    assert hc.backend.startswith(f"hier({L.nodes}x{k}")
    assert L.rank_of[L.node][L.local] == WORLD.Get_rank()


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32"])
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN"])
def test_allreduce_deterministic_bits(hc, dtype, op):
    for it, n in enumerate((1, 7, 1023, 4097)):
        rng = np.random.default_rng([WORLD.Get_rank(), it, len(dtype), len(op)])
        x = _data(rng, dtype, n)
        if op == "PROD" and x.dtype.kind == "f":
            x = (1 + 0.01 * x).astype(dtype)
        xs = WORLD.allgather(x)
        ref = _hier_ref(OPS[op], xs, hc._backend.layout)
        y = np.empty_like(x)
        hc.Allreduce(x, y, op=OPS[op], deterministic=True)
        assert np.array_equal(y.view(np.uint8), ref.view(np.uint8)), f"{dtype} {op} n={n}"
        y2 = x.copy()
        hc.Allreduce(hpccoll.IN_PLACE, y2, op=OPS[op], deterministic=True)
        assert np.array_equal(y2.view(np.uint8), y.view(np.uint8)), "second run / in place differs"
        assert len(set(WORLD.allgather(y.tobytes()))) == 1, "ranks differ"


def test_allreduce_nondeterministic_close(hc):
    x = np.random.default_rng([WORLD.Get_rank(), 5]).standard_normal(999)
    y = np.empty_like(x)
    hc.Allreduce(x, y)
    np.testing.assert_allclose(y, np.sum(WORLD.allgather(x), axis=0), rtol=1e-12, atol=1e-12)


def test_bcast_every_root(hc):
    for root in range(WORLD.Get_size()):
        x = np.random.default_rng([WORLD.Get_rank(), root]).standard_normal(513)
        want = WORLD.bcast(x, root=root)
        hc.Bcast(x, root=root)
        assert np.array_equal(x, want)


def test_allgather_rank_order(hc):
    for n in (1, 6, 1001):
        x = np.random.default_rng([WORLD.Get_rank(), n]).integers(0, 1 << 30, n).astype(np.int64)
        want = np.concatenate(WORLD.allgather(x))
        out = np.empty(n * WORLD.Get_size(), dtype=np.int64)
        hc.Allgather(x, out)
        assert np.array_equal(out, want)
        inplace = np.zeros_like(out)
        inplace[WORLD.Get_rank() * n:(WORLD.Get_rank() + 1) * n] = x
        hc.Allgather(hpccoll.IN_PLACE, inplace)
        assert np.array_equal(inplace, want)


@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_reduce_scatter_matches_allreduce_slice(hc, op):
    size, rank = WORLD.Get_size(), WORLD.Get_rank()
    for n in (1, 5, 300):
        x = np.random.default_rng([rank, n, len(op)]).standard_normal(n * size)
        ref = _hier_ref(OPS[op], WORLD.allgather(x), hc._backend.layout)[rank * n:(rank + 1) * n]
        out = np.empty(n)
        hc.Reduce_scatter_block(x, out, op=OPS[op], deterministic=True)
        assert np.array_equal(out.view(np.uint64), ref.view(np.uint64))
        buf = x.copy()
        hc.Reduce_scatter_block(hpccoll.IN_PLACE, buf, op=OPS[op], deterministic=True)
        assert np.array_equal(buf[:n].view(np.uint64), ref.view(np.uint64))


def test_barrier_dup_split(hc):
    hc.Barrier()
    d = hc.Dup()
    assert d.backend == hc.backend
    x = np.full(3, float(WORLD.Get_rank()))
    y = np.empty_like(x)
    d.Allreduce(x, y)
    assert np.all(y == sum(range(WORLD.Get_size())))
    d.Free()


def test_prepare_reaches_the_node_communicator(hc, monkeypatch):
    """prepare() on a hierarchical communicator prepares its node backend (a no-op on the
    host backend, still checked) and leaves the collectives working."""
    seen = []
    real = hc._backend.node.main.prepare
    monkeypatch.setattr(hc._backend.node.main, "prepare", lambda dtypes: (seen.append(list(dtypes)), real(dtypes)))
    hc.prepare(("float64", np.int32))
    assert seen == [["float64", "int32"]]
    x = np.full(5, float(WORLD.Get_rank() + 1))
    out = np.empty_like(x)
    hc.Allreduce(x, out)
    assert np.array_equal(out, np.full(5, WORLD.Get_size() * (WORLD.Get_size() + 1) / 2))


def test_bad_node_size(monkeypatch):
    if WORLD.Get_size() < 2:
        pytest.skip("needs 2 ranks")
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", str(WORLD.Get_size() + 1))
    with pytest.raises(ValueError, match="HPCCOLL_NODE_SIZE"):
        hpccoll.Communicator(backend="host")


def _spy_routes_and_communicators(monkeypatch):
    """(Communicator entries as (communicator, method), the `main` backend of every route made)."""
    from hpccoll import _routes
    from hpccoll.comm import Communicator

    entered, routed = [], []
    for name in ("Allreduce", "Reduce_scatter_block", "Allgather", "Bcast", "_run"):
        real = getattr(Communicator, name)

        def spy(self, *a, _name=name, _real=real, **kw):
            entered.append((self, _name))
            return _real(self, *a, **kw)

        monkeypatch.setattr(Communicator, name, spy)
    real_route = _routes.route

    def route(host, main, *a, **kw):
        routed.append(main)
        return real_route(host, main, *a, **kw)

    monkeypatch.setattr(_routes, "route", route)
    return entered, routed


def test_a_hierarchical_call_routes_each_phase_once_without_a_communicator(hc, monkeypatch):
    """The hierarchical backend composes backends: a call enters the Communicator once (the
    user's call), is routed once, and each phase ("ar": node Allreduce, stripe Allreduce) is
    routed once on its own backends; repeats keep every route (no routing at all)."""
    entered, routed = _spy_routes_and_communicators(monkeypatch)
    hier = hc._backend
    x, y = np.arange(5.0), np.empty(5)
    hc.Allreduce(x, y)
    assert routed == [hier, hier.node.main, hier.stripe.main]
    assert entered == [(hc, "Allreduce"), (hc, "_run")]
    for _ in range(3):
        hc.Allreduce(x, y)
        assert np.array_equal(y, x * WORLD.Get_size())
    assert len(routed) == 3 and {c for c, _ in entered} == {hc}
    b = np.arange(4.0) if WORLD.Get_rank() == 0 else np.zeros(4)
    hc.Bcast(b, root=0)  # the stripe phase on the node's local rank of the root only
    assert np.array_equal(b, np.arange(4.0))
    assert routed[3] is hier and hier.node.main in routed[4:] and len(routed) <= 6
    assert {c for c, _ in entered} == {hc}


# -- Allreduce, "rsag" variant (node Reduce_scatter / inter-node Allreduce / node Allgather) --------

def _communicator(monkeypatch, node_size: int, rsag_bytes: int | None):
    """A host communicator on nodes of `node_size`; rsag_bytes None = the module default."""
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", str(node_size))
    if rsag_bytes is None:
        monkeypatch.delenv("HPCCOLL_HIER_RSAG_BYTES", raising=False)
    else:
        monkeypatch.setenv("HPCCOLL_HIER_RSAG_BYTES", str(rsag_bytes))
    return hpccoll.Communicator(backend="host")


def _record_variants(monkeypatch, comm) -> list[str]:
    """The Allreduce variants `comm` runs from now on, in call order."""
    ran = []
    hier = comm._backend
    for name in ("ar", "rsag"):
        real = getattr(hier, "_allreduce_" + name)

        def spy(*args, _real=real, _name=name):
            ran.append(_name)
            return _real(*args)

        monkeypatch.setattr(hier, "_allreduce_" + name, spy)
    return ran


def _seed(*parts) -> list[int]:
    """Per-rank, per-case seed (stable across processes, unlike hash())."""
    return [WORLD.Get_rank()] + [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


@pytest.fixture(params=RSAG_NODE_SIZES or [pytest.param(None, marks=pytest.mark.skip(
    reason="rsag needs more than one rank per node: 4 or 6 ranks"))], ids=lambda d: f"node_size{d}")
def hc_rsag(request, monkeypatch):
    """Threshold 0: every Allreduce runs the rsag variant."""
    c = _communicator(monkeypatch, request.param, 0)
    yield c
    c.Free()


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("op", ["SUM", "PROD", "MAX", "MIN"])
def test_allreduce_rsag_deterministic_bits(hc_rsag, monkeypatch, dtype, op):
    """Each element goes through the node Reduce_scatter (local-rank order) and the stripe
    Allreduce (node order): the documented hierarchical order, so _hier_ref is this variant's
    reference too.  Counts below the node size, not divisible by it (padded shards), and large."""
    ran = _record_variants(monkeypatch, hc_rsag)
    again = hc_rsag.Dup()  # a second communicator: "every run" is not one communicator's cache
    counts = (1, 2, 3, 7, 1023, 65537)
    for it, n in enumerate(counts):
        x = _data(np.random.default_rng(_seed(it, dtype, op)), dtype, n)
        if op == "PROD" and x.dtype.kind != "i":
            x = (1 + 0.01 * x.astype(np.float32)).astype(x.dtype)
        ref = _hier_ref(OPS[op], WORLD.allgather(x), hc_rsag._backend.layout)
        y = np.empty_like(x)
        hc_rsag.Allreduce(x, y, op=OPS[op], deterministic=True)
        assert _bits(y) == _bits(ref), f"{dtype} {op} n={n}: differs from the hierarchical order"
        inplace = x.copy()
        hc_rsag.Allreduce(hpccoll.IN_PLACE, inplace, op=OPS[op], deterministic=True)
        assert _bits(inplace) == _bits(y), f"{dtype} {op} n={n}: IN_PLACE differs"
        rerun = np.empty_like(x)
        again.Allreduce(x, rerun, op=OPS[op], deterministic=True)
        assert _bits(rerun) == _bits(y), f"{dtype} {op} n={n}: second run differs"
        assert len(set(WORLD.allgather(_bits(y)))) == 1, f"{dtype} {op} n={n}: ranks differ"
    again.Free()
    assert ran == ["rsag"] * 2 * len(counts)  # `again` is a Dup: its calls are not recorded


def test_an_rsag_call_routes_each_of_its_three_phases_once(hc_rsag, monkeypatch):
    entered, routed = _spy_routes_and_communicators(monkeypatch)
    hier = hc_rsag._backend
    x, y = np.arange(7.0), np.empty(7)
    hc_rsag.Allreduce(x, y, deterministic=True)
    assert _bits(y) == _bits(_hier_ref(OPS["SUM"], WORLD.allgather(x), hier.layout))
    assert routed == [hier, hier.node.main, hier.stripe.main, hier.node.main]
    assert entered == [(hc_rsag, "Allreduce"), (hc_rsag, "_run")]


@pytest.mark.parametrize("node_size", NODE_SIZES, ids=lambda d: f"node_size{d}")
def test_allreduce_variant_by_size(monkeypatch, node_size):
    """Threshold 4 KiB: below it "ar", from it on "rsag" (more than one rank per node only), and
    deterministic bits are the hierarchical order either way: the variants agree bit for bit."""
    c = _communicator(monkeypatch, node_size, 4096)
    ran = _record_variants(monkeypatch, c)
    cases = [("float32", 1023, "ar"), ("float32", 1024, "rsag"), ("float32", 1025, "rsag"),
             ("float64", 511, "ar"), ("float64", 513, "rsag"), ("float16", 2047, "ar"), ("float16", 4099, "rsag")]
    for it, (dtype, n, _) in enumerate(cases):
        x = _data(np.random.default_rng(_seed(it, "by_size")), dtype, n)
        ref = _hier_ref(OPS["SUM"], WORLD.allgather(x), c._backend.layout)
        y = np.empty_like(x)
        c.Allreduce(x, y, deterministic=True)
        assert _bits(y) == _bits(ref), f"{dtype} n={n}"
        assert len(set(WORLD.allgather(_bits(y)))) == 1, f"{dtype} n={n}: ranks differ"
    want = [v if node_size > 1 else "ar" for _, _, v in cases]
    assert ran == want
    c.Free()


def test_allreduce_default_threshold(monkeypatch):
    """Without the variable the module constant decides: RSAG_BYTES - 4 bytes is "ar", RSAG_BYTES "rsag"."""
    node_size = RSAG_NODE_SIZES[-1] if RSAG_NODE_SIZES else NODE_SIZES[-1]
    c = _communicator(monkeypatch, node_size, None)
    assert c._backend.rsag_bytes == Config().hier_rsag_bytes
    ran = _record_variants(monkeypatch, c)
    n = Config().hier_rsag_bytes // 4
    for it, count in enumerate((n - 1, n)):
        x = _data(np.random.default_rng(_seed(it, "default")), "float32", count)
        y = np.empty_like(x)
        c.Allreduce(x, y, deterministic=True)
        assert _bits(y) == _bits(_hier_ref(OPS["SUM"], WORLD.allgather(x), c._backend.layout))
    assert ran == ["ar", "rsag" if node_size > 1 else "ar"]
    c.Free()


def test_allreduce_rsag_nondeterministic(hc_rsag, monkeypatch):
    """deterministic=False promises no bits, only the sum (ints: exactly)."""
    ran = _record_variants(monkeypatch, hc_rsag)
    for it, n in enumerate((5, 4099)):
        x = np.random.default_rng(_seed(it, "nondet")).standard_normal(n)
        y = np.empty_like(x)
        hc_rsag.Allreduce(x, y)
        np.testing.assert_allclose(y, np.sum(WORLD.allgather(x), axis=0), rtol=1e-12, atol=1e-12)
        i = np.random.default_rng(_seed(it, "nondet-int")).integers(-1000, 1000, n)
        j = np.empty_like(i)
        hc_rsag.Allreduce(i, j, op=hpccoll.MAX)
        assert np.array_equal(j, np.max(WORLD.allgather(i), axis=0))
    assert ran == ["rsag"] * 4


def test_allreduce_rsag_rejects_bad_calls(hc_rsag):
    """Validation runs before either variant: the same errors, and the communicator still works."""
    with pytest.raises(ValueError, match="recvbuf has 4 elements, sendbuf 5"):
        hc_rsag.Allreduce(np.zeros(5), np.empty(4))
    with pytest.raises(TypeError, match="same dtype"):
        hc_rsag.Allreduce(np.zeros(5), np.empty(5, np.float32))
    with pytest.raises(ValueError, match="op="):
        hc_rsag.Allreduce(np.zeros(5), np.empty(5), op="XOR")
    with pytest.raises(TypeError, match="dtype"):
        hc_rsag.Allreduce(np.zeros(5, np.uint8), np.empty(5, np.uint8))
    with pytest.raises(ValueError, match="algorithm='oneshot_ll'"):  # a node kernel on the host: "ar" refuses it
        hc_rsag.Allreduce(np.zeros(5), np.empty(5), algorithm="oneshot_ll")
    y = np.empty(5)
    hc_rsag.Allreduce(np.full(5, 1.0), y)
    assert np.all(y == WORLD.Get_size())


@pytest.mark.parametrize("value", ["lots", "-1", "1.5"])
def test_rsag_threshold_env_rejected(monkeypatch, value):
    monkeypatch.setenv("HPCCOLL_HIER_RSAG_BYTES", value)
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", "1")
    with pytest.raises(ValueError, match="HPCCOLL_HIER_RSAG_BYTES=.*non-negative integer"):
        hpccoll.Communicator(backend="host")


def test_rsag_threshold_must_agree(monkeypatch):
    """Ranks with different thresholds would run different variants and hang: refused on every rank."""
    monkeypatch.setenv("HPCCOLL_HIER_RSAG_BYTES", "0" if WORLD.Get_rank() == 0 else "4096")
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", "1")
    with pytest.raises(ValueError, match="differs between ranks"):
        hpccoll.Communicator(backend="host")


def test_a_node_whose_communicator_fails_fails_every_node(monkeypatch):
    """The last simulated node (one rank each) cannot open its node communicator: its rank
    raises its own error, every other node an HpccollError naming it, instead of waiting for
    it in the inter-node communicator's construction."""
    import hpccoll.backends.factory as factory

    last = WORLD.Get_size() - 1
    real = factory.HostBackend

    def host_backend(mpi_comm, *args, **kw):
        if mpi_comm.Get_size() == 1 and WORLD.Get_rank() == last:
            raise RuntimeError("node communicator broken here")
        return real(mpi_comm, *args, **kw)

    monkeypatch.setattr(factory, "HostBackend", host_backend)
    monkeypatch.setenv("HPCCOLL_NODE_SIZE", "1")
    if WORLD.Get_rank() == last:
        with pytest.raises(RuntimeError, match="node communicator broken here"):
            hpccoll.Communicator(backend="host")
    else:
        with pytest.raises(HpccollError, match=f"another node's communicator could not open \\(node {last}: "
                                               "node communicator broken here"):
            hpccoll.Communicator(backend="host")
    monkeypatch.setattr(factory, "HostBackend", real)
    c = hpccoll.Communicator(backend="host")   # the next one opens
    x = np.ones(3)
    y = np.empty_like(x)
    c.Allreduce(x, y)
    assert np.all(y == WORLD.Get_size())
    c.Free()
