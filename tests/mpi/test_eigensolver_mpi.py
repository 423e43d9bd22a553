"""The distributed eigensolver under MPI (1, 2 or 3 ranks): accuracy against scipy and bitwise
reproducibility of the deterministic host path.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_mpi.py"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, NotPositiveDefinite, distribute, gather, sygvd
from hpccoll_eigensolver import metrics, solver, tridiag_dc
from hpccoll_eigensolver.counting import CountingComm, PhaseTimer
from hpccoll_eigensolver.problems import make_problem

pytestmark = pytest.mark.mpi(min_size=1)

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


def _solve(comm, prob, nb, counting=False):
    desc = BlockCyclic(prob.n, prob.n, nb, comm.size)
    c = CountingComm(comm) if counting else comm
    timer = PhaseTimer(np, c)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, c, timer=timer)
    return w, X, desc, c, timer


@pytest.mark.parametrize("kind,n,nb", [("random", 64, 16), ("known", 101, 16), ("clustered", 150, 32),
                                       ("wilkinson", 97, 64), ("known", 300, 64)])
def test_matches_scipy(comm, kind, n, nb):
    prob = make_problem(kind, n, cond_b=1e3, seed=7)  # identical on every rank
    w, X, desc, _, _ = _solve(comm, prob, nb)
    Xg = gather(X, desc, comm)
    ref = sl.eigh(prob.A, prob.B, eigvals_only=True)
    assert metrics.eigenvalue_error(w, ref) < 1e-10
    if prob.eigenvalues is not None:
        assert metrics.eigenvalue_error(w, prob.eigenvalues) < 1e-10
    assert metrics.residual(prob.A, prob.B, Xg, w) < 1.0
    assert metrics.b_orthogonality(prob.B, Xg) < 100


def test_bitwise_reproducible_and_identical_across_ranks(comm):
    prob = make_problem("clustered", 123, cond_b=1e2, seed=3)
    w1, X1, desc, _, _ = _solve(comm, prob, 16)
    w2, X2, _, _, _ = _solve(comm, prob, 16)
    assert w1.tobytes() == w2.tobytes()
    assert X1.tobytes() == X2.tobytes()
    assert metrics.sha256(gather(X1, desc, comm)) == metrics.sha256(gather(X2, desc, comm))
    digests = WORLD.allgather(metrics.sha256(w1))
    assert len(set(digests)) == 1


@pytest.mark.parametrize("potrf", ["replicated", "panels"])
def test_collective_counts(comm, monkeypatch, potrf):
    """potrf: one Allgather (replicated, the default) or one Bcast per panel (panels); one
    Allgather in sygst, per column one Bcast and (for all but the last two columns) one
    Allreduce in sytrd, one Bcast in stedc (host)."""
    monkeypatch.setenv("HPCCOLL_EIG_POTRF", potrf)
    n, nb = 70, 16
    prob = make_problem("random", n, seed=1)
    _, _, _, cc, timer = _solve(comm, prob, nb, counting=True)
    s = cc.summary()
    want = {"Allgather": 1} if potrf == "replicated" else {"Bcast": -(-n // nb)}
    assert {name: c["count"] for name, c in s["potrf"].items()} == want
    assert s["sygst"]["Allgather"]["count"] == 1
    assert s["sytrd"]["Bcast"]["count"] == n
    assert s["sytrd"]["Allreduce"]["count"] == n - 2
    assert s["sytrd"]["Allreduce"]["max_bytes"] == 8 * n  # from an even row: aligned device buffers
    assert s["stedc"]["Bcast"]["count"] == 1
    assert set(timer.seconds) == {"potrf", "sygst", "sytrd", "stedc", "ormtr", "trsm"}


def test_eigenvalues_only(comm):
    prob = make_problem("known", 45, seed=4)
    desc = BlockCyclic(45, 45, 8, comm.size)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm,
                 eigvecs=False)
    assert X is None
    assert metrics.eigenvalue_error(w, prob.eigenvalues) < 1e-10


@pytest.mark.parametrize("kind", ["known", "wilkinson", "clustered"])
def test_stedc_dc_on_every_rank_count(comm, kind):
    """stedc="dc" (the divide-and-conquer tridiagonal solver; n = 141 > one leaf of 64, so its
    halves on ranks 0 and 1 and the top merge on every rank): accurate, every rank the same
    bits, the same eigenvalues as LAPACK's dstevd path to rounding."""
    prob = make_problem(kind, 141, cond_b=1e3, seed=21)
    desc = BlockCyclic(prob.n, prob.n, 16, comm.size)
    A, B = distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank)
    w, X = sygvd(A, B, desc, comm, stedc="dc")
    w_host, _ = sygvd(A, B, desc, comm, stedc="host")
    Xg = gather(X, desc, comm)
    assert metrics.eigenvalue_error(w, w_host) < 1e-12
    assert metrics.residual(prob.A, prob.B, Xg, w) < 1.0
    assert metrics.b_orthogonality(prob.B, Xg) < 100
    assert len(set(WORLD.allgather(metrics.sha256(w) + metrics.sha256(Xg)))) == 1


