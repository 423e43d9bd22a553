"""The eigensolver app's distributed pieces under MPI (any number of ranks; tests/run uses 2, 3
and 4): problems built by column block, input checks that agree across ranks, metrics and
digests without gathering, X written by columns.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_eigensolver_cli_mpi.py"""
from __future__ import annotations

import json
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
    from hpccoll_eigensolver.runs import _content_digest

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


# -- scaling: A and B anywhere in the float64 range ---------------------------------------------------
SCALES = [(1e-300, 1.0), (1e-150, 1.0), (1e150, 1.0), (1e160, 1.0), (1e300, 1.0), (1.0, 1e-300), (1.0, 1e300),
          (1e300, 1e300), (1e-300, 1e-300), (1e-150, 1e150), (1e150, 1e-150)]


@pytest.mark.parametrize("sa,sb", SCALES, ids=[f"A{a:g}-B{b:g}" for a, b in SCALES])
def test_scaled_pairs_solve_as_scipy(comm, sa, sb):
    """A scaled by sa and B by sb (any magnitudes whose eigenvalues fit float64): the eigenvalues
    of scipy.linalg.eigh(A, B) on the same scaled matrices to LAPACK's accuracy, the residual and
    B-orthogonality (distributed, on the host's MPI and on hpccoll's communicator) finite and
    of the unscaled pair's size, on every rank alike."""
    p = make_problem("known", 48, cond_b=1e3, seed=7)
    A, B = p.A * sa, p.B * sb
    desc = BlockCyclic(48, 48, 8, SIZE)
    A_loc, B_loc = distribute(A, desc, RANK), distribute(B, desc, RANK)
    w, X = sygvd(A_loc, B_loc, desc, comm)
    ref = sl.eigh(A, B, eigvals_only=True)
    assert np.isfinite(w).all() and np.isfinite(X).all()
    assert metrics.eigenvalue_error(w, ref) < 1e-13
    for c in (WORLD, comm):
        acc = metrics.distributed_accuracy(A_loc, B_loc, X, w, desc, c)
        assert 0 <= acc["residual"] < 1 and 0 < acc["b_orthogonality"] < 100, acc
    Xg = gather(X, desc, comm)
    assert metrics.residual(A, B, Xg, w) < 1 and metrics.b_orthogonality(B, Xg) < 100
    assert len(set(WORLD.allgather(w.tobytes()))) == 1


def test_scaling_by_powers_of_two_adds_no_rounding(comm):
    """A pair scaled by 2^600 (A) or 2^-600 (B) is solved as the pair itself: w and X are the
    unscaled solve's bits times 2^600 (A), and times 2^600 and 2^300 (B)."""
    import math

    p = make_problem("known", 40, cond_b=1e3, seed=2)
    A0 = p.A * 2.0 ** -math.frexp(np.abs(p.A).max())[1]            # largest magnitude in [1/2, 1)
    e = math.frexp(np.abs(p.B).max())[1]
    B0 = p.B * 2.0 ** -(e + e % 2)                                 # in [1/4, 1), an even power
    desc = BlockCyclic(40, 40, 8, SIZE)
    w0, X0 = sygvd(distribute(A0, desc, RANK), distribute(B0, desc, RANK), desc, comm)
    w1, X1 = sygvd(distribute(A0 * 2.0 ** 600, desc, RANK), distribute(B0, desc, RANK), desc, comm)
    assert w1.tobytes() == (w0 * 2.0 ** 600).tobytes() and X1.tobytes() == X0.tobytes()
    w2, X2 = sygvd(distribute(A0, desc, RANK), distribute(B0 * 2.0 ** -600, desc, RANK), desc, comm)
    assert w2.tobytes() == (w0 * 2.0 ** 600).tobytes() and X2.tobytes() == (X0 * 2.0 ** 300).tobytes()


def _singular_B(n: int) -> np.ndarray:
    """Symmetric, its Cholesky factorization succeeds, cond(B) = 1e300."""
    return np.diag(np.geomspace(1.0, 1e-300, n))


@pytest.mark.parametrize("which", ["cond1e300", "indefinite", "cond1e300-scaled"])
def test_a_numerically_singular_or_indefinite_B_is_named_on_every_rank(comm, which):
    from hpccoll_eigensolver import NotPositiveDefinite

    p = make_problem("known", 40, seed=3)
    B = _singular_B(40) if which.startswith("cond") else p.B.copy()
    if which == "indefinite":
        B[0, 1] = B[1, 0] = 10 * np.abs(B).max()
    if which.endswith("scaled"):
        B = B * 1e200
    desc = BlockCyclic(40, 40, 8, SIZE)
    with pytest.raises(NotPositiveDefinite, match="^B is not numerically positive definite: ") as e:
        sygvd(distribute(p.A, desc, RANK), distribute(B, desc, RANK), desc, comm)
    assert isinstance(e.value, ValueError)
    assert len(set(WORLD.allgather(str(e.value)))) == 1


