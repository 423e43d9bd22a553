"""The two-stage tridiagonalization (sy2sb, sb2st, Q1 Q2) under MPI (1 to 4 ranks): its
tridiagonal's eigenvalues against LAPACK's, the full solve's accuracy against LAPACK sygvd at
ill-conditioned B, edge sizes, and bitwise reproducibility across runs and ranks.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_twostage_mpi.py"""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd
from hpccoll_eigensolver.linalg.sb2st import _groups, group_shape
from hpccoll_eigensolver.linalg.twostage import group_owner, two_stage
from hpccoll_eigensolver.problems import make_problem

from conftest import assert_as_accurate_as_lapack

pytestmark = pytest.mark.mpi(min_size=1)

WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


def _seed() -> int:
    return WORLD.bcast(int(np.random.SeedSequence().entropy % (1 << 32)), root=0)


def _solve(comm, prob, nb, **kw):
    desc = BlockCyclic(prob.n, prob.n, nb, comm.size)
    w, X = sygvd(distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm,
                 reduction="two-stage", **kw)
    return w, X, desc


# n odd, not a multiple of b, n < b, n < P nb (ranks without columns), b < nb (b | nb)
@pytest.mark.parametrize("n,nb,b", [(101, 16, 16), (150, 32, 8), (64, 16, 4), (7, 4, 4), (40, 64, 64),
                                    (1, 4, 4), (2, 4, 2), (3, 2, 2), (200, 64, 32)])
def test_tridiagonal_has_lapacks_eigenvalues(comm, n, nb, b):
    rng = np.random.default_rng(_seed())
    C = rng.standard_normal((n, n))
    C = C + C.T
    desc = BlockCyclic(n, n, nb, comm.size)
    Cl = distribute(np.tril(C), desc, comm.rank)
    d, e, _ = two_stage(Cl, desc, comm, np, b=b)
    ref = sl.eigvalsh(C)
    got = sl.eigvalsh_tridiagonal(d, e) if n > 1 else d
    assert np.abs(got - ref).max() <= 50 * n * np.finfo(float).eps * np.abs(ref).max()
    assert len(set(WORLD.allgather(d.tobytes() + e.tobytes()))) == 1


@pytest.mark.parametrize("n,nb,b", [(150, 16, 8), (101, 16, 16), (7, 4, 4)])
def test_q2_groups_are_held_by_their_owners_only(comm, n, nb, b):
    """Between the bulge chasing and Q2 each rank holds exactly the groups group_owner gives it
    (rank 0 none on several ranks), each of its (K_q, b + 1, g) shape: every group once."""
    rng = np.random.default_rng(_seed())
    C = rng.standard_normal((n, n))
    desc = BlockCyclic(n, n, nb, comm.size)
    _, _, Q = two_stage(distribute(np.tril(C + C.T), desc, comm.rank), desc, comm, np, b=b)
    P, rank, Q_groups = comm.size, comm.rank, _groups(n, b)
    if P == 1:
        assert len(Q.refl) == Q_groups
        return
    assert sorted(Q.refl) == [q for q in range(Q_groups) if group_owner(q, P) == rank]
    assert rank != 0 or not Q.refl
    for q, R in Q.refl.items():
        assert R.shape == group_shape(n, b, b, q)
        assert np.isfinite(R).all()
    assert sorted(q for keys in WORLD.allgather(list(Q.refl)) for q in keys) == list(range(Q_groups))


@pytest.mark.parametrize("kind,n,nb", [("known", 101, 16), ("clustered", 150, 32), ("wilkinson", 97, 64),
                                       ("random", 7, 4), ("known", 1, 4), ("clustered", 40, 64),
                                       ("known", 63, 8)])
def test_matches_scipy(comm, kind, n, nb):
    prob = make_problem(kind, n, cond_b=1e3, seed=_seed())
    w, X, desc = _solve(comm, prob, nb)
    Xg = gather(X, desc, comm)
    ref = sl.eigh(prob.A, prob.B, eigvals_only=True)
    assert metrics.eigenvalue_error(w, ref) < 1e-10
    assert metrics.residual(prob.A, prob.B, Xg, w) < (1.0 if n > 30 else 20.0)
    assert metrics.b_orthogonality(prob.B, Xg) < 100
    assert len(set(WORLD.allgather(w.tobytes()))) == 1


