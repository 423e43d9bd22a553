"""The band reduction's panel on one GPU: sy2sb_device.PanelQR (one cooperative launch: QR, V and
T) against cuSOLVER's geqrf plus the V copy and sy2sb.block_reflector (the path it replaces, still
taken where a panel does not fit the kernel), per panel height m; C22 V by sy2sb.symm_blocked
against one cuBLAS symm from UPDATE_BLOCKED_ROWS rows; then the whole one-GPU sy2sb with the
kernel and without, alternating calls, and how far the two bands differ.

    python bench/sy2sb_panel.py --m 16320,8192,4096,1024,256 --n 8192,16384 [--json FILE]

Panel times: CUDA events around `--reps` back-to-back calls (each queue's launches included: the
host issues them while the GPU runs), their mean; the panels are fresh Gaussian matrices.  Whole
reduction: wall time of a call between device syncs, `--calls` calls each way alternating, the best;
C = sym(Gaussian) from a seed."""
from __future__ import annotations

import argparse
import json
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--m", default="16320,8192,4096,1024,256")
    ap.add_argument("--n", default="8192,16384")
    ap.add_argument("--b", type=int, default=64)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=3)
    ap.add_argument("--grids", default="",
                    help="extra MIN_ROWS:BLOCKS_MAX pairs to time the kernel with too, e.g. 128:66,256:44")
    ap.add_argument("--symm-ab", action="store_true",
                    help="also the whole reduction with C22 V by one cuBLAS symm against symm_blocked")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    import cupy as cp

    import hpccoll
    from hpccoll_eigensolver.linalg import sy2sb as S
    from hpccoll_eigensolver.linalg import sy2sb_device
    from hpccoll_eigensolver.linalg._xp import geqrf_in_place, geqrf_work, symm_lower
    from hpccoll_eigensolver.linalg.layout import BlockCyclic
    from hpccoll_eigensolver.linalg.sy2sb import UPDATE_BLOCKED_ROWS, block_reflector, sy2sb, symm_blocked

    dev = cp.cuda.Device()
    name = cp.cuda.runtime.getDeviceProperties(dev.id)["name"].decode()
    b = args.b
    out = {"device": name, "b": b, "panels": [], "reductions": []}
    print(f"{name}; b = {b}")

    big = cp.ones((8192, 8192))

    def events(fn, reps, busy=False):
        """Mean ms of fn over reps between CUDA events; busy: the calls queued behind a GEMM of
        about 20 ms, so that the events time the GPU's work and not the host's launches."""
        fn()
        start, stop = cp.cuda.Event(), cp.cuda.Event()
        if busy:
            big @ big
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        return cp.cuda.get_elapsed_time(start, stop) / reps

    for m in (int(x) for x in args.m.split(",")):
        A = cp.asfortranarray(cp.random.standard_normal((m, b)))
        P = A.copy(order="F")
        tau = cp.zeros(b)
        V, T = cp.empty((m, b), order="F"), cp.empty((b, b), order="F")
        qr = sy2sb_device.PanelQR(m + b, b)
        work = cp.empty(max(1, geqrf_work((m, b))))

        def kernel():
            P[...] = A
            qr(P, tau, V, T)

        def cusolver():
            P[...] = A
            geqrf_in_place(cp, P, tau, work)
            k = min(m, b)
            W = P.copy(order="F")
            W[:k] = cp.tril(W[:k], -1)
            W[cp.arange(k), cp.arange(k)] = 1.0
            block_reflector(cp, W, tau)

        copy = events(lambda: P.__setitem__(Ellipsis, A), args.reps)
        t_new, t_old = events(kernel, args.reps) - copy, events(cusolver, args.reps) - copy
        G, R = sy2sb_device.panel_grid(m, b, qr.sms, qr.most)
        print(f"  m={m}: kernel {t_new:.3f} ms ({G} blocks of {R} rows), geqrf + V + block_reflector {t_old:.3f} ms "
              f"({t_old / t_new:.2f}x); the panel's copy {copy:.3f} ms subtracted")
        row = {"m": m, "kernel_ms": t_new, "cusolver_ms": t_old, "blocks": G, "grids": {}}
        defaults = sy2sb_device.MIN_ROWS, sy2sb_device.BLOCKS_MAX
        for pair in filter(None, args.grids.split(",")):
            sy2sb_device.MIN_ROWS, sy2sb_device.BLOCKS_MAX = (int(x) for x in pair.split(":"))
            G, R = sy2sb_device.panel_grid(m, b, qr.sms, qr.most)
            t = events(kernel, args.reps) - copy
            print(f"    MIN_ROWS:BLOCKS_MAX {pair}: {t:.3f} ms ({G} blocks of {R} rows)")
            row["grids"][pair] = t
        sy2sb_device.MIN_ROWS, sy2sb_device.BLOCKS_MAX = defaults
        out["panels"].append(row)

    out["symm"] = []
    for m in (int(x) for x in args.m.split(",")):
        if m < UPDATE_BLOCKED_ROWS:
            continue
        C22 = cp.asfortranarray(cp.tril(cp.random.standard_normal((m, m))))
        V = cp.asfortranarray(cp.random.standard_normal((m, b)))
        Y1, Y2 = cp.empty((m, b), order="F"), cp.empty((m, b), order="F")
        t1 = events(lambda: symm_lower(cp, C22, V, Y1), args.reps, busy=True)
        t2 = events(lambda: symm_blocked(cp, C22, V, Y2), args.reps, busy=True)
        diff = float(cp.abs(Y1 - Y2).max() / cp.abs(Y1).max())
        tf = 2.0 * m * m * b / 1e9
        print(f"  C22 V at m={m} (GPU time): cuBLAS symm {t1:.3f} ms ({tf / t1:.1f} TFLOP/s), blocks {t2:.3f} ms "
              f"({tf / t2:.1f} TFLOP/s, {t1 / t2:.2f}x); max difference / max |Y| {diff:.1e}")
        out["symm"].append({"m": m, "symm_ms": t1, "blocked_ms": t2, "rel_diff": diff})
        del C22

    class Old(sy2sb_device.PanelQR):    # the path without the kernel
        def __init__(self, n, b):
            super().__init__(n, b)
            self.fits = False

    comm = hpccoll.Communicator(backend="host", deterministic=True)   # one rank: Get_rank only

    def alternate(Sm, desc, variants):
        """The whole band reduction of Sm once per variant (label, set-up) per call, alternating:
        {label: seconds of each call}, {label: the last band}, and the bands' max difference over
        the second variant's max |band|."""
        runs, bands = {label: [] for label, _ in variants}, {}
        for _ in range(args.calls):
            for label, setup in variants:
                undo = setup()
                C = Sm.copy(order="F")
                cp.cuda.Device().synchronize()
                t0 = time.perf_counter()
                bands[label], _ = sy2sb(C, desc, comm, cp, b)
                cp.cuda.Device().synchronize()
                runs[label].append(time.perf_counter() - t0)
                undo()
                del C
        (a, _), (r, _) = variants
        return runs, float(cp.abs(bands[a] - bands[r]).max() / cp.abs(bands[r]).max())

    def patch(module, name, value):
        old = getattr(module, name)
        setattr(module, name, value)
        return lambda: setattr(module, name, old)

    for n in (int(x) for x in args.n.split(",")):
        Sm = cp.random.default_rng(n).standard_normal((n, n))
        Sm = cp.asfortranarray(cp.tril(Sm + Sm.T))
        desc = BlockCyclic(n, n, 64, 1)
        runs, diff = alternate(Sm, desc, [("kernel", lambda: (lambda: None)),
                                          ("cusolver", lambda: patch(sy2sb_device, "PanelQR", Old))])
        best = {k: min(v) for k, v in runs.items()}
        print(f"n={n}: sy2sb with the kernel best {best['kernel']:.4f} s, with geqrf best {best['cusolver']:.4f} s "
              f"({best['cusolver'] / best['kernel']:.2f}x); runs {' '.join(f'{t:.4f}' for t in runs['kernel'])} | "
              f"{' '.join(f'{t:.4f}' for t in runs['cusolver'])}; bands' max difference / max |band| {diff:.2e}")
        out["reductions"].append({"n": n, "kernel_s": runs["kernel"], "cusolver_s": runs["cusolver"],
                                  "band_rel_diff": diff})
        if args.symm_ab:
            one = lambda xp, C22, V, Y: symm_lower(xp, C22, V, Y)   # noqa: E731 - C22 V by one symm
            ab, d = alternate(Sm, desc, [("blocks", lambda: (lambda: None)),
                                         ("symm", lambda: patch(S, "symm_blocked", one))])
            print(f"n={n}: sy2sb (kernel) with C22 V by blocks best {min(ab['blocks']):.4f} s, by one symm best "
                  f"{min(ab['symm']):.4f} s ({min(ab['symm']) / min(ab['blocks']):.2f}x); runs "
                  f"{' '.join(f'{t:.4f}' for t in ab['blocks'])} | {' '.join(f'{t:.4f}' for t in ab['symm'])}; "
                  f"bands' max difference / max |band| {d:.2e}")
            out["reductions"][-1]["symm_ab"] = {**ab, "band_rel_diff": d}

    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
