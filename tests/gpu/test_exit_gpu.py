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

import numpy as np
import pytest
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture
from _gpu_checks import replay_captured_allreduce_then_free
from _gpu_checks import world as _world

import hpccoll

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

_KEPT = []  # lives until the interpreter exits


def test_a_program_keeping_a_graph_of_nccl_calls_to_its_end_exits_cleanly(cc):
    """Each rank alone (a one-rank NCCL communicator, which runs with ranks sharing a GPU too):
    capture an Allreduce, replay it, check it, Free() (returns at once), and keep the graph."""
    sub = _world().Split(cc.rank, 0)
    c = hpccoll.Communicator(sub, backend="nccl")
    h = np.random.default_rng().standard_normal(1001)
    got, kept = replay_captured_allreduce_then_free(c, h)
    assert np.array_equal(got, h)
    _KEPT.append(kept)
