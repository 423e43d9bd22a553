"""The two-stage reduction on GPUs (2 and 3 ranks sharing a GPU under MPS, or one each): the band
reduction on the device, the bulge chasing on rank 0's GPU, Q2 applied on every rank's GPU.
Accuracy within 2x LAPACK's, the same eigenvalues as the host two-stage path to rounding,
bitwise reproducible across runs and identical on every rank, eigenvalues only, a subset, and
one B for several A.

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_eigensolver_twostage_gpu.py"""
from __future__ import annotations

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from conftest import assert_as_accurate_as_lapack

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]
WORLD = MPI.COMM_WORLD


@pytest.fixture(scope="module", autouse=True)
def compiled():
    """CuPy's kernels and the solver's CUDA sources compiled before any communicator opens (as
    the CLI does: a process with hpccoll's CUDA communicator open has read source files back
    corrupted on the GPU machines, tests/gpu/_gpu_checks.py)."""
    from hpccoll_eigensolver.warmup import warm_up

    warm_up()


@pytest.fixture(scope="module")
def gpu_comm():
    c = hpccoll.Communicator(backend="cuda", deterministic=True)
    yield c
    c.Free()


@pytest.fixture(scope="module")
def self_comm():
    c = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    yield c
    c.Free()


def _seed() -> int:
    return WORLD.bcast(int(np.random.SeedSequence().entropy % (1 << 32)), root=0)


def _solve(comm, prob, nb, **kw):
    import cupy as cp

    from hpccoll_eigensolver import BlockCyclic, distribute, sygvd

    desc = BlockCyclic(prob.n, prob.n, nb, comm.size)
    A = cp.asarray(distribute(prob.A, desc, comm.rank))
    B = cp.asarray(distribute(prob.B, desc, comm.rank))
    w, X = sygvd(A, B, desc, comm, reduction="two-stage", **kw)
    return w, X, desc


def _gather(X, desc, comm):
    from hpccoll_eigensolver import gather

    return gather(X, desc, comm).get()


@pytest.mark.parametrize("ranks", ["all", "one"])
@pytest.mark.parametrize("kind,n,nb", [("known", 301, 32), ("clustered", 256, 64), ("wilkinson", 97, 16),
                                       ("random", 7, 4), ("known", 3, 2), ("known", 1000, 64)])
def test_two_stage_gpu_matches_scipy(request, ranks, kind, n, nb):
    from hpccoll_eigensolver import metrics
    from hpccoll_eigensolver.problems import make_problem

    comm = request.getfixturevalue("gpu_comm" if ranks == "all" else "self_comm")
    prob = make_problem(kind, n, cond_b=1e3, seed=_seed())
    w, X, desc = _solve(comm, prob, nb)
    Xg = _gather(X, desc, comm)
    ref = sl.eigh(prob.A, prob.B, eigvals_only=True)
    assert metrics.eigenvalue_error(w.get(), ref) < 1e-10
    assert metrics.residual(prob.A, prob.B, Xg, w.get()) < (1.0 if n > 30 else 20.0)
    assert metrics.b_orthogonality(prob.B, Xg) < 100
    assert len(set(WORLD.allgather(w.get().tobytes()))) == 1   # one rank each: the same bits on each


@pytest.mark.parametrize("cond_b", [1e3, 1e8, 1e12])
@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson"])
def test_two_stage_gpu_accuracy_as_lapack(gpu_comm, kind, cond_b):
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem(kind, 320, cond_b=cond_b, seed=3)
    w, X, desc = _solve(gpu_comm, prob, 32)
    assert_as_accurate_as_lapack(prob, w.get(), _gather(X, desc, gpu_comm), f"GPU two-stage {kind} cond(B)={cond_b:g}")


def test_two_stage_gpu_agrees_with_the_host_path(gpu_comm):
    """The device two-stage and the host two-stage (different kernels, the same algorithm):
    eigenvalues to rounding."""
    from hpccoll_eigensolver import BlockCyclic, distribute, sygvd
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem("known", 257, cond_b=1e4, seed=_seed())
    w_gpu, _, _ = _solve(gpu_comm, prob, 32, eigvals_only=True)
    host = hpccoll.Communicator(backend="host", deterministic=True)
    try:
        desc = BlockCyclic(prob.n, prob.n, 32, host.size)
        w_host, _ = sygvd(distribute(prob.A, desc, host.rank), distribute(prob.B, desc, host.rank), desc, host,
                          reduction="two-stage", eigvals_only=True)
    finally:
        host.Free()
    scale = np.abs(w_host).max()
    assert np.abs(w_gpu.get() - w_host).max() <= 1e-12 * scale


def test_two_stage_gpu_bitwise_reproducible(gpu_comm):
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem("clustered", 300, cond_b=1e2, seed=_seed())
    w1, X1, _ = _solve(gpu_comm, prob, 32)
    w2, X2, _ = _solve(gpu_comm, prob, 32)
    assert w1.get().tobytes() == w2.get().tobytes()
    assert X1.get().tobytes() == X2.get().tobytes()
    assert len(set(WORLD.allgather(w1.get().tobytes()))) == 1


def test_two_stage_gpu_eigenvalues_only_and_subset(gpu_comm):
    """eigvals_only: the same eigenvalues as with vectors (bitwise: the same tridiagonal and
    the same tridiagonal eigenvalue solver is not promised, so to rounding); a subset: its
    eigenpairs as scipy's."""
    from hpccoll_eigensolver import BlockCyclic, gather, metrics
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem("known", 211, cond_b=1e3, seed=_seed())
    w, X, desc = _solve(gpu_comm, prob, 16)
    w_only, none, _ = _solve(gpu_comm, prob, 16, eigvals_only=True)
    assert none is None
    assert np.abs(w_only.get() - w.get()).max() <= 1e-12 * np.abs(w.get()).max()
    lo, hi = 3, 40
    ws, Xs, _ = _solve(gpu_comm, prob, 16, subset_by_index=(lo, hi))
    ref_w, ref_X = sl.eigh(prob.A, prob.B, subset_by_index=(lo, hi))
    assert metrics.eigenvalue_error(ws.get(), ref_w) < 1e-10
    Xg = gather(Xs, BlockCyclic(prob.n, hi - lo + 1, 16, gpu_comm.size), gpu_comm).get()
    assert metrics.residual(prob.A, prob.B, Xg, ws.get()) < 1.0
    assert metrics.b_orthogonality(prob.B, Xg) < 100


def test_two_stage_gpu_generalized_solver_repeats_a_fresh_solve(gpu_comm):
    import cupy as cp

    from hpccoll_eigensolver import BlockCyclic, GeneralizedSolver, distribute
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem("known", 150, cond_b=1e3, seed=_seed())
    desc = BlockCyclic(prob.n, prob.n, 16, gpu_comm.size)
    B = cp.asarray(distribute(prob.B, desc, gpu_comm.rank))
    rng = np.random.default_rng(_seed())
    with GeneralizedSolver(B, desc, gpu_comm, reduction="two-stage") as s:
        for _ in range(2):
            E = rng.standard_normal((prob.n, prob.n)) * 1e-3
            A_global = prob.A + (E + E.T)
            A = cp.asarray(distribute(A_global, desc, gpu_comm.rank))
            w, X = s.solve(A)
            from hpccoll_eigensolver import sygvd

            w2, X2 = sygvd(A, B, desc, gpu_comm, reduction="two-stage")
            assert w.get().tobytes() == w2.get().tobytes()
            assert X.get().tobytes() == X2.get().tobytes()
