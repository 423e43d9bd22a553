"""`hpccoll bench` end to end under MPI on the host backend (tiny sizes, few iterations)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import pytest
from mpi4py import MPI

from hpccoll.bench import cli as bench_cli
from hpccoll.bench import sweep
from hpccoll.cli import main

pytestmark = pytest.mark.mpi(min_size=2)
WORLD = MPI.COMM_WORLD


def _args(argv):
    p = argparse.ArgumentParser(prog="hpccoll")
    sub = p.add_subparsers(dest="cmd", required=True)
    bench_cli.add_parsers(sub)
    return p.parse_args(argv)


def _shared_dir():
    d = tempfile.mkdtemp(prefix="hpccoll-bench-") if WORLD.Get_rank() == 0 else None
    return WORLD.bcast(d, root=0)


def _no_gpu():
    from hpccoll.backends.factory import device_unavailable_reason

    return WORLD.allreduce(device_unavailable_reason() is not None, op=MPI.LAND)


@pytest.mark.parametrize("collective", ["allreduce", "bcast", "allgather", "reduce_scatter"])
def test_bench_host_rows(collective):
    if not _no_gpu():
        pytest.skip("a GPU is usable here: this test checks the host-backend path")
    d = _shared_dir()
    path = os.path.join(d, f"{collective}.json")
    plot = os.path.join(d, f"{collective}.png")
    args = _args(["bench", collective, "--sizes", "8:256", "--iters", "3", "--json", path, "--plot", plot])
    assert bench_cli.main(args) == 0
    WORLD.Barrier()
    res = json.loads(open(path).read())
    assert res["ranks"] == WORLD.Get_size() and res["backend"] == "host"
    assert res["sol_us"] is None and res["collective"] == collective
    assert [r["bytes"] for r in res["rows"]] == [8, 16, 32, 64, 128, 256]
    for r in res["rows"]:
        assert r["ok"] is True, r
        assert r["algorithm"] == "mpi" and r["dtype"] == "float32" and r["count"] == r["bytes"] // 4
        assert r["eager_us"] > 0
        assert r["graph_us"] is None and r["in_kernel_us"] is None and r["blocking_us"] is None
    if WORLD.Get_rank() == 0:
        pytest.importorskip("matplotlib")
        assert os.path.getsize(plot) > 0


def test_bench_host_deterministic_float64():
    if not _no_gpu():
        pytest.skip("a GPU is usable here")
    res = sweep.run_sweep(_args(["bench", "allreduce", "--sizes", "24,1K", "--dtype", "float64",
                                 "--iters", "2", "--deterministic"]), log=lambda *m: None)
    assert [(r["bytes"], r["count"], r["ok"]) for r in res["rows"]] == [(24, 3, True), (1024, 128, True)]
    # every rank returns the same result
    assert WORLD.allgather([r["ok"] for r in res["rows"]]) == [[True, True]] * WORLD.Get_size()


@pytest.mark.parametrize("argv, words", [(["bench", "allreduce", "--algorithms", "foo"], "unknown foo"),
                                         (["bench", "allreduce", "--sizes", "8:4"], "sizes '8:4'"),
                                         (["tune", "--out", "/no/such/dir/t.json"], "/no/such/dir does not exist"),
                                         (["bench", "nonsense"], "invalid choice")])
def test_errors_print_once(argv, words, capsys, monkeypatch):
    """Every rank refuses the same arguments; only rank 0 says why."""
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)  # (main installs its own)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code not in (0, None)
    err = capsys.readouterr().err
    if WORLD.Get_rank() == 0:
        assert words in err, err
    else:
        assert err == ""
    WORLD.Barrier()
