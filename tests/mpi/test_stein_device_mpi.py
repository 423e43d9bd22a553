"""The distributed form of the GPU tridiagonal subset (stein_device.stein_subset_device) under
MPI, run on the host through the kernels' NumPy twin (stein_twin.TwinOps): the same w on every
rank, each rank's columns in BlockCyclic(n, k, nb, P) as stein.stein_subset lays them out, and
the gathered vectors bitwise those of one process (a vector's bits do not depend on P).

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_stein_device_mpi.py"""
from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, gather
from hpccoll_eigensolver.linalg.stein import stein_subset
from hpccoll_eigensolver.linalg.stein_device import stein_subset_device
from hpccoll_eigensolver.linalg.stein_twin import TwinOps

pytestmark = pytest.mark.mpi(min_size=1)
WORLD = MPI.COMM_WORLD
NB = 4


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


def _problem(case: str):
    """(d, e), fresh random data drawn on rank 0 and shared."""
    rng = np.random.default_rng()
    n = int(rng.integers(45, 70)) | 1
    d, e = rng.standard_normal(n), rng.standard_normal(n - 1)
    if case == "glued":                            # clusters of 21 across the ranks' shares
        d = np.tile(np.abs(np.arange(21) - 10.0), 3)
        e = np.ones(62)
        e[20::21] = 1e-12
    elif case == "split":
        e[rng.choice(n - 1, 5, replace=False)] = 0.0
    return WORLD.bcast((d, e), root=0)


@pytest.mark.parametrize("case", ["random", "glued", "split"])
@pytest.mark.parametrize("part", ["all", "low", "one"])
def test_distributed_subset_is_the_one_process_result(comm, case, part):
    d, e = _problem(case)
    n = d.shape[0]
    lo, hi = {"all": (0, n - 1), "low": (2, n // 3), "one": (n // 2, n // 2)}[part]
    k = hi - lo + 1
    w, X = stein_subset_device(d, e, lo, hi, NB, comm, np, ops=TwinOps())
    desc = BlockCyclic(n, k, NB, comm.size)
    assert X.shape == (n, desc.local_n(comm.rank)) and X.flags.f_contiguous
    assert len(set(WORLD.allgather(w.tobytes()))) == 1
    w1, Z1 = stein_subset_device(d, e, lo, hi, ops=TwinOps())
    assert np.array_equal(w, w1)
    assert np.array_equal(gather(X, desc, comm), Z1)
    _, Xh = stein_subset(d, e, lo, hi, NB, comm, np)   # the host path: the same layout
    assert Xh.shape == X.shape
