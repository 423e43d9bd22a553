"""`hpccoll bench` / `hpccoll tune` pieces that need no GPU and no MPI job (hpccoll/bench/)."""
from __future__ import annotations

import argparse
import json

import pytest

from hpccoll.bench import cli as bench_cli
from hpccoll.bench import collectives, ranks, report, sizes, sweep, tune
from hpccoll.bench.baselines import torch_baselines_first
from hpccoll.bench.rows import ROW_KEYS


def _parser():
    p = argparse.ArgumentParser(prog="hpccoll")
    sub = p.add_subparsers(dest="cmd", required=True)
    bench_cli.add_parsers(sub)
    return p


@pytest.mark.parametrize("text, expect", [("8", 8), ("4K", 4096), ("64M", 64 << 20), ("1G", 1 << 30),
                                          ("16KiB", 16384), ("2kb", 2048), (" 3 ", 3)])
def test_parse_size(text, expect):
    assert sizes.parse_size(text) == expect


@pytest.mark.parametrize("bad", ["", "K", "4X", "-8", "1.5M"])
def test_parse_size_rejects(bad):
    with pytest.raises(ValueError, match="size"):
        sizes.parse_size(bad)


def test_parse_sizes_range_and_list():
    r = sizes.parse_sizes("8:64M")
    assert r[0] == 8 and r[-1] == 64 << 20 and len(r) == 24
    assert all(b == 2 * a for a, b in zip(r, r[1:]))
    assert sizes.parse_sizes("4K,64K,1M") == [4096, 65536, 1 << 20]
    assert sizes.parse_sizes("1K:1K") == [1024]
    with pytest.raises(ValueError):
        sizes.parse_sizes("64M:8")
    with pytest.raises(ValueError):
        sizes.parse_sizes("0:8")


def test_fmt_bytes():
    assert [sizes.fmt_bytes(b) for b in (8, 1000, 4096, 3 << 20, 1 << 30)] == ["8", "1000", "4K", "3M", "1G"]


def test_parsers_defaults():
    a = _parser().parse_args(["bench", "allreduce"])
    assert (a.cmd, a.collective, a.sizes, a.dtype, a.algorithms) == ("bench", "allreduce", "8:64M", "float32", "all")
    assert not a.deterministic and not a.baselines and a.json is None and a.plot is None
    t = _parser().parse_args(["tune", "--out", "/tmp/t.json"])
    assert t.cmd == "tune" and t.out == "/tmp/t.json"


def test_algorithm_list():
    assert collectives.algorithm_list("allreduce", "all", "float32", False, False, on_gpu=False) == ["mpi"]
    full = collectives.algorithm_list("allreduce", "all", "float32", False, True, on_gpu=True)
    assert full == list(collectives.ALLREDUCE_ALGORITHMS) + ["auto"]
    det = collectives.algorithm_list("allreduce", "all", "float32", True, True, on_gpu=True)
    assert "twoshot_ll128" not in det and "auto" in det
    ints = collectives.algorithm_list("allreduce", "all", "int32", False, True, on_gpu=True)
    assert ints == ["oneshot_ll", "twoshot_ll", "auto"]
    assert collectives.algorithm_list("bcast", "all", "float32", False, True, on_gpu=True) == ["ll", "auto"]
    assert collectives.algorithm_list("reduce_scatter", "all", "float32", False, True, True) == ["sentinel", "ll", "auto"]
    assert collectives.algorithm_list("allreduce", "oneshot_ll, auto", "float32", False, True, True) == ["oneshot_ll", "auto"]


