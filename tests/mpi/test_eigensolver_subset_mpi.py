"""A subset of the eigenpairs (subset_by_index, linalg/stein.py) and the solver that factors B
once (GeneralizedSolver) under MPI, 1 to 4 ranks: accuracy against SciPy's
eigh(A, B, subset_by_index=...) (LAPACK dsygvx) as B gets ill-conditioned, the layout of the
k vectors, bitwise reproducibility, the solver's later solves skipping potrf and equal to a
fresh sygvd, the errors of a bad subset, and both with reduction="two-stage".

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_subset_mpi.py"""
from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, GeneralizedSolver, InputError, distribute, gather, metrics, sygvd
from hpccoll_eigensolver.counting import CountingComm, PhaseTimer
from hpccoll_eigensolver.linalg import driver
from hpccoll_eigensolver.problems import make_problem

pytestmark = pytest.mark.mpi(min_size=1)

WORLD = MPI.COMM_WORLD
N, NB = 160, 16
EPS = np.finfo(np.float64).eps
SUBSETS = [(0, 0), (0, 10), (73, 79), (N - 5, N - 1), (N - 1, N - 1), (0, N - 1)]   # ends, middle, k = 1, k = n


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


@functools.lru_cache(maxsize=None)
def _reference(kind: str, cond_b: float):
    """The problem, its stored pair's exact spectrum and LAPACK's full solve (w, X)."""
    prob = make_problem(kind, N, cond_b=cond_b, seed=3)
    return prob, metrics.stored_spectrum(prob.A, prob.B), sl.eigh(prob.A, prob.B)


def _local(prob, desc, comm):
    return distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank)


@pytest.mark.parametrize("lo,hi", SUBSETS)
@pytest.mark.parametrize("cond_b", [1e3, 1e8, 1e12])
@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson"])
def test_subset_as_accurate_as_lapack(comm, kind, cond_b, lo, hi):
    """The k eigenpairs against LAPACK.  Eigenvalues: our full solve's at the same indices to
    n eps max|w| (the tridiagonal methods agree; the rest of the error is the reduction's), and an
    error against the stored pair's exact spectrum within 2x of LAPACK's full solve (floored at
    n eps, as the full solve's test).  Residual and B-orthogonality (metrics': Frobenius norms in
    units of eps): within 2x of SciPy's for the same subset or its full solve, the larger; for
    k < 5 a norm of so few entries is a sample of one or two roundings, so every entry of
    |A x - lambda B x| / ||x|| and |X^T B X - I| is held to 2x the largest of LAPACK's full
    solve instead."""
    _check_subset(comm, kind, cond_b, lo, hi)


def _check_subset(comm, kind, cond_b, lo, hi, reduction="auto"):
    """test_subset_as_accurate_as_lapack's criteria for one problem, subset and reduction."""
    prob, exact, (wl, Xl) = _reference(kind, cond_b)
    desc = BlockCyclic(N, N, NB, comm.size)
    k = hi - lo + 1
    a, b = _local(prob, desc, comm)
    w, X = sygvd(a, b, desc, comm, subset_by_index=(lo, hi), reduction=reduction)
    wf, _ = sygvd(a, b, desc, comm, eigvals_only=True, reduction=reduction)
    assert w.shape == (k,) and X.shape == (N, BlockCyclic(N, k, NB, comm.size).local_n(comm.rank))
    assert len(set(WORLD.allgather(w.tobytes()))) == 1
    Xg = gather(X, BlockCyclic(N, k, NB, comm.size), comm)
    what = f"{kind} cond(B)={cond_b:g} subset ({lo}, {hi}) reduction={reduction}"
    assert np.abs(w - wf[lo:hi + 1]).max() <= N * EPS * np.abs(wf).max(), what
    whole = exact.copy()
    whole[lo:hi + 1] = w                        # the error of the subset on the whole spectrum's scale
    lapack_error = metrics.floored_eigenvalue_error(wl, exact)
    assert metrics.floored_eigenvalue_error(whole, exact) <= 2 * lapack_error, what
    ws, Xs = sl.eigh(prob.A, prob.B, subset_by_index=(lo, hi))
    if k >= 5:
        assert metrics.residual(prob.A, prob.B, Xg, w) <= 2 * max(metrics.residual(prob.A, prob.B, Xs, ws),
                                                                  metrics.residual(prob.A, prob.B, Xl, wl)), what
        assert metrics.b_orthogonality(prob.B, Xg) <= 2 * max(metrics.b_orthogonality(prob.B, Xs),
                                                              metrics.b_orthogonality(prob.B, Xl)), what
    else:
        def columns_residual(X, w):
            return (np.linalg.norm(prob.A @ X - prob.B @ X * w, axis=0) / np.linalg.norm(X, axis=0)).max()

        def largest_entry(X):
            return np.abs(X.T @ prob.B @ X - np.eye(X.shape[1])).max()

        assert columns_residual(Xg, w) <= 2 * columns_residual(Xl, wl), what
        assert largest_entry(Xg) <= 2 * largest_entry(Xl), what
    return w


