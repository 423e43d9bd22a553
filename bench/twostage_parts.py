"""The two-stage reduction's parts on one GPU, each timed alone between device syncs: sy2sb
(dense -> band), sb2st_device (bulge chasing), apply_q2_device (Q2 Z, Z n x n) and Q1's ormtr
(Z n x n), for each half-bandwidth b: the data behind the GPU's choice of b
(linalg/twostage.py); bench/eig_vs_cusolver.py times the whole solves.

    python bench/twostage_parts.py --n 8192,16384 --b 32,64 [--json FILE]

One process, one rank (every column local: no collective runs); C = sym(Gaussian) from a seed;
each part run twice, the second timed."""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="8192,16384")
    ap.add_argument("--b", default="32,64")
    ap.add_argument("--nb", type=int, default=64)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp

    import hpccoll
    from hpccoll_eigensolver.linalg.layout import BlockCyclic
    from hpccoll_eigensolver.linalg.ormtr import ormtr
    from hpccoll_eigensolver.linalg.q2_device import apply_q2_device, q2_flops
    from hpccoll_eigensolver.linalg.sb2st_device import sb2st_device
    from hpccoll_eigensolver.linalg.sy2sb import gather_band, sy2sb

    comm = hpccoll.Communicator(backend="host", deterministic=True)   # one rank: Get_rank only
    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    rows = []

    def timed(fn):
        cp.cuda.get_current_stream().synchronize()
        t0 = time.perf_counter()
        out = fn()
        cp.cuda.get_current_stream().synchronize()
        return time.perf_counter() - t0, out

    print(f"# {name}; one rank; seconds of the second of two runs of each part")
    print("| n | b | sy2sb | sb2st | Q2 Z | Q2 TFLOP/s | Q1 Z (ormtr) | sum |")
    print("|---|---|---|---|---|---|---|---|")
    for n in [int(x) for x in args.n.split(",")]:
        desc = BlockCyclic(n, n, args.nb, 1)
        rs = cp.random.RandomState(1)
        G = rs.standard_normal((n, n))
        C0 = cp.asfortranarray(cp.tril(G + G.T))
        del G
        for b in [int(x) for x in args.b.split(",")]:
            for _ in range(2):
                C = C0.copy(order="F")
                t1, (band, tau1) = timed(lambda: sy2sb(C, desc, comm, cp, b))
                full = gather_band(band, desc, comm, cp)
                t2, (d, e, flat) = timed(lambda: sb2st_device(full, b))
                Z = cp.asfortranarray(cp.eye(n))
                t3, _ = timed(lambda: apply_q2_device(flat, n, b, b, Z))
                del flat
                t4, _ = timed(lambda: ormtr(C, tau1, Z, desc, comm, cp, offset=b))
                del C, Z, band, full
            rate = q2_flops(n, b, b, n) / t3 / 1e12
            rows.append({"card": name, "n": n, "b": b, "sy2sb_s": t1, "sb2st_s": t2, "q2_s": t3, "q2_tflops": rate,
                         "q1_s": t4})
            print(f"| {n} | {b} | {t1:.3f} | {t2:.3f} | {t3:.3f} | {rate:.1f} | {t4:.3f} | {t1 + t2 + t3 + t4:.3f} |",
                  flush=True)
            cp.get_default_memory_pool().free_all_blocks()
        del C0
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
