"""hpccoll-eigensolver's command line, problems, checks, metrics and I/O, without an MPI job of
their own: argument checks, the generated problems' construction, and end-to-end runs under
`mpiexec -n 2` and `-n 3` started as subprocesses with a timeout, so that a run that hangs
fails the test instead of the suite."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg as sl

from hpccoll_eigensolver import BlockCyclic, metrics
from hpccoll_eigensolver.cli import build_parser
from hpccoll_eigensolver.problems import (Butterfly, ProblemError, generated_columns, make_problem,
                                          parse_problem, read_columns)
from hpccoll_eigensolver.report import build_report
from hpccoll_eigensolver.runinfo import THREAD_ENV, host_thread_choice, parse_host_threads

REPO = Path(__file__).resolve().parents[2]
#: seconds one end-to-end run may take before it counts as hung (they take 2-5 s)
HANG_TIMEOUT = float(os.environ.get("HPCCOLL_TEST_HANG_TIMEOUT", "90"))


def _mpiexec() -> str:
    here = Path(sys.executable).with_name("mpiexec")
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def _env(thread_env: bool = True) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for k in list(env):
        if not thread_env and k in THREAD_ENV:
            env.pop(k)
        if k.startswith(("PMI_", "OMPI_", "PMIX_", "HYDRA_")):  # not inside this process's own MPI job
            env.pop(k)
    return env


#: the working directory of run_cli's commands unless given (solve without --out writes there)
_CWD = tempfile.mkdtemp(prefix="hpccoll-eig-cli-")


def run_cli(*args, ranks: int | None = None, cwd=None, timeout: float = HANG_TIMEOUT,
            thread_env: bool = True) -> subprocess.CompletedProcess:
    """hpccoll-eigensolver ARGS, under mpiexec -n ranks when given; a hang fails the test."""
    cmd = [sys.executable, "-m", "hpccoll_eigensolver.cli", *map(str, args)]
    cwd = _CWD if cwd is None else cwd
    if ranks:
        cmd = [_mpiexec(), "-n", str(ranks)] + cmd
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd,
                              env=_env(thread_env))
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung: no exit within {timeout:.0f} s: {' '.join(cmd)}\n{exc.stdout or ''}{exc.stderr or ''}")


# -- arguments: checked at parse time -----------------------------------------------------------------
@pytest.mark.parametrize("argv,needle", [
    (["solve", "--n", "0"], "--n"), (["solve", "--nb", "0"], "--nb"), (["solve", "--repeat", "0"], "--repeat"),
    (["solve", "--cond-b", "nan"], "--cond-b"), (["solve", "--cond-b", "inf"], "--cond-b"),
    (["solve", "--cond-b", "0.5"], "--cond-b"), (["solve", "--seed", "-1"], "--seed"),
    (["solve", "--symmetry-tol", "-1"], "--symmetry-tol"), (["compare", "--ranks", "0"], "--ranks"),
    (["compare", "--repeat", "0"], "--repeat"), (["compare", "--comm", "mpi,bogus"], "--comm"),
    (["solve", "--host-threads", "0"], "--host-threads"), (["solve", "--host-threads", "many"], "--host-threads"),
    (["compare", "--host-threads", "-2"], "--host-threads"), (["compare", "--ranks", "2,x"], "--ranks"),
    (["compare", "--ranks", "2,0"], "--ranks"), (["compare", "--ranks", ","], "--ranks"),
    (["compare", "--config-timeout", "0"], "--config-timeout"), (["compare", "--config-timeout", "inf"], "--config-timeout"),
    (["solve", "--subset", "5:2"], "LO = 5 > HI = 2"), (["solve", "--subset=-1:3"], "negative"),
    (["solve", "--subset", "3"], "one eigenpair i is i:i"), (["solve", "--subset", "a:b"], "--subset"),
    (["solve", "--subset", "1:2:3"], "give LO:HI"), (["solve", "--subset", "1.0:2"], "give LO:HI"),
    (["compare", "--subset", "2:1"], "--subset"), (["solve", "--scf", "0"], "--scf"),
    (["solve", "--scf-step", "0"], "--scf-step"), (["solve", "--scf-step", "nan"], "--scf-step"),
    (["solve", "--scf-step", "-1e-3"], "--scf-step"), (["compare", "--scf", "x"], "--scf"),
])
def test_bad_arguments_are_refused_when_parsed(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_subset_and_scf_parse_to_their_values():
    args = build_parser().parse_args(["solve", "--subset", "0:9", "--scf", "4"])
    assert args.subset == (0, 9) and args.scf == 4 and args.scf_step is None   # finish_args sets the default
    assert build_parser().parse_args(["compare", "--subset", "7:7", "--scf-step", "0.5"]).subset == (7, 7)
    assert build_parser().parse_args(["solve"]).subset is None


def test_help_lists_the_new_options():
    for cmd, opts in (("solve", ("--overwrite", "--gather-vectors", "--symmetry-tol", "--no-trace-memory", "--name",
                                 "--eigvals-only", "auto is accepted and means yes", "--subset LO:HI", "--scf K",
                                 "--scf-step STEP", "STEM_runRRR_sJJJ")),
                      ("compare", ("--overwrite", "--ranks", "--subset", "--scf"))):
        text = " ".join(build_parser()._subparsers._group_actions[0].choices[cmd].format_help().split())
        assert all(o in text for o in opts), cmd


@pytest.mark.parametrize("make,needle", [
    (lambda d: np.zeros((3, 3), complex), "complex"),
    (lambda d: np.zeros((3, 4)), "square"),
    (lambda d: np.array(["a"] * 9).reshape(3, 3), "dtype"),
])
def test_file_problems_are_checked_from_their_headers(tmp_path, make, needle):
    np.save(tmp_path / "A.npy", make(tmp_path))
    np.save(tmp_path / "B.npy", np.eye(3))
    with pytest.raises(ProblemError, match=needle):
        parse_problem(f"file:{tmp_path / 'A.npy'},{tmp_path / 'B.npy'}", 0)


def test_file_problem_names_a_missing_file_and_a_shape_mismatch(tmp_path):
    np.save(tmp_path / "A.npy", np.eye(3))
    np.save(tmp_path / "B.npy", np.eye(4))
    with pytest.raises(ProblemError, match="does not exist"):
        parse_problem(f"file:{tmp_path / 'A.npy'},{tmp_path / 'nope.npy'}", 0)
    with pytest.raises(ProblemError, match="same order"):
        parse_problem(f"file:{tmp_path / 'A.npy'},{tmp_path / 'B.npy'}", 0)


# -- the generated problems ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 64, 100])
def test_butterfly_is_orthogonal_and_mixes_every_row(n):
    U = np.eye(n)
    Butterfly(n, np.random.default_rng(n)).apply(U)
    np.testing.assert_allclose(U.T @ U, np.eye(n), atol=1e-14)
    assert n == 1 or np.all(U != 0), "some output row does not depend on some input row"
    Butterfly(n, np.random.default_rng(n)).apply(U, transpose=True)
    np.testing.assert_allclose(U, np.eye(n), atol=1e-13)


@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson", "random"])
def test_a_column_has_the_same_bits_whichever_columns_are_built_with_it(kind):
    """The construction is elementwise per column: the bits of column j do not depend on the
    other columns built in the same call (so not on the number of ranks or the block size)."""
    spec = parse_problem(kind, 77, cond_b=1e4, seed=9)
    A, B = generated_columns(spec, np.arange(77))
    pick = np.array([76, 3, 40, 0, 41])
    A2, B2 = generated_columns(spec, pick)
    assert A[:, pick].tobytes() == np.asfortranarray(A2).tobytes()
    assert B[:, pick].tobytes() == np.asfortranarray(B2).tobytes()


@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson", "random"])
def test_generated_problems_are_symmetric_definite_and_have_their_spectrum(kind):
    p = make_problem(kind, 90, cond_b=1e4, seed=2)
    assert p.A.tobytes() == make_problem(kind, 90, cond_b=1e4, seed=2).A.tobytes()
    assert p.A.tobytes() != make_problem(kind, 90, cond_b=1e4, seed=3).A.tobytes()
    np.testing.assert_array_equal(p.A, p.A.T)
    np.testing.assert_array_equal(p.B, p.B.T)
    assert np.linalg.cond(p.B) == pytest.approx(1e4, rel=1e-6)
    if p.eigenvalues is not None:
        w = sl.eigh(p.A, p.B, eigvals_only=True)
        assert metrics.eigenvalue_error(w, p.eigenvalues) < 1e-12


@pytest.mark.parametrize("order", ["C", "F"])
def test_read_columns_reads_the_columns_asked_for(tmp_path, order):
    M = np.asarray(np.arange(35.0).reshape(5, 7)[:, :5], order=order).astype(np.float32)
    np.save(tmp_path / "M.npy", M)
    digests = []
    got = read_columns(str(tmp_path / "M.npy"), [4, 0, 1], digests=digests)
    np.testing.assert_array_equal(got, M[:, [4, 0, 1]].astype(np.float64))
    assert got.dtype == np.float64 and got.flags.f_contiguous
    assert [d.hex() for d in digests] == [
        __import__("hashlib").sha256(np.ascontiguousarray(M[:, j], dtype=np.float64).tobytes()).hexdigest()
        for j in (4, 0, 1)]


# -- metrics and digests on one process --------------------------------------------------------------
class _SelfComm:
    """One process's Bcast/Allreduce (what distributed_accuracy needs) without MPI."""

    def Get_rank(self):
        return 0

    def Get_size(self):
        return 1

    def Bcast(self, buf, root=0):
        pass

    def Allreduce(self, send, recv):
        recv[...] = send

    def Allgather(self, send, recv):
        recv[...] = send.reshape(recv.shape)


