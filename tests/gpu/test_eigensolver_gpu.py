"""The eigensolver on GPUs through hpccoll's CUDA backend (2 ranks; 4 ranks on 2 GPUs under MPS):
accuracy against SciPy, bitwise identical across two runs and across ranks on the deterministic
path, the same eigenvalues as the host path to rounding, and LL128 at least accurate.

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_eigensolver_gpu.py"""
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
    """CuPy's kernels compiled before any communicator opens (as the CLI does)."""
    from hpccoll_eigensolver.warmup import warm_up

    warm_up()
    warm_up(stedc="dc")


@pytest.fixture(scope="module")
def gpu_comm():
    c = hpccoll.Communicator(backend="cuda", deterministic=True)
    assert c.backend == "cuda"
    yield c
    c.Free()


def _solve(comm, prob, nb, **kw):
    import cupy as cp

    from hpccoll_eigensolver import BlockCyclic, distribute, sygvd

    desc = BlockCyclic(prob.n, prob.n, nb, comm.size)
    A = cp.asarray(distribute(prob.A, desc, comm.rank))
    B = cp.asarray(distribute(prob.B, desc, comm.rank))
    w, X = sygvd(A, B, desc, comm, **kw)
    return w, X, desc


class _NoTransfers:
    """A communicator that fails the test if Bcast or Allreduce is called (one rank needs none)."""

    def __init__(self, comm):
        self.comm = comm

    def __getattr__(self, name):
        if name in ("Bcast", "Allreduce"):
            raise AssertionError(f"the one-rank column step called {name}")
        return getattr(self.comm, name)


@pytest.mark.parametrize("n,nb", [(600, 32), (1100, 64)])
def test_gpu_one_rank_solve_and_column_step_without_transfers(n, nb):
    """One rank (every rank with a communicator of its own): sygvd runs potrf and trsm as single
    in-place cuSOLVER / cuBLAS calls, steps sygst through 256-column panels and ormtr through
    512-reflector blocks, and matches SciPy; its
    column step calls neither Bcast nor Allreduce, and gives the same bits in graphs as eagerly."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver import BlockCyclic, metrics
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.linalg.sytrd_device import sytrd_device

    c = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    try:
        prob = make_problem("clustered", n, cond_b=1e3, seed=7 + WORLD.Get_rank())
        w, X, _ = _solve(c, prob, nb)
        w, X = w.get(), X.get()
        assert metrics.eigenvalue_error(w, sl.eigh(prob.A, prob.B, eigvals_only=True)) < 1e-10
        assert metrics.residual(prob.A, prob.B, X, w) < 1.0
        assert metrics.b_orthogonality(prob.B, X) < 100
        outs = []
        for mode in ("graph", "eager"):
            local = cp.asfortranarray(cp.asarray(np.tril(prob.A)))
            res = sytrd_device(local, BlockCyclic(n, n, nb, 1), _NoTransfers(c), mode)
            outs.append(b"".join(cp.asnumpy(x).tobytes() for x in res) + cp.asnumpy(local).tobytes())
        assert outs[0] == outs[1]
    finally:
        c.Free()


@pytest.mark.parametrize("kind,n,nb", [("known", 197, 32), ("clustered", 256, 64), ("wilkinson", 131, 16)])
def test_gpu_matches_scipy(gpu_comm, kind, n, nb):
    from hpccoll_eigensolver import gather, metrics
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem(kind, n, cond_b=1e3, seed=11)
    w, X, desc = _solve(gpu_comm, prob, nb)
    Xg = gather(X, desc, gpu_comm).get()
    w = w.get()
    ref = sl.eigh(prob.A, prob.B, eigvals_only=True)
    assert metrics.eigenvalue_error(w, ref) < 1e-10
    assert metrics.residual(prob.A, prob.B, Xg, w) < 1.0
    assert metrics.b_orthogonality(prob.B, Xg) < 100


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize("m,n,k", [(1, 1, 1), (37, 5, 3), (200, 130, 64), (65, 1, 17)])
def test_gpu_gemm_acc_into_strided_views(m, n, k, trans_a, trans_b):
    """C += alpha A B through cuBLAS into a block of a Fortran-order array, operands of either
    memory order and non-contiguous ones; the rest of the array untouched."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver.linalg._xp import gemm_acc

    rng = np.random.default_rng()
    big = cp.asfortranarray(cp.asarray(rng.standard_normal((m + 7, n + 5))))
    before = big.copy()
    A = cp.asarray(rng.standard_normal((k, m))).T if trans_a else cp.asarray(rng.standard_normal((m, k)))
    B = cp.asarray(rng.standard_normal((2 * n, k)))[::2].T if trans_b else cp.asfortranarray(
        cp.asarray(rng.standard_normal((k, n))))
    alpha = float(rng.uniform(-2, 2))
    view = big[3:3 + m, 2:2 + n]
    gemm_acc(cp, view, A, B, alpha)
    want = before.get()
    want[3:3 + m, 2:2 + n] += alpha * (A.get() @ B.get())
    np.testing.assert_allclose(big.get(), want, rtol=1e-13, atol=1e-12 * k)
    outside = np.ones(big.shape, dtype=bool)
    outside[3:3 + m, 2:2 + n] = False
    assert np.array_equal(big.get()[outside], before.get()[outside])