@pytest.mark.parametrize("cond_b", [1e3, 1e8, 1e12])
@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson"])
def test_accuracy_as_lapack(comm, kind, cond_b):
    """Residual, B-orthogonality and eigenvalue error within 2x of LAPACK sygvd's (as the
    one-stage path's test_eigensolver_mpi.test_accuracy_as_lapack, fixed seeds)."""
    prob = make_problem(kind, 160, cond_b=cond_b, seed=3)
    w, X, desc = _solve(comm, prob, 16)
    assert_as_accurate_as_lapack(prob, w, gather(X, desc, comm), f"two-stage {kind} cond(B)={cond_b:g}")


def test_bitwise_reproducible_and_identical_across_ranks(comm):
    prob = make_problem("clustered", 123, cond_b=1e2, seed=_seed())
    w1, X1, _ = _solve(comm, prob, 16)
    w2, X2, _ = _solve(comm, prob, 16)
    assert w1.tobytes() == w2.tobytes()
    assert X1.tobytes() == X2.tobytes()
    assert len(set(WORLD.allgather(w1.tobytes()))) == 1


def test_eigenvalues_only(comm):
    prob = make_problem("known", 90, cond_b=1e3, seed=_seed())
    w, X, _ = _solve(comm, prob, 16, eigvals_only=True)
    assert X is None
    assert metrics.eigenvalue_error(w, sl.eigh(prob.A, prob.B, eigvals_only=True)) < 1e-10


def test_reduction_must_agree(comm):
    from hpccoll_eigensolver import InputError

    prob = make_problem("known", 20, cond_b=1e2, seed=1)
    desc = BlockCyclic(20, 20, 4, comm.size)
    mine = "two-stage" if comm.rank == comm.size - 1 else "one-stage"
    args = (distribute(prob.A, desc, comm.rank), distribute(prob.B, desc, comm.rank), desc, comm)
    if comm.size > 1:
        with pytest.raises(InputError, match="reduction"):
            sygvd(*args, reduction=mine)
    with pytest.raises(InputError, match="reduction='three-stage'"):
        sygvd(*args, reduction="three-stage")


@pytest.mark.parametrize("n,nb,offset", [(150, 16, 8), (101, 16, 1), (37, 8, 8)])
def test_packed_reflectors_give_ormtrs_bits_on_every_rank_count(comm, n, nb, offset):
    """ormtr on pack_reflectors' copies (one rank: the blocks; several: each owned panel's rows)
    gives the bits of ormtr on the local columns, about half of them kept; packed for another rank
    count, it refuses."""
    from hpccoll_eigensolver.linalg.ormtr import ormtr, pack_reflectors

    rng = np.random.default_rng(_seed())
    desc = BlockCyclic(n, n, nb, comm.size)
    V = np.tril(rng.standard_normal((n, n)), -offset)
    V[np.arange(max(n - offset, 0)) + offset, np.arange(max(n - offset, 0))] = 1.0
    tau = rng.uniform(0.1, 2.0, n) * (rng.random(n) < 0.8)
    tau[max(n - offset, 0):] = 0.0
    Vl = distribute(V, desc, comm.rank)
    Z = distribute(rng.standard_normal((n, n)), desc, comm.rank)
    want = ormtr(Vl, tau, Z.copy(order="F"), desc, comm, np, block=32, offset=offset)
    packed = pack_reflectors(Vl, tau, desc, np, block=32, offset=offset, rank=comm.rank)
    assert packed.nbytes <= 0.5 * Vl.nbytes + 8 * n * (nb + 32)
    got = ormtr(packed, tau, Z.copy(order="F"), desc, comm, np, offset=offset)
    assert np.array_equal(got, want)
    other = BlockCyclic(n, n, nb, comm.size + 1)
    with pytest.raises(ValueError, match="packed for"):
        ormtr(packed, tau, Z.copy(order="F"), other, comm, np)