@pytest.mark.parametrize("chunk_bytes", [None, 8 * 50])
def test_distributed_accuracy_on_one_rank_is_the_full_matrix_metric(chunk_bytes):
    p = make_problem("known", 50, cond_b=1e3, seed=1)
    w, X = sl.eigh(p.A, p.B)
    desc = BlockCyclic(50, 50, 7, 1)
    got = metrics.distributed_accuracy(p.A, p.B, np.asfortranarray(X), w, desc, _SelfComm(), chunk_bytes=chunk_bytes)
    # on a correct solution both measure rounding, which another summation order changes by O(1)
    assert 0.5 < got["residual"] / metrics.residual(p.A, p.B, X, w) < 2
    assert 0.5 < got["b_orthogonality"] / metrics.b_orthogonality(p.B, X) < 2
    # on a perturbed one they measure the perturbation: equal to many digits
    Xp = np.asfortranarray(X + 1e-9 * np.random.default_rng(0).standard_normal(X.shape))
    got = metrics.distributed_accuracy(p.A, p.B, Xp, w, desc, _SelfComm(), chunk_bytes=chunk_bytes)
    assert got["residual"] == pytest.approx(metrics.residual(p.A, p.B, Xp, w), rel=1e-6)
    assert got["b_orthogonality"] == pytest.approx(metrics.b_orthogonality(p.B, Xp), rel=1e-6)