@pytest.mark.parametrize("lo,hi", [(0, 0), (0, 10), (73, 79), (N - 5, N - 1), (0, N - 1)])
@pytest.mark.parametrize("kind,cond_b", [("known", 1e8), ("clustered", 1e12), ("wilkinson", 1e3)])
def test_two_stage_subset_as_accurate_as_lapack(comm, kind, cond_b, lo, hi):
    """reduction="two-stage" with subset_by_index: Q1 Q2 applied to the k columns only, held to
    the one-stage subset's criteria against SciPy's eigh(A, B, subset_by_index=...) (the
    eigenvalues against the two-stage full solve's); eigvals_only gives the same eigenvalues."""
    w = _check_subset(comm, kind, cond_b, lo, hi, reduction="two-stage")
    prob = _reference(kind, cond_b)[0]
    desc = BlockCyclic(N, N, NB, comm.size)
    w_only, X_none = sygvd(*_local(prob, desc, comm), desc, comm, subset_by_index=(lo, hi), eigvals_only=True,
                           reduction="two-stage")
    assert X_none is None and w_only.tobytes() == w.tobytes()


def test_subset_is_bitwise_reproducible_and_the_same_with_eigvals_only(comm):
    prob = make_problem("clustered", 123, cond_b=1e8, seed=5)
    desc = BlockCyclic(123, 123, 8, comm.size)
    a, b = _local(prob, desc, comm)
    w1, X1 = sygvd(a, b, desc, comm, subset_by_index=(40, 90))
    w2, X2 = sygvd(a, b, desc, comm, subset_by_index=(40, 90))
    assert w1.tobytes() == w2.tobytes() and X1.tobytes() == X2.tobytes()
    assert len(set(WORLD.allgather(metrics.sha256(w1)))) == 1
    w3, X3 = sygvd(a, b, desc, comm, subset_by_index=(40, 90), eigvals_only=True)
    assert X3 is None and w3.tobytes() == w1.tobytes()


