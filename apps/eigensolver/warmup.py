"""Compile the device code of a solve before the communicator opens.

A tiny solve on this rank alone (local_comm: the host backend on MPI.COMM_SELF) makes CuPy
compile every elementwise, reduction and raw kernel that the real run uses - the problem's
construction, the input checks, the solver, the accuracy metrics - so that no run-time compile
happens once hpccoll's CUDA backend is open, nor inside a timed solve.  CuPy caches the
kernels for the process (and on disk)."""
from __future__ import annotations


def local_comm():
    """This rank alone on hpccoll's host backend (MPI.COMM_SELF): no peer, no GPU communicator."""
    from mpi4py import MPI

    from hpccoll import Communicator

    return Communicator(MPI.COMM_SELF, backend="host", deterministic=True)


def warm_up(nb: int = 8, stedc: str = "auto") -> None:
    """Build and solve a small known problem on this rank's GPU the way `solve` does: problem
    columns, symmetrization, input checks, sygvd, the distributed metrics and the column
    digests, and the two-stage reduction, a subset and eigenvalues only.  n is large enough for
    the branches a large one-rank solve takes, each of which compiles kernels of its own: sygst's
    panel loop past its first 1024-column panel, and for the divide and conquer (stedc "auto" or
    "dc") ten equal leaves and a short one, solved once more as one whole tree (a batch of equal
    leaves, more than 8 rows gathered at once: CuPy's single-kernel concatenation); then the
    several-rank branches' kernels (warm_ranks) and the trailing updates' GEMMs."""
    import cupy as cp
    from mpi4py import MPI

    from . import metrics
    from .checks import check_input
    from .linalg.layout import BlockCyclic
    from .problems import generated_columns, parse_problem
    from .tiles import symmetrize
    from .linalg.driver import stedc_choice, sygvd
    from .linalg.sygst import SYGST_ONE_RANK_NB_DEVICE
    from .linalg.stedc.common import LEAF_DEVICE

    stedc = stedc_choice(stedc, device=True)
    n = max(10 * LEAF_DEVICE if stedc == "dc" else 0, SYGST_ONE_RANK_NB_DEVICE) + 37
    spec = parse_problem("known", n, cond_b=10.0, seed=1)
    desc = BlockCyclic(n, n, nb, 1)
    A, B = generated_columns(spec, desc.local_cols(0), cp)
    symmetrize(A, desc, MPI.COMM_SELF)
    symmetrize(B, desc, MPI.COMM_SELF)
    check_input(A, B, desc, MPI.COMM_SELF, check_symmetry=True)
    with local_comm() as comm:
        w, X = sygvd(A, B, desc, comm, stedc=stedc)
        metrics.distributed_accuracy(A, B, X, w, desc, comm)
        # the two-stage reduction's, the subset's and the eigenvalues-only kernels (bulge
        # chasing, Q2 by levels, bisection and inverse iteration: their own CUDA sources)
        sygvd(A, B, desc, comm, stedc=stedc, reduction="two-stage")
        sygvd(A, B, desc, comm, stedc=stedc, reduction="two-stage", eigvals_only=True, subset_by_index=(0, 9))
        sygvd(A, B, desc, comm, stedc=stedc, subset_by_index=(0, 9))
        sygvd(A, B, desc, comm, stedc=stedc, eigvals_only=True)
    metrics.column_digests(X)
    metrics.sha256(w)
    if stedc == "dc":
        # one divide and conquer of the whole tree of ten equal leaves and a short one: the
        # solve above splits its tree (stedc.Early), so none of its solves gathers more
        # than eight leaves' rows at once (CuPy's concatenation of more than eight strided rows,
        # as the early subtrees of a large solve and every solve of several ranks do)
        import numpy as np

        from .linalg.stedc import eigh_tridiagonal_dc

        rng = np.random.default_rng(1)
        eigh_tridiagonal_dc(cp.asarray(rng.standard_normal(n)), cp.asarray(rng.standard_normal(n - 1)), cp)
    # more than 8 equal contiguous arrays: CuPy's same-size concatenation kernel (the leaves'
    # eigenvalues when a solve's leaves all have LEAF_DEVICE rows; the solves above have a short one)
    cp.concatenate([cp.zeros(4) for _ in range(9)])
    # a 32-bit pattern fill, as hpccoll's CUDA communicator arms its buffers when it opens
    cp.empty(64, dtype=cp.uint32).fill(0xFFFAFFFA)
    warm_ranks()
    warm_gemms()
    cp.cuda.get_current_stream().synchronize()


def warm_ranks(n: int = 300, w: int = 8) -> None:
    """The kernels of the several-rank branches that the one-rank solve above does not take
    (bench/late_builds.py lists any a solve still builds): potrf's panel Cholesky, a small
    cuSOLVER potrf whose result CuPy masks to its lower triangle, and ormtr's reflector block
    masked by the live reflectors (a column-major block times a boolean row)."""
    import cupy as cp

    from .linalg.potrf import potrf_block

    B = cp.asfortranarray(cp.eye(n) * 2.0)
    potrf_block(cp, B[n - w:, n - w:])
    Vb = cp.zeros((n, w), dtype=cp.float64, order="F")
    lives = cp.arange(2 * w) != 0
    Vb *= lives[w:][None, :]


def warm_gemms(m: int = 4096, cols: int = 1024) -> None:
    """One in-place GEMM (_xp.gemm_acc) of every operand layout and inner dimension the trailing
    updates use, at a size where cuBLAS picks the kernels of a large solve (the tiny solve above
    makes it pick others), so that they are loaded before the timed solve."""
    import cupy as cp

    from .linalg._xp import gemm_acc

    out = cp.zeros((m, cols), dtype=cp.float64, order="F")
    for k in (64, 128, 256, 512):  # potrf's panel, sygst's / sytrd's two; on one rank the 256-column panels
        a = cp.ones((m, k), dtype=cp.float64, order="F")
        b = cp.ones((k, cols), dtype=cp.float64, order="F")
        rights = (b, cp.ascontiguousarray(b))
        for left in (a, cp.ascontiguousarray(a)):
            for right in rights:
                gemm_acc(cp, out, left, right)