def test_eigenvalues_beyond_the_float64_range_raise_nonfiniteresult(comm):
    """A ~ 1e300 and B ~ 1e-300: eigenvalues ~ 1e600; an error on every rank, no result."""
    from hpccoll_eigensolver import NonFiniteResult

    p = make_problem("known", 40, seed=3)
    desc = BlockCyclic(40, 40, 8, SIZE)
    for eigvals_only in (False, True):
        with pytest.raises(NonFiniteResult, match="NaN or Inf in the eigenvalues") as e:
            sygvd(distribute(p.A * 1e300, desc, RANK), distribute(p.B * 1e-300, desc, RANK), desc, comm,
                  eigvals_only=eigvals_only)
        assert isinstance(e.value, ArithmeticError)
        assert len(set(WORLD.allgather(str(e.value)))) == 1


def test_non_finite_input_is_refused_on_every_rank_by_sygvd(comm):
    from hpccoll_eigensolver import InputError

    p = make_problem("known", 40, seed=3)
    A = p.A.copy()
    A[39, 39] = np.inf          # the last column: the last rank's
    desc = BlockCyclic(40, 40, 8, SIZE)
    with pytest.raises(InputError, match=f"A has NaN or Inf entries .*rank {desc.owner(39)}"):
        sygvd(distribute(A, desc, RANK), distribute(p.B, desc, RANK), desc, comm)


# -- arguments wrong on one rank, or differing between ranks: the same ValueError everywhere ---------
@pytest.mark.mpi(min_size=2)
def test_sygvd_local_shapes_that_differ_raise_the_same_valueerror_everywhere(comm):
    from hpccoll_eigensolver import InputError

    p = make_problem("known", 40, seed=3)
    desc = BlockCyclic(40, 40, 8, SIZE)
    A = distribute(p.A, desc, RANK)
    if RANK == SIZE - 1:
        A = A[:, :-1]
    with pytest.raises(InputError, match=f"rank {SIZE - 1}: A_local has shape") as e:
        sygvd(A, distribute(p.B, desc, RANK), desc, comm)
    assert isinstance(e.value, ValueError) and len(set(WORLD.allgather(str(e.value)))) == 1


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("what", ["nb", "n"])
def test_sygvd_descriptors_that_differ_raise_the_same_valueerror_everywhere(comm, what):
    from hpccoll_eigensolver import InputError

    n = 40 if what == "nb" or RANK == 0 else 48
    nb = 8 if what == "n" or RANK == 0 else 4
    p = make_problem("known", n, seed=3)
    desc = BlockCyclic(n, n, nb, SIZE)
    with pytest.raises(InputError, match="the ranks pass different descriptor values") as e:
        sygvd(distribute(p.A, desc, RANK), distribute(p.B, desc, RANK), desc, comm)
    assert len(set(WORLD.allgather(str(e.value)))) == 1


# -- the command line's input errors: agreed before any solve, printed once, exit 2 everywhere --------
# (the fixtures cli_main and agreed_error: tests/conftest.py)
@pytest.fixture(scope="module")
def npy_pair(tmp_path_factory):
    folder = WORLD.bcast(str(tmp_path_factory.mktemp("cli")) if RANK == 0 else None, root=0)
    p = make_problem("known", 40, seed=4)
    if RANK == 0:
        np.save(os.path.join(folder, "A.npy"), p.A)
        np.save(os.path.join(folder, "B.npy"), p.B)
        with open(os.path.join(folder, "A.npy"), "rb") as f:
            data = f.read()
        with open(os.path.join(folder, "A_truncated.npy"), "wb") as f:
            f.write(data[:len(data) - 8 * 100])
    WORLD.Barrier()
    return folder


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("bad", ["missing", "truncated"])
def test_cli_a_file_bad_on_one_rank_only_fails_every_rank_once(cli_main, agreed_error, npy_pair, tmp_path_factory,
                                                              bad):
    """A path not mounted on the last rank's node, or a truncated copy there: every rank exits 2
    before any solve, and rank 0 prints one error naming that rank and the file."""
    last = SIZE - 1
    a = os.path.join(npy_pair, "A.npy")
    if RANK == last:
        a = os.path.join(npy_pair, "not-mounted", "A.npy") if bad == "missing" else \
            os.path.join(npy_pair, "A_truncated.npy")
    out = WORLD.bcast(str(tmp_path_factory.mktemp("out")) if RANK == 0 else None, root=0)
    code, _, err = cli_main(["solve", "--problem", f"file:{a},{os.path.join(npy_pair, 'B.npy')}", "--nb", 8,
                             "--comm", "mpi", "--out", out])
    agreed_error(code, err, [f"rank {last}", os.path.basename(os.path.dirname(a)) if bad == "missing" else
                              "A_truncated.npy", "does not exist" if bad == "missing" else "truncated"])
    assert not [f for f in os.listdir(out) if f.endswith(".json")]


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize("flag", ["--n", "--nb"])
def test_cli_arguments_that_differ_between_ranks_fail_every_rank_once(cli_main, agreed_error, tmp_path_factory, flag):
    base = {"--n": 40, "--nb": 8}[flag]
    value = base + (4 if RANK == SIZE - 1 else 0)
    out = WORLD.bcast(str(tmp_path_factory.mktemp("out")) if RANK == 0 else None, root=0)
    argv = ["solve", "--n", 40, "--nb", 8, "--comm", "mpi", "--out", out, flag, value]
    code, _, err = cli_main(argv)
    agreed_error(code, err, ["different inputs", f"{flag}: rank 0 {base}", f"rank {SIZE - 1} {base + 4}"])