@pytest.mark.parametrize("update_cols", [8, 1024])
def test_gpu_potrf_sygst_trsm_against_lapack(gpu_comm, update_cols):
    """The distributed Cholesky, sygst and back-transform on the GPU (in-place cuBLAS trailing
    updates, in one chunk or many) against LAPACK on the host."""
    import cupy as cp
    import numpy as np
    from scipy.linalg.lapack import dsygst

    from hpccoll_eigensolver import BlockCyclic, distribute, gather
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.linalg.potrf import back_transform, potrf
    from hpccoll_eigensolver.linalg.sygst import sygst

    n, nb = 301, 16
    seed = WORLD.bcast(int(np.random.default_rng().integers(1 << 30)))  # fresh, the same on every rank
    prob = make_problem("random", n, cond_b=1e4, seed=seed)
    desc = BlockCyclic(n, n, nb, gpu_comm.size)
    L = potrf(cp.asarray(distribute(prob.B, desc, gpu_comm.rank)), desc, gpu_comm, cp, update_cols=update_cols)
    Lref = sl.cholesky(prob.B, lower=True)
    Lg = gather(L, desc, gpu_comm).get()
    assert np.array_equal(Lg, np.tril(Lg))
    np.testing.assert_allclose(Lg, Lref, rtol=0, atol=1e-13 * np.abs(Lref).max())
    C = sygst(cp.asarray(distribute(prob.A, desc, gpu_comm.rank)), L, desc, gpu_comm, cp, update_cols=update_cols)
    ref, info = dsygst(np.asfortranarray(prob.A), Lref, itype=1, lower=1)
    Cg = gather(C, desc, gpu_comm).get()
    assert info == 0 and np.array_equal(Cg, np.tril(Cg))
    np.testing.assert_allclose(Cg, np.tril(ref), rtol=0, atol=1e-9 * np.abs(ref).max())
    Y = np.random.default_rng(seed).standard_normal((n, n))
    X = back_transform(cp.asarray(distribute(Y, desc, gpu_comm.rank)), L, desc, gpu_comm, cp)
    np.testing.assert_allclose(gather(X, desc, gpu_comm).get(), sl.solve_triangular(Lref, Y, lower=True, trans=1),
                               rtol=0, atol=1e-9)


@pytest.mark.parametrize("n", [7, 293, 1500])
def test_gpu_one_rank_potrf_and_trsm_in_place(n):
    """One rank: potrf is cuSOLVER's on the whole matrix and the back-substitution one cuBLAS
    trsm, both in place (here on a block of a larger array, so the leading dimension is not n),
    against LAPACK; a B that is not positive definite (a negative or NaN pivot) raises
    NotPositiveDefinite; arrays that are not column-major are refused by name."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver import BlockCyclic, NotPositiveDefinite
    from hpccoll_eigensolver.linalg._xp import trsm_in_place
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.linalg.potrf import back_transform, potrf

    c = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    try:
        rng = np.random.default_rng()
        prob = make_problem("random", n, cond_b=1e6, seed=int(rng.integers(1 << 30)))
        desc = BlockCyclic(n, n, 64, 1)
        big = cp.asfortranarray(cp.asarray(rng.standard_normal((n + 5, n + 3))))
        outside = big.copy()
        B = big[2:2 + n, 1:1 + n]
        B[...] = cp.asarray(prob.B)
        L = potrf(B, desc, c, cp)
        assert L.data.ptr == B.data.ptr
        Lref = sl.cholesky(prob.B, lower=True)
        Lg = L.get()
        eps = np.finfo(np.float64).eps
        assert np.array_equal(Lg, np.tril(Lg))
        assert np.linalg.norm(Lg @ Lg.T - prob.B) <= 4 * n * eps * np.linalg.norm(prob.B)  # backward error
        np.testing.assert_allclose(Lg, Lref, rtol=0, atol=1e-8 * np.abs(Lref).max())      # cond(B) = 1e6
        rest = np.ones(big.shape, dtype=bool)
        rest[2:2 + n, 1:1 + n] = False
        assert np.array_equal(big.get()[rest], outside.get()[rest])
        Y = rng.standard_normal((n, n + 2))
        X = cp.asfortranarray(cp.asarray(Y))
        assert back_transform(X, L, desc, c, cp) is X
        for trans, Xg in ((True, X.get()), (False, None)):
            if Xg is None:
                X = cp.asfortranarray(cp.asarray(Y))
                trsm_in_place(cp, L, X)
                Xg = X.get()
            op = Lg.T if trans else Lg
            assert np.linalg.norm(op @ Xg - Y) <= 4 * n * eps * np.linalg.norm(Lg) * np.linalg.norm(Xg)
            ref = sl.solve_triangular(Lref, Y, lower=True, trans=1 if trans else 0)
            np.testing.assert_allclose(Xg, ref, rtol=0, atol=1e-7 * np.abs(ref).max())
        with pytest.raises(ValueError, match="`b` must be column-major"):
            trsm_in_place(cp, L, cp.ascontiguousarray(cp.asarray(Y)))
        for bad in (-1.0, np.nan):
            Bbad = prob.B.copy()
            Bbad[n // 2, n // 2] = bad
            with pytest.raises(NotPositiveDefinite):
                potrf(cp.asfortranarray(cp.asarray(Bbad)), desc, c, cp)
    finally:
        c.Free()


@pytest.mark.parametrize("n,nb,block", [(301, 16, 64), (1030, 64, 512), (1031, 64, 512)])
def test_gpu_ormtr_matches_host(n, nb, block):
    """ormtr on the GPU, one rank - the distributed blocks (from an
    aligned row with a zero first row of Vb, T = M^-1 and a GEMM) - against the host's (LAPACK's
    rows, a triangular solve): random reflectors in sytrd's storage (unit first entry; some
    with tau = 0) and random Z."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver import BlockCyclic
    from hpccoll_eigensolver.linalg.ormtr import ormtr

    rng = np.random.default_rng()
    V = np.asfortranarray(np.tril(rng.standard_normal((n, n)), -1) / np.sqrt(n))
    V[np.arange(1, n), np.arange(n - 1)] = 1.0
    tau = 1.0 + rng.random(n)
    tau[rng.integers(0, n, 5)] = 0.0
    Z = np.asfortranarray(rng.standard_normal((n, n - 3)))
    desc = BlockCyclic(n, n, nb, 1)
    gc = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    hc = hpccoll.Communicator(MPI.COMM_SELF, backend="host")
    try:
        Zh = Z.copy(order="F")
        ormtr(V, tau, Zh, desc, hc, np, block=block)
        assert not np.allclose(Zh, Z)
        Zd = cp.asfortranarray(cp.asarray(Z))
        ormtr(cp.asarray(V), cp.asarray(tau), Zd, desc, gc, cp, block=block)
        np.testing.assert_allclose(Zd.get(), Zh, rtol=0, atol=1e-11 * np.abs(Zh).max())
    finally:
        gc.Free()
        hc.Free()


