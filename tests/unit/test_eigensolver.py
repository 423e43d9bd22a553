"""Serial tests of the eigensolver app: layout, problems, metrics, a one-rank solve, the report."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg as sl

from hpccoll_eigensolver import BlockCyclic, distribute, gather, numroc, sygvd
from hpccoll_eigensolver import metrics
from hpccoll_eigensolver.problems import make_problem
from hpccoll_eigensolver.report import build_report

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "eigensolver"  # recorded runs (README there)


def _unpack(archive: Path, dest: Path) -> None:
    """The regular files of a recorded-runs archive under `dest` (what extractall's
    filter="data" does, which Python before 3.10.12 / 3.11.4 lacks)."""
    import tarfile

    root = dest.resolve()
    with tarfile.open(archive) as tar:
        for m in tar.getmembers():
            path = (dest / m.name).resolve()
            if m.isfile() and path.is_relative_to(root):
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(tar.extractfile(m).read())


# -- layout ----------------------------------------------------------------------------
@pytest.mark.parametrize("n,nb,p", [(1, 1, 1), (10, 3, 3), (64, 16, 2), (101, 8, 3), (7, 64, 4)])
def test_block_cyclic_partitions_columns(n, nb, p):
    desc = BlockCyclic(n, n, nb, p)
    seen = np.concatenate([desc.local_cols(r) for r in range(p)])
    assert sorted(seen.tolist()) == list(range(n))
    for r in range(p):
        cols = desc.local_cols(r)
        assert cols.size == desc.local_n(r) == numroc(n, nb, r, p)
        assert all(desc.owner(int(j)) == r for j in cols)
        assert [desc.local_index(int(j)) for j in cols] == list(range(cols.size))
    assert desc.max_local_n == max(desc.local_n(r) for r in range(p))


class _SimComm:
    """Plays all ranks of an Allgather for the serial gather test."""

    def __init__(self, rank, size, blocks):
        self.rank, self.size, self.blocks = rank, size, blocks

    def Get_rank(self):
        return self.rank

    def Allgather(self, send, recv):
        for r, blk in enumerate(self.blocks):
            recv[r] = 0
            recv[r, :blk.shape[1]] = blk.T


@pytest.mark.parametrize("n,nb,p", [(13, 4, 3), (64, 64, 2), (50, 7, 1)])
def test_distribute_gather_round_trip(n, nb, p):
    a = np.random.default_rng(0).standard_normal((n, n))
    desc = BlockCyclic(n, n, nb, p)
    blocks = [distribute(a, desc, r) for r in range(p)]
    assert all(b.flags.f_contiguous for b in blocks)
    for r in range(p):
        np.testing.assert_array_equal(gather(blocks[r], desc, _SimComm(r, p, blocks)), a)


def test_distribute_rejects_wrong_shape():
    with pytest.raises(ValueError, match="shape"):
        distribute(np.zeros((3, 4)), BlockCyclic(4, 4, 2, 1), 0)


# -- problems ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["known", "clustered", "wilkinson", "random"])
def test_problems_are_deterministic_and_correct(kind):
    p1 = make_problem(kind, 60, cond_b=1e3, seed=5)
    p2 = make_problem(kind, 60, cond_b=1e3, seed=5)
    assert p1.A.tobytes() == p2.A.tobytes() and p1.B.tobytes() == p2.B.tobytes()
    np.testing.assert_array_equal(p1.A, p1.A.T)
    np.testing.assert_array_equal(p1.B, p1.B.T)
    assert np.linalg.cond(p1.B) == pytest.approx(1e3, rel=1e-6)
    w = sl.eigh(p1.A, p1.B, eigvals_only=True)
    if kind == "random":
        assert p1.eigenvalues is None
    else:
        assert metrics.eigenvalue_error(w, p1.eigenvalues) < 1e-12


def test_clustered_and_wilkinson_have_clusters():
    assert len(metrics.clusters(make_problem("clustered", 64).eigenvalues)) == 8
    assert len(metrics.clusters(make_problem("wilkinson", 41).eigenvalues, 1e-9)) >= 5


def test_file_problem(tmp_path):
    p = make_problem("random", 20, seed=1)
    np.save(tmp_path / "A.npy", p.A)
    np.save(tmp_path / "B.npy", p.B)
    q = make_problem(f"file:{tmp_path / 'A.npy'},{tmp_path / 'B.npy'}", 0)
    np.testing.assert_array_equal(q.A, p.A)
    with pytest.raises(ValueError, match="file:A.npy,B.npy"):
        make_problem("file:onlyone.npy", 0)
    with pytest.raises(ValueError, match="known"):
        make_problem("nonsense", 10)


# -- metrics --------------------------------------------------------------------------------
def test_metrics_on_scipy_solution():
    p = make_problem("known", 80, seed=2)
    w, X = sl.eigh(p.A, p.B)
    assert metrics.residual(p.A, p.B, X, w) < 1.0
    assert metrics.b_orthogonality(p.B, X) < 50
    assert metrics.eigenvalue_error(w, None) is None
    assert metrics.sha256(X) == metrics.sha256(np.asfortranarray(X))


def test_ulp_distance():
    a = np.array([1.0, 0.0, -0.0, -2.0, 1e-300])
    b = np.array([np.nextafter(1.0, 2.0), -0.0, 5e-324, np.nextafter(-2.0, 0.0), -1e-300])
    d = metrics.ulp_distance(a, b)
    assert d[:4].tolist() == [1.0, 0.0, 1.0, 1.0]
    assert d[4] > 1e17


def test_sign_alignment():
    X0 = np.eye(3)
    X = X0 * np.array([1.0, -1.0, 1.0])
    np.testing.assert_array_equal(metrics.align_signs(X, X0), X0)


# -- solver at one rank ------------------------------------------------------------------------
@pytest.mark.parametrize("n,nb", [(1, 4), (2, 4), (37, 8), (64, 64), (600, 64), (517, 32)])
def test_sygvd_one_rank(n, nb):
    """One rank (potrf, sygst and trsm then step through 256-column panels: 600 and 517 have
    several, the last one ragged) against LAPACK."""
    from hpccoll import Communicator

    p = make_problem("random", n, cond_b=10.0, seed=n)
    with Communicator(backend="host", deterministic=True) as comm:
        desc = BlockCyclic(n, n, nb, 1)
        w, X = sygvd(p.A.copy(order="F"), p.B.copy(order="F"), desc, comm)
    ref = sl.eigh(p.A, p.B, eigvals_only=True)
    assert metrics.eigenvalue_error(w, ref) < 1e-12
    assert metrics.residual(p.A, p.B, X, w) < 1.0
    assert metrics.b_orthogonality(p.B, X) < 50


def test_sygvd_eigvals_only_and_its_older_name_eigvecs():
    """eigvals_only=True (scipy.linalg.eigh's keyword) returns (w, None) with the eigenvalues of
    the full solve; eigvecs=False means the same with a DeprecationWarning naming eigvals_only;
    both keywords at once are a TypeError."""
    import warnings

    from hpccoll import Communicator
    from hpccoll_eigensolver.linalg.driver import solve_distributed

    n = 30
    p = make_problem("known", n, seed=2)
    with Communicator(backend="host", deterministic=True) as comm:
        desc = BlockCyclic(n, n, 8, 1)
        w_full, X = sygvd(p.A, p.B, desc, comm)
        assert X is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            w, X = sygvd(p.A, p.B, desc, comm, eigvals_only=True)
            assert X is None
            assert sygvd(p.A, p.B, desc, comm, eigvals_only=False)[1] is not None
        np.testing.assert_allclose(w, sl.eigh(p.A, p.B, eigvals_only=True), rtol=1e-12, atol=0)
        np.testing.assert_allclose(w, w_full, rtol=1e-13, atol=0)
        with pytest.warns(DeprecationWarning, match="eigvals_only=True"):
            w_old, X_old = sygvd(p.A, p.B, desc, comm, eigvecs=False)
        assert X_old is None and w_old.tobytes() == w.tobytes()
        with pytest.warns(DeprecationWarning, match="eigvals_only=False"):
            assert sygvd(p.A, p.B, desc, comm, eigvecs=True)[1] is not None
        for both in ({"eigvals_only": True, "eigvecs": False}, {"eigvals_only": False, "eigvecs": True}):
            with pytest.raises(TypeError, match="eigvals_only"):
                sygvd(p.A, p.B, desc, comm, **both)
            with pytest.raises(TypeError, match="eigvals_only"):
                solve_distributed(p.A, p.B, comm, nb=8, **both)
        assert solve_distributed(p.A, p.B, comm, nb=8, eigvals_only=True)[1] is None
        with pytest.warns(DeprecationWarning, match="eigvals_only=True"):
            assert solve_distributed(p.A, p.B, comm, nb=8, eigvecs=False)[1] is None


def test_sygvd_rejects_indefinite_b():
    from hpccoll import Communicator
    from hpccoll_eigensolver import NotPositiveDefinite

    n = 10
    with Communicator(backend="host") as comm, pytest.raises(NotPositiveDefinite):
        sygvd(np.eye(n), -np.eye(n), BlockCyclic(n, n, 4, 1), comm)


# -- report -------------------------------------------------------------------------------------
def _synthetic_run(out, comm, r, w, ranks=3, x_digest="x0"):
    rec = {"schema": "hpccoll-eigensolver/run/1", "n": w.size, "nb": 2, "ranks": ranks, "comm": comm,
           "backend": "host", "device": "cpu", "problem": "known", "cond_b": 1e3, "seed": 0,
           "repeat_index": r, "repeat": 3, "eigenvalues_sha256": metrics.sha256(w),
           "eigenvectors_sha256": x_digest,
           "per_rank": [{"rank": i, "eigenvalues_sha256": metrics.sha256(w),
                         "local_eigenvectors_sha256": f"{x_digest}-{i}"} for i in range(ranks)],
           "ranks_agree_on_eigenvalues": True, "residual": 1e-3, "b_orthogonality": 2.0,
           "eigenvalue_error": 1e-15, "eigenvalue_error_vs_scipy": None,
           "eigenvalue_error_definition": metrics.EIGENVALUE_ERROR_DEFINITION,
           "phases": {"potrf": 0.1, "sytrd": 0.5}, "solve_seconds": 0.7,
           "collectives": {"count": 10, "bytes": 800, "seconds": 0.2, "share_of_solve": 0.2,
                           "by_phase": {"sytrd": {"Allreduce": {"count": 10, "bytes": 800, "seconds": 0.2,
                                                                "min_bytes": 8, "max_bytes": 80}}},
                           "by_name": {"Allreduce": {"count": 10, "bytes": 800, "seconds": 0.2,
                                                     "min_bytes": 8, "max_bytes": 80}},
                           "sizes": {"<=1KiB": 10}},
           "machine": {"hostname": "test", "cpu": "cpu", "gpu": None}, "git_commit": None,
           "eigenvalues": w.tolist(), "eigenvectors_file": None}
    with open(os.path.join(out, f"known_n{w.size}_p{ranks}_{comm}_run{r:03d}.json"), "w") as f:
        json.dump(rec, f)


def test_report_from_synthetic_runs(tmp_path):
    w = np.linspace(-1.0, 1.0, 9)
    w2 = w.copy()
    w2[3] = np.nextafter(w2[3], 9.0)
    for r, ww in enumerate([w, w, w2]):
        _synthetic_run(tmp_path, "ll128", r, ww, x_digest="x0" if r < 2 else "x1")
    for r in range(2):
        _synthetic_run(tmp_path, "sentinel", r, w)
    with open(tmp_path / "failed_known_n9_p3_nccl.json", "w") as f:
        json.dump({"schema": "hpccoll-eigensolver/failure/1", "comm": "nccl", "ranks": 3, "n": 9,
                   "returncode": 2, "error": "backend='nccl' is not available: no GPU"}, f)
    paths = build_report(str(tmp_path))
    assert {os.path.basename(p) for p in paths} >= {"report.md", "report.json"}
    rep = json.loads((tmp_path / "report.json").read_text())
    by = {c["comm"]: c for c in rep["configurations"]}
    assert by["ll128"]["distinct_eigenvalue_digests"] == 2
    assert by["ll128"]["max_ulp_to_run0"] == 1.0
    assert by["sentinel"]["distinct_eigenvalue_digests"] == 1
    assert by["sentinel"]["max_ulp_to_run0"] == 0.0
    md = (tmp_path / "report.md").read_text()
    assert "three or more contributions" in md and "nccl" in md and "no GPU" in md


def _no_verdicts(directory: Path) -> None:
    """report.json has no target or verdict key anywhere, report.md no target table."""
    def keys(x):
        if isinstance(x, dict):
            for k, v in x.items():
                yield k
                yield from keys(v)
        elif isinstance(x, list):
            for v in x:
                yield from keys(v)

    rep = json.loads((directory / "report.json").read_text())
    assert not [k for k in keys(rep) if "target" in k.lower() or k in ("met", "verdict")]
    md = (directory / "report.md").read_text()
    assert "target" not in md.lower() and "| met |" not in md and "**no**" not in md


def test_report_compares_medians_and_keeps_the_analysis(tmp_path):
    """From a recorded 8192 job (sentinel, NCCL, cuSOLVERMp at 2 ranks, one GPU): each
    configuration's median solve time and its ratio to the fastest baseline present, computed
    from the medians; no targets or verdicts; a person's analysis.md in the directory is carried
    into report.md."""
    _unpack(FIXTURES / "2026-11-30-h200x2-2a29633-n8192.tar.xz", tmp_path)
    (tmp_path / "analysis.md").write_text("The product kernel is latency-bound (measured).")
    build_report(str(tmp_path))
    rep = json.loads((tmp_path / "report.json").read_text())
    by = {c["comm"]: c for c in rep["configurations"]}
    medians = {comm: float(np.median([json.loads(p.read_text())["solve_seconds"]
                                      for p in tmp_path.glob(f"known_n8192_p*_{comm}_run*.json")]))
               for comm in ("sentinel", "nccl", "cusolvermp", "single-gpu")}
    for comm, t in medians.items():
        assert by[comm]["median_solve_seconds"] == pytest.approx(t, rel=1e-12)
    fastest = min(("nccl", "cusolvermp", "single-gpu"), key=medians.get)
    rows = {r["config"]: r for r in rep["comparisons"]["time"]}
    assert len(rows) == 4
    for comm, ranks in (("sentinel", 2), ("nccl", 2), ("cusolvermp", 2), ("single-gpu", 1)):
        row = rows[f"{comm} ({ranks} rank{'s' if ranks > 1 else ''})"]
        assert row["median_solve_seconds"] == pytest.approx(medians[comm], rel=1e-12)
        assert row["baseline_median_solve_seconds"] == pytest.approx(medians[fastest], rel=1e-12)
        assert row["time_over_baseline"] == pytest.approx(medians[comm] / medians[fastest], rel=1e-12)
    md = (tmp_path / "report.md").read_text()
    assert "## Comparisons" in md and "latency-bound (measured)" in md
    sentinel = rows["sentinel (2 ranks)"]
    assert f"| {sentinel['time_over_baseline']:.2f} |" in md
    _no_verdicts(tmp_path)


def test_report_compares_memory_with_the_one_rank_share_from_a_recorded_job(tmp_path):
    """From the recorded one-H200 job (the first run of each configuration at n = 8192 and 16384:
    P = 1, 2, 4 through MPS, and the anchor): the per-rank device memory of P ranks against the
    one-rank share (the solve's own pool mark), and each configuration's time against the
    anchor, the only baseline there - numbers from the records, no verdicts."""
    _unpack(FIXTURES / "2026-12-04-h200x1-624f21c-run000.tar.xz", tmp_path)
    build_report(str(tmp_path))
    rep = json.loads((tmp_path / "report.json").read_text())
    groups = {(c["comm"], c["ranks"], c["n"]): c for c in rep["configurations"]}

    def peak(c):
        return c["memory"]["device_pool_solve_peak_bytes"]["max"]

    memory = {(r["n"], r["config"]): r for r in rep["comparisons"]["memory"]}
    times = {(r["n"], r["config"]): r for r in rep["comparisons"]["time"]}
    assert len(memory) == 4 and len(times) == 8
    for n in (8192, 16384):
        one, anchor = groups[("sentinel", 1, n)], groups[("single-gpu", 1, n)]
        for p in (2, 4):
            row = memory[(n, f"sentinel ({p} ranks)")]
            assert row["memory"] == "device pool"
            assert row["per_rank_peak_bytes"] == peak(groups[("sentinel", p, n)])
            assert row["one_rank_share_bytes"] == peak(one) / p
            assert row["per_rank_over_share"] == pytest.approx(peak(groups[("sentinel", p, n)]) / (peak(one) / p))
        for p in (1, 2, 4):
            row = times[(n, f"sentinel ({p} rank{'s' if p > 1 else ''})")]
            assert row["baseline"] == "single-gpu (1 rank)"
            assert row["time_over_baseline"] == pytest.approx(
                groups[("sentinel", p, n)]["median_solve_seconds"] / anchor["median_solve_seconds"])
    assert groups[("sentinel", 4, 8192)]["gpus_used"] == 1
    _no_verdicts(tmp_path)


def test_report_from_recorded_gpu_runs(tmp_path):
    """The report rebuilt from the committed GPU run JSON (2xH200, 4 ranks on 2 GPUs under MPS,
    n=2048, 10 runs each): determinism per path and rank agreement come out of the recorded data."""
    _unpack(FIXTURES / "2026-11-30-h200x2-f4b2279-n2048-p4-mps.tar.xz", tmp_path)
    n = len(list(tmp_path.glob("known_*.json")))
    assert n == 20, f"expected 20 recorded runs in the fixture, found {n}"
    build_report(str(tmp_path))
    rep = json.loads((tmp_path / "report.json").read_text())
    by = {c["comm"]: c for c in rep["configurations"]}
    assert by["sentinel"]["runs"] == 10 and by["ll128"]["runs"] == 10
    assert by["sentinel"]["distinct_eigenvalue_digests"] == 1          # deterministic at 4 ranks
    assert by["sentinel"]["distinct_eigenvector_digests"] == 1
    assert by["sentinel"]["max_ulp_to_run0"] == 0.0
    assert by["ll128"]["distinct_eigenvalue_digests"] > 1              # atomics: order varies
    assert by["ll128"]["max_ulp_to_run0"] > 0
    assert all(c["ranks_agree_on_eigenvalues_all_runs"] for c in rep["configurations"])
    assert rep["rank_counts"] == [4]


# -- CLI -------------------------------------------------------------------------------------------
def test_cli_help():
    from hpccoll_eigensolver.cli import build_parser

    for cmd in ("solve", "compare", "report"):
        with pytest.raises(SystemExit) as e:
            build_parser().parse_args([cmd, "--help"])
        assert e.value.code == 0


def test_compare_end_to_end(tmp_path):
    """compare launches mpiexec: the host path runs twice identically; the cuda path without a GPU
    is recorded as a failure in the report instead of crashing."""
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "hpccoll_eigensolver.cli", "compare", "--n", "40", "--nb", "8",
           "--ranks", "2", "--repeat", "2", "--comm", "mpi,sentinel", "--problem", "clustered", "--out", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    rep = json.loads((out / "report.json").read_text())
    # compare exits 1 when a configuration failed (the cuda path without a GPU), 0 when all ran
    assert proc.returncode == (1 if rep["failures"] else 0), proc.stdout + proc.stderr
    mpi = [c for c in rep["configurations"] if c["comm"] == "mpi"][0]
    assert mpi["runs"] == 2 and mpi["distinct_eigenvalue_digests"] == 1 and mpi["distinct_eigenvector_digests"] == 1
    assert mpi["ranks_agree_on_eigenvalues_all_runs"]
    if not any(c["comm"] == "sentinel" for c in rep["configurations"]):
        assert any(f["comm"] == "sentinel" for f in rep["failures"])


@pytest.mark.parametrize("n,nb,block", [(37, 8, 8), (64, 8, 16), (5, 4, 64), (300, 32, 256), (70, 8, 1)])
def test_ormtr_applies_the_reflectors_including_identity_ones(n, nb, block):
    """ormtr (compact WY through the UT transform, one triangular solve per block of panels)
    equals the explicit product H_0 ... H_{n-2} applied to Z, with some tau = 0 (identity
    reflectors whose v is not zero) in the mix; fresh random data each run.  One rank: the
    local V is all of it."""
    from hpccoll import Communicator
    from hpccoll_eigensolver.linalg.ormtr import ormtr

    rng = np.random.default_rng()
    V = np.zeros((n, n), order="F")
    for j in range(n - 1):
        V[j + 1, j] = 1.0
        V[j + 2:, j] = rng.standard_normal(n - j - 2)
    tau = 2.0 / (V * V).sum(axis=0).clip(min=1e-300)
    tau[n - 1:] = 0.0
    tau[rng.choice(n - 1, size=max(1, n // 6), replace=False)] = 0.0  # identity reflectors
    Z = rng.standard_normal((n, 7))
    Q = np.eye(n)
    for j in range(n - 1):
        Q = Q @ (np.eye(n) - tau[j] * np.outer(V[:, j], V[:, j]))
    with Communicator(backend="host", deterministic=True) as comm:
        if comm.size != 1:
            pytest.skip("single-process test")
        got = ormtr(V, tau, np.asfortranarray(Z), BlockCyclic(n, n, nb, 1), comm, np, block=block)
    np.testing.assert_allclose(got, Q @ Z, atol=1e-12 * n)


def test_sygvd_rejects_bad_options():
    from hpccoll import Communicator

    n = 6
    with Communicator(backend="host") as comm:
        desc = BlockCyclic(n, n, 4, 1)
        for kw, match in [({"stedc": "lapack"}, "stedc='lapack': use 'auto', 'dc', 'host', 'gpu'"),
                          ({"stedc": "gpu"}, "stedc='gpu' needs device"),
                          ({"sytrd": "fast"}, "sytrd='fast': use 'auto', 'fused'")]:
            with pytest.raises(ValueError, match=match):
                sygvd(np.eye(n), np.eye(n), desc, comm, **kw)


def test_largest_n_table_in_the_docs_is_the_models():
    """docs/eigensolver.md's table of the largest n per GPU count is what memory.largest_n gives
    (by the model, and by the model times the measured factor it names)."""
    import re
    from pathlib import Path

    from hpccoll_eigensolver.memory import largest_n

    text = (Path(__file__).resolve().parents[2] / "docs" / "eigensolver.md").read_text()
    gpus = [int(x) for x in re.search(r"^\| GPUs \|(.*)\|$", text, re.M).group(1).split("|")]
    rows = dict(re.findall(r"^\| largest n, model( × [0-9.]+)? \|(.*)\|$", text, re.M))
    assert "" in rows and len(rows) == 2, rows
    for label, cells in rows.items():
        factor = float(label.split("×")[1]) if label else 1.0
        assert [int(c.replace(",", "")) for c in cells.split("|")] == [largest_n(g, factor=factor) for g in gpus]


def test_rows_to_columns_on_one_rank_is_the_rows():
    """One rank holds every row and every column: rows_to_columns hands its rows back (F order,
    no exchange), and a wrong shape is still refused by name."""
    from mpi4py import MPI

    import hpccoll
    from hpccoll_eigensolver.linalg.layout import rows_to_columns

    rng = np.random.default_rng()
    n = int(rng.integers(2, 40))
    desc = BlockCyclic(n, n, 4, 1)
    comm = hpccoll.Communicator(MPI.COMM_SELF, backend="host")
    try:
        rows = np.asfortranarray(rng.standard_normal((n, n)))
        got = rows_to_columns(rows, [0, n], desc, comm)
        assert got.flags.f_contiguous and np.array_equal(got, rows)
        got = rows_to_columns(np.ascontiguousarray(rows), [0, n], desc, comm)
        assert got.flags.f_contiguous and np.array_equal(got, rows)
        with pytest.raises(ValueError, match="rows_to_columns"):
            rows_to_columns(rows[:-1], [0, n], desc, comm)
    finally:
        comm.Free()


@pytest.mark.parametrize("cond_b", [1e8, 1e12])
@pytest.mark.parametrize("kind", ["known", "wilkinson"])
def test_the_stored_spectrum_is_far_more_accurate_than_a_float64_solve(kind, cond_b):
    """metrics.stored_spectrum, the accuracy checks' reference: a symmetric permutation of the
    pair leaves its eigenvalues exactly as they are but rounds every step differently, so the
    two references differ by about their own error; that must be a small fraction of LAPACK's
    float64 error (about 1/500 on these problems).  Fresh seed and permutation each run."""
    rng = np.random.default_rng()
    n = int(rng.integers(60, 90))
    prob = make_problem(kind, n, cond_b=cond_b, seed=int(rng.integers(1 << 30)))
    A, B = np.asarray(prob.A), np.asarray(prob.B)
    p = np.ix_(*[rng.permutation(n)] * 2)
    exact, permuted = metrics.stored_spectrum(A, B), metrics.stored_spectrum(A[p], B[p])
    lapack = metrics.eigenvalue_error(sl.eigh(A, B, eigvals_only=True), exact)
    assert metrics.eigenvalue_error(permuted, exact) < 0.05 * lapack, (n, lapack)


def test_subset_and_solver_object_on_one_rank():
    """One rank (the serial stage; tests/mpi/test_eigensolver_subset_mpi.py runs 1-4 ranks):
    subset_by_index against SciPy's, eigvals_only the same w, GeneralizedSolver's second solve
    the same bits as a fresh sygvd, bad subsets a ValueError naming subset_by_index."""
    import scipy.linalg as sl
    from hpccoll import Communicator

    from hpccoll_eigensolver import GeneralizedSolver

    n = 61
    prob, other = make_problem("clustered", n, cond_b=1e8, seed=2), make_problem("known", n, cond_b=1e8, seed=4)
    desc = BlockCyclic(n, n, 8, 1)
    with Communicator(backend="host", deterministic=True) as comm:
        w, X = sygvd(prob.A, prob.B, desc, comm, subset_by_index=(10, 24))
        ws, Xs = sl.eigh(prob.A, prob.B, subset_by_index=(10, 24))
        assert X.shape == (n, 15) and np.abs(w - ws).max() <= 1e-6 * np.abs(ws).max()
        assert metrics.residual(prob.A, prob.B, X, w) <= 2 * max(metrics.residual(prob.A, prob.B, Xs, ws), 1.0)
        assert sygvd(prob.A, prob.B, desc, comm, subset_by_index=(10, 24), eigvals_only=True)[0].tobytes() == w.tobytes()
        with GeneralizedSolver(prob.B, desc, comm) as solver:
            solver.solve(other.A)
            w2, X2 = solver.solve(prob.A, subset_by_index=(10, 24))
        assert w2.tobytes() == w.tobytes() and X2.tobytes() == X.tobytes()
        for bad in [(3, 2), (0, n), (0.5, 3), "0:3"]:
            with pytest.raises(ValueError, match="subset_by_index"):
                sygvd(prob.A, prob.B, desc, comm, subset_by_index=bad)
