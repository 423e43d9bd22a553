"""Compile the device code of a solve before the communicator opens.

A tiny solve on one rank (LocalComm: no MPI traffic) makes CuPy compile every elementwise,
reduction and raw kernel the real solve and its accuracy metrics use, so no run-time compile
happens after hpccoll's CUDA backend is open - the place where CuPy's NVRTC failed on the GPU
machine of 2026-11-30 (hpccoll._nvrtc now shares CuPy's NVRTC; this keeps compiles out of the
timed runs either way).  CuPy caches the kernels for the process (and on disk)."""
from __future__ import annotations


class LocalComm:
    """A one-rank stand-in for a Communicator: Bcast is a no-op, reductions are copies."""

    backend = "local"
    rank, size = 0, 1

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 1

    @property
    def mpi_comm(self):
        from mpi4py import MPI

        return MPI.COMM_SELF

    def Bcast(self, buf, root: int = 0, **_kw) -> None:
        pass

    def Allreduce(self, sendbuf, recvbuf, *_a, **_kw) -> None:
        recvbuf[...] = sendbuf

    def Allgather(self, sendbuf, recvbuf, **_kw) -> None:
        recvbuf.reshape((1,) + tuple(sendbuf.shape))[0] = sendbuf


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
    comm = LocalComm()
    desc = BlockCyclic(prob.n, prob.n, nb, 1)
    A, B = cp.asarray(prob.A), cp.asarray(prob.B)
    w, X = sygvd(cp.asarray(distribute(prob.A, desc, 0)), cp.asarray(distribute(prob.B, desc, 0)), desc, comm,
                 stedc=stedc)
    Xg = gather(X, desc, comm)
    metrics.residual(A, B, Xg, w)
    metrics.b_orthogonality(B, Xg)
    metrics.eigenvalue_error(w, prob.eigenvalues)
    metrics.sha256(w)
    cp.cuda.get_current_stream().synchronize()