def test_eigenvector_digest_is_made_of_column_digests():
    X = np.asfortranarray(np.random.default_rng(0).standard_normal((9, 6)))
    cols = metrics.column_digests(X, chunk_bytes=8 * 9 * 2)
    assert len(cols) == 6 and metrics.combine_digests(cols) == metrics.matrix_sha256(X)
    assert metrics.matrix_sha256(X[:, ::-1]) != metrics.matrix_sha256(X)
    for key in ("residual", "b_orthogonality", "eigenvectors_sha256"):
        assert key in metrics.DEFINITIONS


# -- end to end under mpiexec: never a hang, one message, a non-zero exit ------------------------------
@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    p = make_problem("known", 40, seed=4)
    np.save(d / "A.npy", p.A)
    np.save(d / "B.npy", p.B)
    a = p.A.copy()
    a[3, 7] = np.nan
    np.save(d / "A_nan.npy", a)
    a = p.A.copy()
    a[3, 7] += 0.1
    np.save(d / "A_nonsym.npy", a)
    np.save(d / "A_complex.npy", p.A.astype(complex))
    b = p.B.copy()
    b[0, 1] = b[1, 0] = 10 * np.abs(b).max()           # positive diagonal, indefinite
    np.save(d / "B_indefinite.npy", b)
    b = p.B.copy()
    b[5, 5] = -1.0
    np.save(d / "B_negdiag.npy", b)
    np.save(d / "B_cond1e300.npy", np.diag(np.geomspace(1.0, 1e-300, 40)))   # passes the Cholesky
    np.save(d / "A_1e300.npy", p.A * 1e300)
    np.save(d / "B_1e-300.npy", p.B * 1e-300)
    return d


def _one_error(proc, needle: str, code: int = 2) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == code, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if "error:" in line]
    assert len(errors) == 1, f"want the error printed once, got {len(errors)}:\n{out}"
    assert needle in errors[0], out


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("files,extra,needle", [
    (("A_nan", "B"), (), "must be finite"),
    (("A", "B_indefinite"), (), "B is not numerically positive definite"),
    (("A", "B_indefinite"), ("--no-reference",), "B is not numerically positive definite"),
    (("A", "B_negdiag"), (), "positive definite"),
    (("A", "B_cond1e300"), (), "B is not numerically positive definite: its Cholesky pivots"),
    (("A_nonsym", "B"), (), "not symmetric"),
    (("A_complex", "B"), (), "complex"),
    (("A_1e300", "B_1e-300"), (), "NaN or Inf in the eigenvalues"),
], ids=["nan-in-A", "indefinite-B", "indefinite-B-no-reference", "negative-diagonal", "cond-B-1e300",
        "nonsymmetric-A", "complex-A", "eigenvalues-beyond-float64"])
