"""Compile the device code of a solve before the communicator opens.

A tiny solve on this rank alone (local_comm: the host backend on MPI.COMM_SELF) makes CuPy compile every elementwise,
reduction and raw kernel the real solve and its accuracy metrics use, so no run-time compile
happens after hpccoll's CUDA backend is open - the place where CuPy's NVRTC failed on the GPU
machine of 2026-11-30 (hpccoll._nvrtc now shares CuPy's NVRTC; this keeps compiles out of the
timed runs either way).  CuPy caches the kernels for the process (and on disk)."""
from __future__ import annotations


def local_comm():
    """This rank alone on hpccoll's host backend (MPI.COMM_SELF): no peer, no GPU communicator."""
    from mpi4py import MPI

    from hpccoll import Communicator

    return Communicator(MPI.COMM_SELF, backend="host", deterministic=True)


def warm_up(nb: int = 8, stedc: str = "auto") -> None:
    """Solve a small known problem on this rank's GPU (n = 3 nb + 5; one leaf + 37 for
    stedc="dc") and evaluate its accuracy."""
    import cupy as cp

    from . import metrics
    from .layout import BlockCyclic, distribute, gather
    from .problems import make_problem
    from .solver import sygvd
    from .tridiag_dc import LEAF_DEVICE

    n = LEAF_DEVICE + 37 if stedc == "dc" else 3 * nb + 5  # dc: past one leaf, so the merge compiles too
    prob = make_problem("known", n, cond_b=10.0, seed=1)
    desc = BlockCyclic(prob.n, prob.n, nb, 1)
    A, B = cp.asarray(prob.A), cp.asarray(prob.B)
    with local_comm() as comm:
        w, X = sygvd(cp.asarray(distribute(prob.A, desc, 0)), cp.asarray(distribute(prob.B, desc, 0)), desc,
                     comm, stedc=stedc)
        Xg = gather(X, desc, comm)
    metrics.residual(A, B, Xg, w)
    metrics.b_orthogonality(B, Xg)
    metrics.eigenvalue_error(w, prob.eigenvalues)
    metrics.sha256(w)
    cp.cuda.get_current_stream().synchronize()
