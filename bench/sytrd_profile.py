"""Where the tridiagonalization's column step spends its time on GPUs, stage by stage
(apps/eigensolver/sytrd_device.py).

    mpiexec -n 2 python3 bench/sytrd_profile.py [--n 8192] [--nb 64] [--comm sentinel] [--json out.json]

For panels starting at 0, n/4, n/2 and 3n/4 (--panels): the panel's nb column steps are captured in one
CUDA graph, as the solver does, once whole and once with each stage left out (col on the
owner, bcast, gemv, allreduce, w, both collectives; --stages picks among them); each graph is replayed 5 times from
the panel's start (median of the event times). A stage's cost = whole - without it, per column.
C holds random numbers (the timing does not depend on the values; the variants' results are
wrong on purpose and discarded).  Also printed: the bytes the gemv reads per column and the
bandwidth that implies."""
from __future__ import annotations

import argparse
import json
import statistics

import numpy as np

from hpccoll.config import git_commit

VARIANTS = {"whole": (), "-col": ("col",), "-bcast": ("bcast",), "-gemv": ("gemv",),
            "-allreduce": ("allreduce",), "-w": ("w",), "-collectives": ("bcast", "allreduce")}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--nb", type=int, default=64)
    ap.add_argument("--comm", default="sentinel")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--symv", default="default",
                    help="';'-separated sytrd_symv variants, each 'default' or defines (NAME=VALUE,...)")
    ap.add_argument("--panels", default="0,0.25,0.5,0.75",
                    help="','-separated panel starts as fractions of n (rounded down to a multiple of nb)")
    ap.add_argument("--stages", default=",".join(VARIANTS),
                    help="','-separated graphs to time per panel: 'whole' and stage removals (" + ", ".join(VARIANTS) + ")")
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    stages = [s for s in opts.stages.split(",") if s]
    unknown = [s for s in stages if s not in VARIANTS]
    if unknown or "whole" not in stages:
        ap.error(f"--stages {opts.stages!r}: name 'whole' and any of {', '.join(VARIANTS)}")
    opts.stages = stages
    import cupy as cp
    from mpi4py import MPI

    from hpccoll_eigensolver._xp import kept_streams
    from hpccoll_eigensolver.layout import BlockCyclic
    from hpccoll_eigensolver.runinfo import make_communicator, select_device
    from hpccoll_eigensolver.sytrd_device import _Step, symv_defines

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    xp, dev = select_device(world)
    if xp is np:
        raise SystemExit("sytrd_profile: needs a GPU per rank")
    comm = make_communicator(opts.comm, world, dev)
    comm.prepare(("float64",))
    n, nb = opts.n, opts.nb
    desc = BlockCyclic(n, n, nb, size)
    cols = desc.local_cols(rank)
    # random local columns: the timing does not depend on the values (nor on symmetry)
    C = cp.asfortranarray(cp.random.default_rng(7 + rank).standard_normal((n, cols.size)))
    stream = kept_streams("sytrd", priority="high")[0]  # the solver's capture stream (the legacy stream cannot be captured)
    rows = []
    for product in opts.symv.split(";"):
        st = _Step(C, desc, rank, defines=symv_defines(product.strip()))
        with stream:
            rows += _profile(st, product, desc, comm, stream, world, opts, cols)
    comm.Free()
    if rank == 0 and opts.json:
        with open(opts.json, "w") as fh:
            json.dump({"n": n, "nb": nb, "ranks": size, "comm": opts.comm,
                       "commit": git_commit(), "rows": rows}, fh, indent=1)
    return 0


def _profile(st, product, desc, comm, stream, world, opts, cols):
    import cupy as cp
    from mpi4py import MPI

    n, nb, rank = desc.n, desc.nb, world.Get_rank()
    rows = []
    for p0 in sorted({min(int(float(f) * n) // nb * nb, (n - 1) // nb * nb) for f in opts.panels.split(",")}):
        owner = desc.owner(p0)
        width = min(nb, n - p0)
        per_variant = {}
        for name in opts.stages:
            skip = VARIANTS[name]
            st.begin_panel(p0)
            stream.begin_capture()
            try:
                for _ in range(width):
                    st.column(owner, comm, skip=skip)
            finally:
                g = stream.end_capture()
            times = []
            for _ in range(opts.reps + 1):
                st.begin_panel(p0)
                stream.synchronize()
                world.Barrier()
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(stream)
                g.launch(stream=stream)
                e1.record(stream)
                e1.synchronize()
                times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / width)  # us per column
            us = world.allreduce(statistics.median(times[1:]), op=MPI.MAX)
            per_variant[name] = us
        lt = int(np.searchsorted(cols, p0))
        gemv_bytes = int(8 * (n - cols[lt:]).sum())  # each trailing local column from its diagonal down
        row = {"product": product, "p0": p0, "us_per_column": per_variant,
               "stage_us": {k[1:]: per_variant["whole"] - v for k, v in per_variant.items() if k != "whole"},
               "gemv_bytes": gemv_bytes}
        g_us = row["stage_us"].get("gemv")
        row["gemv_GBps"] = gemv_bytes / (g_us * 1e3) if g_us and g_us > 0 else None
        rows.append(row)
        if rank == 0:
            print(f"{product:12s} p0={p0:6d} whole {per_variant['whole']:7.2f} us/col  "
                  + "  ".join(f"{k} {v:6.2f}" for k, v in row["stage_us"].items())
                  + f"  | gemv reads {gemv_bytes / 1e6:.1f} MB"
                  + (f" = {row['gemv_GBps']:.0f} GB/s" if row["gemv_GBps"] else ""), flush=True)
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
