"""Write a large test problem A x = lambda B x as A.npy, B.npy (float64) built on the GPU.

The CLI's problems are built on the host (problems.py: two n x n QRs, ~20 s at n = 8192 and
8x that at 16384); this builds the same kind of problem as `--problem known` (B of chosen
condition, A = L Q diag(lam) Q^T L^T with lam spread over three decades, both signs) with
CuPy in a few seconds, for `hpccoll-eigensolver compare --problem file:DIR/A.npy,DIR/B.npy`.
Not the same bits as problems.make_problem (another generator); the spectrum is saved as
lam.npy beside it.

    python3 bench/make_problem_gpu.py --n 16384 --cond-b 1e3 --out /tmp/p16k"""
from __future__ import annotations

import argparse
import os
import time


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--cond-b", type=float, default=1e3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.n < 2 or a.cond_b < 1:
        p.error("need --n >= 2 and --cond-b >= 1")
    import cupy as cp
    import numpy as np

    t0 = time.perf_counter()
    rng = cp.random.default_rng(a.seed)
    n = a.n

    def orthogonal():
        q, r = cp.linalg.qr(rng.standard_normal((n, n)))
        return q * cp.sign(cp.diag(r))[None, :]

    s = cp.asarray(np.geomspace(1.0, 1.0 / a.cond_b, n))
    q = orthogonal()
    B = (q * s[None, :]) @ q.T
    B = (B + B.T) / 2
    del q
    L = cp.linalg.cholesky(B)
    mag = cp.asarray(np.geomspace(1e-3, 1.0, n))
    lam = cp.sort(cp.where(rng.random(n) < 0.5, -1.0, 1.0) * mag)
    LQ = L @ orthogonal()
    A = (LQ * lam[None, :]) @ LQ.T
    A = (A + A.T) / 2
    os.makedirs(a.out, exist_ok=True)
    for name, x in (("A", A), ("B", B), ("lam", lam)):
        np.save(os.path.join(a.out, f"{name}.npy"), cp.asnumpy(x))
    print(f"make_problem_gpu: n={n} cond_b={a.cond_b:g} in {time.perf_counter() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