def test_cli_a_truncated_file_is_named(cli_main, agreed_error, npy_pair, tmp_path_factory):
    """On every rank alike (and on one rank): the file and what is missing, not a reshape error."""
    out = WORLD.bcast(str(tmp_path_factory.mktemp("out")) if RANK == 0 else None, root=0)
    a = os.path.join(npy_pair, "A_truncated.npy")
    code, _, err = cli_main(["solve", "--problem", f"file:{a},{os.path.join(npy_pair, 'B.npy')}", "--comm", "mpi",
                             "--out", out])
    agreed_error(code, err, ["A_truncated.npy", "is truncated", "needs 12800"])
    assert "reshape" not in err


# -- what solve writes ------------------------------------------------------------------------------
def test_cli_solve_writes_w_and_x_by_stem_and_eigvals_only_writes_no_x(cli_main, npy_pair, tmp_path_factory):
    """--name STEM: STEM_run000.json, _w.npy (the JSON's eigenvalues, scipy's to LAPACK accuracy)
    and _X.npy (A X = B X diag(w), X^T B X = I), the paths printed by rank 0; --eigvals-only: no
    _X.npy."""
    out = WORLD.bcast(str(tmp_path_factory.mktemp("out")) if RANK == 0 else None, root=0)
    prob = f"file:{os.path.join(npy_pair, 'A.npy')},{os.path.join(npy_pair, 'B.npy')}"
    code, stdout, _ = cli_main(["solve", "--problem", prob, "--nb", 6, "--comm", "mpi", "--out", out,
                                "--name", f"pair-{SIZE}"])
    assert WORLD.allgather(code) == [0] * SIZE
    code, stdout_w, _ = cli_main(["solve", "--problem", prob, "--nb", 6, "--comm", "mpi", "--out", out,
                                  "--name", f"pair-{SIZE}.w", "--eigvals-only"])
    assert WORLD.allgather(code) == [0] * SIZE
    if RANK != 0:
        assert "wrote" not in stdout + stdout_w
        return
    stem, stem_w = os.path.join(out, f"pair-{SIZE}_run000"), os.path.join(out, f"pair-{SIZE}.w_run000")
    assert f"wrote {stem}_w.npy, {stem}_X.npy, {stem}.json" in stdout.splitlines()
    assert f"wrote {stem_w}_w.npy, {stem_w}.json" in stdout_w.splitlines()
    assert sorted(os.listdir(out)) == sorted(os.path.basename(f) for f in (
        f"{stem}_w.npy", f"{stem}_X.npy", f"{stem}.json", f"{stem_w}_w.npy", f"{stem_w}.json"))
    A, B = np.load(os.path.join(npy_pair, "A.npy")), np.load(os.path.join(npy_pair, "B.npy"))
    ref = sl.eigh(A, B, eigvals_only=True)
    for s in (stem, stem_w):
        with open(s + ".json") as f:
            rec = json.load(f)
        w = np.load(s + "_w.npy")
        assert w.tolist() == rec["eigenvalues"] and metrics.sha256(w) == rec["eigenvalues_sha256"]
        assert np.max(np.abs(w - ref)) <= 1e-13 * np.max(np.abs(ref))
    X = np.load(stem + "_X.npy")
    w = np.load(stem + "_w.npy")
    assert X.flags.f_contiguous and X.shape == (40, 40)
    assert np.linalg.norm(A @ X - B @ X @ np.diag(w)) <= 1e-12 * np.linalg.norm(A) * np.linalg.norm(X)
    assert np.max(np.abs(X.T @ B @ X - np.eye(40))) <= 1e-12
