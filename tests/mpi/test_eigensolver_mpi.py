"""The distributed eigensolver under MPI (1 to 4 ranks): every phase against a one-process
reference, accuracy against SciPy (LAPACK sygvd) at ill-conditioned B, the collectives each
phase issues, and bitwise reproducibility of the deterministic host path across runs and ranks.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_mpi.py"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, NotPositiveDefinite, distribute, gather, sygvd
from hpccoll_eigensolver import metrics
from hpccoll_eigensolver.linalg.stedc.common import _leaf_size
from hpccoll_eigensolver.counting import CountingComm, PhaseTimer
from hpccoll_eigensolver.problems import make_problem

from conftest import assert_as_accurate_as_lapack

pytestmark = pytest.mark.mpi(min_size=1)

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


def _fresh_seed() -> int:
    """A seed drawn on rank 0 and shared: fresh data each run, the same on every rank."""
    return WORLD.bcast(int(np.random.SeedSequence().entropy % (1 << 32)), root=0)


def _solve(comm, prob, nb, counting=False, **kw):
    desc = BlockCyclic(prob.n, prob.n, nb, comm.size)
    c = CountingComm(comm) if counting else comm
    timer = PhaseTimer(np, c)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, c, timer=timer,
                 **kw)
    return w, X, desc, c, timer


# n not a multiple of nb, n < P nb (ranks without columns at 3 and 4 ranks), one block
@pytest.mark.parametrize("stedc", ["dc", "host"])
@pytest.mark.parametrize("kind,n,nb", [("random", 64, 16), ("known", 101, 16), ("clustered", 150, 32),
                                       ("wilkinson", 97, 64), ("known", 300, 64), ("random", 7, 4),
                                       ("known", 1, 4), ("clustered", 40, 64)])
def test_matches_scipy(comm, kind, n, nb, stedc):
    prob = make_problem(kind, n, cond_b=1e3, seed=_fresh_seed())  # identical on every rank
    w, X, desc, _, _ = _solve(comm, prob, nb, stedc=stedc)
    Xg = gather(X, desc, comm)
    ref = sl.eigh(prob.A, prob.B, eigvals_only=True)
    assert metrics.eigenvalue_error(w, ref) < 1e-10
    if prob.eigenvalues is not None:
        assert metrics.eigenvalue_error(w, prob.eigenvalues) < 1e-10
    assert metrics.residual(prob.A, prob.B, Xg, w) < (1.0 if n > 30 else 20.0)
    assert metrics.b_orthogonality(prob.B, Xg) < 100
    assert len(set(WORLD.allgather(w.tobytes()))) == 1


def test_bitwise_reproducible_and_identical_across_ranks(comm):
    prob = make_problem("clustered", 123, cond_b=1e2, seed=_fresh_seed())
    w1, X1, desc, _, _ = _solve(comm, prob, 16)
    w2, X2, _, _, _ = _solve(comm, prob, 16)
    assert w1.tobytes() == w2.tobytes()
    assert X1.tobytes() == X2.tobytes()
    assert metrics.sha256(gather(X1, desc, comm)) == metrics.sha256(gather(X2, desc, comm))
    assert len(set(WORLD.allgather(metrics.sha256(w1)))) == 1


def test_eigenvalues_only(comm):
    prob = make_problem("known", 45, seed=_fresh_seed())
    desc = BlockCyclic(45, 45, 8, comm.size)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm,
                 eigvals_only=True)
    assert X is None
    assert metrics.eigenvalue_error(w, prob.eigenvalues) < 1e-10
    assert len(set(WORLD.allgather(w.tobytes()))) == 1


def _dc_levels(n: int, nranks: int) -> int:
    leaves = -(-n // _leaf_size(None, np, n, nranks))
    return (leaves - 1).bit_length()


def test_collective_counts(comm):
    """potrf one Bcast per panel; sygst one per panel but the last, then one per panel but the
    first (the deferred substitution); sytrd per column one Bcast and (for all but the last two
    columns) one Allreduce; stedc (dc) per tree level one Allreduce and one Allgather, then one
    Alltoallv; ormtr and trsm one Bcast per panel; before potrf one Allgather of each rank's
    B and options, before sygst one of its A (shapes, largest magnitudes), after trsm one of its
    X's finiteness.  Nothing else: no Allgather of a matrix."""
    n, nb = 70, 16
    panels = -(-n // nb)
    prob = make_problem("random", n, seed=1)
    _, _, _, cc, timer = _solve(comm, prob, nb, counting=True)
    s = cc.summary()
    counts = {phase: {name: c["count"] for name, c in s.get(phase, {}).items()} for phase in timer.seconds}
    levels = _dc_levels(n, comm.size) if comm.size > 1 else 0   # one rank: no collective to make
    assert counts["potrf"] == {"Bcast": panels}
    assert counts["sygst"] == {"Bcast": 2 * (panels - 1)}
    assert counts["sytrd"] == {"Bcast": n, "Allreduce": n - 2}
    assert s["sytrd"]["Allreduce"]["max_bytes"] == 8 * n  # from an even row: aligned device buffers
    assert counts["stedc"] == {**({"Allreduce": levels, "Allgather": levels} if levels else {}), "Alltoallv": 1}
    if levels:
        assert s["stedc"]["Allreduce"]["max_bytes"] <= 8 * 2 * n
        assert s["stedc"]["Allgather"]["max_bytes"] <= 8 * 2 * (n + comm.size) * comm.size
    assert counts["ormtr"] == {"Bcast": panels}
    assert counts["trsm"] == {"Bcast": panels, "Allgather": 1}      # and whether any rank's X is finite
    # the agreed records, B's (before potrf) then A's (before sygst): per array its largest
    # magnitude, shape (2), realness and module; the descriptor (4) and the rank's column count;
    # then the options, B's stedc, sytrd and reduction, A's eigvals_only and subset_by_index (2)
    b_record, a_record = 5 + 5 + 3, 5 + 5 + 3
    assert {name: c["count"] for name, c in s["other"].items()} == {"Allgather": 2}   # the agreed B, then A
    assert s["other"]["Allgather"]["max_bytes"] == 8 * max(b_record, a_record) * comm.size
    assert s["other"]["Allgather"]["bytes"] == 8 * (b_record + a_record) * comm.size
    assert set(timer.seconds) == {"potrf", "sygst", "sytrd", "stedc", "ormtr", "trsm"}
    # no message carries a matrix: at most a panel of 2 nb columns, or a rank's columns
    largest = max(v["max_bytes"] for phase, d in s.items() if phase != "total" for v in d.values())
    assert largest <= 8 * n * max(2 * nb, BlockCyclic(n, n, nb, comm.size).max_local_n)


@pytest.mark.parametrize("kind", ["known", "wilkinson", "clustered"])
def test_stedc_dc_and_host_agree(comm, kind):
    """stedc="dc" (divide and conquer over the ranks; n = 141 > one leaf) and "host" (dstevd on
    rank 0, dealt by Alltoallv): the same eigenvalues to rounding, both accurate, every rank the
    same eigenvalue bits."""
    prob = make_problem(kind, 141, cond_b=1e3, seed=_fresh_seed())
    desc = BlockCyclic(prob.n, prob.n, 16, comm.size)
    A, B = distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank)
    w, X = sygvd(A, B, desc, comm, stedc="dc")
    w_host, _ = sygvd(A, B, desc, comm, stedc="host")
    Xg = gather(X, desc, comm)
    assert metrics.eigenvalue_error(w, w_host) < 1e-12
    assert metrics.residual(prob.A, prob.B, Xg, w) < 1.0
    assert metrics.b_orthogonality(prob.B, Xg) < 100
    assert len(set(WORLD.allgather(metrics.sha256(w)))) == 1