def _spied(monkeypatch):
    """Count potrf's calls in driver (the solver's factorization)."""
    calls = []
    real = driver.potrf

    def potrf(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(driver, "potrf", potrf)
    return calls


@pytest.mark.parametrize("reduction", ["auto", "two-stage"])
@pytest.mark.parametrize("options", [{}, {"subset_by_index": (3, 17)}, {"eigvals_only": True},
                                     {"subset_by_index": (0, 0), "eigvals_only": True}])
def test_solver_factors_b_once_and_equals_a_fresh_sygvd(comm, monkeypatch, options, reduction):
    """The solver's second solve (another A) against a fresh sygvd of that pair with the same
    reduction (the solver's constructor option, sygvd's keyword): the same bits."""
    n, nb = 70, 8
    desc = BlockCyclic(n, n, nb, comm.size)
    first = make_problem("known", n, cond_b=1e6, seed=7)
    second = make_problem("wilkinson", n, cond_b=1e6, seed=8)   # another A, the same B below
    B = distribute(first.B, desc, comm.rank)
    A1, A2 = (distribute(p.A, desc, comm.rank) for p in (first, second))
    calls = _spied(monkeypatch)
    cc = CountingComm(comm)
    with GeneralizedSolver(B, desc, cc, reduction=reduction) as solver:
        assert len(calls) == 1
        solver.solve(A1, **options)
        timer = PhaseTimer(np, cc)
        w, X = solver.solve(A2, timer=timer, **options)
        assert len(calls) == 1 and "potrf" not in timer.seconds   # no potrf in the solves
        B_again = np.array(B)
        wf, Xf = sygvd(A2, B, desc, comm, reduction=reduction, **options)
    assert len(calls) == 2 and np.array_equal(B, B_again)
    assert w.tobytes() == wf.tobytes()
    assert (X is None and Xf is None) or X.tobytes() == Xf.tobytes()
    with pytest.raises(ValueError, match="solve after free"):
        solver.solve(A2)


def test_solver_skips_b_checks_and_potrf_collectives(comm):
    """A later solve issues no potrf Bcast and one argument Allgather (A's), not two."""
    n, nb = 50, 8
    desc = BlockCyclic(n, n, nb, comm.size)
    prob = make_problem("random", n, seed=2)
    A, B = _local(prob, desc, comm)
    cc = CountingComm(comm)
    solver = GeneralizedSolver(B, desc, cc, timer=PhaseTimer(np, cc))
    before = cc.summary()
    solver.solve(A, timer=PhaseTimer(np, cc))
    after = cc.summary()
    solver.free()
    count = lambda s, phase, name: s.get(phase, {}).get(name, {}).get("count", 0)   # noqa: E731
    assert count(after, "potrf", "Bcast") == count(before, "potrf", "Bcast")
    assert count(after, "other", "Allgather") - count(before, "other", "Allgather") == 1


@pytest.mark.parametrize("bad,needle", [((5, 2), "lo > hi"), ((-1, 3), "out of range"), ((0, 40), "out of range"),
                                        ((1.0, 3), "pair of integers"), ((True, 3), "pair of integers"),
                                        (3, "pair of integers"), ("0:3", "pair of integers"),
                                        ((1, 2, 3), "pair of integers")])
def test_bad_subsets_raise_a_valueerror_naming_subset_by_index_everywhere(comm, bad, needle):
    n = 40
    desc = BlockCyclic(n, n, 8, comm.size)
    A, B = _local(make_problem("known", n, seed=1), desc, comm)
    with pytest.raises(ValueError, match=f"subset_by_index=.*{needle}") as e:
        sygvd(A, B, desc, comm, subset_by_index=bad)
    assert len(set(WORLD.allgather(str(e.value)))) == 1


def test_solver_agrees_on_reduction_in_its_constructor(comm):
    """reduction is the solver's option, agreed with B: a wrong or differing value raises the same
    InputError on every rank from the constructor, before potrf."""
    n = 40
    desc = BlockCyclic(n, n, 8, comm.size)
    _, B = _local(make_problem("known", n, seed=1), desc, comm)
    cases = [("three-stage", "reduction='three-stage'")]
    if comm.size > 1:
        cases.append(("two-stage" if comm.rank == comm.size - 1 else "one-stage", "different reduction"))
    for reduction, needle in cases:
        with pytest.raises(InputError, match=needle) as e:
            GeneralizedSolver(B, desc, comm, reduction=reduction)
        assert len(set(WORLD.allgather(str(e.value)))) == 1


@pytest.mark.mpi(min_size=2)
def test_subsets_that_differ_between_ranks_raise_the_same_inputerror(comm):
    n = 40
    desc = BlockCyclic(n, n, 8, comm.size)
    A, B = _local(make_problem("known", n, seed=1), desc, comm)
    with pytest.raises(InputError, match="different subset_by_index") as e:
        sygvd(A, B, desc, comm, subset_by_index=(0, comm.rank))
    assert len(set(WORLD.allgather(str(e.value)))) == 1