def fake_result(nranks=2):
    """A result as run_sweep returns it on the GPU, with every kind of row."""
    res = {"machine": {"hostname": "node1", "gpu": "NVIDIA H200", "driver": "580.0", "cuda_runtime": 13000},
           "commit": "abc", "date": "2026-12-01T00:00:00+00:00", "ranks": nranks, "backend": "cuda",
           "collective": "allreduce", "dtype": "float32", "command": "hpccoll bench allreduce",
           "sol_us": 0.88, "sol": {"fence_ns": 200.0, "pingpong_roundtrip_ns": 1360.0, "one_way_ns": 680.0,
                                   "remote_store_ns": 480.0, "sol_ns": 880.0, "sol_us": 0.88,
                                   "bw_GBps": 400.0},
           "rows": [], "skipped": {"torch": "no torch here"}}
    for b in (1024, 4096):
        for algo, eager, graph, ik, blk in (("oneshot_sentinel", 9.0, 2.0, 1.0, 1.5),
                                            ("auto", 9.1, 2.1, 1.1, None),
                                            ("nccl", 30.0, 10.0, None, 12.0),
                                            ("torch_one_shot", 14.0, 6.0, None, None),
                                            ("mpi", 40.0, None, None, None)):
            res["rows"].append({"collective": "allreduce", "algorithm": algo, "dtype": "float32", "bytes": b,
                                "count": b // 4, "eager_us": eager,
                                "eager_persistent_us": 5.5 if algo == "auto" else None,
                                "eager_request_us": 4.5 if algo == "auto" else None,
                                "graph_us": graph, "in_kernel_us": ik,
                                "graph_group_us": {"oneshot_sentinel": 0.25, "auto": 0.26, "nccl": 1.0}.get(algo),
                                "graph_unfused_us": {"oneshot_sentinel": 2.4, "auto": 2.5}.get(algo),
                                "blocking_us": blk, "barrier_us": 0.9 if blk else None, "ok": True})
    for r in res["rows"]:
        sweep.annotate(r, res, nranks)
    return res


def test_annotate():
    res = fake_result()
    r = next(r for r in res["rows"] if r["algorithm"] == "oneshot_sentinel" and r["bytes"] == 1024)
    assert r["speedup_vs_nccl"] == pytest.approx(5.0)
    assert r["speedup_vs_torch"] == pytest.approx(3.0)
    assert r["busbw_GBps"] == pytest.approx(1024 * 2 * 1 / 2 / 2000)
    assert r["sol_us"] == pytest.approx(0.88 + 1024 / 400.0 / 1e3)
    assert r["ratio_to_sol"] == pytest.approx(1.0 / r["sol_us"])
    assert r["group_speedup_vs_nccl"] == pytest.approx(4.0)
    mpi = next(r for r in res["rows"] if r["algorithm"] == "mpi")
    assert mpi["ratio_to_sol"] is None and mpi["busbw_GBps"] > 0  # eager time when no graph


def test_format_table():
    txt = report.format_table(fake_result())
    lines = txt.splitlines()
    header = next(line for line in lines if "algorithm" in line)
    for col in ("size", "count", "dtype", "eager", "graph", "unfused", "in-kern", "blocking", "busbw", "xSoL",
                "vsNCCL", "vsTorch", "ok"):
        assert col in header
    data = [line for line in lines if not line.startswith("#") and line is not header]
    assert len(data) == 10
    assert all(len(line) == len(header) for line in data)
    assert "SoL 0.880 us" in txt and "skipped torch: no torch here" in txt
    first = data[0].split()
    assert first[:4] == ["1K", "256", "float32", "oneshot_sentinel"] and first[-1] == "yes"
    assert "5.00" in data[0]  # x vs NCCL
    auto = data[1].split()
    assert auto[3].startswith("auto") and auto[4:7] == ["9.10", "5.50", "4.50"]  # eager, eager*, req*
    assert first[4:7] == ["9.00", "-", "-"]  # no engine row: eager* and req* empty
    assert first[7:10] == ["2.00", "2.40", "0.25"]  # graph, unfused, group


def test_json_schema(tmp_path):
    p = tmp_path / "r.json"
    report.write_json(fake_result(), str(p))
    d = json.loads(p.read_text())
    for key in ("machine", "commit", "date", "ranks", "sol_us", "sol", "command", "rows"):
        assert key in d
    for key in ("hostname", "gpu", "driver"):
        assert key in d["machine"]
    for r in d["rows"]:
        for key in ROW_KEYS:
            assert key in r
    assert d["rows"][2]["in_kernel_us"] is None  # nccl: N/A is null


def test_plot_written(tmp_path):
    pytest.importorskip("matplotlib")
    p = tmp_path / "r.png"
    report.plot(fake_result(), str(p))
    assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tuning_rows():
    w = [(8, "oneshot_ll"), (64, "oneshot_ll"), (1024, "oneshot_sentinel"), (1 << 20, "twoshot_sentinel"),
         (4 << 20, "twoshot_sentinel")]
    assert tune.tuning_rows(w) == [[64, "oneshot_ll"], [1024, "oneshot_sentinel"], [None, "twoshot_sentinel"]]
    assert tune.tuning_rows([]) == []
    rows = fake_result()["rows"]
    assert tune.winners_of(rows) == [(1024, "oneshot_sentinel"), (4096, "oneshot_sentinel")]