# -- the phases one by one, against one-process references -------------------------------
@pytest.mark.parametrize("update_cols", [None, 1, 16])
@pytest.mark.parametrize("n,nb", [(1, 4), (37, 8), (150, 16), (20, 64)])
def test_potrf_distributed(comm, n, nb, update_cols):
    """Each rank's columns of L (zeros above the diagonal), equal to LAPACK's factor to rounding;
    the trailing updates in one chunk or in many (update_cols)."""
    from hpccoll_eigensolver.linalg.potrf import potrf

    B = make_problem("random", n, cond_b=1e3, seed=_fresh_seed()).B
    desc = BlockCyclic(n, n, nb, comm.size)
    kw = {} if update_cols is None else {"update_cols": update_cols}
    L = potrf(distribute(B, desc, comm.rank), desc, comm, np, **kw)
    assert L.shape == (n, desc.local_n(comm.rank)) and L.flags.f_contiguous
    Lg = gather(L, desc, comm)
    assert np.array_equal(Lg, np.tril(Lg))
    np.testing.assert_allclose(Lg, sl.cholesky(B, lower=True), rtol=0, atol=1e-13 * np.abs(Lg).max())


@pytest.mark.parametrize("where", [3, 20, 29])
def test_potrf_not_positive_definite_on_every_rank(comm, where):
    """A negative pivot in any panel (the first, a middle one, the last) raises on every rank."""
    from hpccoll_eigensolver.linalg.potrf import potrf

    B = np.eye(30)
    B[where, where] = -1.0
    desc = BlockCyclic(30, 30, 8, comm.size)
    with pytest.raises(NotPositiveDefinite):
        potrf(distribute(B, desc, comm.rank), desc, comm, np)


