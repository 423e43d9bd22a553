"""hpccoll-eigensolver solve --subset LO:HI and --scf K, run in this process on every rank (any
number of ranks; tests/run uses 2 and 3, and 1 runs as plain pytest): the files and records of a
subset of the eigenpairs, the SCF loop's solves bitwise equal to fresh solves of the same pairs
(GeneralizedSolver's promise, through the command line), and their errors.  Odd n, a block size
that does not divide it.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_cli_scf_mpi.py"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import scipy.linalg as sl
from mpi4py import MPI

import hpccoll
from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd
from hpccoll_eigensolver.problems import make_problem, scf_operand
from hpccoll_eigensolver.report import build_report

pytestmark = pytest.mark.mpi(min_size=1)

WORLD = MPI.COMM_WORLD
RANK, SIZE = WORLD.Get_rank(), WORLD.Get_size()
N, NB = 157, 10     # odd n, nb not dividing it; 16 blocks: every rank owns several at 3 ranks
EPS = np.finfo(np.float64).eps


@pytest.fixture(scope="module")
def problem():
    return make_problem("known", N, cond_b=1e4, seed=2)


def _folder(tmp_path_factory, name: str) -> str:
    return WORLD.bcast(str(tmp_path_factory.mktemp(name)) if RANK == 0 else None, root=0)


def _ok(code, err=""):
    assert WORLD.allgather(code) == [0] * SIZE, err


def _solve(cli_main, out, name, *extra, problem_args=("--n", N, "--cond-b", 1e4, "--seed", 2)):
    code, stdout, err = cli_main(["solve", *problem_args, "--nb", NB, "--comm", "mpi", "--out", out,
                                  "--name", name, *extra])
    _ok(code, err)
    return stdout


def _load(out, stem):
    with open(os.path.join(out, stem + ".json")) as f:
        rec = json.load(f)
    w = np.load(os.path.join(out, stem + "_w.npy"))
    x = os.path.join(out, stem + "_X.npy")
    return rec, w, (np.load(x) if os.path.exists(x) else None)


# -- --subset ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lo,hi", [(7, 30), (0, 0), (N - 1, N - 1), (140, N - 1)])
def test_subset_writes_k_eigenpairs_and_their_metrics(cli_main, problem, tmp_path_factory, lo, hi):
    """w has k = hi - lo + 1 values, X is n x k (Fortran order), the record names the subset;
    the bits are sygvd's with subset_by_index on the same communicator, and the metrics are
    those of the k pairs: residual and B-orthogonality as metrics' whole-matrix formulas (k
    columns, B-orth in units of k eps), the eigenvalue errors against the known spectrum's and
    SciPy's w[lo..hi] on the whole spectrum's scale."""
    out = _folder(tmp_path_factory, "subset")
    k = hi - lo + 1
    stdout = _solve(cli_main, out, "sub", "--subset", f"{lo}:{hi}")
    comm = hpccoll.Communicator(backend="host", deterministic=True)
    try:
        desc, x_desc = BlockCyclic(N, N, NB, SIZE), BlockCyclic(N, k, NB, SIZE)
        w_lib, X_loc = sygvd(distribute(problem.A, desc, RANK), distribute(problem.B, desc, RANK), desc, comm,
                             subset_by_index=(lo, hi))
        X_lib = gather(X_loc, x_desc, comm)
    finally:
        comm.Free()
    if RANK != 0:
        return
    assert f"subset {lo}:{hi}]" in stdout and "subset=" in stdout
    rec, w, X = _load(out, "sub_run000")
    assert w.shape == (k,) and X.shape == (N, k) and X.flags.f_contiguous
    assert w.tobytes() == w_lib.tobytes() and X.tobytes() == np.asfortranarray(X_lib).tobytes()
    assert rec["subset"] == [lo, hi] and rec["config"]["subset"] == [lo, hi]
    assert len(rec["eigenvalues"]) == k and metrics.matrix_sha256(X) == rec["eigenvectors_sha256"]
    assert f"k = {k}" in rec["eigenvectors_layout"]
    ours = metrics.residual(problem.A, problem.B, X, w), metrics.b_orthogonality(problem.B, X)
    if k >= 5:   # rounding in another order: the same size
        assert 0.5 < rec["residual"] / ours[0] < 2 and 0.5 < rec["b_orthogonality"] / ours[1] < 2
    else:        # a norm of one or a few roundings: the same to a few of them
        assert abs(rec["residual"] - ours[0]) < 0.01 and abs(rec["b_orthogonality"] - ours[1]) * k < 1e3
    lam = np.asarray(problem.eigenvalues)
    ref = sl.eigh(problem.A, problem.B, eigvals_only=True)
    for key, whole in (("eigenvalue_error", lam), ("eigenvalue_error_vs_scipy", ref)):
        assert rec[key] == pytest.approx(np.abs(w - whole[lo:hi + 1]).max() / np.abs(whole).max(), rel=1e-12)
        assert rec[key] < 1e-12
    assert "lo <= i <= hi" in rec["eigenvalue_error_definition"]


def test_subset_eigvals_only_and_full_solve_agree(cli_main, tmp_path_factory):
    """--subset with --eigvals-only: the same eigenvalues, no X; a full solve's w[lo..hi] to
    n eps max|w|; another subset is another configuration (its own digest and report row)."""
    out = _folder(tmp_path_factory, "subset-w")
    _solve(cli_main, out, "vec", "--subset", "20:60")
    _solve(cli_main, out, "val", "--subset", "20:60", "--eigvals-only")
    _solve(cli_main, out, "all")
    _solve(cli_main, out, "other", "--subset", "20:61", "--save-vectors", "no")
    if RANK != 0:
        return
    (vec, w_vec, _), (val, w_val, X_val), (full, w_all, _), (other, _, _) = (
        _load(out, f"{s}_run000") for s in ("vec", "val", "all", "other"))
    assert X_val is None and val["residual"] is None and val["eigenvectors_file"] is None
    assert w_val.tobytes() == w_vec.tobytes()
    assert np.abs(w_vec - w_all[20:61]).max() <= N * EPS * np.abs(w_all).max()
    digests = {r["config_digest"] for r in (vec, val, full, other)}
    assert len(digests) == 4 and "subset" not in full["config"]
    build_report(out)
    with open(os.path.join(out, "report.json")) as f:
        rep = json.load(f)
    groups = {(tuple(g["subset"] or ()), g["config_digest"]) for g in rep["configurations"]}
    assert len(groups) == 4 and all(g["distinct_eigenvalue_digests"] == 1 for g in rep["configurations"])
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert "known subset 20:60" in md and "known subset 20:61" in md


def test_a_subset_past_n_or_differing_between_ranks_fails_every_rank_once(cli_main, agreed_error, tmp_path_factory):
    """Checked against n before any solve (HI = n is one past the last eigenpair), and agreed
    across the ranks like the other inputs."""
    out = _folder(tmp_path_factory, "subset-bad")
    code, _, err = cli_main(["solve", "--n", N, "--nb", NB, "--comm", "mpi", "--out", out, "--subset", f"3:{N}"])
    agreed_error(code, err, ["--subset 3:157", f"HI = {N}", f"0 <= LO <= HI <= {N - 1}"])
    if SIZE > 1:
        code, _, err = cli_main(["solve", "--n", N, "--nb", NB, "--comm", "mpi", "--out", out,
                                 "--subset", f"0:{RANK}"])
        agreed_error(code, err, ["different inputs", "--subset: rank 0 (0, 0)", f"rank {SIZE - 1} (0, {SIZE - 1})"])
    code, _, err = cli_main(["solve", "--n", N, "--nb", NB, "--comm", "mpi", "--out", out, "--scf-step", "0.1"])
    agreed_error(code, err, ["--scf-step 0.1 without --scf"])
    assert not os.listdir(out)


# -- --scf -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra", [(), ("--subset", "5:40"), ("--eigvals-only",)], ids=["all", "subset", "w-only"])
def test_scf_solves_are_bitwise_fresh_solves_of_their_pairs(cli_main, problem, tmp_path_factory, extra):
    """--scf 3: solve 0 is a plain solve of the problem (same bits, same configuration digest),
    solve j >= 1 a fresh solve of A_j = A + step max|A| Z_j with the same B (each written to .npy
    files and solved from them); only solve 0 has potrf among its phases, and the loop's line
    reports the solves' times."""
    out = _folder(tmp_path_factory, "scf")
    step = 2e-3
    stdout = _solve(cli_main, out, "loop", "--scf", 3, "--scf-step", step, *extra)
    _solve(cli_main, out, "plain", *extra)
    scale = step * np.abs(problem.A).max()
    A = [scf_operand(problem.A, np.arange(N), j, scale, 2) for j in range(3)]
    if RANK == 0:
        for j in (1, 2):
            np.save(os.path.join(out, f"A{j}.npy"), A[j])
        np.save(os.path.join(out, "B.npy"), problem.B)
    WORLD.Barrier()
    for j in (1, 2):
        _solve(cli_main, out, f"fresh{j}", *extra,
               problem_args=("--problem", f"file:{os.path.join(out, f'A{j}.npy')},{os.path.join(out, 'B.npy')}"))
    if RANK != 0:
        return
    assert "scf run 0: 3 solves with one B, factored once" in stdout
    loop = [_load(out, f"loop_run000_s{j:03d}") for j in range(3)]
    fresh = [_load(out, "plain_run000")] + [_load(out, f"fresh{j}_run000") for j in (1, 2)]
    for j, ((rec, w, X), (_, w_f, X_f)) in enumerate(zip(loop, fresh)):
        assert w.tobytes() == w_f.tobytes(), j
        assert (X is None and X_f is None) or X.tobytes() == X_f.tobytes(), j
        assert rec["scf"]["index"] == j and rec["scf"]["solves"] == 3 and rec["scf"]["scale"] == scale
        assert ("potrf" in rec["phases"]) == (j == 0)
        assert ("potrf" in rec["collectives"]["by_phase"]) == (j == 0)
    assert loop[0][0]["config_digest"] == fresh[0][0]["config_digest"]
    assert len({rec["problem_digest"] for rec, _, _ in loop}) == 3
    assert loop[1][1].tobytes() != loop[2][1].tobytes()
    assert loop[0][0]["eigenvalue_error"] is not None and loop[1][0]["eigenvalue_error"] is None
    assert all(rec["eigenvalue_error_vs_scipy"] < 1e-12 for rec, _, _ in loop)
    build_report(out)
    with open(os.path.join(out, "report.json")) as f:
        groups = json.load(f)["configurations"]
    # the plain solve and the loop's solve 0 in one configuration (the same bits); the loop's solves
    # 1 and 2 and the files' solves (problems named by their paths) one each
    assert sorted(g["runs"] for g in groups) == [1, 1, 1, 1, 2]
    assert all(g["distinct_eigenvalue_digests"] == 1 for g in groups)
    assert sorted(g["scf_index"] or 0 for g in groups) == [0, 0, 0, 1, 2]


def test_scf_operand_is_the_same_from_any_columns_and_symmetric(problem):
    """A_j's columns built on this rank (its own, in chunks of one column too) are the whole
    A_j's; Z_j symmetric, within [-scale, scale], another for each j, and A_0 is A."""
    desc = BlockCyclic(N, N, NB, SIZE)
    cols = desc.local_cols(RANK)
    scale = 1e-3 * np.abs(problem.A).max()
    whole = scf_operand(problem.A, np.arange(N), 1, scale, 2)
    mine = scf_operand(distribute(problem.A, desc, RANK), cols, 1, scale, 2)
    assert mine.tobytes() == np.asfortranarray(whole[:, cols]).tobytes()
    assert np.array_equal(whole, whole.T)
    D = whole - problem.A
    assert 0.5 * scale < np.abs(D).max() <= scale
    assert not np.array_equal(scf_operand(problem.A, np.arange(N), 2, scale, 2), whole)
    assert not np.array_equal(scf_operand(problem.A, np.arange(N), 1, scale, 3), whole)
    assert scf_operand(problem.A, np.arange(N), 0, scale, 2).tobytes() == np.asfortranarray(problem.A).tobytes()