def test_winners_are_picked_by_one_node_per_call():
    """A fused graph time (one-shot calls captured back to back) must not pick the table's
    algorithm for calls alone: the unfused time does."""
    rows = [{"algorithm": "oneshot_sentinel", "bytes": 8 << 20, "graph_us": 26.0, "graph_unfused_us": 30.5, "ok": True},
            {"algorithm": "twoshot_sentinel", "bytes": 8 << 20, "graph_us": 27.6, "ok": True}]
    assert tune.winners_of(rows) == [(8 << 20, "twoshot_sentinel")]


def test_tuning_rows_work_with_choose():
    from hpccoll import policy as select

    rows = tune.tuning_rows([(8, "oneshot_ll"), (4096, "oneshot_sentinel"), (1 << 20, "twoshot_sentinel")])
    table = {"allreduce": {"2": rows}}
    assert select.choose(table, "Allreduce", "float32", "SUM", 8, 2, False, True) == "oneshot_ll"
    assert select.choose(table, "Allreduce", "float32", "SUM", 4096, 2, False, True) == "oneshot_sentinel"
    assert select.choose(table, "Allreduce", "float32", "SUM", 1 << 26, 2, False, True) == "twoshot_sentinel"


def test_h200_table_is_a_valid_table():
    from importlib import resources

    t = json.loads((resources.files("hpccoll") / "tuning" / "h200.json").read_text())
    g = json.loads((resources.files("hpccoll") / "tuning" / "generic.json").read_text())
    assert t["gpu"] == "NVIDIA H200"
    for key in ("allreduce", "allreduce_deterministic"):
        assert set(t[key]) == set(g[key])
        for table_rows in t[key].values():
            assert table_rows[-1][0] is None and all(r[0] is not None for r in table_rows[:-1])


def test_single_rank_host_run(tmp_path, capsys):
    """The whole command on one rank (host backend without a GPU)."""
    from hpccoll.backends.factory import device_unavailable_reason

    if device_unavailable_reason() is None:
        pytest.skip("a GPU is usable here: the host-only path is not what runs")
    out = tmp_path / "one.json"
    args = _parser().parse_args(["bench", "allreduce", "--sizes", "8,1K", "--iters", "3", "--json", str(out)])
    assert bench_cli.main(args) == 0
    d = json.loads(out.read_text())
    assert d["ranks"] == 1 and [r["bytes"] for r in d["rows"]] == [8, 1024]
    assert all(r["ok"] and r["algorithm"] == "mpi" and r["eager_us"] > 0 for r in d["rows"])
    assert "float32" in capsys.readouterr().out


def test_nccl_rows_only_with_nccl_open_and_not_deterministic():
    from hpccoll import policy as select

    table = {"allreduce": {"2": [[65536, "oneshot_sentinel"], [4 << 20, "twoshot_ll128"], [None, "nccl"]]},
             "allreduce_deterministic": {"2": [[65536, "oneshot_sentinel"], [None, "twoshot_sentinel"]]}}
    big, small = 64 << 20, 4096
    assert select.wants_nccl(table, 2)
    assert not select.wants_nccl({"allreduce": {"2": [[None, "twoshot_sentinel"]]}}, 2)
    assert not select.wants_nccl({"allreduce_deterministic": {"2": [[None, "nccl"]]}}, 2)
    assert select.choose(table, "Allreduce", "float32", "SUM", big, 2, False, True, nccl=True) == "nccl"
    assert select.choose(table, "Allreduce", "float32", "SUM", small, 2, False, True, nccl=True) == "oneshot_sentinel"
    # NCCL not opened: the previous row's hpccoll algorithm serves
    assert select.choose(table, "Allreduce", "float32", "SUM", big, 2, False, True, nccl=False) == "twoshot_ll128"
    assert select.choose(table, "Allreduce", "float32", "MAX", big, 2, False, True, nccl=False) == "twoshot_sentinel"
    assert select.choose(table, "Allreduce", "int32", "SUM", big, 2, False, True, nccl=False) == "twoshot_ll"
    # the deterministic policy never reaches NCCL, nor bfloat16 (CuPy's binding may lack it)
    assert select.choose(table, "Allreduce", "float32", "SUM", big, 2, True, True, nccl=True) == "twoshot_sentinel"
    assert select.choose(table, "Allreduce", "bfloat16", "SUM", big, 2, False, True, nccl=True) == "twoshot_ll128"
    # a table whose first row is NCCL falls back to two-shot sentinel without NCCL
    only = {"allreduce": {"2": [[None, "nccl"]]}}
    assert select.choose(only, "Allreduce", "float32", "SUM", small, 2, False, True, nccl=False) == "twoshot_sentinel"
    with pytest.raises(ValueError, match="not deterministic"):
        select.validate("nccl", "Allreduce", "float32", "SUM", True, True)