@pytest.mark.parametrize("update_cols", [None, 1, 16])
@pytest.mark.parametrize("n,nb", [(1, 4), (37, 8), (101, 16), (20, 64)])
def test_sygst_distributed(comm, n, nb, update_cols):
    """C's lower triangle (strict upper zero) equals LAPACK dsygst's to rounding, from the
    distributed L; the trailing updates in one chunk or in many (update_cols)."""
    from scipy.linalg.lapack import dsygst

    from hpccoll_eigensolver.linalg.potrf import potrf
    from hpccoll_eigensolver.linalg.sygst import sygst

    prob = make_problem("random", n, cond_b=1e4, seed=_fresh_seed())
    desc = BlockCyclic(n, n, nb, comm.size)
    kw = {} if update_cols is None else {"update_cols": update_cols}
    L = potrf(distribute(prob.B, desc, comm.rank), desc, comm, np, **kw)
    C = sygst(distribute(prob.A, desc, comm.rank), L, desc, comm, np, **kw)
    Cg = gather(C, desc, comm)
    assert np.array_equal(Cg, np.tril(Cg))
    ref, info = dsygst(np.asfortranarray(prob.A), sl.cholesky(prob.B, lower=True), itype=1, lower=1)
    np.testing.assert_allclose(Cg, np.tril(ref), rtol=0, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("n,nb", [(1, 4), (37, 8), (101, 16)])
def test_back_transform_and_ormtr_distributed(comm, n, nb):
    """X = L^-T Y (trsm) and Q Z (ormtr) on the owned columns, from distributed L and reflectors,
    against dense one-process products."""
    from hpccoll_eigensolver.linalg.ormtr import ormtr
    from hpccoll_eigensolver.linalg.potrf import back_transform

    rng = np.random.default_rng(_fresh_seed())
    desc = BlockCyclic(n, n, nb, comm.size)
    L = np.tril(rng.standard_normal((n, n))) + 4 * np.eye(n)
    Y = rng.standard_normal((n, n))
    X = back_transform(distribute(Y, desc, comm.rank), distribute(L, desc, comm.rank), desc, comm, np)
    np.testing.assert_allclose(gather(X, desc, comm), sl.solve_triangular(L, Y, lower=True, trans=1), atol=1e-12)
    V = np.tril(rng.standard_normal((n, n)), -2)
    V[np.arange(1, n), np.arange(n - 1)] = 1.0
    tau = 2.0 / (V * V).sum(axis=0).clip(min=1e-300)
    tau[n - 1:] = 0.0
    Q = np.eye(n)
    for j in range(n - 1):
        Q = Q @ (np.eye(n) - tau[j] * np.outer(V[:, j], V[:, j]))
    Z = ormtr(distribute(V, desc, comm.rank), tau, distribute(Y, desc, comm.rank), desc, comm, np, block=2 * nb)
    np.testing.assert_allclose(gather(Z, desc, comm), Q @ Y, atol=1e-12 * n)


@pytest.mark.parametrize("n,leaf", [(1, 4), (7, 64), (300, 16), (517, 32), (131, 64)])
def test_stedc_rows_distributed(comm, n, leaf):
    """The divide and conquer over the ranks: every rank the same eigenvalue bits, the rows of
    every rank together an orthogonal eigenvector matrix of T, matching the one-process solve
    with the same leaves to rounding; a fresh T with some zero couplings (merges that only
    sort)."""
    from hpccoll_eigensolver.linalg.stedc import eigh_tridiagonal_dc, stedc_rows

    rng = np.random.default_rng(_fresh_seed())
    d, e = rng.standard_normal(n), rng.standard_normal(max(n - 1, 0))
    if n > 10:
        e[rng.integers(0, n - 1, 3)] = 0.0
    res = stedc_rows(d, e, comm, np, leaf=leaf)
    rs = res.row_starts
    assert rs[0] == 0 and rs[-1] == n and all(a <= b for a, b in zip(rs, rs[1:]))
    rows = res.take_rows()
    assert rows.shape == (rs[comm.rank + 1] - rs[comm.rank], n)
    assert len(set(WORLD.allgather(res.w.tobytes()))) == 1
    Z = np.concatenate(WORLD.allgather(rows))
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    eps = np.finfo(float).eps
    nt = max(np.abs(T).max(), 1.0)
    assert np.all(np.diff(res.w) >= 0)
    assert np.linalg.norm(Z.T @ Z - np.eye(n)) <= 10 * n * eps
    assert np.linalg.norm(T @ Z - Z * res.w) <= 50 * n * eps * nt
    w1, Z1 = eigh_tridiagonal_dc(d, e, leaf=_leaf_size(leaf, np, n, comm.size))
    np.testing.assert_allclose(res.w, w1, rtol=0, atol=10 * n * eps * nt)


@pytest.mark.parametrize("n,nb", [(1, 4), (9, 2), (50, 7), (10, 64)])
def test_rows_to_columns(comm, n, nb):
    """Contiguous row blocks (uneven, some empty) to block-cyclic columns by one Alltoallv."""
    from hpccoll_eigensolver.linalg.layout import column_order, rows_to_columns

    rng = np.random.default_rng(_fresh_seed())
    M = rng.standard_normal((n, n))
    cuts = np.sort(rng.integers(0, n + 1, comm.size - 1))
    starts = [0] + cuts.tolist() + [n]
    desc = BlockCyclic(n, n, nb, comm.size)
    r0, r1 = starts[comm.rank], starts[comm.rank + 1]
    mine = np.asfortranarray(M[r0:r1][:, column_order(desc)])
    got = rows_to_columns(mine, starts, desc, comm)
    assert got.flags.f_contiguous and got.tobytes() == distribute(M, desc, comm.rank).tobytes()


# -- accuracy against LAPACK (scipy.linalg.eigh(A, B): dsygvd) ---------------------------
ACCURACY_N, ACCURACY_NB = 160, 16


@pytest.mark.parametrize("cond_b", [1e3, 1e8, 1e12])
@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson"])
def test_accuracy_as_lapack(comm, kind, cond_b):
    """Residual, B-orthogonality and eigenvalue error within 2x of LAPACK sygvd's (SciPy) as B
    gets ill-conditioned, on make_problem's problems, the eigenvalue errors against the stored
    pair's exact spectrum (conftest.assert_as_accurate_as_lapack).  Fixed seeds: a ratio of two
    rounding errors is itself a random sample (over n = 150..170 it exceeds 2x in 1 of 63
    problems at cond(B) = 1e12 on 2 ranks: docs/eigensolver.md, Accuracy)."""
    prob = make_problem(kind, ACCURACY_N, cond_b=cond_b, seed=3)
    w, X, desc, _, _ = _solve(comm, prob, ACCURACY_NB)
    assert_as_accurate_as_lapack(prob, w, gather(X, desc, comm), f"{kind} cond(B)={cond_b:g}")


def test_select_device_refuses_a_job_where_only_some_ranks_have_a_gpu(monkeypatch):
    """A rank without a usable GPU among ranks with one: every rank raises MixedDevices naming
    the ranks without one (before any rank splits the communicator for its GPU)."""
    from hpccoll_eigensolver.linalg import _xp
    from hpccoll_eigensolver.runinfo import MixedDevices, select_device

    world = MPI.COMM_WORLD
    monkeypatch.setattr(_xp, "gpu_available", lambda: world.Get_rank() == 0)
    others = ", ".join(str(r) for r in range(1, world.Get_size()))
    with pytest.raises(MixedDevices, match=f"{others} found no usable GPU.*CUDA_VISIBLE_DEVICES"):
        select_device(world)
    monkeypatch.setattr(_xp, "gpu_available", lambda: False)
    xp, dev = select_device(world)
    assert xp is np and dev is None
