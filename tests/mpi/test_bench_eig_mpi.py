"""bench/eig_vs_cusolver.py --mpi on the host backend (any number of ranks): the P = 1 run on
rank 0, then the ranks' run against its eigenvalue files, as bench/eig_vs_cusolver.sh runs them
on a GPU.

Run: mpiexec -n 3 python -m pytest --with-mpi tests/mpi/test_bench_eig_mpi.py"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import eig_vs_cusolver as evc

pytestmark = pytest.mark.mpi(min_size=2)
WORLD = MPI.COMM_WORLD


def test_ranks_against_one_rank():
    rank, size = WORLD.Get_rank(), WORLD.Get_size()
    out = WORLD.bcast(tempfile.mkdtemp(prefix="eig-vs-cusolver-") if rank == 0 else None, root=0)
    common = ["--host", "--n", "29", "--nb", "4", "--warmup-n", "12", "--out", out]
    if rank == 0:
        assert evc.main(["--what", "dsygvd,one-stage,two-stage-sub"] + common) == 0
    WORLD.Barrier()
    assert evc.main(["--mpi", "--what", "one-stage,two-stage-sub,two-stage-w"] + common) == 0
    WORLD.Barrier()
    res = json.loads(Path(out, f"eig-vs-cusolver-mpi-p{size}.json").read_text())
    assert res["complete"] and res["ranks"] == size and res["sol"]["measured_by"]
    assert [(r["problem"], r["what"]) for r in res["rows"]] == [
        (p, w) for p in ("random", "known") for w in ("one-stage", "two-stage-sub", "two-stage-w")]
    for r in res["rows"]:
        assert r["status"] == "ok", r
        assert r["ranks_agree"] and len(r["per_rank"]) == size and r["seconds"] == max(
            p["seconds"] for p in r["per_rank"])
        assert r["problem_check"] == {"ranks_alike": True, "as_p1": True}
        if r["what"] == "two-stage-w":      # not run at P = 1
            assert r["vs_p1"] is None
        else:
            assert r["vs_p1"]["max_rel_diff"] < 1e-12, r["vs_p1"]
        if r["problem"] == "known":
            assert r["error_known"] < 1e-12
    if rank == 0:
        assert os.path.exists(os.path.join(out, f"eig-vs-cusolver-mpi-p{size}.md"))
