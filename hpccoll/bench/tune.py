"""`hpccoll tune`: sweep the allreduce algorithms at this rank count (both policies) and write
the tuning table that algorithm='auto' reads (hpccoll.policy): per size the fastest algorithm,
merged into the table already there for this GPU."""
from __future__ import annotations

import argparse
import json
import os
import socket

from .collectives import ALLREDUCE_ALGORITHMS
from .ranks import say
from .report import format_table, now, write_json
from .sweep import run_sweep


def tuning_rows(winners: list[tuple[int, str]]) -> list[list]:
    """[(bytes, algorithm)] ascending -> [[max_bytes, algorithm], ..., [None, last]]."""
    rows: list[list] = []
    for nbytes, algo in sorted(winners):
        if rows and rows[-1][1] == algo:
            rows[-1][0] = nbytes
        else:
            rows.append([nbytes, algo])
    if rows:
        rows[-1][0] = None
    return rows


def winners_of(rows: list[dict], also=()) -> list[tuple[int, str]]:
    """Fastest algorithm per size (graph time, else eager) among hpccoll's and `also` (e.g.
    "nccl" for the non-deterministic table: auto falls back to NCCL where it wins).  The graph
    time of one node per call where the row has it: the table serves calls alone, and captured
    chains choose their own one-shot (policy.chain_algorithm)."""
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        t = r.get("graph_unfused_us") or r.get("graph_us") or r.get("eager_us")
        if r.get("ok") and t and (r["algorithm"] in ALLREDUCE_ALGORITHMS or r["algorithm"] in also):
            if r["bytes"] not in best or t < best[r["bytes"]][0]:
                best[r["bytes"]] = (t, r["algorithm"])
    return [(b, a) for b, (t, a) in best.items()]


def tune(opts) -> int:
    """Both sweeps (non-deterministic with NCCL as a candidate, then deterministic), then rank 0
    writes the table to opts.out (default: policy.tuning_path()) and the sweeps to opts.json."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    rank = world.Get_rank()
    tables, sweeps, gpu_name = {}, {}, None
    for det in (False, True):
        sweep = argparse.Namespace(collective="allreduce", sizes=opts.sizes, dtype=opts.dtype, iters=opts.iters,
                                   algorithms="all", deterministic=det, baselines=False if det else "nccl",
                                   persistent=False, engine_order="stream")
        res = run_sweep(sweep)
        if res["backend"] != "cuda":
            raise SystemExit(f"hpccoll tune: needs the single-node cuda backend; this run's is "
                             f"{res['backend']!r}: nothing written")
        gpu_name = res["machine"].get("gpu")
        key = "allreduce_deterministic" if det else "allreduce"
        tables[key] = tuning_rows(winners_of(res["rows"], also=() if det else ("nccl",)))
        sweeps[key] = res
        say(rank, format_table(res))
    if rank == 0:
        path = write_table(opts.out, gpu_name, world.Get_size(), tables)
        print(f"hpccoll tune: wrote {path}: " + json.dumps(tables), flush=True)
        if opts.json:
            write_json(sweeps, opts.json)
    return 0


def write_table(out: str | None, gpu_name: str | None, nranks: int, tables: dict) -> str:
    """Merge `tables` (key -> rows) for `nranks` into the table at `out` (default
    policy.tuning_path()) when it is this GPU's, else into the shipped generic one; its path."""
    from .. import policy

    path = out or str(policy.tuning_path())
    table: dict = {}
    if os.path.exists(path):
        try:
            with open(path) as f:
                table = json.load(f)
        except (OSError, ValueError):
            table = {}
        if table.get("gpu") != gpu_name:
            table = {}
    if not table:
        table = policy.shipped_table("generic")  # parsed afresh: ours to change
    table["gpu"] = gpu_name
    table["note"] = f"measured by hpccoll tune on {socket.gethostname()} at {now()}"
    for key, rows in tables.items():
        if rows:
            table.setdefault(key, {})[str(nranks)] = rows
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(table, f, indent=1)
        f.write("\n")
    return path
