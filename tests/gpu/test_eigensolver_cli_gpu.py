"""hpccoll-eigensolver solve --scf and --subset on GPUs (its main in this process on every rank,
--comm sentinel): each solve of the loop bitwise equal to a fresh solve of its pair, and the
loop's A_j built by CuPy with NumPy's bits.

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_eigensolver_cli_gpu.py"""
from __future__ import annotations

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from _gpu_checks import assert_bitwise

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=1)]
WORLD = MPI.COMM_WORLD
N, NB = 301, 32      # odd n, nb not dividing it


def _solve(cli_main, argv):
    """solve ARGV on every rank (a cold GPU compiles its kernels first: up to minutes)."""
    code, _, err = cli_main(["solve", *argv], timeout=600)
    assert WORLD.allgather(code) == [0] * WORLD.Get_size(), err


def test_scf_operand_has_numpys_bits_on_the_gpu():
    import cupy as cp

    from hpccoll_eigensolver.problems import make_problem, scf_operand

    A = make_problem("random", N, seed=4).A
    scale = 1e-3 * float(np.abs(A).max())
    for j in (1, 2):
        host = scf_operand(A, np.arange(N), j, scale, 4)
        assert_bitwise(cp.asnumpy(scf_operand(cp.asarray(A), np.arange(N), j, scale, 4)), host, f"A_{j}")


@pytest.mark.parametrize("extra", [(), ("--subset", "10:60")], ids=["all", "subset"])
def test_scf_solves_are_bitwise_fresh_solves_on_the_gpu(cli_main, tmp_path_factory, extra):
    """--scf 3 against a plain solve (solve 0) and solves of A_j, B from .npy files (A_j and B
    as the GPU builds them: CuPy's bits).  cli_main: tests/conftest.py."""
    import cupy as cp

    from hpccoll_eigensolver.problems import make_problem, scf_operand

    rank = WORLD.Get_rank()
    out = WORLD.bcast(str(tmp_path_factory.mktemp("scf-gpu")) if rank == 0 else None, root=0)
    common = ["--n", N, "--nb", NB, "--comm", "sentinel", "--out", out, "--no-reference", *extra]
    _solve(cli_main, [*common, "--name", "loop", "--scf", 3])
    _solve(cli_main, [*common, "--name", "plain"])
    prob = make_problem("known", N, xp=cp)
    scale = 1e-3 * float(cp.abs(prob.A).max())
    if rank == 0:
        for j in (1, 2):
            np.save(os.path.join(out, f"A{j}.npy"), cp.asnumpy(scf_operand(prob.A, np.arange(N), j, scale, 0)))
        np.save(os.path.join(out, "B.npy"), cp.asnumpy(prob.B))
    WORLD.Barrier()
    for j in (1, 2):
        files = f"file:{os.path.join(out, f'A{j}.npy')},{os.path.join(out, 'B.npy')}"
        _solve(cli_main, [*common[2:], "--problem", files, "--name", f"fresh{j}"])
    if rank != 0:
        return
    fresh = ["plain_run000", "fresh1_run000", "fresh2_run000"]
    for j, other in enumerate(fresh):
        with open(os.path.join(out, f"loop_run000_s{j:03d}.json")) as f:
            rec = json.load(f)
        assert rec["scf"]["scale"] == scale and ("potrf" in rec["phases"]) == (j == 0)
        for suffix in ("_w.npy", "_X.npy"):
            got = np.load(os.path.join(out, f"loop_run000_s{j:03d}{suffix}"))
            assert_bitwise(got, np.load(os.path.join(out, other + suffix)), f"solve {j} {suffix}")
