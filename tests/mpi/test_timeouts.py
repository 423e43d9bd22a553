"""Every accepted timeout is honoured on the host backend (2 and 3 ranks): one beyond the range
of a deadline in nanoseconds (1e10 s), or math.inf, waits for a rank that comes late, on the
shared-memory path and on the MPI path; a finite one still raises CollectiveTimeout when a rank
never comes."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest
from mpi4py import MPI

import hpccoll
from hpccoll import CollectiveTimeout
from hpccoll.backends.host import SHM_SLOT_BYTES

pytestmark = pytest.mark.mpi(min_size=2)

WORLD = MPI.COMM_WORLD
#: float64 elements: within one shared-memory slot, and above it (the MPI path)
SIZES = {"shm": 16, "mpi": SHM_SLOT_BYTES // 8 + 1}


@pytest.mark.parametrize("path", list(SIZES))
@pytest.mark.parametrize("timeout", [1e10, math.inf], ids=["1e10", "inf"])
def test_a_timeout_beyond_the_clocks_range_waits_for_a_late_rank(path, timeout):
    c = hpccoll.Communicator(backend="host", check=False, timeout=timeout)
    assert c.timeout == timeout
    if path == "shm":
        assert c._host.shm is not None, c._host.shm_off
    n = SIZES[path]
    x, out = np.full(n, WORLD.rank + 1.0), np.empty(n)
    WORLD.Barrier()
    if WORLD.rank == WORLD.size - 1:
        time.sleep(0.5)
    c.Allreduce(x, out)
    assert np.all(out == WORLD.size * (WORLD.size + 1) / 2)
    c.Free()


@pytest.mark.parametrize("path", list(SIZES))
def test_a_finite_timeout_still_raises_when_a_rank_never_comes(path):
    c = hpccoll.Communicator(backend="host", check=False, timeout=0.3)
    n = SIZES[path]
    x, out = np.ones(n), np.empty(n)
    WORLD.Barrier()
    if WORLD.rank != WORLD.size - 1:
        t0 = time.monotonic()
        with pytest.raises(CollectiveTimeout, match="Allreduce: rank .* waited 0.3 s"):
            c.Allreduce(x, out)
        assert time.monotonic() - t0 < 10
    WORLD.Barrier()
    # Not freed: the ranks disagree about the calls made on it (the job's end frees the MPI side).
