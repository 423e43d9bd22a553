"""How cuSOLVER's dense symmetric eigensolver (what the one-GPU anchor's syevd runs) splits its
time: cupy.linalg.eigh (syevd with eigenvectors) against cupy.linalg.eigvalsh (the same without:
the tridiagonalization and the eigenvalues of T only), on one random symmetric matrix per n.
The difference is what cuSOLVER spends on the tridiagonal eigenvectors and the
back-transformation (our stedc + ormtr); eigvalsh is about its sytrd (CuPy exposes no sytrd of
its own to time: the cuSOLVER names it has are printed first).

    python3 bench/syevd_split.py 8192,16384

Wall seconds, median of 3 after one warm-up call, device synchronized around each."""
import sys

import cupy as cp
from cupy_backends.cuda.libs import cusolver

from _lab import median_wall


def timed(fn):
    return median_wall(lambda _: fn())[0]


def main() -> int:
    print("cusolver names:", [x for x in dir(cusolver) if any(k in x for k in ("sytrd", "ormtr", "stedc", "syevd"))])
    for n in [int(x) for x in (sys.argv[1] if len(sys.argv) > 1 else "8192").split(",")]:
        A = cp.random.default_rng(1).standard_normal((n, n))
        A = cp.asfortranarray((A + A.T) / 2)
        out = {"n": n, "syevd": timed(lambda: cp.linalg.eigh(A)), "syevd_noV": timed(lambda: cp.linalg.eigvalsh(A))}
        print(out, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
