"""sytrd_symv alone on one GPU: time per launch and bandwidth at several columns j, for
compile-time variants of the kernel, with a CuPy check of its result.

The column step's product (sytrd_step.cu) is the tridiagonalization's memory traffic; inside
the panel graphs it can only be timed by difference (bench/sytrd_profile.py).  Here it runs
by itself on rank `--rank` of a `--nprocs`-rank layout's local columns (no MPI: the product
has no communication), so variants of its tiling can be compared in one process:

    python3 bench/symv_bench.py --n 8192 --variants "SY_C=64,SY_G=3;SY_C=32,SY_G=3" --json out.json

Bytes counted: the lower triangle of the trailing local columns (i >= g > j) plus the panel
dot products' columns (2k columns of n - j - 1 rows).  The same run first measures the GPU's
memory bandwidth (a device-to-device copy of 2 GiB: bytes read + written over its time), and
every row prints its share of it."""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np

from hpccoll.config import git_commit



def hbm_gbps(cp, nbytes: int = 2 << 30, reps: int = 10) -> float:
    """Device memory bandwidth, GB/s: a copy of `nbytes` reads and writes them (median of reps)."""
    src = cp.ones(nbytes // 8, dtype=cp.float64)
    dst = cp.empty_like(src)
    times = []
    for _ in range(reps + 2):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        cp.copyto(dst, src)
        e1.record()
        e1.synchronize()
        times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e-3)
    del src, dst
    return 2 * nbytes / float(np.median(times[2:])) * 1e-9


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--nb", type=int, default=64)
    p.add_argument("--nprocs", type=int, default=2)
    p.add_argument("--rank", type=int, default=0)
    p.add_argument("--k", type=int, default=32, help="panel columns already used (panel dots)")
    p.add_argument("--js", default="0,2048,4096,6144")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--variants", default="default",
                   help="';'-separated variants, each 'default' or sytrd_symv's defines (NAME=VALUE,...)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import cupy as cp

    from hpccoll_eigensolver.layout import BlockCyclic
    from hpccoll_eigensolver.sytrd_device import _Step, symv_defines

    hbm = hbm_gbps(cp)
    print(f"device memory bandwidth (2 GiB copy, read + write): {hbm:.0f} GB/s", flush=True)
    n, nb = a.n, a.nb
    desc = BlockCyclic(n, n, nb, a.nprocs)
    cols = desc.local_cols(a.rank)
    rng = np.random.default_rng(1)
    C = cp.asfortranarray(cp.asarray(rng.standard_normal((n, cols.size))))
    P = cp.asarray(rng.standard_normal((n, 2 * nb)))
    bb = cp.asarray(rng.standard_normal(n + 4))
    bb[3] = 0.37
    rows = []
    for variant in a.variants.split(";"):
        # the solver's own buffers and launch, built for this variant's defines
        step = _Step(C, desc, a.rank, defines=symv_defines(variant.strip()))
        step.P[...] = P
        step.bb[...] = bb

        def product():  # the column step with every stage but the product left out
            step.column(owner=-1, comm=None, skip=("col", "bcast", "allreduce", "w"))

        for j in (int(x) for x in a.js.split(",")):
            step.st.fill(0)  # every ticket and counter at rest
            step.st[:2] = cp.asarray(np.array([j, a.k], dtype=np.int64))
            step.y.fill(0)
            product()
            err = _check(cp, C, cols, step.bb, j, n, step.y, step.P, a.k, nb, step.s)
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            for _ in range(3):
                product()
            e0.record()
            for _ in range(a.reps):
                product()
            e1.record()
            e1.synchronize()
            us = cp.cuda.get_elapsed_time(e0, e1) * 1e3 / a.reps
            g = cols[cols > j]
            nbytes = 8 * (int(np.sum(n - g)) + 2 * a.k * (n - j - 1))
            gbps = nbytes / us * 1e-3
            rows.append({"variant": variant, "j": j, "us": us, "bytes": nbytes, "GBps": gbps,
                         "of_hbm": gbps / hbm, "max_rel_err": err, "grid": step.symv_grid})
            print(f"{variant:32s} j={j:6d} {us:8.2f} us  {nbytes / 1e6:7.1f} MB  {gbps:7.0f} GB/s"
                  f" ({gbps / hbm:4.0%} of the copy's)  err {err:.1e}", flush=True)
    if a.json:
        with open(a.json, "w") as fh:
            json.dump({"n": n, "nb": nb, "nprocs": a.nprocs, "hbm_copy_GBps": hbm, "rank": a.rank, "k": a.k, "reps": a.reps,
                       "device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                       "commit": git_commit(), "rows": rows}, fh, indent=1)
    # SY_NOTICKET=1 is timing only (no finalizers: its y is wrong by design)
    bad = [r for r in rows if not r["max_rel_err"] < 1e-12 and "SY_NOTICKET=1" not in r["variant"]]
    if bad:
        print(f"symv_bench: {len(bad)} results off the CuPy reference", file=sys.stderr)
        return 1
    return 0


def _check(cp, C, cols, bb, j, n, y, P, k, nb, s):
    """Largest error of y (rows half at rows > j, columns half at local columns > j) and of the
    panel dots against CuPy, relative to the mean absolute column sum of C."""
    i = cp.arange(n)
    v = cp.where(i <= j, 0.0, cp.where(i == j + 1, 1.0, bb[4:] * bb[3]))
    act = cp.asarray(np.nonzero(cols > j)[0])
    G = cp.asarray(cols)[act]
    Cl = C[:, act]
    rows_ref = cp.where(i[:, None] >= G[None, :], Cl, 0.0) @ v[G]
    cols_ref = (cp.where(i[:, None] > G[None, :], Cl, 0.0) * v[:, None]).sum(axis=0)
    scale = float(cp.abs(Cl).sum()) / max(1, Cl.shape[1]) + 1.0
    err = max(_maxabs(cp, y[:n][j + 1:] - rows_ref[j + 1:]), _maxabs(cp, y[n + G] - cols_ref))
    z = cp.zeros(nb - k)
    sref = cp.concatenate([P[j + 1:, :k].T @ v[j + 1:], z, P[j + 1:, nb:nb + k].T @ v[j + 1:], z])
    err = max(err, _maxabs(cp, s - sref))
    return err / scale


def _maxabs(cp, x) -> float:
    return float(cp.abs(x).max()) if x.size else 0.0


if __name__ == "__main__":
    raise SystemExit(main())
