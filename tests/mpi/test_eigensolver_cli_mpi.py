"""The eigensolver app's distributed pieces under MPI (any number of ranks; tests/run uses 2, 3
and 4): problems built by column block, input checks that agree across ranks, metrics and
digests without gathering, X written by columns.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_cli_mpi.py"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd
from hpccoll_eigensolver.checks import InputError, check_input
from hpccoll_eigensolver.runs import build_local_problem, write_vectors
from hpccoll_eigensolver.problems import gather_problem_on_root, make_problem, parse_problem
from hpccoll_eigensolver.tiles import asymmetry, symmetrize

pytestmark = pytest.mark.mpi(min_size=1)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()


@pytest.fixture(scope="module")
def comm():
    c = hpccoll.Communicator(backend="host", deterministic=True)
    yield c
    c.Free()


@pytest.mark.parametrize("kind,n,nb", [("known", 101, 8), ("clustered", 64, 16), ("wilkinson", 37, 5),
                                       ("random", 90, 7), ("known", 5, 64)])
def test_columns_have_the_bits_of_the_one_process_problem(kind, n, nb):
    """Built by column block on every rank and symmetrized by tile exchange: the same bits as
    make_problem on one process, whatever the number of ranks (1 here, 2, 3 and 4 in tests/run)."""
    spec = parse_problem(kind, n, cond_b=1e3, seed=11)
    desc = BlockCyclic(n, n, nb, SIZE)
    A, B, digests = build_local_problem(spec, desc, WORLD, np)
    assert digests is None
    whole = make_problem(kind, n, cond_b=1e3, seed=11)
    assert A.tobytes() == distribute(whole.A, desc, RANK).tobytes()
    assert B.tobytes() == distribute(whole.B, desc, RANK).tobytes()
    assert A.flags.f_contiguous and B.flags.f_contiguous


def test_symmetrize_is_the_one_process_formula_and_asymmetry_sees_one_entry():
    n = 53
    desc = BlockCyclic(n, n, 6, SIZE)
    M = np.random.default_rng(1).standard_normal((n, n))
    loc = distribute(M, desc, RANK)
    assert asymmetry(loc, desc, WORLD) == pytest.approx(np.abs(M - M.T).max())
    symmetrize(loc, desc, WORLD)
    assert loc.tobytes() == distribute((M + M.T) / 2, desc, RANK).tobytes()
    assert asymmetry(loc, desc, WORLD) == 0.0
    S = (M + M.T) / 2
    S[50, 2] += 1e-3
    assert asymmetry(distribute(S, desc, RANK), desc, WORLD) == pytest.approx(1e-3, rel=1e-6)


def _bad(which: str, n: int = 40):
    p = make_problem("known", n, seed=3)
    A, B = p.A.copy(), p.B.copy()
    if which == "nan":
        A[31, 38] = np.nan          # a column of the last rank with nb = 8 at 2 or 3 ranks
    elif which == "inf-B":
        B[2, 1] = B[1, 2] = np.inf
    elif which == "asym":
        A[0, 39] += 1e-6
    elif which == "diag":
        B[17, 17] = -2.0
    return A, B


@pytest.mark.parametrize("which,needle", [("nan", r"A\[31, 38\] = nan"), ("inf-B", "B must be finite"),
                                          ("asym", "A is not symmetric"), ("diag", r"B\[17, 17\] = -2")])
def test_check_input_raises_the_same_error_on_every_rank(which, needle):
    A, B = _bad(which)
    desc = BlockCyclic(40, 40, 8, SIZE)
    with pytest.raises(InputError, match=needle) as e:
        check_input(distribute(A, desc, RANK), distribute(B, desc, RANK), desc, WORLD)
    assert len(set(WORLD.allgather(str(e.value)))) == 1


def test_check_input_accepts_a_good_problem_and_measures_its_symmetry():
    p = make_problem("random", 40, seed=3)
    desc = BlockCyclic(40, 40, 8, SIZE)
    got = check_input(distribute(p.A, desc, RANK), distribute(p.B, desc, RANK), desc, WORLD, sym_tol=0.0)
    assert got["asymmetry_A"] == 0.0 and got["asymmetry_B"] == 0.0


def test_distributed_metrics_and_digests_match_the_gathered_ones(comm):
    p = make_problem("clustered", 75, cond_b=1e2, seed=5)
    desc = BlockCyclic(75, 75, 8, SIZE)
    A, B = distribute(p.A, desc, RANK), distribute(p.B, desc, RANK)
    w, X = sygvd(A, B, desc, comm)
    Xg = gather(X, desc, comm)
    Xp = Xg + 1e-9 * np.random.default_rng(0).standard_normal(Xg.shape)   # an error to measure
    for chunk in (None, 8 * 75 * 3):
        got = metrics.distributed_accuracy(A, B, X, w, desc, WORLD, chunk_bytes=chunk)
        assert 0.5 < got["residual"] / metrics.residual(p.A, p.B, Xg, w) < 2    # rounding, any order
        assert 0.5 < got["b_orthogonality"] / metrics.b_orthogonality(p.B, Xg) < 2
        assert len({(v["residual"], v["b_orthogonality"]) for v in WORLD.allgather(got)}) == 1
        got = metrics.distributed_accuracy(A, B, distribute(Xp, desc, RANK), w, desc, comm, chunk_bytes=chunk)
        assert got["residual"] == pytest.approx(metrics.residual(p.A, p.B, Xp, w), rel=1e-6)
        assert got["b_orthogonality"] == pytest.approx(metrics.b_orthogonality(p.B, Xp), rel=1e-6)
    cols = WORLD.gather(metrics.column_digests(X), root=0)
    if RANK == 0:
        ordered = [None] * 75
        for q, cq in enumerate(cols):
            for j, d in zip(desc.local_cols(q), cq):
                ordered[j] = d
        assert metrics.combine_digests(ordered) == metrics.matrix_sha256(Xg)


@pytest.mark.parametrize("gather_to_root", [False, True])
def test_write_vectors_writes_the_gathered_matrix(comm, gather_to_root):
    n = 29
    desc = BlockCyclic(n, n, 4, SIZE)
    Xg = np.asfortranarray(np.random.default_rng(2).standard_normal((n, n)))
    folder = WORLD.bcast(tempfile.mkdtemp(prefix="hpccoll-x-") if RANK == 0 else None, root=0)
    path = os.path.join(folder, "X.npy")
    write_vectors(path, distribute(Xg, desc, RANK), desc, WORLD, gather_to_root)
    WORLD.Barrier()
    assert np.load(path).tobytes() == Xg.tobytes()
    assert not os.path.exists(path + ".part")
    WORLD.Barrier()


def test_gather_problem_on_root_is_the_whole_problem():
    p = make_problem("known", 33, seed=8)
    desc = BlockCyclic(33, 33, 4, SIZE)
    Ag, Bg = gather_problem_on_root(distribute(p.A, desc, RANK), distribute(p.B, desc, RANK), desc, WORLD)
    if RANK == 0:
        assert Ag.tobytes() == np.asfortranarray(p.A).tobytes() and Bg.tobytes() == np.asfortranarray(p.B).tobytes()
        w = sl.eigh(Ag, Bg, eigvals_only=True)
        assert metrics.eigenvalue_error(w, p.eigenvalues) < 1e-12
    else:
        assert Ag is None and Bg is None


def test_file_columns_and_their_content_digest(tmp_path_factory):
    from hpccoll_eigensolver.cli import _content_digest

    p = make_problem("known", 26, seed=1)
    folder = WORLD.bcast(str(tmp_path_factory.mktemp("f")) if RANK == 0 else None, root=0)
    if RANK == 0:
        np.save(os.path.join(folder, "A.npy"), np.ascontiguousarray(p.A))     # C order
        np.save(os.path.join(folder, "B.npy"), np.asfortranarray(p.B))        # Fortran order
    WORLD.Barrier()
    spec = parse_problem(f"file:{folder}/A.npy,{folder}/B.npy", 0)
    desc = BlockCyclic(26, 26, 3, SIZE)
    A, B, digests = build_local_problem(spec, desc, WORLD, np)
    assert A.tobytes() == distribute(p.A, desc, RANK).tobytes()
    assert B.tobytes() == distribute(p.B, desc, RANK).tobytes()
    content = _content_digest(WORLD, desc, digests)
    if RANK == 0:
        assert content == metrics.combine_digests(metrics.column_digests(p.A) + metrics.column_digests(p.B))
