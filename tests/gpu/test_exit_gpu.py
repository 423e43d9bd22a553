"""A program that ends while a CUDA graph of captured NCCL calls is still alive exits cleanly.

NCCL's destroy waits until every graph that captured the communicator's calls is destroyed, so
`Free()` hands the release to a thread of its own (tests/gpu/test_group_gpu.py checks that).
Here each rank keeps such a graph in a module global to the end: the interpreter exits, and MPI
finalizes, with that release still waiting.  The check is the MPI job's exit status:
tests/gpu/run.sh marks this file failed when mpiexec exits non-zero or runs past its limit, so
the file holds this one test only.

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_exit_gpu.py; echo $?
"""
from __future__ import annotations

import time

import numpy as np
import pytest
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture
from _gpu_checks import world as _world

import hpccoll

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

_KEPT = []  # lives until the interpreter exits


def test_a_program_keeping_a_graph_of_nccl_calls_to_its_end_exits_cleanly(cc):
    """Each rank alone (a one-rank NCCL communicator, which runs with ranks sharing a GPU too):
    capture an Allreduce, replay it, check it, Free() (returns at once), and keep the graph."""
    import cupy as cp

    sub = _world().Split(cc.rank, 0)
    c = hpccoll.Communicator(sub, backend="nccl")
    h = np.random.default_rng().standard_normal(1001)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        x, y = cp.asarray(h), cp.zeros(h.size)
        s.begin_capture()
        c.Allreduce(x, y, stream=s)
        g = s.end_capture()
    g.launch(stream=s)
    s.synchronize()
    assert np.array_equal(cp.asnumpy(y), h)
    t0 = time.monotonic()
    c.Free()
    assert time.monotonic() - t0 < 10, "Free waited for the graph"
    assert c._backend.releaser is not None and c._backend.releaser.is_alive()  # NCCL waits for g
    _KEPT.append((g, s, x, y))
