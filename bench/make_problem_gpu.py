"""Write a large test problem A x = lambda B x as A.npy, B.npy (float64) built on the GPU.

The CLI's problems are built on the host (problems.py: two n x n QRs, ~20 s at n = 8192 and
8x that at 16384); this builds the same kind of problem as `--problem known` with the same
builders (problems.with_spectrum, spread_spectrum) on CuPy arrays, in a few seconds, for
`hpccoll-eigensolver compare --problem file:DIR/A.npy,DIR/B.npy`.  Not the same bits as problems.make_problem (another generator); the spectrum is saved as
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

    from hpccoll_eigensolver.problems import spread_spectrum, with_spectrum

    t0 = time.perf_counter()
    rng = cp.random.default_rng(a.seed)
    prob = with_spectrum("known", spread_spectrum(a.n, rng, cp), a.cond_b, rng, cp)
    os.makedirs(a.out, exist_ok=True)
    for name, x in (("A", prob.A), ("B", prob.B), ("lam", prob.eigenvalues)):
        np.save(os.path.join(a.out, f"{name}.npy"), cp.asnumpy(x))
    print(f"make_problem_gpu: n={a.n} cond_b={a.cond_b:g} in {time.perf_counter() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
