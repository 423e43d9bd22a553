"""Write a large test problem A x = lambda B x as A.npy, B.npy (float64) built on the GPU.

`hpccoll-eigensolver solve` builds its generated problems itself, by column block on each
rank's device; this writes the whole `--problem known` (problems.make_problem with CuPy: the
CLI's GPU bits) to files, for runs that want `--problem file:DIR/A.npy,DIR/B.npy`.  The
spectrum is saved as lam.npy beside it.

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

    from hpccoll_eigensolver.problems import make_problem

    t0 = time.perf_counter()
    prob = make_problem("known", a.n, cond_b=a.cond_b, seed=a.seed, xp=cp)
    os.makedirs(a.out, exist_ok=True)
    for name, x in (("A", prob.A), ("B", prob.B), ("lam", prob.eigenvalues)):
        np.save(os.path.join(a.out, f"{name}.npy"), cp.asnumpy(x))
    print(f"make_problem_gpu: n={a.n} cond_b={a.cond_b:g} in {time.perf_counter() - t0:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
