"""The eigensolver's local GEMMs through CuPy (cuBLAS) and through nvmath-python's stateful
Matmul (planned once, executed many times), one GPU, float64: which is faster?

    python3 bench/gemm_nvmath_vs_cupy.py [--n 4096,8192] [--ranks 2] [--nb 64] [--json out.json]

Shapes per n (P ranks, nb): the sytrd trailing update (n x 2nb) @ (2nb x n/P), the ormtr block
(nb x n) @ (n x n/P) and its (n x nb) @ (nb x n/P), and the stedc="dc" top merge (n x n) @ (n x n).
Per shape: median of 20 timed executions (CUDA events), after 3 warm-up runs; nvmath's plan()
is timed apart (it is paid once per shape and reused).  Results are checked against each other
(max relative difference)."""
from __future__ import annotations

import argparse
import json

import numpy as np

from hpccoll.config import git_commit


def _time(fn, reps: int = 20) -> float:
    import cupy as cp

    for _ in range(3):
        fn()
    cp.cuda.Device().synchronize()
    out = []
    for _ in range(reps):
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        out.append(cp.cuda.get_elapsed_time(e0, e1))  # ms
    return float(np.median(out))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", default="4096,8192")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--nb", type=int, default=64)
    ap.add_argument("--json", default=None)
    opts = ap.parse_args()
    import cupy as cp

    try:
        from hpccoll_eigensolver.cusolvermp import use_anchor_site

        use_anchor_site()  # nvmath-python from the carried wheels on the GPU machine
        import nvmath
        from nvmath.linalg.advanced import Matmul

        nvmath_version = nvmath.__version__
    except Exception as exc:  # noqa: BLE001
        print(f"nvmath-python not importable ({type(exc).__name__}: {exc}): CuPy only", flush=True)
        Matmul, nvmath_version = None, None
    rows = []
    rng = np.random.default_rng(1)
    for n in (int(x) for x in opts.n.split(",")):
        nloc, nb = n // opts.ranks, opts.nb
        shapes = {"sytrd trailing (n x 2nb)(2nb x n/P)": (n, 2 * nb, nloc),
                  "ormtr V^T Z (nb x n)(n x n/P)": (nb, n, nloc),
                  "ormtr V W (n x nb)(nb x n/P)": (n, nb, nloc),
                  "dc merge (n x n)(n x n)": (n, n, n)}
        for name, (m, k, q) in shapes.items():
            a = cp.asarray(rng.standard_normal((m, k)), order="F")
            b = cp.asarray(rng.standard_normal((k, q)), order="F")
            row = {"n": n, "shape": name, "m": m, "k": k, "n_cols": q,
                   "cupy_ms": _time(lambda: cp.matmul(a, b))}
            ref = cp.matmul(a, b)
            if Matmul is not None:
                try:
                    mm = Matmul(a, b)
                    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                    e0.record()
                    mm.plan()
                    e1.record()
                    e1.synchronize()
                    row["nvmath_plan_ms"] = cp.cuda.get_elapsed_time(e0, e1)
                    row["nvmath_ms"] = _time(mm.execute)
                    got = mm.execute()
                    row["max_rel_diff"] = float(cp.abs(got - ref).max() / cp.abs(ref).max())
                    mm.free()
                except Exception as exc:  # noqa: BLE001 - record and go on
                    row["nvmath_error"] = f"{type(exc).__name__}: {exc}"[:200]
            flops = 2.0 * m * k * q
            row["cupy_tflops"] = flops / row["cupy_ms"] * 1e-9
            if "nvmath_ms" in row:
                row["nvmath_tflops"] = flops / row["nvmath_ms"] * 1e-9
            rows.append(row)
            print(f"n={n:5d} {name:40s} cupy {row['cupy_ms']:8.3f} ms ({row['cupy_tflops']:5.1f} TF/s)  "
                  f"nvmath {row.get('nvmath_ms', float('nan')):8.3f} ms (plan {row.get('nvmath_plan_ms', float('nan')):.1f} ms)"
                  f"  {row.get('nvmath_error', '')}", flush=True)
    if opts.json:
        name = cp.cuda.runtime.getDeviceProperties(0)["name"]
        with open(opts.json, "w") as fh:
            json.dump({"gpu": name.decode() if isinstance(name, bytes) else str(name),
                       "commit": git_commit(), "dtype": "float64",
                       "nvmath": nvmath_version,
                       "cupy": cp.__version__, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