def test_bad_input_fails_on_every_rank_once_without_a_hang(bad_inputs, ranks, files, extra, needle, tmp_path):
    """Printed once, status 2 (input rejected) or 1 (a solve whose result is not finite), and
    nothing written as a result."""
    prob = f"file:{bad_inputs / (files[0] + '.npy')},{bad_inputs / (files[1] + '.npy')}"
    out = tmp_path / "runs"
    proc = run_cli("solve", "--problem", prob, "--nb", 8, "--comm", "mpi", "--out", out, *extra, ranks=ranks)
    _one_error(proc, needle, 1 if files[0] == "A_1e300" else 2)
    assert not list(out.glob("*.json")) and not list(out.glob("*.npy")), list(out.iterdir())


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("files", [("A_1e300", "B"), ("A", "B_1e-300")])
def test_scaled_file_problems_solve_to_scipys_eigenvalues(bad_inputs, ranks, files, tmp_path):
    """A ~ 1e300 or B ~ 1e-300: the eigenvalues of scipy.linalg.eigh(A, B), finite small metrics."""
    prob = f"file:{bad_inputs / (files[0] + '.npy')},{bad_inputs / (files[1] + '.npy')}"
    out = tmp_path / "runs"
    proc = run_cli("solve", "--problem", prob, "--nb", 8, "--comm", "mpi", "--out", out, ranks=ranks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = json.loads(_runs(out)[0].read_text())
    assert rec["eigenvalue_error_vs_scipy"] < 1e-13
    assert 0 <= rec["residual"] < 1 and 0 < rec["b_orthogonality"] < 100, rec
    X = np.load(out / rec["eigenvectors_file"])
    A, B = np.load(bad_inputs / (files[0] + ".npy")), np.load(bad_inputs / (files[1] + ".npy"))
    assert metrics.residual(A, B, X, np.asarray(rec["eigenvalues"])) < 1 and metrics.b_orthogonality(B, X) < 100


def test_solve_without_out_writes_into_its_default_directory(tmp_path):
    proc = run_cli("solve", "--n", 32, "--nb", 8, "--comm", "mpi", ranks=2, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = _runs(tmp_path / "hpccoll-eigensolver-runs")
    assert len(runs) == 1 and (tmp_path / "hpccoll-eigensolver-runs" / (runs[0].stem + "_X.npy")).exists()
    assert f"results {os.path.join('hpccoll-eigensolver-runs', runs[0].stem[:-7])}_run*" in proc.stdout
    written = [os.path.join("hpccoll-eigensolver-runs", runs[0].stem + s) for s in ("_w.npy", "_X.npy", ".json")]
    assert "wrote " + ", ".join(written) in proc.stdout.splitlines()


# -- what solve writes: STEM_runRRR.json, STEM_runRRR_w.npy, STEM_runRRR_X.npy -------------------------
def _files(out: Path) -> set[str]:
    return {p.name for p in out.iterdir()}


def _check_w(out: Path, stem: str, A, B) -> tuple[np.ndarray, dict]:
    """STEM_w.npy: the JSON's eigenvalues (its digest too), ascending, scipy's to LAPACK accuracy."""
    rec = json.loads((out / (stem + ".json")).read_text())
    w = np.load(out / (stem + "_w.npy"))
    assert w.dtype == np.float64 and w.shape == (A.shape[0],)
    assert np.all(np.diff(w) >= 0)
    assert metrics.sha256(w) == rec["eigenvalues_sha256"] and w.tolist() == rec["eigenvalues"]
    ref = sl.eigh(A, B, eigvals_only=True)
    assert np.max(np.abs(w - ref)) <= 1e-13 * np.max(np.abs(ref))
    return w, rec


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_solve_writes_eigenvalues_eigenvectors_and_json_for_every_run(tmp_path, ranks):
    n = 36
    out = tmp_path / "runs"
    proc = run_cli("solve", "--n", n, "--nb", 5, "--comm", "mpi", "--repeat", 2, "--out", out, ranks=ranks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (stem,) = {p.name.split("_run")[0] for p in out.iterdir()}
    assert re.fullmatch(rf"known_n{n}_p{ranks}_mpi_[0-9a-f]{{10}}", stem), stem
    runs = [f"{stem}_run{r:03d}" for r in range(2)]
    assert _files(out) == {r + s for r in runs for s in ("_w.npy", "_X.npy", ".json")}
    for r in runs:
        assert f"wrote {out / r}_w.npy, {out / r}_X.npy, {out / r}.json" in proc.stdout.splitlines()
    p = make_problem("known", n)
    for r in runs:
        w, rec = _check_w(out, r, p.A, p.B)
        assert rec["eigenvalues_file"] == r + "_w.npy" and rec["eigenvectors_file"] == r + "_X.npy"
        X = np.load(out / (r + "_X.npy"))
        assert X.shape == (n, n) and X.dtype == np.float64 and X.flags.f_contiguous
        assert metrics.matrix_sha256(X) == rec["eigenvectors_sha256"]
        scale = np.linalg.norm(p.A) * np.linalg.norm(X)
        assert np.linalg.norm(p.A @ X - p.B @ X @ np.diag(w)) <= 1e-12 * scale
        assert np.max(np.abs(X.T @ p.B @ X - np.eye(n))) <= 1e-12


def test_name_eigvals_only_and_save_vectors_choose_the_files(tmp_path):
    """--name sets the stem; --eigvals-only and --save-vectors no write no X (eigenvalues only:
    no eigenvector metrics either); --save-vectors auto means yes; the _w.npy of a stem is
    never overwritten silently."""
    n, out = 30, tmp_path / "runs"
    p = make_problem("known", n)
    common = ("solve", "--n", n, "--nb", 4, "--comm", "mpi", "--out", out)
    proc = run_cli(*common, "--name", "only.w-1", "--eigvals-only", ranks=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _files(out) == {"only.w-1_run000.json", "only.w-1_run000_w.npy"}
    assert f"wrote {out}/only.w-1_run000_w.npy, {out}/only.w-1_run000.json" in proc.stdout.splitlines()
    _, rec = _check_w(out, "only.w-1_run000", p.A, p.B)
    assert rec["residual"] is None and rec["b_orthogonality"] is None and rec["eigenvectors_sha256"] is None
    assert rec["eigenvectors_file"] is None and rec["config"]["eigvals_only"] is True
    proc = run_cli(*common, "--name", "no_X", "--save-vectors", "no", ranks=3)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert {f for f in _files(out) if f.startswith("no_X")} == {"no_X_run000.json", "no_X_run000_w.npy"}
    _, rec = _check_w(out, "no_X_run000", p.A, p.B)
    assert rec["residual"] < 1 and rec["eigenvectors_file"] is None
    assert run_cli(*common, "--name", "auto", "--save-vectors", "auto", ranks=1).returncode == 0
    assert (out / "auto_run000_X.npy").exists()
    (out / "no_X_run000.json").unlink()
    _one_error(run_cli(*common, "--name", "no_X", "--save-vectors", "no", ranks=2), "no_X_run000_w.npy exists")
    build_report(str(out))   # runs without eigenvectors among them
    assert len(json.loads((out / "report.json").read_text())["configurations"]) == 2


@pytest.mark.parametrize("name", ["a/b", "x y", "", "..", "é"])
def test_a_bad_name_is_refused_once(tmp_path, name):
    proc = run_cli("solve", "--n", 16, "--nb", 4, "--comm", "mpi", "--out", tmp_path / "o", "--name", name, ranks=2)
    _one_error(proc, "--name")
    assert "use letters, digits, '.', '_' and '-' only" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_report_of_a_directory_without_runs_is_an_error(tmp_path):
    proc = run_cli("report", tmp_path)
    assert proc.returncode == 2 and "no runs there" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not (tmp_path / "report.md").exists() and not (tmp_path / "report.json").exists()


def _tables(md: str) -> list[list[str]]:
    """The markdown tables of md, each as its lines."""
    tables, cur = [], []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            cur.append(line)
        elif cur:
            tables.append(cur)
            cur = []
    return tables


@pytest.mark.parametrize("content", ["none", "failure"])
def test_report_tables_have_as_many_header_cells_as_columns(tmp_path, content):
    """Every table's header, separator and rows have one cell count, with no phase recorded too
    (compare's report when every configuration failed)."""
    if content == "failure":
        (tmp_path / "failed_known_n16_p2_mpi_0.json").write_text(json.dumps(
            {"schema": "hpccoll-eigensolver/failure/2", "comm": "mpi", "ranks": 2, "n": 16, "problem": "known",
             "returncode": 1, "command": [], "reason": "exit 1", "error": "x", "seconds": 1.0}))
    build_report(str(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "## Time" in md
    for table in _tables(md):
        counts = {line.count("|") for line in table}
        assert len(counts) == 1, table


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_cond_b_nan_or_inf_is_an_argument_error_printed_once(value):
    proc = run_cli("solve", "--n", 32, "--cond-b", value, "--comm", "mpi", ranks=2)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2 and out.count("error: argument --cond-b") == 1, out


def test_unwritable_out_fails_before_the_solve(tmp_path):
    (tmp_path / "a_file").write_text("x")
    for out in (tmp_path / "a_file", tmp_path / "a_file" / "sub"):
        proc = run_cli("solve", "--n", 48, "--comm", "mpi", "--out", out, ranks=2)
        _one_error(proc, "--out")
        assert "solve " not in proc.stdout, "it solved before checking --out"


def test_report_and_compare_check_their_directories(tmp_path):
    proc = run_cli("report", tmp_path / "no" / "such" / "dir")
    assert proc.returncode == 2 and "no such directory" in proc.stderr and "Traceback" not in proc.stderr
    (tmp_path / "f").write_text("x")
    proc = run_cli("compare", "--n", 16, "--comm", "mpi", "--out", tmp_path / "f")
    assert proc.returncode == 2 and "not a directory" in proc.stderr, proc.stdout + proc.stderr
    assert "==" not in proc.stdout, "compare launched a configuration before checking --out"


def _runs(out: Path) -> list[Path]:
    return sorted(out.glob("*_run[0-9][0-9][0-9].json"))


def test_results_are_never_overwritten_silently(tmp_path):
    out = tmp_path / "runs"
    common = ("solve", "--n", 40, "--nb", 8, "--comm", "mpi", "--out", out)
    assert run_cli(*common, ranks=2).returncode == 0
    first = _runs(out)
    assert len(first) == 1
    before = first[0].read_bytes()
    _one_error(run_cli(*common, ranks=2), "--overwrite")
    assert first[0].read_bytes() == before
    # another matrix of the same n, and another --stedc: their own files
    assert run_cli(*common, "--seed", 1, ranks=2).returncode == 0
    assert run_cli(*common, "--stedc", "dc", ranks=2).returncode == 0
    assert len(_runs(out)) == 3
    assert run_cli(*common, "--overwrite", ranks=2).returncode == 0
    assert len(_runs(out)) == 3
    build_report(str(out))
    rep = json.loads((out / "report.json").read_text())
    assert len(rep["configurations"]) == 3, "runs of different problems or options were grouped together"


@pytest.mark.parametrize("ranks", [2, 3])
def test_solve_json_defines_its_metrics_and_records_blas_and_memory(tmp_path, ranks):
    out = tmp_path / "runs"
    proc = run_cli("solve", "--n", 45, "--nb", 4, "--comm", "mpi", "--repeat", 2, "--out", out, ranks=ranks)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "units of n eps" in proc.stdout and "n·eps" in proc.stdout
    runs = _runs(out)
    assert len(runs) == 2
    rec = json.loads(runs[0].read_text())
    defs = rec["metric_definitions"]
    for key in ("residual", "b_orthogonality", "eigenvalue_error", "eigenvalue_error_vs_scipy",
                "peak_rss_bytes", "numpy_peak_bytes", "tracemalloc_peak_bytes", "device_pool_peak_bytes"):
        assert key in defs, key
    assert "n eps" in defs["residual"] and "n eps" in defs["b_orthogonality"]
    blas = rec["machine"]["blas"]
    assert blas["env"]["OMP_NUM_THREADS"] == "1"
    assert blas["host_threads"]["threads"] is None and "OMP_NUM_THREADS=1" in blas["host_threads"]["reason"]
    assert any(lib.get("num_threads") for lib in blas["libraries"]), blas
    assert "thread" in rec["reproducibility"]
    mem = rec["memory"]["per_rank"]
    assert [m["rank"] for m in mem] == list(range(ranks))
    assert all(m["peak_rss_bytes"] > 10 * 2**20 and (m["numpy_peak_bytes"] or m["tracemalloc_peak_bytes"]) > 0
               for m in mem)
    gcs = rec["host_gc"]
    assert "host_gc" in defs
    assert [g["rank"] for g in gcs["per_rank"]] == list(range(ranks))
    assert all(len(g["collections"]) == 3 and min(g["seconds"]) >= 0 for g in gcs["per_rank"])
    assert rec["residual"] < 1 and rec["b_orthogonality"] < 100 and rec["eigenvalue_error"] < 1e-12
    # X, written by the ranks into one file, is the solution the JSON describes
    X = np.load(out / rec["eigenvectors_file"])
    p = make_problem("known", 45)
    w = np.asarray(rec["eigenvalues"])
    assert metrics.matrix_sha256(X) == rec["eigenvectors_sha256"]
    assert metrics.residual(p.A, p.B, X, w) < 1
    assert rec["eigenvectors_sha256"] == json.loads(runs[1].read_text())["eigenvectors_sha256"]


def test_one_rank_runs_name_their_early_subtrees(tmp_path):
    """At one rank the divide and conquer's early subtrees (each scaled by its own |T|) change
    the bits, so their minimum size is part of the configuration: a run without them gets its
    own files and its own row in the report instead of a false 'distinct digests'."""
    out = tmp_path / "runs"
    common = ("solve", "--n", 300, "--nb", 32, "--comm", "mpi", "--out", out, "--repeat", 2)
    # the CLI in a process whose smallest early subtree is `leaves` leaves (0: none)
    tool = [sys.executable, "-c", "import sys; from hpccoll_eigensolver.linalg.stedc import early; "
            "early.EARLY_LEAVES = int(sys.argv[1]); from hpccoll_eigensolver.cli import main; "
            "sys.exit(main(sys.argv[2:]))"]
    for leaves in (0, 2):
        proc = subprocess.run([_mpiexec(), "-n", "1", *tool, str(leaves), *map(str, common)], capture_output=True,
                              text=True, timeout=HANG_TIMEOUT, env=_env())
        assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(p.read_text()) for p in _runs(out)]
    assert len(recs) == 4
    by_leaves = {}
    for rec in recs:
        by_leaves.setdefault(rec["config"]["dc_early_leaves"], set()).add(rec["eigenvalues_sha256"])
    assert sorted(by_leaves) == [0, 2]
    assert all(len(d) == 1 for d in by_leaves.values()), by_leaves
    assert by_leaves[0] != by_leaves[2], "the early subtrees no longer change the bits: drop the field"
    build_report(str(out))
    rep = json.loads((out / "report.json").read_text())
    assert len(rep["configurations"]) == 2
    # more ranks: no early subtrees, no field
    proc = run_cli("solve", "--n", 40, "--nb", 8, "--comm", "mpi", "--out", tmp_path / "p2", ranks=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dc_early_leaves" not in json.loads(_runs(tmp_path / "p2")[0].read_text())["config"]


def test_same_problem_and_solution_bits_on_2_and_3_ranks(tmp_path):
    """The generated problem is identical on any number of ranks (its digest and the
    eigenvalues' bits agree up to the rank-count-dependent solve)."""
    recs = []
    for ranks in (2, 3):
        out = tmp_path / f"p{ranks}"
        proc = run_cli("solve", "--n", 50, "--nb", 5, "--comm", "mpi", "--problem", "clustered", "--out", out,
                       "--save-vectors", "no", ranks=ranks)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        recs.append(json.loads(_runs(out)[0].read_text()))
    assert recs[0]["problem_digest"] == recs[1]["problem_digest"]
    assert metrics.eigenvalue_error(np.asarray(recs[0]["eigenvalues"]), np.asarray(recs[1]["eigenvalues"])) < 1e-13


def test_gathered_vectors_equal_the_ones_written_by_columns(tmp_path):
    digests = []
    for how in ((), ("--gather-vectors",)):
        out = tmp_path / ("g" if how else "c")
        assert run_cli("solve", "--n", 30, "--nb", 4, "--comm", "mpi", "--out", out, *how, ranks=3).returncode == 0
        rec = json.loads(_runs(out)[0].read_text())
        digests.append(metrics.matrix_sha256(np.load(out / rec["eigenvectors_file"])))
    assert digests[0] == digests[1]


def _aborted(run):
    """An MPI job expected to abort, run once more if its stderr came back empty: MPICH's
    launcher has lost an aborted job's whole output (exit code 1, nothing on stdout or stderr)
    twice in several hundred runs, both while other MPI jobs loaded the machine.  The exit code
    is checked on both runs; the message the user reads, on the one whose output arrived."""
    proc = run()
    if proc.returncode != 0 and not proc.stderr:
        proc = run()
    return proc


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_failure_of_rank_0_alone_in_the_solve_loop_ends_the_job(tmp_path, ranks):
    """Rank 0 cannot write run 1's JSON (a directory holds its name) while the other ranks go on
    to run 2: the job ends with rank 0's error, no rank is left waiting in a teardown."""
    out = tmp_path / "runs"
    common = ("solve", "--n", 24, "--nb", 4, "--comm", "mpi", "--save-vectors", "no", "--out", out)
    assert run_cli(*common, ranks=ranks).returncode == 0
    stem = _runs(out)[0].name.replace("_run000.json", "")
    (out / f"{stem}_run001.json").mkdir()
    proc = _aborted(lambda: run_cli(*common, "--repeat", 3, "--overwrite", ranks=ranks))
    assert proc.returncode != 0
    assert f"rank 0 of {ranks} failed" in proc.stderr and "IsADirectoryError" in proc.stderr, proc.stderr


def test_an_uncaught_exception_on_one_rank_aborts_the_job():
    """runinfo.install_abort_hook: rank 1 raises while rank 0 waits in a collective."""
    code = ("from hpccoll_eigensolver.runinfo import install_abort_hook; install_abort_hook('t')\n"
            "from mpi4py import MPI\n"
            "if MPI.COMM_WORLD.Get_rank() == 1:\n    raise RuntimeError('boom on rank 1')\n"
            "MPI.COMM_WORLD.Barrier()\n")

    def run():
        try:
            return subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-c", code], capture_output=True,
                                  text=True, timeout=HANG_TIMEOUT, env=_env())
        except subprocess.TimeoutExpired:
            pytest.fail("rank 0 was left waiting: the job did not abort")

    proc = _aborted(run)
    assert proc.returncode != 0
    assert "rank 1 of 2 failed" in proc.stderr and "boom on rank 1" in proc.stderr


def test_compare_exits_1_when_a_configuration_failed_and_refuses_stale_failures(tmp_path):
    out = tmp_path / "cmp"
    args = ("compare", "--n", 24, "--nb", 4, "--ranks", 2, "--comm", "mpi,nccl", "--out", out,
            "--sytrd", "eager", "--host-threads", "2")
    proc = run_cli(*args, timeout=3 * HANG_TIMEOUT)
    # every solve option reaches the solves compare launches
    assert proc.stdout.count("--sytrd eager --host-threads 2") == 2, proc.stdout
    rep = json.loads((out / "report.json").read_text())
    if not rep["failures"]:
        pytest.skip("nccl ran here (a GPU machine): nothing failed")
    assert proc.returncode == 1 and "configurations failed (nccl)" in proc.stderr, proc.stdout + proc.stderr
    again = run_cli(*args)
    assert again.returncode == 2 and "--overwrite" in again.stderr, again.stdout + again.stderr


def test_compare_passes_subset_and_scf_to_its_solves(tmp_path):
    """compare --subset --scf: every solve of every configuration solves that subset, K times
    with one B; the report names the subset and the loop's solves."""
    out = tmp_path / "cmp"
    proc = run_cli("compare", "--n", 41, "--nb", 7, "--comm", "mpi", "--ranks", "1,2", "--subset", "2:9",
                   "--scf", 2, "--out", out)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    recs = [json.loads(p.read_text()) for p in out.glob("*_run000_s00[0-9].json")]
    assert len(recs) == 4
    assert all(r["subset"] == [2, 9] and len(r["eigenvalues"]) == 8 for r in recs)
    assert sorted((r["ranks"], r["scf"]["index"]) for r in recs) == [(1, 0), (1, 1), (2, 0), (2, 1)]
    md = (out / "report.md").read_text()
    assert "known subset 2:9 scf solve 1" in md and "known subset 2:9 |" in md


def test_compare_runs_every_configuration_at_each_rank_count(tmp_path):
    """--ranks 1,3: each --comm path at one rank and at three, one report over all of them."""
    assert build_parser().parse_args(["compare", "--ranks", "3, 1,3"]).ranks == [3, 1]
    out = tmp_path / "cmp"
    proc = run_cli("compare", "--n", 24, "--nb", 4, "--ranks", "1,3", "--comm", "mpi", "--repeat", 2,
                   "--out", out, timeout=3 * HANG_TIMEOUT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("mpiexec -n 1 ") == 1 and proc.stdout.count("mpiexec -n 3 ") == 1, proc.stdout
    assert len(_runs(out)) == 4 and {r.name.split("_")[2] for r in _runs(out)} == {"p1", "p3"}
    rep = json.loads((out / "report.json").read_text())
    assert not rep["failures"]
    assert "Rank counts used: 1, 3." in (out / "report.md").read_text()


# -- host BLAS threads ---------------------------------------------------------------------------------
@pytest.mark.parametrize("setting,cpus,sharing,env,threads", [
    ("auto", 16, 2, {}, 8), ("auto", 16, 3, {}, 5), ("auto", 2, 3, {}, 1), ("auto", 16, 1, {}, None),
    ("auto", 16, 4, {"OMP_NUM_THREADS": "2"}, None), ("auto", 16, 4, {"OPENBLAS_NUM_THREADS": "3"}, None),
    ("all", 16, 4, {}, None), (3, 16, 4, {}, 3), (3, 16, 1, {"OMP_NUM_THREADS": "8"}, 3),
])
def test_host_threads_share_the_cpus_ranks_share(setting, cpus, sharing, env, threads):
    got, why = host_thread_choice(setting, cpus, sharing, env)
    assert got == threads and why
    if env and setting == "auto":
        assert next(iter(env)) in why


def test_parse_host_threads():
    assert parse_host_threads("auto") == "auto" and parse_host_threads("all") == "all"
    assert parse_host_threads("7") == 7
    for bad in ("0", "-1", "1.5", "", "ALL"):
        with pytest.raises(ValueError, match="--host-threads"):
            parse_host_threads(bad)


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_getaffinity (Linux)")
def test_unbound_ranks_share_the_node_for_host_blas(tmp_path):
    """Two ranks of one node on the same CPUs (MPICH's mpiexec binds nothing) and no thread
    variable: each limits its BLAS to its share; the run's JSON says so."""
    out = tmp_path / "runs"
    proc = run_cli("solve", "--n", 40, "--nb", 4, "--comm", "mpi", "--out", out, ranks=2, thread_env=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blas = json.loads(_runs(out)[0].read_text())["machine"]["blas"]
    ht = blas["host_threads"]
    assert ht["ranks_sharing_them"] == 2 and ht["cpus"] == len(os.sched_getaffinity(0))
    assert ht["threads"] == max(1, ht["cpus"] // 2)
    assert all(lib["num_threads"] == ht["threads"] for lib in blas["libraries"] if lib.get("user_api") == "blas")
    # --host-threads N wins over everything
    proc = run_cli("solve", "--n", 40, "--nb", 4, "--comm", "mpi", "--out", out, "--host-threads", 3,
                   "--overwrite", ranks=2)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    blas = json.loads(_runs(out)[0].read_text())["machine"]["blas"]
    assert blas["host_threads"]["threads"] == 3
    assert all(lib["num_threads"] == 3 for lib in blas["libraries"] if lib.get("user_api") == "blas")


# -- the test command itself ---------------------------------------------------------------------------
def test_slurm_stage_installs_nothing_unless_asked(tmp_path):
    """tests/slurm/run without Slurm on PATH: skipped with a reason, apt-get never called; with
    HPCCOLL_TEST_INSTALL=1 it calls apt-get."""
    fake = tmp_path / "bin"
    fake.mkdir()
    marker = tmp_path / "apt-get-called"
    (fake / "apt-get").write_text(f"#!/bin/sh\necho \"$@\" >> {marker}\n")
    (fake / "apt-get").chmod(0o755)
    for tool in ("bash", "id", "dirname", "env", "nproc", "mktemp", "cat"):
        path = shutil.which(tool)
        if path:
            (fake / tool).symlink_to(path)
    env = dict(_env(), PATH=str(fake), PYTHON=sys.executable)
    env.pop("HPCCOLL_TEST_INSTALL", None)
    proc = subprocess.run([shutil.which("bash"), str(REPO / "tests" / "slurm" / "run")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 77 and "skipped: " in proc.stdout, proc.stdout + proc.stderr  # 77: skipped
    assert not marker.exists(), "tests/slurm/run ran apt-get unasked"
    if os.geteuid() == 0:
        env["HPCCOLL_TEST_INSTALL"] = "1"
        proc = subprocess.run([shutil.which("bash"), str(REPO / "tests" / "slurm" / "run")], env=env,
                              capture_output=True, text=True, timeout=60)
        assert marker.exists() and "install" in marker.read_text()
        assert proc.returncode != 0   # the fake apt-get installed nothing


def test_test_command_keeps_the_kernel_cache_and_ci_asks_for_installs():
    run = (REPO / "tests" / "run").read_text()
    assert "HPCCOLL_TEST_KERNEL_CACHE" in run and "apt-get" not in run.replace("apt-get install Slurm", "")
    assert "HPCCOLL_TEST_INSTALL=1" in (REPO / ".ci" / "run").read_text()
    assert "HPCCOLL_TEST_KERNEL_CACHE" in (REPO / "tests" / "unit" / "test_device_code.py").read_text()


def test_gc_pauses_count_only_the_collections_made_inside():
    import gc

    from hpccoll_eigensolver.runinfo import GcPauses

    with GcPauses() as pauses:
        gc.collect()
        gc.collect(0)
    assert pauses.collections == [1, 0, 1] and pauses.seconds[2] > 0
    gc.collect()                       # outside: not counted
    assert pauses.record()["collections"] == [1, 0, 1]
    assert pauses._callback not in gc.callbacks


def _hanging_launcher(pidfile) -> list[str]:
    """A launcher stand-in that starts a child (a "rank", which would outlive it if only the
    launcher were stopped), writes the child's pid to `pidfile`, prints 'started' and sleeps."""
    return [sys.executable, "-c",
            "import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
            "print('started', flush=True)\n"
            "time.sleep(120)\n"]


def _assert_gone(pid: int, what: str) -> None:
    """The process `pid` ends within 5 s."""
    import time

    for _ in range(50):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    pytest.fail(f"the configuration's child process outlived {what}")


def test_a_configuration_past_config_timeout_is_stopped_and_recorded(tmp_path):
    """compare's --config-timeout: a configuration still running past it is stopped with every
    process it started (its own process group), recorded as failed with the reason, and the
    next one runs."""
    import time

    from hpccoll_eigensolver.compare import _launch

    out = tmp_path / "cmp"
    out.mkdir()
    pidfile = tmp_path / "child.pid"
    args = build_parser().parse_args(["compare", "--n", "24", "--nb", "4", "--out", str(out),
                                      "--config-timeout", "2"])
    args.ranks = 2
    t0 = time.monotonic()
    assert _launch("nccl", _hanging_launcher(pidfile), args) is False
    assert time.monotonic() - t0 < 30
    rec = json.loads(next(out.glob("failed_*.json")).read_text())
    assert rec["returncode"] is None and "--config-timeout 2 s" in rec["reason"] and "started" in rec["error"]
    _assert_gone(int(pidfile.read_text()), "the timeout")  # it went with its group
    args.config_timeout = None
    assert _launch("mpi", [sys.executable, "-c", "print('fine')"], args) is True


def test_an_interrupted_compare_stops_the_configuration_it_runs(tmp_path):
    """Ctrl-C during a configuration run with --config-timeout (in its own process group, which
    the terminal's SIGINT does not reach): compare stops the group and the interrupt goes on."""
    import signal
    import threading
    import time

    from hpccoll_eigensolver.compare import _launch

    out = tmp_path / "cmp"
    out.mkdir()
    pidfile = tmp_path / "child.pid"
    args = build_parser().parse_args(["compare", "--n", "24", "--out", str(out), "--config-timeout", "60"])
    args.ranks = 2

    def interrupt():
        for _ in range(100):  # once the child is up
            if pidfile.exists() and pidfile.read_text():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _launch("nccl", _hanging_launcher(pidfile), args)
    assert time.monotonic() - t0 < 30
    _assert_gone(int(pidfile.read_text()), "the interrupt")


def test_compare_refuses_ranks_sharing_a_gpu_without_mps_before_running_anything(tmp_path):
    """2 ranks on the one GPU CUDA_VISIBLE_DEVICES shows, no MPS running and none to start: the
    refusal names the cost and the fix, and no configuration runs."""
    env = dict(_env(), CUDA_VISIBLE_DEVICES="0", CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"),
               PATH=os.path.dirname(sys.executable) + os.pathsep + "/usr/bin:/bin")
    out = tmp_path / "cmp"
    proc = subprocess.run([sys.executable, "-m", "hpccoll_eigensolver.cli", "compare", "--n", "24", "--nb", "4",
                           "--ranks", "2", "--comm", "mpi", "--out", str(out)],
                          capture_output=True, text=True, timeout=HANG_TIMEOUT, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "compare: 2 ranks on 1 GPU share GPUs and no MPS runs" in proc.stderr
    assert "nvidia-cuda-mps-control -d" in proc.stderr and "mpiexec" not in proc.stdout
    assert not _runs(out)