def test_tune_winners_take_nccl_only_when_asked():
    tuning_rows, winners_of = tune.tuning_rows, tune.winners_of
    rows = [{"algorithm": "twoshot_sentinel", "bytes": 1 << 20, "graph_us": 7.5, "ok": True},
            {"algorithm": "nccl", "bytes": 1 << 20, "graph_us": 13.0, "ok": True},
            {"algorithm": "twoshot_sentinel", "bytes": 64 << 20, "graph_us": 260.0, "ok": True},
            {"algorithm": "nccl", "bytes": 64 << 20, "graph_us": 240.0, "ok": True}]
    assert tuning_rows(winners_of(rows)) == [[None, "twoshot_sentinel"]]
    assert tuning_rows(winners_of(rows, also=("nccl",))) == [[1 << 20, "twoshot_sentinel"], [None, "nccl"]]


def test_format_table_prints_the_graph_floor():
    r = fake_result()
    r["sol"].update(floor_empty_pdl_us=0.73, floor_empty_us=0.74, floor_store_pdl_us=1.14, floor_store_us=1.15)
    line = next(x for x in report.format_table(r).splitlines() if x.startswith("# graph floor"))
    assert "empty+pdl 0.73" in line and "empty 0.74" in line and "store+pdl 1.14" in line and "store 1.15" in line


def test_describe_is_one_line():
    """A failure's reason for a skip is its first line, with the exception's class."""
    text = ranks.describe(ValueError("first line\nsecond line"))
    assert text == "ValueError: first line"


def test_torch_baselines_first_skips_cleanly_without_torch_or_gpu(monkeypatch):
    """Without torch (or a GPU torch can see) the torch rows are skipped with the reason."""
    import importlib.util

    from mpi4py import MPI

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here")
    opts = argparse.Namespace(dtype="float32", iters=3)
    rows, why = torch_baselines_first(opts, [8], MPI.COMM_SELF, lambda *m: None)
    assert rows == {} and "torch" in why


def test_algorithm_names_come_from_the_policy():
    from hpccoll import policy

    assert collectives.ALLREDUCE_ALGORITHMS == ("oneshot_sentinel", "oneshot_ll", "twoshot_sentinel",
                                                "twoshot_ll", "twoshot_ll128")
    assert collectives.algorithms_of("reduce_scatter") == ("sentinel", "ll")
    assert collectives.algorithms_of("bcast") == collectives.algorithms_of("allgather") == ("ll",)
    for coll, call in collectives.COLLECTIVE_CALL.items():
        for a in collectives.algorithms_of(coll):
            assert call in policy.ALGORITHMS[a][0]


@pytest.mark.parametrize("coll, spec", [("allreduce", "all"), ("allreduce", " all "), ("allreduce", "auto"),
                                        ("allreduce", "oneshot_ll, auto"), ("reduce_scatter", "sentinel,ll"),
                                        ("bcast", "ll")])
def test_valid_algorithm_specs(coll, spec):
    assert collectives.unknown_algorithms(coll, spec) is None


@pytest.mark.parametrize("coll, spec, named", [("allreduce", "foo", "foo"), ("allreduce", "oneshot_ll,bar", "bar"),
                                               ("bcast", "oneshot_ll", "oneshot_ll"), ("allreduce", "nccl", "nccl"),
                                               ("allreduce", "all,auto", "all"), ("allreduce", ",", "no algorithm")])
def test_invalid_algorithm_specs_name_the_bad_and_the_valid(coll, spec, named):
    why = collectives.unknown_algorithms(coll, spec)
    assert named in why and "--algorithms" in why
    assert all(a in why for a in ("auto",) + collectives.algorithms_of(coll))


def test_nccl_eager_timing_runs_unwatched_and_restores_the_watchdog():
    """The NCCL row's eager timing runs with the NCCL backend's watchdog off (NCCL itself), and
    the watchdog is back on afterwards, also when the timing raises."""
    import types

    from hpccoll.bench.baselines import _unwatched

    nccl = types.SimpleNamespace(watch=True)
    comm = types.SimpleNamespace(backends=types.SimpleNamespace(main=nccl))
    assert _unwatched(comm, lambda: nccl.watch) is False
    assert nccl.watch is True

    def boom():
        raise RuntimeError("timing failed")

    with pytest.raises(RuntimeError, match="timing failed"):
        _unwatched(comm, boom)
    assert nccl.watch is True
