"""bench/eig_vs_cusolver.py on one GPU at a small n, as bench/eig_vs_cusolver.sh runs it: every
case at P = 1 (cuSOLVER's dsygvd / dsygvdx called through ctypes, the CuPy anchor, the solver's
one-stage and two-stage paths), then two ranks sharing the GPU under MPS against the P = 1 run.
This process is no MPI job: tests/gpu/run.sh runs the file once with plain pytest, and the test
starts the script's processes itself."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import _gpu_checks  # noqa: F401 - lazily-imported modules first (see there)
import pytest

pytestmark = pytest.mark.gpu
STARTS_ITS_OWN_JOBS = True  # tests/gpu/run.sh: run this file outside mpiexec

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "bench" / "eig_vs_cusolver.py")
N = 389   # odd: not a multiple of the block
COMMON = ["--n", str(N), "--nb", "64", "--warmup-n", "200", "--calls", "2"]


def _env() -> dict:
    """This environment less a launcher's job variables (a new mpiexec needs none), on GPU 0."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "OMPI_COMM_"))}
    env.update(CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0], PYTHONUNBUFFERED="1")
    return env


def _run(cmd: list[str], env: dict) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    return out


@pytest.fixture(scope="module")
def out_dir(tmp_path_factory):
    """The P = 1 run of every case (its JSON checked in the tests below)."""
    d = tmp_path_factory.mktemp("eig-vs-cusolver")
    _run([sys.executable, SCRIPT, *COMMON, "--what", "all", "--sol-n", "2048", "--sol-gib", "0.25",
          "--out", str(d)], _env())
    return d


def test_one_gpu_every_case(out_dir):
    res = json.loads((out_dir / "eig-vs-cusolver-p1.json").read_text())
    assert res["complete"] and res["mode"] == "gpu" and res["machine"]["gpu"]
    assert isinstance(res["machine"]["cusolver"], int) and res["machine"]["device_properties"]["multiProcessorCount"]
    assert res["sol"]["dgemm_tflops"] > 1 and res["sol"]["copy_GBps"] > 100 and res["sol"]["read_GBps"] > 100
    rows = res["rows"]
    cases = {"dsygvd", "dsygvd-w", "dsygvdx-sub", "anchor", "anchor-w", "one-stage", "two-stage", "one-stage-w",
             "two-stage-w", "one-stage-sub", "two-stage-sub", "one-stage-again", "two-stage-again"}
    assert {r["what"] for r in rows} == cases
    assert len(rows) == 2 * len(cases) and not res["skipped"]
    for r in rows:
        assert r["status"] == "ok", r
        assert r["seconds"] > 0 and r["memory"]["pool_peak_bytes"] >= r["memory"]["pool_inputs_bytes"] > 0
        if r["what"] != "dsygvd":
            assert r["error"] < 1e-11, (r["what"], r["error"])
        if r["problem"] == "known":
            assert r["error_known"] < 1e-11, (r["what"], r["error_known"])
        if r["output"] != "values":
            assert r["residual"] < 10 and r["b_orthogonality"] < 1000, r
        if r["solver"] == "cusolver":
            assert r["workspace_bytes"] > 0 and r["ratio"] == 1.0
        if r["what"].endswith("-again"):    # B factored before the timed call: no potrf, the fresh solve's bits
            assert "potrf" not in r["phase_rates"] and {"sygst", "sytrd", "stedc"} <= set(r["phase_rates"])
            fresh = next(x for x in rows if (x["n"], x["problem"], x["what"]) ==
                         (r["n"], r["problem"], r["what"].replace("-again", "")))
            assert r["calls"][-1]["w_sha256"] == fresh["calls"][-1]["w_sha256"]
        elif r["solver"] == "hpccoll":
            assert {"potrf", "sygst", "sytrd", "stedc"} <= set(r["phase_rates"])
            assert r["same_bits_every_call"], r["what"]      # the solver's reproducibility


def test_two_ranks_under_mps_against_one(out_dir, tmp_path):
    from hpccoll import mps

    env = _env()
    launcher = shlex.split(os.environ.get("MPIEXEC", "mpiexec"))
    cmd = [*launcher, "-n", "2", sys.executable, SCRIPT, "--mpi", *COMMON, "--what", "one-stage,two-stage",
           "--out", str(out_dir)]
    if not mps.mps_status(env)[0]:
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "log"))
        os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
    try:
        with mps.mps_where_needed(2, 1, env):
            _run(cmd, env)
    except Exception as exc:  # noqa: BLE001 - no MPS on this machine
        if "not on PATH" in str(exc) or "did not start" in str(exc):
            pytest.skip(f"MPS cannot be started here: {exc}")
        raise
    res = json.loads((out_dir / "eig-vs-cusolver-mpi-p2.json").read_text())
    assert res["complete"] and res["ranks"] == 2 and len(res["rows"]) == 4
    for r in res["rows"]:
        assert r["status"] == "ok" and r["ranks_agree"], r
        assert r["problem_check"] == {"ranks_alike": True, "as_p1": True}
        assert r["vs_p1"]["max_rel_diff"] < 1e-12 and all(p["pool_peak_bytes"] > 0 for p in r["per_rank"])


def test_dsygvd_refuses_an_overflowing_workspace_before_allocating():
    import cupy as cp

    sys.path.insert(0, str(ROOT / "bench"))
    import cusolver_direct as cd

    thin = cp.empty((32768, 1))          # only its row count is read before the refusal
    with pytest.raises(cd.SizeLimit, match="32-bit"):
        cd.prepare_sygvd(cp, thin, thin, True)
    with pytest.raises(cd.SizeLimit, match="32-bit"):
        cd.prepare_sygvdx(cp, thin, thin, 0, 9)
