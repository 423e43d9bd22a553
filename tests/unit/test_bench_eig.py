"""bench/eig_vs_cusolver.py on the CPU: its arguments, flop model, tables and accuracy metrics,
and the whole run end to end with --host (NumPy; scipy.linalg.eigh(A, B) standing in for
cuSOLVER's dsygvd), so that a GPU run meets no Python error of its own."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.linalg as sl

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import cusolver_direct as cd
import eig_measure as em
import eig_vs_cusolver as evc


def test_defaults():
    a = evc.parse_args([])
    assert a.n == [8192, 16384] and a.problems == ["random", "known"] and a.calls == 2
    assert a.cases[0] == "sol" and "dsygvd" in a.cases and "two-stage-sub" in a.cases
    assert "anchor" not in a.cases and a.comm == "sentinel" and a.sol_n == [8192, 16384] and not a.mpi
    h = evc.parse_args(["--host", "--n", "40,50"])
    assert h.n == [40, 50] and h.comm == "mpi" and h.sol_n == [256]
    m = evc.parse_args(["--ranks-child"])
    assert m.mpi and m.cases == ["one-stage", "two-stage"]
    assert set(evc.parse_args(["--what", "all"]).cases) == set(em.CASES) | {"sol"}


@pytest.mark.parametrize("argv, named", [(["--what", "dsygvd,foo"], "foo"), (["--what", ","], "nothing named"),
                                         (["--mpi", "--what", "dsygvd"], "dsygvd"), (["--n", "8192,x"], "integers"),
                                         (["--problems", "wilkinson"], "wilkinson"), (["--calls", "0"], "--calls")])
def test_bad_arguments_are_named(argv, named, capsys):
    with pytest.raises(SystemExit):
        evc.parse_args(argv)
    err = capsys.readouterr().err
    assert named in err
    if "--what" in argv:
        assert "one-stage" in err   # the valid names are listed


def test_references_run_first():
    assert evc.ordered(["one-stage", "dsygvd", "two-stage-w", "anchor-w"]) == ["dsygvd", "anchor-w", "one-stage",
                                                                                "two-stage-w"]


def test_cusolver_workspace_limit():
    """LAPACK's dsyevd minimum, 1 + 6n + 2n^2 doubles with vectors, first overflows the 32-bit
    lwork at n = 32767; cuSOLVER is not called there (nor is CuPy needed to refuse)."""
    assert cd.lapack_syevd_lwork(32766, True) <= cd.INT32_MAX < cd.lapack_syevd_lwork(32767, True)
    assert cd.lapack_syevd_lwork(10**6, False) == 2 * 10**6 + 1
    thin = np.empty((32768, 1))
    with pytest.raises(cd.SizeLimit, match="32-bit"):
        cd.prepare_sygvd(object(), thin, thin, True)       # any device module: refused before use
    with pytest.raises(cd.SizeLimit, match="32-bit"):
        cd.prepare_sygvdx(object(), thin, thin, 0, 9)


def test_flop_model():
    n, k = 1000, 100
    assert em.phase_flops("potrf", n, n) == pytest.approx(n**3 / 3)
    assert em.phase_flops("sygst", n, n) == n**3
    assert em.phase_flops("sytrd", n, n, "one-stage") == pytest.approx(4 * n**3 / 3)
    assert em.phase_flops("sytrd", n, n, "two-stage", band=32) == pytest.approx(4 * n**3 / 3 + 6 * 32 * n**2)
    assert em.phase_flops("ormtr", n, k, "one-stage") == 2 * n**2 * k
    assert em.phase_flops("ormtr", n, k, "two-stage") == 4 * n**2 * k   # Q2 nominal + Q1
    assert em.phase_flops("trsm", n, k) == n**2 * k
    assert em.phase_flops("stedc", n, n) is None and em.phase_flops("syevd", n, n) is None
    assert em.useful_flops(n, n) == pytest.approx(17 * n**3 / 3)
    assert em.useful_flops(n, 0) == pytest.approx(8 * n**3 / 3)
    assert [em.vectors_of(o, 95) for o in ("full", "values", "subset")] == [95, 0, 9]
    assert em.subset_k(5) == 1


def test_phase_rates():
    sol = {"dgemm_tflops": 50.0, "read_GBps": 3000.0}
    r = em.phase_rates({"sytrd": 2.0, "stedc": 0.5, "trsm": 0.25}, 12000, 12000, "one-stage", 64, sol)
    assert r["sytrd"]["tflops"] == pytest.approx(4 * 12000**3 / 3 / 2.0 / 1e12)
    assert r["sytrd"]["pct_dgemm"] == pytest.approx(100 * r["sytrd"]["tflops"] / 50)
    assert r["sytrd"]["GBps"] == pytest.approx(8 * 12000**3 / 6 / 2.0 / 1e9)
    assert r["sytrd"]["pct_read_bw"] == pytest.approx(100 * r["sytrd"]["GBps"] / 3000)
    assert r["stedc"]["tflops"] is None and r["stedc"]["pct_dgemm"] is None and "GBps" not in r["trsm"]
    two = em.phase_rates({"sytrd": 2.0}, 12000, 12000, "two-stage", 64, {})
    assert "GBps" not in two["sytrd"] and two["sytrd"]["pct_dgemm"] is None


def _rows():
    ok = {"n": 8192, "problem": "random", "what": "two-stage", "status": "ok", "seconds": 0.5812, "ratio": 0.91,
          "tflops": 5.2, "pct_dgemm": 10.4, "error": 3.1e-15, "error_known": None, "residual": 0.4,
          "b_orthogonality": 2.5, "memory": {"pool_peak_bytes": 3 * 2**30},
          "phase_rates": {"sytrd": {"seconds": 0.3, "tflops": 2.5, "pct_dgemm": 5.0},
                          "stedc": {"seconds": 0.05, "tflops": None, "pct_dgemm": None}}}
    failed = {"n": 32768, "problem": "random", "what": "dsygvd", "status": "failed: SizeLimit: lwork"}
    return [ok, failed]


def test_tables():
    txt = em.format_table(_rows())
    lines = txt.splitlines()
    assert lines[0] == em.table_line(em.COLUMNS) and len(lines) == 4
    assert all(line.count("|") == len(em.COLUMNS) + 1 for line in lines)
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:8] == ["8192", "random", "two-stage", "0.5812", "0.910", "5.2", "10.4", "3.1e-15"]
    assert cells[8] == "-" and cells[-1] == "3.00"
    assert "failed: SizeLimit" in lines[3]
    phases = em.format_phases(_rows()).splitlines()
    assert len(phases) == 4 and "| sytrd | 0.3 | 2.5 | 5.0 | - | - |" in phases[2]
    assert "time only" in em.phase_lines(_rows()[0])[1]
    mpi = {"n": 8192, "problem": "known", "what": "one-stage", "ranks": 4, "status": "ok", "seconds": 1.37,
           "slowest_rank": 2, "peak_bytes_max": 2**30, "ranks_agree": True,
           "vs_p1": {"bitwise": False, "max_rel_diff": 2.2e-15}}
    m = em.format_table([mpi], mpi=True).splitlines()
    assert m[2] == "| 8192 | known | one-stage | 4 | 1.37 | 2 | 1.00 | yes | 2.2e-15 |"


def test_outputs_are_written_whole(tmp_path):
    res = {"ranks": 1, "mode": "host", "machine": {"cpu": "x"}, "commit": "c", "date": "d",
           "sol": {"dgemm": [{"n": 256, "tflops": 0.01}], "copy_GBps": 3.0, "read_GBps": 9.0, "bytes": 2**25},
           "rows": _rows(), "skipped": ["n=32768 known: above --known-max-n 16384"], "x": np.float64(1.5)}
    em.write_outputs(res, str(tmp_path), "r")
    assert json.loads((tmp_path / "r.json").read_text())["x"] == 1.5
    md = (tmp_path / "r.md").read_text()
    assert "DGEMM n=256" in md and "Skipped: n=32768 known" in md and "| sytrd |" in md
    assert sorted(os.listdir(tmp_path)) == ["r.json", "r.md"]


@pytest.mark.parametrize("k", [None, 4])
def test_accuracy_is_the_metrics_definition(k):
    from hpccoll_eigensolver import metrics

    rng = np.random.default_rng()
    n = int(rng.integers(30, 60))
    G = rng.standard_normal((n, n))
    A = (G + G.T) / 2
    Q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    B = (Q * np.logspace(0, 3, n)) @ Q.T
    B = (B + B.T) / 2
    w, X = sl.eigh(A, B, subset_by_index=None if k is None else (0, k - 1))
    # perturbed well above rounding, so that both sides measure the perturbation (a rounding-level
    # residual depends on the products' blocking)
    X = X * (1 + 1e-9 * rng.standard_normal(X.shape))
    w = w * (1 + 1e-10 * rng.standard_normal(w.shape))
    got = em.accuracy(np, A, B, X, w, block=7)
    assert got["residual"] == pytest.approx(metrics.residual(A, B, X, w), rel=1e-5)
    assert got["b_orthogonality"] == pytest.approx(metrics.b_orthogonality(B, X), rel=1e-5)
    assert em.rel_error(w * (1 + 1e-9), w) == pytest.approx(1e-9, rel=1e-6)


def test_problems_on_the_host():
    dev = em.Device(host=True)
    A, B, known = em.build_problem(dev, "random", 33, 5, 1e3)
    assert known is None and A.flags.f_contiguous and B.flags.f_contiguous
    assert np.array_equal(A, A.T) and np.array_equal(B, B.T)
    assert np.linalg.cond(B) == pytest.approx(1e3, rel=1e-6)
    A2, B2, _ = em.build_problem(dev, "random", 33, 5, 1e3)
    assert em.fingerprint(dev, A, B) == em.fingerprint(dev, A2, B2)
    K, L, lam = em.build_problem(dev, "known", 20, 0, 10.0)
    assert lam.shape == (20,) and em.rel_error(sl.eigh(K, L, eigvals_only=True), lam) < 1e-12


def test_the_whole_run_on_the_host(tmp_path, capsys):
    """Every case at two orders: references first, each row ok and accurate, the ratio of a
    reference 1, the P = 1 eigenvalue files written; then the ranks' mode on this one process
    against them."""
    out = str(tmp_path)
    common = ["--host", "--nb", "8", "--warmup-n", "16", "--out", out]
    assert evc.main(["--n", "23,30", "--what", "all", "--known-max-n", "25"] + common) == 0
    res = json.loads((tmp_path / "eig-vs-cusolver-p1.json").read_text())
    assert res["complete"] and res["mode"] == "host" and res["ranks"] == 1
    assert res["sol"]["dgemm_tflops"] > 0 and res["sol"]["read_GBps"] > 0
    assert res["skipped"] == ["n=30 known: above --known-max-n 25"]
    assert [(r["n"], r["problem"]) for r in res["problems"]] == [(23, "random"), (23, "known"), (30, "random")]
    rows = res["rows"]
    assert len(rows) == 3 * len(em.CASES)
    for r in rows:
        assert r["status"] == "ok", r
        assert len(r["calls"]) == 2 and r["seconds"] > 0 and r["tflops"] > 0
        if r["what"] in ("dsygvd", "dsygvd-w", "dsygvdx-sub"):
            assert r["ratio"] == 1.0
        else:
            assert r["ratio_to"] == {"full": "dsygvd", "values": "dsygvd-w", "subset": "dsygvdx-sub"}[r["output"]]
        if r["what"] != "dsygvd":
            assert r["error"] < 1e-12
        if r["problem"] == "known":
            assert r["error_known"] < 1e-12
        if r["output"] != "values":
            assert r["residual"] < 10 and r["b_orthogonality"] < 100
        if r["what"] in em.SAME_B:             # B factored before the timed call; the fresh solve's bits
            assert "potrf" not in r["phases"] and set(r["phases"]) >= {"sygst", "sytrd", "stedc"}
            fresh = next(x for x in rows if (x["n"], x["problem"], x["what"]) ==
                         (r["n"], r["problem"], r["what"].replace("-again", "")))
            assert r["calls"][-1]["w_sha256"] == fresh["calls"][-1]["w_sha256"]
        elif r["solver"] == "hpccoll":
            assert set(r["phases"]) >= {"potrf", "sygst", "sytrd", "stedc"}
        if r["solver"] == "hpccoll":
            assert (tmp_path / f"w-{r['problem']}-n{r['n']}-{r['what']}.npy").exists()
    printed = capsys.readouterr().out
    assert em.table_line(em.COLUMNS) in printed and "| 30 | random | two-stage-sub |" in printed

    assert evc.main(["--mpi", "--n", "23", "--problems", "random", "--what", "two-stage,one-stage-w"] + common) == 0
    ranks = json.loads((tmp_path / "eig-vs-cusolver-mpi-p1.json").read_text())
    assert ranks["complete"] and ranks["ranks"] == 1 and ranks["sol"]["measured_by"]
    assert [r["what"] for r in ranks["rows"]] == ["two-stage", "one-stage-w"]
    for r in ranks["rows"]:
        assert r["status"] == "ok" and r["ranks_agree"] and r["problem_check"] == {"ranks_alike": True, "as_p1": True}
        assert r["vs_p1"]["bitwise"], r["vs_p1"]     # the same solve as the P = 1 run's


def test_a_spent_budget_skips_every_case_by_name(tmp_path):
    assert evc.main(["--host", "--n", "20,24", "--problems", "random", "--what", "dsygvd,one-stage",
                     "--warmup-n", "0", "--budget-s", "0", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "eig-vs-cusolver-p1.json").read_text())
    assert res["rows"] == [] and res["complete"]
    assert res["skipped"] == [f"n={n} random: every case (--budget-s 0 passed)" for n in (20, 24)]


def test_a_problem_that_cannot_be_built_is_skipped_and_the_run_goes_on(tmp_path, monkeypatch):
    real = evc.build_problem

    def build(dev, kind, n, seed, cond_b):
        if n == 21:
            raise MemoryError("out of memory allocating 3,528 bytes")
        return real(dev, kind, n, seed, cond_b)

    monkeypatch.setattr(evc, "build_problem", build)
    assert evc.main(["--host", "--n", "21,22", "--problems", "random", "--what", "dsygvd,one-stage",
                     "--warmup-n", "0", "--calls", "1", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "eig-vs-cusolver-p1.json").read_text())
    assert res["skipped"] == ["n=21 random: every case (the problem was not built: MemoryError: out of memory "
                              "allocating 3,528 bytes)"]
    assert [(r["n"], r["what"], r["status"]) for r in res["rows"]] == [(22, "dsygvd", "ok"), (22, "one-stage", "ok")]


def test_dsygvd_refused_the_anchor_is_the_reference(tmp_path, monkeypatch):
    """As at n = 32768 on the GPU: dsygvd refused for size, the anchor (with vectors, and
    eigvalsh without) measured in its place and every ratio and error taken against it."""
    def refuse(xp, A, B, vectors):
        raise cd.SizeLimit("dsygvd: LAPACK's minimal syevd workspace ... beyond the 32-bit lwork")

    monkeypatch.setattr(cd, "prepare_sygvd", refuse)
    assert evc.main(["--host", "--n", "26", "--problems", "known", "--what", "one-stage,dsygvd,dsygvd-w,two-stage-w",
                     "--warmup-n", "0", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "eig-vs-cusolver-p1.json").read_text())["rows"]
    assert [(r["what"], r["status"][:17], r.get("fallback")) for r in rows] == [
        ("dsygvd", "failed: SizeLimit", "anchor"), ("anchor", "ok", None), ("dsygvd-w", "failed: SizeLimit", "anchor-w"),
        ("anchor-w", "ok", None), ("one-stage", "ok", None), ("two-stage-w", "ok", None)]
    anchor, anchor_w, one, two_w = rows[1], rows[3], rows[4], rows[5]
    assert anchor["ratio"] == anchor_w["ratio"] == 1.0 and anchor["w_reference"] == "self"
    assert one["ratio_to"] == "anchor" and two_w["ratio_to"] == "anchor-w"
    assert one["error"] < 1e-12 and two_w["error"] < 1e-12 and anchor_w["error"] < 1e-12
    assert set(anchor["phases"]) == {"potrf", "sygst", "syevd", "trsm"} and set(anchor_w["phases"]) == {
        "potrf", "sygst", "syevd"}
