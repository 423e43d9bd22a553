"""The Case: one collective at one size on one rank - its buffers, the call as a user writes
it, and the check of a result against a float64 reference built from every rank's input."""
from __future__ import annotations

import functools

import numpy as np

from .collectives import COLLECTIVE_CALL
from .ranks import agree


class Case:
    """Buffers of one (collective, size) on one rank (`xp`: numpy, or cupy for device buffers).
    The input is random and fixed per (rank, count): every check can rebuild the reference."""

    def __init__(self, collective: str, nbytes: int, dtype: str, rank: int, size: int, xp):
        from ..ops import np_dtype

        self.collective, self.rank, self.size, self.xp = collective, rank, size, xp
        self.np_dtype = np_dtype(dtype)
        esize = self.np_dtype.itemsize
        self.count = max(1, nbytes // esize)
        self.nbytes = self.count * esize
        rng = np.random.default_rng([rank, self.count, 12345])
        n = size
        host_in = {"allreduce": self.count, "bcast": self.count, "allgather": self.count,
                   "reduce_scatter": self.count * n}[collective]
        if self.np_dtype.kind == "f" or self.np_dtype.itemsize == 2 and self.np_dtype.kind == "V":
            base = rng.uniform(-1, 1, host_in)  # (bfloat16 is numpy kind "V")
        else:
            base = rng.integers(-100, 100, host_in)
        self.host_send = base.astype(self.np_dtype)
        out_n = {"allreduce": self.count, "bcast": self.count, "allgather": self.count * n,
                 "reduce_scatter": self.count}[collective]
        self.send = self._to_dev(self.host_send)
        self.recv = self.send if collective == "bcast" else self._to_dev(np.zeros(out_n, self.np_dtype))
        if collective == "bcast" and rank != 0:
            self.recv[...] = self._to_dev(np.zeros(out_n, self.np_dtype))

    def _to_dev(self, a):
        if self.xp is np:
            return a.copy()
        return self.xp.asarray(a)

    def prepare(self):
        """hpccoll._validate.Call of this case (for the in-kernel mode, which runs the backend)."""
        from .. import SUM
        from .._validate import prepare

        if self.collective == "bcast":
            return prepare("Bcast", self.size, None, self.recv, root=0)
        return prepare(COLLECTIVE_CALL[self.collective], self.size, self.send, self.recv, op=SUM)

    def call(self, comm, algorithm=None, deterministic=None, stream=None):
        self.bound(comm, algorithm, deterministic)(stream=stream)

    def bound(self, comm, algorithm=None, deterministic=None):
        """The blocking call as a user writes it, bound once: comm.Allreduce(send, recv), with
        the keywords only where they differ from the communicator's own policy (the eager
        columns time this, not the bench's own argument handling)."""
        kw = {}
        if algorithm is not None and algorithm != comm.algorithm:
            kw["algorithm"] = algorithm
        if deterministic is not None and bool(deterministic) != comm.deterministic:
            kw["deterministic"] = deterministic
        args = {"allreduce": (comm.Allreduce, self.send, self.recv),
                "bcast": (comm.Bcast, self.recv),
                "allgather": (comm.Allgather, self.send, self.recv),
                "reduce_scatter": (comm.Reduce_scatter_block, self.send, self.recv)}[self.collective]
        return functools.partial(*args, **kw)

    def reset(self, full: bool = False) -> None:
        """Bcast works in place: clear the receivers' buffers so every check sees a fresh result
        (full: every collective's output)."""
        if self.collective == "bcast":
            if self.rank != 0:
                self.recv[...] = 0
        elif full:
            self.recv[...] = 0

    def host_result(self, arr=None) -> np.ndarray:
        """The output (or `arr`) as a numpy array."""
        a = self.recv if arr is None else arr
        if self.xp is np:
            return np.asarray(a)
        return a.get()

    def check(self, mpi_comm, result: np.ndarray) -> bool:
        """Result against a float64 reference built from every rank's gathered input; True on
        every rank only when it holds on every rank (collective)."""
        allin = mpi_comm.allgather(self.host_send)
        x = np.stack([a.astype(np.float64) for a in allin])  # [n, host_in]
        n = self.size
        if self.collective == "allreduce":
            ref = x.sum(axis=0)
        elif self.collective == "bcast":
            ref = x[0]
        elif self.collective == "allgather":
            ref = x.reshape(-1)
        else:
            ref = x.reshape(n, n, self.count)[:, self.rank, :].sum(axis=0)
        res = np.asarray(result).astype(np.float64).reshape(-1)
        eps = {8: 1e-12, 4: 1e-5, 2: 1e-2}.get(self.np_dtype.itemsize, 1e-5)
        if self.np_dtype.itemsize == 2 and self.np_dtype.name != "float16":
            eps = 2e-2  # bfloat16
        tol = eps * n if self.collective in ("allreduce", "reduce_scatter") else eps
        ok = res.shape == ref.shape and bool(np.allclose(res, ref, rtol=tol, atol=tol * n))
        return agree(mpi_comm, ok)
