"""The distributed eigensolver under MPI (1, 2 or 3 ranks): accuracy against scipy and bitwise
reproducibility of the deterministic host path.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_mpi.py"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, distribute, gather, sygvd
from hpccoll_eigensolver import metrics
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


def test_collective_counts(comm):
    """One Bcast per panel in potrf, one Allgather in sygst, per column one Bcast and (for all but
    the last two columns) one Allreduce in sytrd, one Bcast in stedc."""
    n, nb = 70, 16
    prob = make_problem("random", n, seed=1)
    _, _, _, cc, timer = _solve(comm, prob, nb, counting=True)
    s = cc.summary()
    assert s["potrf"]["Bcast"]["count"] == -(-n // nb)
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
    """stedc="dc" (the divide-and-conquer tridiagonal solver on rank 0, then one Bcast): accurate,
    every rank the same bits, the same eigenvalues as LAPACK's dstevd path to rounding."""
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