# -- potrf: replicated (the default) and panels --------------------------------------------
def _potrf(comm, B, nb, variant, monkeypatch):
    monkeypatch.setenv("HPCCOLL_EIG_POTRF", variant)
    desc = BlockCyclic(B.shape[0], B.shape[0], nb, comm.size)
    return solver._potrf(distribute(B, desc, comm.rank), desc, comm, np)


@pytest.mark.parametrize("n,nb", [(1, 4), (37, 8), (150, 16)])
def test_potrf_replicated_matches_panels_and_is_identical_across_ranks(comm, monkeypatch, n, nb):
    B = make_problem("random", n, cond_b=1e3, seed=n).B
    L = _potrf(comm, B, nb, "replicated", monkeypatch)
    L_panels = _potrf(comm, B, nb, "panels", monkeypatch)
    assert L.shape == (n, n) and L.flags.f_contiguous
    assert np.array_equal(L, np.tril(L))
    np.testing.assert_allclose(L, L_panels, rtol=0, atol=1e-13 * np.abs(L_panels).max())
    np.testing.assert_allclose(L, sl.cholesky(B, lower=True), rtol=0, atol=1e-13 * np.abs(L).max())
    assert len(set(WORLD.allgather(metrics.sha256(L)))) == 1


@pytest.mark.parametrize("variant", ["replicated", "panels"])
def test_potrf_not_positive_definite_on_every_rank(comm, monkeypatch, variant):
    B = np.diag(np.r_[np.ones(20), -1.0, np.ones(9)])
    with pytest.raises(NotPositiveDefinite):
        _potrf(comm, B, 8, variant, monkeypatch)


def test_potrf_ranks_that_disagree_raise_on_every_rank(comm, monkeypatch):
    """A rank whose library potrf gives other bits (here: rank 1's factor one ulp off) makes every
    rank raise, instead of solving with different factors."""
    if comm.size < 2:
        pytest.skip("needs >= 2 ranks")
    if comm.rank == 1:
        def off_by_an_ulp(xp, a):
            L = np.linalg.cholesky(a)
            L[-1, -1] = np.nextafter(L[-1, -1], np.inf)
            return L
        monkeypatch.setattr(solver, "potrf", off_by_an_ulp)
    B = make_problem("random", 40, cond_b=10.0, seed=2).B
    with pytest.raises(RuntimeError, match="Cholesky factors of the same B differ.*HPCCOLL_EIG_POTRF=panels"):
        _potrf(comm, B, 8, "replicated", monkeypatch)


def test_potrf_variant_rejects_unknown_values(comm, monkeypatch):
    monkeypatch.setenv("HPCCOLL_EIG_POTRF", "blocked")
    prob = make_problem("random", 20, seed=1)
    desc = BlockCyclic(20, 20, 8, comm.size)
    with pytest.raises(ValueError, match=r"HPCCOLL_EIG_POTRF='blocked': use replicated or panels"):
        sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm)


# -- stedc="dc": the tree's halves on ranks 0 and 1, the top merge on every rank -------------
@pytest.fixture
def leaf_32(monkeypatch):
    """Host leaves of 32 rows: n = 300 .. 517 then merges 4-5 levels."""
    monkeypatch.setattr(tridiag_dc, "LEAF", 32)