def _drot_loop(Q, rots):
    """dlaed2's DROT applied in order on the host, each product and sum rounded on its own."""
    out = Q.copy()
    for a, b, c, s in rots:
        x, y = out[:, a].copy(), out[:, b].copy()
        out[:, a] = c * x + s * y
        out[:, b] = c * y - s * x
    return out


@pytest.mark.parametrize("h,k", [(1, 5), (77, 40), (1000, 700)])
def test_gpu_dc_rotations_bitwise_as_sequential_drot(h, k):
    """The divide and conquer's deflation rotations on the GPU (a thread per row, loads issued
    ahead) give the bits of the sequential DROT loop, on random chains over a random order of
    the columns of a block of a larger array; a list that does not chain the way dlaed2's do
    is refused."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver.linalg.stedc import deflation

    rng = np.random.default_rng()
    Q = rng.standard_normal((h, k))
    cols, rots, at = rng.permutation(k), [], 0
    while at < k - 1:
        chain = cols[at:at + int(rng.integers(2, 12))]
        at += chain.size
        for a, b in zip(chain[:-1], chain[1:]):
            th = rng.uniform(0.0, 2.0 * np.pi)
            rots.append((int(a), int(b), float(np.cos(th)), float(np.sin(th))))
    assert deflation._chained(rots)
    big = cp.asfortranarray(cp.asarray(rng.standard_normal((h + 3, k + 2))))
    view = big[1:1 + h, 2:2 + k]
    view[...] = cp.asarray(Q)
    deflation._rotate(view, rots, cp)
    assert np.array_equal(view.get(), _drot_loop(Q, rots))
    bad = rots[:3] + [(rots[0][1], rots[0][0], 0.6, 0.8)]  # a column rotated as b twice
    assert not deflation._chained(bad)
    with pytest.raises(ValueError, match="chain"):
        deflation._rotate(cp.asfortranarray(cp.asarray(Q)), bad, cp)


@pytest.fixture(scope="module")
def self_comm():
    c = hpccoll.Communicator(MPI.COMM_SELF, backend="cuda", deterministic=True)
    yield c
    c.Free()


@pytest.mark.parametrize("ranks", ["all", "one"])
@pytest.mark.parametrize("cond_b", [1e3, 1e8, 1e12])
@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson"])
def test_gpu_accuracy_as_lapack(request, ranks, kind, cond_b):
    """The host backend's accuracy matrix (tests/mpi/test_eigensolver_mpi.py) on the GPU path:
    residual, B-orthogonality and eigenvalue error within 2x of LAPACK sygvd's (SciPy) as B gets
    ill-conditioned (conftest.assert_as_accurate_as_lapack); on all ranks and on one (whose
    potrf and back-substitution are whole-matrix cuSOLVER / cuBLAS calls and sygst's panels
    SYGST_ONE_RANK_NB_DEVICE wide)."""
    from hpccoll_eigensolver import gather
    from hpccoll_eigensolver.problems import make_problem

    comm = request.getfixturevalue("gpu_comm" if ranks == "all" else "self_comm")
    prob = make_problem(kind, 160, cond_b=cond_b, seed=3)
    w, X, desc = _solve(comm, prob, 16)
    assert_as_accurate_as_lapack(prob, w.get(), gather(X, desc, comm).get(), f"{kind} cond(B)={cond_b:g} {ranks}")


@pytest.mark.parametrize("stedc", ["gpu", "host", "dc"])
def test_gpu_bitwise_reproducible_and_identical_across_ranks(gpu_comm, stedc, monkeypatch):
    from hpccoll_eigensolver import gather, metrics
    from hpccoll_eigensolver.linalg.stedc import common as stedc_common
    from hpccoll_eigensolver.problems import make_problem

    monkeypatch.setattr(stedc_common, "LEAF_DEVICE", 64)  # n = 160 splits: the halves on two ranks

    prob = make_problem("clustered", 160, cond_b=1e2, seed=5)
    runs = [_solve(gpu_comm, prob, 32, stedc=stedc) for _ in range(2)]
    (w1, X1, desc), (w2, X2, _) = runs
    assert metrics.sha256(w1) == metrics.sha256(w2)
    assert metrics.sha256(X1) == metrics.sha256(X2)
    assert len(set(WORLD.allgather(metrics.sha256(w1)))) == 1
    assert metrics.sha256(gather(X1, desc, gpu_comm)) == metrics.sha256(gather(X2, desc, gpu_comm))


def test_gpu_ll128_path_is_accurate():
    from hpccoll_eigensolver import metrics
    from hpccoll_eigensolver.problems import make_problem

    c = hpccoll.Communicator(backend="cuda", algorithm="twoshot_ll128", deterministic=False)
    try:
        prob = make_problem("known", 150, cond_b=1e3, seed=2)
        w, _X, _ = _solve(c, prob, 32)
        assert metrics.eigenvalue_error(w.get(), prob.eigenvalues) < 1e-10
        assert len(set(WORLD.allgather(metrics.sha256(w)))) == 1  # every rank gets the owners' sums
    finally:
        c.Free()


def test_gpu_nccl_path_is_accurate(gpu_comm):
    """`--comm nccl`: the solve through NCCL's collectives (graph-captured column step included)
    as accurate as LAPACK; every rank the same eigenvalues."""
    from _gpu_checks import skip_where_nccl_refuses

    from hpccoll_eigensolver import gather, metrics
    from hpccoll_eigensolver.problems import make_problem

    skip_where_nccl_refuses(gpu_comm)
    c = hpccoll.Communicator(backend="nccl")
    try:
        seed = WORLD.bcast(int(np.random.SeedSequence().entropy % 2**31) if WORLD.rank == 0 else None)
        prob = make_problem("clustered", 173, cond_b=1e3, seed=seed)
        w, X, desc = _solve(c, prob, 32)
        assert_as_accurate_as_lapack(prob, w.get(), gather(X, desc, c).get(), f"nccl, seed {seed}")
        assert len(set(WORLD.allgather(metrics.sha256(w)))) == 1
    finally:
        c.Free()


def test_gpu_dc_copy_cols_matches_indexing():
    """stedc.merge._copy_cols on the GPU (dc_copy_cols) against NumPy's indexing: a gather into a
    new array, a scatter and a gather-scatter into row blocks of a column-major matrix (a view
    with an offset and its parent's leading dimension), fresh data and indices each time."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver.linalg.stedc.merge import _copy_cols

    rng = np.random.default_rng()
    for rows, ncols, m in ((300, 517, 200), (1, 9, 4), (4097, 70, 70)):
        src = np.asfortranarray(rng.standard_normal((rows, ncols)))
        sidx = rng.permutation(ncols)[:m].astype(np.int64)
        didx = rng.permutation(m + 5)[:m].astype(np.int64)
        got = _copy_cols(None, None, cp.asarray(src, order="F"), cp.asarray(sidx), cp)
        assert got.flags.f_contiguous and np.array_equal(got.get(), src[:, sidx])
        big = np.asfortranarray(rng.standard_normal((rows + 7, m + 5)))
        dst = cp.asarray(big, order="F")
        _copy_cols(dst[7:], cp.asarray(didx), cp.asarray(src, order="F"), cp.asarray(sidx), cp)
        want = big.copy()
        want[7:, didx] = src[:, sidx]
        assert np.array_equal(dst.get(), want)
        part = np.asfortranarray(rng.standard_normal((rows, m)))
        _copy_cols(dst[:rows], cp.asarray(didx), cp.asarray(part, order="F"), None, cp)
        want[:rows, didx] = part
        assert np.array_equal(dst.get(), want)


@pytest.mark.parametrize("n,nb", [(517, 32), (1100, 64), (2600, 64), (7300, 64)])
def test_gpu_sytrd_one_rank_deferred_sums_change_no_bit(self_comm, n, nb):
    """One rank: each kernel's grid-wide sums finished by the next kernel (sytrd_symv's blocks
    computing dlarfg's scalars, sytrd_w adding the product's partials: the default) give the same
    bits as the last blocks finishing them (defer=False, the path of several ranks), in graphs
    and eagerly: the tridiagonal, tau and the reflectors in C, fresh data each run; the sizes
    reach chunks of one, two and four SY_C columns and rows summed over many chunks."""
    import cupy as cp

    from hpccoll_eigensolver import BlockCyclic
    from hpccoll_eigensolver.linalg import sytrd_device as sd

    a = cp.random.standard_normal((n, n))
    C = cp.tril(a + a.T)
    desc = BlockCyclic(n, n, nb, 1)
    outs = {}
    for defer in (True, False):
        assert bool(sd._Step(cp.asfortranarray(C), desc, 0, None, defer).defer) == defer
        for mode in ("graph", "eager"):
            local = cp.asfortranarray(C)
            res = sd.sytrd_device(local, desc, self_comm, mode, defer=defer)
            outs[(defer, mode)] = [cp.asnumpy(x).tobytes() for x in res] + [local.get().tobytes()]
    ref = outs[(True, "graph")]
    assert all(out == ref for out in outs.values()), [k for k, out in outs.items() if out != ref]
    d, e, _ = (cp.asnumpy(x) for x in res)
    w = sl.eigvalsh_tridiagonal(d, e)
    assert abs(w - cp.linalg.eigvalsh(a + a.T).get()).max() <= 1e-10 * abs(w).max()


@pytest.mark.parametrize("n,nb", [(203, 32), (128, 64), (77, 16), (1100, 64)])
def test_gpu_sytrd_graph_eager_and_ops_agree(gpu_comm, n, nb):
    """The device column step replayed in CUDA graphs gives the same bits as the same kernels
    launched eagerly - the tridiagonal, tau and the reflectors left in C's columns - and the
    CuPy-op version's to rounding; C v from the lower triangle (sytrd_symv: tiles of 256 rows,
    so 1100 has 5 tiles and column chunks).  C holds its lower triangle only, as sygst leaves it."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver import BlockCyclic, distribute, gather
    from hpccoll_eigensolver.linalg.sytrd import sytrd_ops
    from hpccoll_eigensolver.linalg.sytrd_device import sytrd_device

    rng = np.random.default_rng(n + WORLD.Get_size())
    a = rng.standard_normal((n, n))
    C = WORLD.bcast((a + a.T) / 2, root=0)
    desc = BlockCyclic(n, n, nb, gpu_comm.size)
    outs = []
    for run in ("graph", "eager", "ops"):
        local = cp.asfortranarray(cp.asarray(distribute(np.tril(C), desc, gpu_comm.rank)))
        res = sytrd_ops(local, desc, gpu_comm, cp) if run == "ops" else sytrd_device(local, desc, gpu_comm, run)
        outs.append([cp.asnumpy(x) for x in res] + [gather(local, desc, gpu_comm).get()])
    for x, y in zip(outs[0], outs[1]):
        assert x.tobytes() == y.tobytes()
    for x, y in zip(outs[0], outs[2]):
        np.testing.assert_allclose(x, y, atol=1e-9 * n)
    d, sub = outs[0][0], outs[0][1]
    T = np.diag(d) + np.diag(sub, 1) + np.diag(sub, -1)
    np.testing.assert_allclose(np.linalg.eigvalsh(T), np.linalg.eigvalsh(C), atol=1e-11 * n * np.abs(C).max())
    V = outs[0][3]
    assert np.array_equal(V, np.tril(V, -1))                          # reflector j: rows j+1..
    assert len(set(WORLD.allgather(d.tobytes()))) == 1                # identical on every rank


def test_gpu_stedc_dc_matches_scipy(gpu_comm, monkeypatch):
    """The divide-and-conquer tridiagonal solver on the GPU (stedc="dc"; leaves of 128 rows, so
    n = 333 merges, the leaves on several streams), against SciPy's generalized eigenvalues."""
    from hpccoll_eigensolver import gather, metrics
    from hpccoll_eigensolver.linalg.stedc import common as stedc_common
    from hpccoll_eigensolver.problems import make_problem

    monkeypatch.setattr(stedc_common, "LEAF_DEVICE", 128)

    for kind in ("known", "clustered", "wilkinson"):
        prob = make_problem(kind, 333, cond_b=1e3, seed=13)
        w, X, desc = _solve(gpu_comm, prob, 32, stedc="dc")
        Xg = gather(X, desc, gpu_comm).get()
        ref = sl.eigh(prob.A, prob.B, eigvals_only=True)
        assert metrics.eigenvalue_error(w.get(), ref) < 1e-10, kind
        assert metrics.residual(prob.A, prob.B, Xg, w.get()) < 10, kind
        assert metrics.b_orthogonality(prob.B, Xg) < 100, kind


def _host_dc_tests():
    """tests/test_tridiag_dc.py (the host tests' hard matrices and tolerances)."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "unit" / "test_tridiag_dc.py"
    spec = importlib.util.spec_from_file_location("_host_dc_tests", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("leaf", [16, 64, 100])
def test_gpu_tridiag_dc_hard_matrices(leaf):
    """The divide and conquer on CuPy arrays (fused secular/vector kernels, GPU GEMMs) on the
    host tests' matrices, small leaves so every matrix merges several levels: the same bounds
    against LAPACK, leaves on the device (batched, one by one) and on the host, bitwise equal on
    a second solve."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver.linalg.stedc import eigh_tridiagonal_dc, leaves as stedc_leaves

    host = _host_dc_tests()
    seed = host._seed()
    eps = np.finfo(np.float64).eps
    for name, (d, e) in host._matrices(np.random.default_rng(seed)).items():
        n = d.size
        T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
        nt = max(np.abs(d).max(), np.abs(e).max())
        ref = sl.eigh_tridiagonal(d, e, eigvals_only=True)
        for leaves in ("batched", "device", "host"):
            stedc_leaves.LEAVES = leaves
            try:
                w, Z = eigh_tridiagonal_dc(cp.asarray(d), cp.asarray(e), cp, leaf=leaf)
                w2, Z2 = eigh_tridiagonal_dc(cp.asarray(d), cp.asarray(e), cp, leaf=leaf)
            finally:
                stedc_leaves.LEAVES = "batched"
            msg = f"{name} n={n} leaf={leaf} leaves={leaves} seed={seed}"
            assert isinstance(w, cp.ndarray) and isinstance(Z, cp.ndarray), msg
            assert w.get().tobytes() == w2.get().tobytes() and Z.get().tobytes() == Z2.get().tobytes(), msg
            w, Z = w.get(), Z.get()
            assert np.all(np.diff(w) >= 0), msg
            assert np.abs(w - ref).max() <= 10 * n * eps * nt, msg
            assert np.linalg.norm(Z.T @ Z - np.eye(n)) <= 10 * n * eps, msg
            assert np.linalg.norm(T @ Z - Z * w) <= 50 * n * eps * nt, msg


@pytest.fixture(scope="module")
def sentinel_comm():
    c = hpccoll.Communicator(backend="cuda", algorithm="oneshot_sentinel", deterministic=True)
    yield c
    c.Free()


@pytest.mark.parametrize("n,nb", [(203, 32), (77, 16), (1100, 64), (515, 8)])
def test_gpu_sytrd_fused_equals_the_collectives(sentinel_comm, n, nb):
    """The fused transfers (sentinel stores from sytrd_col and sytrd_symv into the peers, no
    collective launches) give the bits of the same kernels with the sentinel Bcast and
    Allreduce, at odd sizes and panel widths; twice in a row on the same workspace (every word
    re-armed: a stale one would be read as data and change the bits)."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver import BlockCyclic, distribute
    from hpccoll_eigensolver.linalg.sytrd_device import mode_for, sytrd_device

    if WORLD.allreduce(int(mode_for(sentinel_comm) != "fused"), op=MPI.MAX):
        pytest.skip("several ranks share a GPU: the fused transfers are off (sytrd_device.fusable)")
    rng = np.random.default_rng(7 * n + WORLD.Get_size())
    desc = BlockCyclic(n, n, nb, sentinel_comm.size)
    a = WORLD.bcast(rng.standard_normal((n, n)), root=0)
    C = (a + a.T) / 2
    outs = []
    for mode in ("graph", "fused", "fused"):
        local = cp.asfortranarray(cp.asarray(distribute(np.tril(C), desc, sentinel_comm.rank)))
        res = sytrd_device(local, desc, sentinel_comm, mode)
        outs.append([cp.asnumpy(x).tobytes() for x in (*res, local)])  # with the reflectors left in C
    assert outs[1] == outs[0]
    assert outs[2] == outs[0]
    assert len(set(WORLD.allgather(outs[1][0]))) == 1


def test_gpu_sytrd_fused_missing_peer_times_out():
    """A rank that never runs its column step: the others' polls give up after the
    communicator's timeout, and the workspace's check raises CollectiveTimeout naming that rank,
    instead of hanging.  (The column step is launched by hand: sytrd_device itself agrees on its
    graphs over MPI first, which an absent rank would never reach.)"""
    import time

    import cupy as cp
    import numpy as np

    from hpccoll.errors import CollectiveTimeout
    from hpccoll_eigensolver import BlockCyclic, distribute
    from hpccoll_eigensolver.linalg.sytrd_device import _Step, fused_workspace, mode_for, release_fused

    c = hpccoll.Communicator(backend="cuda", algorithm="oneshot_sentinel", deterministic=True, timeout=2.0)
    try:
        if WORLD.allreduce(int(mode_for(c) != "fused"), op=MPI.MAX):
            pytest.skip("several ranks share a GPU: the fused transfers are off")
        n, nb = 96, 16
        desc = BlockCyclic(n, n, nb, c.size)
        fw = fused_workspace(c, n)  # collective: every rank opens it
        absent = c.size - 1
        if c.rank != absent:
            a = np.random.default_rng(3).standard_normal((n, n))
            st = _Step(cp.asfortranarray(cp.asarray(distribute(a + a.T, desc, c.rank))), desc, c.rank, fw)
            st.begin_panel(0)
            t0 = time.perf_counter()
            st.column(desc.owner(0), None)  # the owner's column, the product, then w waits for `absent`
            cp.cuda.get_current_stream().synchronize()
            assert time.perf_counter() - t0 < 30
            with pytest.raises(CollectiveTimeout) as info:
                fw.check()
            assert info.value.peer == absent
        release_fused(c)
    finally:
        c.Free()


@pytest.mark.parametrize("k,cols", [(1, 1), (37, 5), (700, 300)])
def test_gpu_dc_vectors_kernel_matches_the_expression(k, cols):
    """dc_vectors (a block per column, only the rows the GEMMs read) against _u_chunk's CuPy
    expression on a real merge's roots: the same columns to rounding, unit norms, rows None
    left out."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver.linalg.stedc import secular, vectors

    rng = np.random.default_rng()
    d = np.sort(rng.standard_normal(k)) + np.arange(k) * 1e-3
    z = rng.standard_normal(k)
    z /= np.linalg.norm(z)
    rho = float(rng.uniform(0.5, 2.0))
    origin, tau = secular._secular(d, z, rho, cp)
    dx = cp.asarray(d)
    zhat = vectors._zhat(dx, origin, tau, cp.asarray(z), rho, cp)
    c0 = int(rng.integers(0, k - cols + 1))
    U = vectors._u_chunk(dx, zhat, origin, tau, c0, c0 + cols, cp).get()
    rows = rng.permutation(k)
    rL, rR = np.sort(rows[:k // 2]), np.sort(rows[k // 2:])
    UL, UR = vectors._u_rows(dx, zhat, origin, tau, c0, c0 + cols, cp.asarray(rL), cp.asarray(rR), cp)
    np.testing.assert_allclose(UL.get(), U[rL], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(UR.get(), U[rR], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(np.linalg.norm(U, axis=0), 1.0, rtol=1e-14)
    none, UR2 = vectors._u_rows(dx, zhat, origin, tau, c0, c0 + cols, None, cp.asarray(rR), cp)
    assert none is None and cp.array_equal(UR2, UR)


@pytest.mark.parametrize("n,nb", [(1100, 64), (2600, 64), (1900, 100)])
def test_gpu_one_rank_early_subtrees_overlap_and_change_no_bit(self_comm, n, nb):
    """One GPU rank solves the divide and conquer's early subtrees from sytrd's host loop, on the
    caller's stream, while the high-priority sytrd stream still reduces the last columns: the
    hooks are called before sytrd's last panel is done (they overlap it), and the solve has the
    same bits as one that runs every hook after the tridiagonalization, as sygvd's own; accurate against SciPy;
    fresh problem each run (odd n and a panel width that does not divide the leaves)."""
    import cupy as cp
    import numpy as np

    from hpccoll_eigensolver import BlockCyclic, metrics
    from hpccoll_eigensolver.linalg import sytrd_device as sd
    from hpccoll_eigensolver.counting import PhaseTimer
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.linalg.driver import _stedc, tridiagonalize
    from hpccoll_eigensolver.linalg.stedc import Early, early_ranges

    seed = int(np.random.SeedSequence().entropy % (1 << 30))
    prob = make_problem("clustered", n, cond_b=1e3, seed=seed)
    desc = BlockCyclic(n, n, nb, 1)
    ranges = early_ranges(n, device=True)
    assert ranges, n
    A, B = (cp.asfortranarray(cp.asarray(x)) for x in (prob.A, prob.B))
    early = Early(n, cp)
    seen = []   # (rows, was sytrd's stream still busy when the hook ran)
    stream = sd.kept_streams("sytrd", priority="high")[0]
    lo, hi = cp.cuda.Stream(non_blocking=True).priority, stream.priority
    assert hi < lo, (hi, lo)   # lower numbers are higher priorities
    hooks = [(rows, lambda d, e, fn=fn, rows=rows: (seen.append((rows, not stream.done)), fn(d, e)))
             for rows, fn in early.hooks]
    d, e, _, V, L = tridiagonalize(A, B, desc, self_comm, cp, PhaseTimer(cp, self_comm), "auto", hooks)
    assert [r for r, _ in seen] == [b for _, b in ranges] and set(early.solved) == set(ranges)
    if n - ranges[0][1] >= 500:   # ~10 ms of columns left after the first subtree's rows
        assert seen[0][1], f"the first early subtree ran after sytrd had finished (seed {seed})"
    w1, Z1 = _stedc(d, e, desc, self_comm, cp, True, "dc", early.solved)
    late = Early(n, cp)
    for _, fn in late.hooks:
        fn(d, e)
    w2, Z2 = _stedc(d, e, desc, self_comm, cp, True, "dc", late.solved)
    assert w1.get().tobytes() == w2.get().tobytes() and Z1.get().tobytes() == Z2.get().tobytes(), seed
    w, X, _ = _solve(self_comm, prob, nb)
    assert w.get().tobytes() == w1.get().tobytes(), seed
    w, X = w.get(), X.get()
    assert metrics.eigenvalue_error(w, sl.eigh(prob.A, prob.B, eigvals_only=True)) < 1e-10, seed
    assert metrics.residual(prob.A, prob.B, X, w) < 1.0, seed
    assert metrics.b_orthogonality(prob.B, X) < 100, seed


GPU_SCALES = [(1e-300, 1.0), (1e-150, 1.0), (1e300, 1.0), (1.0, 1e-300), (1.0, 1e300), (1e300, 1e300),
              (1e-300, 1e-300), (1e-150, 1e150)]


@pytest.mark.parametrize("ranks", ["all", "one"])
@pytest.mark.parametrize("sa,sb", GPU_SCALES, ids=[f"A{a:g}-B{b:g}" for a, b in GPU_SCALES])
def test_gpu_scaled_pairs_match_scipy(request, ranks, sa, sb):
    """The host's scaling cases (tests/mpi/test_eigensolver_cli_mpi.py) on the GPU path: A and B
    scaled anywhere in the float64 range solve to scipy.linalg.eigh's eigenvalues of the same
    matrices, with finite small residual and B-orthogonality (distributed and gathered), on all
    ranks and on one (cuSOLVER's whole-matrix potrf and its pivot check)."""
    from hpccoll_eigensolver import distribute, gather, metrics
    from hpccoll_eigensolver.problems import Problem, make_problem

    import cupy as cp

    comm = request.getfixturevalue("gpu_comm" if ranks == "all" else "self_comm")
    base = make_problem("known", 160, cond_b=1e3, seed=3)
    prob = Problem("known", base.A * sa, base.B * sb, None)
    w, X, desc = _solve(comm, prob, 16)
    wh = w.get()
    assert np.isfinite(wh).all() and bool(cp.isfinite(X).all())
    assert metrics.eigenvalue_error(wh, sl.eigh(prob.A, prob.B, eigvals_only=True)) < 1e-13
    acc = metrics.distributed_accuracy(cp.asarray(distribute(prob.A, desc, comm.rank)),
                                       cp.asarray(distribute(prob.B, desc, comm.rank)), X, w, desc, comm)
    assert 0 <= acc["residual"] < 1 and 0 < acc["b_orthogonality"] < 100, acc
    Xg = gather(X, desc, comm).get()
    assert metrics.residual(prob.A, prob.B, Xg, wh) < 1 and metrics.b_orthogonality(prob.B, Xg) < 100


@pytest.mark.parametrize("ranks", ["all", "one"])
def test_gpu_numerically_singular_B_and_overflowing_eigenvalues_raise(request, ranks):
    """cond(B) = 1e300 (the Cholesky succeeds): NotPositiveDefinite naming B; A ~ 1e300 with
    B ~ 1e-300 (eigenvalues ~ 1e600): NonFiniteResult; on every rank alike."""
    from hpccoll_eigensolver import NonFiniteResult, NotPositiveDefinite
    from hpccoll_eigensolver.problems import Problem, make_problem

    comm = request.getfixturevalue("gpu_comm" if ranks == "all" else "self_comm")
    base = make_problem("known", 96, cond_b=1e3, seed=3)
    with pytest.raises(NotPositiveDefinite, match="^B is not numerically positive definite: its Cholesky pivots"):
        _solve(comm, Problem("known", base.A, np.diag(np.geomspace(1.0, 1e-300, 96)), None), 16)
    with pytest.raises(NonFiniteResult, match="NaN or Inf in the eigenvalues"):
        _solve(comm, Problem("known", base.A * 1e300, base.B * 1e-300, None), 16)


@pytest.mark.parametrize("ranks", ["all", "one"])
@pytest.mark.parametrize("lo,hi", [(0, 0), (40, 46), (150, 159), (0, 159)])
def test_gpu_subset_matches_the_host_path_and_lapack(request, ranks, lo, hi):
    """subset_by_index on CuPy arrays: the tridiagonal subset on the host, the back-transformations
    on the device; the k columns in BlockCyclic(n, k, nb, P) as CuPy arrays, residual and
    B-orthogonality at LAPACK's level, w the same on every rank and close to SciPy's."""
    import cupy as cp

    from hpccoll_eigensolver import BlockCyclic, gather, metrics
    from hpccoll_eigensolver.problems import make_problem

    comm = request.getfixturevalue("gpu_comm" if ranks == "all" else "self_comm")
    prob = make_problem("clustered", 160, cond_b=1e8, seed=3)
    w, X, desc = _solve(comm, prob, 16, subset_by_index=(lo, hi))
    k = hi - lo + 1
    assert isinstance(X, cp.ndarray) and X.shape == (160, BlockCyclic(160, k, 16, comm.size).local_n(comm.rank))
    assert len(set(WORLD.allgather(metrics.sha256(w)))) == 1
    Xg = gather(X, BlockCyclic(160, k, 16, comm.size), comm).get()
    ws, Xs = sl.eigh(prob.A, prob.B, subset_by_index=(lo, hi))
    wl, Xl = sl.eigh(prob.A, prob.B)
    assert np.abs(w.get() - ws).max() <= 1e-6 * np.abs(wl).max()
    assert metrics.residual(prob.A, prob.B, Xg, w.get()) <= 2 * max(metrics.residual(prob.A, prob.B, Xs, ws),
                                                                    metrics.residual(prob.A, prob.B, Xl, wl))
    assert np.abs(Xg.T @ prob.B @ Xg - np.eye(k)).max() <= 2 * np.abs(Xl.T @ prob.B @ Xl - np.eye(160)).max()


def test_gpu_solver_object_solves_many_a_as_fresh_sygvd(gpu_comm):
    """GeneralizedSolver on CuPy arrays: B factored once; each later solve (full, subset,
    eigenvalues only) the same bits as a fresh sygvd of the pair."""
    import cupy as cp

    from hpccoll_eigensolver import BlockCyclic, GeneralizedSolver, distribute, sygvd
    from hpccoll_eigensolver.problems import make_problem

    n, nb = 200, 32
    desc = BlockCyclic(n, n, nb, gpu_comm.size)
    first, second = make_problem("known", n, cond_b=1e6, seed=7), make_problem("wilkinson", n, cond_b=1e6, seed=8)
    B = cp.asarray(distribute(first.B, desc, gpu_comm.rank))
    A1, A2 = (cp.asarray(distribute(p.A, desc, gpu_comm.rank)) for p in (first, second))
    with GeneralizedSolver(B, desc, gpu_comm) as solver:
        for options in ({}, {"subset_by_index": (5, 27)}, {"eigvals_only": True}):
            solver.solve(A1, **options)
            w, X = solver.solve(A2, **options)
            wf, Xf = sygvd(A2, B, desc, gpu_comm, **options)
            assert w.tobytes() == wf.tobytes()
            assert (X is None and Xf is None) or X.tobytes() == Xf.tobytes()