@pytest.mark.parametrize("n", [300, 448, 517])
def test_stedc_dc_split_is_the_one_rank_solve_bitwise(comm, leaf_32, n):
    """w and every rank's columns of Z are the bits of eigh_tridiagonal_dc on one rank; the
    halves travel in two Bcasts (from ranks 0 and 1) instead of one of [w, Z]."""
    rng = np.random.default_rng(n)
    d, e = rng.standard_normal(n), rng.standard_normal(n - 1)   # the same on every rank
    desc = BlockCyclic(n, n, 16, comm.size)
    cc = CountingComm(comm)
    w, Z = solver._stedc(d, e, desc, cc, np, True, "dc")
    w_ref, Z_ref = tridiag_dc.eigh_tridiagonal_dc(d, e, leaf=32)
    assert w.tobytes() == w_ref.tobytes()
    assert Z.tobytes() == np.asfortranarray(Z_ref[:, desc.local_cols(comm.rank)]).tobytes()
    bcast = cc.summary()["other"]["Bcast"]
    if comm.size >= 2:
        tree = tridiag_dc.split_tree(d, e, np, 32)
        rows = [b - a for a, b in (tree.half_rows(0), tree.half_rows(1))]
        assert bcast["count"] == 2
        assert bcast["bytes"] == sum(8 * m * (m + 1) for m in rows)
    else:
        assert bcast["count"] == 1


@pytest.mark.parametrize("n", [300, 517])
def test_sygvd_stedc_dc_split_matches_scipy(comm, leaf_32, monkeypatch, n):
    """sygvd with the split stedc: its tridiagonal step is eigh_tridiagonal_dc's bits on the
    tridiagonal sytrd made, every rank has the same eigenvalues and X, and they solve A x = w B x."""
    stedc, seen = solver._stedc, {}

    def recording_stedc(d, e, desc, comm, xp, eigvecs, where):
        seen["d, e"], seen["w, Z"] = (d.copy(), e.copy()), stedc(d, e, desc, comm, xp, eigvecs, where)
        return seen["w, Z"]
    monkeypatch.setattr(solver, "_stedc", recording_stedc)
    prob = make_problem("random", n, cond_b=1e2, seed=n)
    desc = BlockCyclic(n, n, 32, comm.size)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm,
                 stedc="dc")
    w_ref, Z_ref = tridiag_dc.eigh_tridiagonal_dc(*seen["d, e"], leaf=32)
    assert seen["w, Z"][0].tobytes() == w.tobytes() == w_ref.tobytes()
    assert seen["w, Z"][1].tobytes() == np.asfortranarray(Z_ref[:, desc.local_cols(comm.rank)]).tobytes()
    Xg = gather(X, desc, comm)
    assert metrics.eigenvalue_error(w, sl.eigh(prob.A, prob.B, eigvals_only=True)) < 1e-12
    assert metrics.residual(prob.A, prob.B, Xg, w) < 1.0
    assert metrics.b_orthogonality(prob.B, Xg) < 100
    assert len(set(WORLD.allgather(metrics.sha256(w)))) == 1
    assert len(set(WORLD.allgather(metrics.sha256(Xg)))) == 1


def test_stedc_dc_ranks_that_disagree_take_rank_0s_result(comm, leaf_32, monkeypatch):
    """A rank whose top merge gives other bits (here: every rank but 0 one ulp off) makes every
    rank warn and take rank 0's [w, Z] by one more Bcast: never silently different."""
    if comm.size < 2:
        pytest.skip("needs >= 2 ranks")
    n = 300
    rng = np.random.default_rng(5)
    d, e = rng.standard_normal(n), rng.standard_normal(n - 1)
    w_ref, Z_ref = tridiag_dc.eigh_tridiagonal_dc(d, e, leaf=32)   # before the merge goes wrong
    if comm.rank != 0:
        merge = tridiag_dc.merge_halves

        def off_by_an_ulp(*args):
            w, Z = merge(*args)
            w[0] = np.nextafter(w[0], np.inf)
            return w, Z
        monkeypatch.setattr(tridiag_dc, "merge_halves", off_by_an_ulp)
    desc = BlockCyclic(n, n, 16, comm.size)
    cc = CountingComm(comm)
    with pytest.warns(RuntimeWarning, match="top merge gave different bits"):
        w, Z = solver._stedc(d, e, desc, cc, np, True, "dc")
    assert w.tobytes() == w_ref.tobytes()
    assert Z.tobytes() == np.asfortranarray(Z_ref[:, desc.local_cols(comm.rank)]).tobytes()
    assert cc.summary()["other"]["Bcast"]["count"] == 3
