"""What bench/eig_vs_cusolver.py measures and how it reports it: the cases, the flop and byte
models, the tables, a phase clock, the speed of light (DGEMM rate, memory bandwidth), the
machine record, the problems and the accuracy metrics.  Imports without CuPy (the unit tests
read it on the CPU)."""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import os
import time

import numpy as np

EPS = float(np.finfo(np.float64).eps)
GIB = 2.0**30
#: case -> (solver, output, reduction): solver cusolver | anchor | hpccoll; output full (all
#: eigenpairs) | values (eigenvalues only) | subset (the lowest k = max(1, n // 10) pairs).
#: The "-again" cases (SAME_B) time GeneralizedSolver.solve with B factored before the timed call:
#: the second and later solves of an SCF loop.
CASES = {
    "dsygvd": ("cusolver", "full", None), "dsygvd-w": ("cusolver", "values", None),
    "dsygvdx-sub": ("cusolver", "subset", None),
    "anchor": ("anchor", "full", None), "anchor-w": ("anchor", "values", None),
    "one-stage": ("hpccoll", "full", "one-stage"), "two-stage": ("hpccoll", "full", "two-stage"),
    "one-stage-w": ("hpccoll", "values", "one-stage"), "two-stage-w": ("hpccoll", "values", "two-stage"),
    "one-stage-sub": ("hpccoll", "subset", "one-stage"), "two-stage-sub": ("hpccoll", "subset", "two-stage"),
    "one-stage-again": ("hpccoll", "full", "one-stage"), "two-stage-again": ("hpccoll", "full", "two-stage"),
}
SAME_B = ("one-stage-again", "two-stage-again")
DEFAULT_WHAT = ("sol,dsygvd,one-stage,two-stage,one-stage-again,two-stage-again,dsygvd-w,one-stage-w,two-stage-w,"
                "dsygvdx-sub,one-stage-sub,two-stage-sub")
ALL_WHAT = DEFAULT_WHAT + ",anchor,anchor-w"
MPI_WHAT = "one-stage,two-stage"
FLOP_MODEL = {
    "potrf": "n^3/3", "sygst": "n^3 (the anchor's two triangular solves do 2n^3; n^3 counted)",
    "sytrd": "one-stage 4n^3/3; two-stage sy2sb 4n^3/3 + sb2st 6 b n^2 (b the half-bandwidth): the phase "
             "times both",
    "stedc": "time only", "syevd": "time only (the anchor's tridiagonalization, stedc and back-transformation)",
    "ormtr": "one-stage 2n^2 k; two-stage Q2 2n^2 k (nominal) + Q1 2n^2 k; k eigenvectors",
    "trsm": "n^2 k", "sy2sb": "4n^3/3", "sb2st": "6 b n^2",
    "sytrd_bytes": "one-stage: 8 n^3/6 bytes, each column's symv reading the trailing lower triangle once "
                   "(the panel updates' traffic left out: a lower bound), against the measured read rate",
}


def int_list(text: str) -> list[int]:
    try:
        out = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give integers separated by commas, e.g. 8192,16384") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give orders >= 1, e.g. 8192,16384")
    return out


def parse_what(text: str, mpi: bool = False) -> list[str]:
    """The cases of --what, in order ("all": ALL_WHAT); ValueError naming the unknown ones."""
    names = [t.strip() for t in (ALL_WHAT if text.strip() == "all" else text).split(",") if t.strip()]
    valid = [k for k, v in CASES.items() if not mpi or v[0] == "hpccoll"] + ([] if mpi else ["sol"])
    bad = [t for t in names if t not in valid]
    if bad or not names:
        raise ValueError(f"--what {text!r}: {'unknown ' + ', '.join(bad) if bad else 'nothing named'}; use "
                         f"'all' or names from {', '.join(valid)}")
    return list(dict.fromkeys(names))


# -- the flop and byte models ----------------------------------------------------------------
def subset_k(n: int) -> int:
    return max(1, n // 10)


def vectors_of(output: str, n: int) -> int:
    """k, the eigenvectors an output computes."""
    return {"full": n, "values": 0, "subset": subset_k(n)}[output]


def phase_flops(phase: str, n: int, k: int, reduction: str | None = None, band: int = 64) -> float | None:
    """The flops a phase is credited with (FLOP_MODEL); None: time only."""
    two = reduction == "two-stage"
    model = {"potrf": n**3 / 3, "sygst": float(n**3),
             "sytrd": 4 * n**3 / 3 + (6.0 * band * n**2 if two else 0.0),
             "sy2sb": 4 * n**3 / 3, "sb2st": 6.0 * band * n**2,  # a timer that names the two stages
             "ormtr": (4.0 if two else 2.0) * n**2 * k, "trsm": float(n**2 * k)}
    return model.get(phase)


def useful_flops(n: int, k: int) -> float:
    """LAPACK's count of a solve with k eigenvectors (stedc left out): the rate of every solver."""
    return sum(phase_flops(p, n, k) for p in ("potrf", "sygst", "sytrd", "ormtr", "trsm"))


def sytrd_bytes(n: int) -> float:
    return 8.0 * n**3 / 6


def phase_rates(phases: dict, n: int, k: int, reduction, band: int, sol: dict) -> dict:
    """{phase: {seconds, tflops, pct_dgemm[, GBps, pct_read_bw]}}."""
    out = {}
    for name, s in phases.items():
        f = phase_flops(name, n, k, reduction, band)
        r = {"seconds": s, "tflops": f / s / 1e12 if f and s > 0 else None}
        r["pct_dgemm"] = _pct(r["tflops"], sol.get("dgemm_tflops"))
        if name == "sytrd" and reduction == "one-stage" and s > 0:
            r["GBps"] = sytrd_bytes(n) / s / 1e9
            r["pct_read_bw"] = _pct(r["GBps"], sol.get("read_GBps"))
        out[name] = r
    return out


def _pct(x, of):
    return 100.0 * x / of if x is not None and of else None


# -- tables ----------------------------------------------------------------------------------
COLUMNS = ("n", "problem", "what", "seconds", "ratio to dsygvd", "TFLOP/s", "% of DGEMM", "error", "err known",
           "residual", "B-orth", "peak GiB")
MPI_COLUMNS = ("n", "problem", "what", "P", "seconds", "slowest rank", "peak GiB/rank", "ranks agree", "vs P = 1")


LEGEND = ("seconds: the timed call; ratio: to the reference of the same output (dsygvd, dsygvd-w, dsygvdx-sub; the "
          "anchor where dsygvd failed); -again: a solve with B factored before it (GeneralizedSolver), to set against the "
          "same reduction's full solve less its potrf; TFLOP/s: LAPACK's useful flops over seconds; error: max |w - w_ref| / max "
          "|w_ref|, w_ref the reference's eigenvalues; err known: against the built spectrum; residual and B-orth in "
          "units of n eps (hpccoll_eigensolver.metrics); peak GiB: CuPy's pool high-water mark over the first call, "
          "the inputs A and B included")
LEGEND_MPI = ("seconds: the slowest rank's timed call; peak GiB/rank: the largest rank's CuPy pool high-water mark "
              "(its share of A and B included); ranks agree: the eigenvalues' bits alike on every rank; vs P = 1: "
              "max |w - w_1| / max |w_1| against the P = 1 run's eigenvalues of the same case (bitwise: equal)")


def _f(x, spec=".3g") -> str:
    return "-" if x is None else format(x, spec)


def table_line(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def row_cells(r: dict) -> list:
    if r.get("status", "ok") != "ok":
        return [r["n"], r["problem"], r["what"], r["status"]] + [""] * (len(COLUMNS) - 4)
    peak = r.get("memory", {}).get("pool_peak_bytes")
    return [r["n"], r["problem"], r["what"], _f(r["seconds"], ".4g"), _f(r.get("ratio"), ".3f"),
            _f(r.get("tflops"), ".3g"), _f(r.get("pct_dgemm"), ".1f"), _f(r.get("error")), _f(r.get("error_known")),
            _f(r.get("residual")), _f(r.get("b_orthogonality")), _f(None if peak is None else peak / GIB, ".2f")]


def mpi_cells(r: dict) -> list:
    if r.get("status", "ok") != "ok":
        return [r["n"], r["problem"], r["what"], r["ranks"], r["status"]] + [""] * (len(MPI_COLUMNS) - 5)
    p1 = r.get("vs_p1")
    vs = "-" if p1 is None else ("bitwise" if p1["bitwise"] else f"{p1['max_rel_diff']:.2g}")
    return [r["n"], r["problem"], r["what"], r["ranks"], _f(r["seconds"], ".4g"), r["slowest_rank"],
            _f(r["peak_bytes_max"] / GIB if r.get("peak_bytes_max") is not None else None, ".2f"),
            "yes" if r["ranks_agree"] else "NO", vs]


def phase_lines(r: dict) -> list[str]:
    """One line per phase of a row: seconds, TFLOP/s, % of DGEMM (and GB/s for one-stage sytrd)."""
    out = []
    for name, p in (r.get("phase_rates") or {}).items():
        extra = f", {p['GBps']:.0f} GB/s = {_f(p.get('pct_read_bw'), '.0f')}% of read" if "GBps" in p else ""
        rate = f"{p['tflops']:.2f} TFLOP/s = {_f(p['pct_dgemm'], '.0f')}% of DGEMM" if p["tflops"] else "time only"
        out.append(f"    {name:6s} {p['seconds']:9.4f} s  {rate}{extra}")
    return out


def format_table(rows: list, mpi: bool = False) -> str:
    cols, cells = (MPI_COLUMNS, mpi_cells) if mpi else (COLUMNS, row_cells)
    lines = [table_line(cols), table_line(["---"] * len(cols))]
    return "\n".join(lines + [table_line(cells(r)) for r in rows])


def format_phases(rows: list) -> str:
    """A markdown table: one line per (row, phase)."""
    lines = [table_line(("n", "problem", "what", "phase", "seconds", "TFLOP/s", "% of DGEMM", "GB/s", "% of read")),
             table_line(["---"] * 9)]
    for r in rows:
        for name, p in (r.get("phase_rates") or {}).items():
            lines.append(table_line((r["n"], r["problem"], r["what"], name, _f(p["seconds"], ".4g"),
                                     _f(p["tflops"], ".3g"), _f(p["pct_dgemm"], ".1f"), _f(p.get("GBps"), ".0f"),
                                     _f(p.get("pct_read_bw"), ".1f"))))
    return "\n".join(lines)


def format_sol(sol: dict) -> str:
    parts = [f"DGEMM n={d['n']}: {d['tflops']:.2f} TFLOP/s" for d in sol.get("dgemm", [])]
    if sol.get("copy_GBps"):
        parts.append(f"copy {sol['copy_GBps']:.0f} GB/s (read + write), read {sol['read_GBps']:.0f} GB/s "
                     f"({sol['bytes'] / GIB:.2g} GiB arrays)")
    return "speed of light: " + "; ".join(parts) if parts else "speed of light: not measured"


def report_md(res: dict) -> str:
    m = res["machine"]
    where = (f"{m.get('gpu')}; CuPy {m.get('cupy')}, CUDA runtime {m.get('cuda_runtime')}, cuSOLVER "
             f"{m.get('cusolver')}" if res["mode"] == "gpu" else f"{m.get('cpu')} (NumPy; dsygvd: scipy.linalg.eigh)")
    head = [f"# eigensolver against cuSOLVER, P = {res['ranks']}", "",
            f"{where}; commit {res['commit']}; {res['date']}", "", format_sol(res.get("sol", {})),
            "", LEGEND_MPI if res["ranks"] > 1 else LEGEND, "", format_table(res["rows"], res["ranks"] > 1)]
    if res["ranks"] == 1:
        head += ["", "Phases:", "", format_phases(res["rows"])]
    if res["skipped"]:
        head += ["", "Skipped: " + "; ".join(res["skipped"])]
    return "\n".join(head) + "\n"


def write_outputs(res: dict, out: str, stem: str) -> None:
    """stem.json and stem.md in out, each replaced whole (a kill leaves the last complete pair)."""
    for ext, text in ((".json", json.dumps(res, indent=1, default=float)), (".md", report_md(res))):
        path = os.path.join(out, stem + ext)
        with open(path + ".tmp", "w") as fh:
            fh.write(text)
        os.replace(path + ".tmp", path)


# -- the device ------------------------------------------------------------------------------
class Device:
    """The array module and the few device facts the benchmark reads (no-ops on the host)."""

    def __init__(self, host: bool):
        if host:
            self.xp = np
        else:
            import cupy

            self.xp = cupy
        self.gpu = not host

    def sync(self) -> None:
        """Wait for all of this process's device work (the solver's own streams included)."""
        if self.gpu:
            self.xp.cuda.runtime.deviceSynchronize()

    def pool_reset(self) -> None:
        if self.gpu:
            self.sync()
            self.xp.get_default_memory_pool().free_all_blocks()

    def pool(self) -> tuple[int, int] | tuple[None, None]:
        """(bytes in use, bytes reserved) of CuPy's default pool."""
        if not self.gpu:
            return None, None
        p = self.xp.get_default_memory_pool()
        return int(p.used_bytes()), int(p.total_bytes())

    def free_bytes(self) -> int | None:
        return int(self.xp.cuda.runtime.memGetInfo()[0]) if self.gpu else None

    def host(self, a) -> np.ndarray:
        return a if isinstance(a, np.ndarray) else a.get()


class PhaseClock:
    """A hpccoll_eigensolver.linalg.timer.Timer: each phase between two device syncs."""

    def __init__(self, dev: Device):
        self.dev, self.seconds = dev, {}

    @contextlib.contextmanager
    def phase(self, name: str):
        self.dev.sync()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.dev.sync()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0


def speed_of_light(dev: Device, sizes, gib: float, reps: int = 3) -> dict:
    """The DGEMM rate (best of reps after one warm-up, per n) and the memory bandwidth: a
    device-to-device copy (read + write bytes) and a read-only sum of one array by row sums (best of 5)."""
    xp, out = dev.xp, {"dgemm": []}

    def best(fn, k):
        fn()
        dev.sync()
        ts = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            dev.sync()
            ts.append(time.perf_counter() - t0)
        return min(ts)

    for n in sizes:
        a = (np.random.default_rng(n) if xp is np else xp.random.RandomState(n)).standard_normal((n, n))
        b, c = a.T.copy(), xp.empty_like(a)
        s = best(lambda a=a, b=b, c=c: xp.matmul(a, b, out=c), reps)
        out["dgemm"].append({"n": n, "seconds": s, "tflops": 2.0 * n**3 / s / 1e12})
        a = b = c = None
    nbytes = int(gib * GIB) // 8 * 8
    src = xp.ones(nbytes // 8)
    dst = xp.empty_like(src)
    copy = (lambda: dst.data.copy_from_device_async(src.data, nbytes)) if dev.gpu else (lambda: np.copyto(dst, src))
    # read: the array summed as `rows` row sums (one CUDA block each: every byte read once,
    # 8 rows bytes written), then those; a sum to one scalar without CuPy's CUB accelerator runs
    # in one block, and a 1-D dot product as a 1 x 1 GEMM, both far below bandwidth
    rows = next(r for r in (4096, 2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1) if src.size % r == 0)
    out.update(bytes=nbytes, copy_GBps=2 * nbytes / best(copy, 5) / 1e9,
               read_GBps=nbytes / best(lambda: float(src.reshape(rows, -1).sum(axis=1).sum()), 5) / 1e9)
    out["dgemm_tflops"] = max(d["tflops"] for d in out["dgemm"]) if out["dgemm"] else None
    dev.pool_reset()
    return out


# -- the run's facts ---------------------------------------------------------------------------
def two_stage_band(nb: int) -> tuple[int, str]:
    """The half-bandwidth b of the two-stage flop model, and where it came from."""
    try:
        from hpccoll_eigensolver.linalg.twostage import band_width

        return band_width(nb), "hpccoll_eigensolver.linalg.twostage.band_width(nb)"
    except Exception:  # noqa: BLE001 - the model only: the library's rule as it was written
        return max(d for d in range(1, min(nb, 64) + 1) if nb % d == 0), "the largest divisor of nb <= 64"


def machine(dev: Device) -> dict:
    """hpccoll_eigensolver's machine record, with the GPU's properties, cuSOLVER's version, nvidia-smi
    and the environment variables that steer CUDA libraries."""
    import subprocess

    from hpccoll_eigensolver.runinfo import machine_info

    info = machine_info(dev.xp)
    if dev.gpu:
        props = dev.xp.cuda.runtime.getDeviceProperties(dev.xp.cuda.Device().id)
        info["device_properties"] = {k: int(props[k]) for k in ("multiProcessorCount", "totalGlobalMem", "major",
                                                                  "minor", "clockRate", "memoryClockRate",
                                                                  "memoryBusWidth") if k in props}
        from cusolver_direct import cusolver_version

        info["cusolver"] = cusolver_version()
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit",
                 "--format=csv,noheader"], capture_output=True, text=True, timeout=20, check=False).stdout.strip()
        except (OSError, subprocess.SubprocessError) as exc:
            info["nvidia_smi"] = f"unavailable: {exc}"
    info["env"] = {k: v for k, v in sorted(os.environ.items())
                   if k.startswith(("CUBLAS_", "CUPY_", "CUDA_", "NCCL_", "OMP_", "OPENBLAS_", "HPCCOLL_"))}
    return info


# -- problems and accuracy ---------------------------------------------------------------------
def build_problem(dev: Device, kind: str, n: int, seed: int, cond_b: float):
    """(A, B, known eigenvalues or None), Fortran order on the device."""
    xp = dev.xp
    if kind == "known":
        from hpccoll_eigensolver.problems import make_problem

        p = make_problem("known", n, cond_b=cond_b, seed=seed, xp=xp)
        return xp.asfortranarray(p.A), xp.asfortranarray(p.B), dev.host(p.eigenvalues)
    rs = np.random.default_rng(seed) if not dev.gpu else xp.random.RandomState(seed)
    G = rs.standard_normal((n, n))
    A = G + G.T              # exactly symmetric (a sum commutes), so A.T is A in Fortran order
    A *= 0.5
    del G
    Q = xp.linalg.qr(rs.standard_normal((n, n)))[0]
    B = (Q * xp.asarray(np.logspace(0.0, math.log10(cond_b), n))) @ Q.T
    del Q
    B = B + B.T
    B *= 0.5
    return xp.asfortranarray(A.T), xp.asfortranarray(B.T), None


def fingerprint(dev: Device, A, B) -> str:
    """SHA-256 of every 7th row and column of A and B: the same builder's bits on another run."""
    h = hashlib.sha256()
    for M in (A, B):
        h.update(np.ascontiguousarray(dev.host(M[::7, ::7])).tobytes())
    return h.hexdigest()


def accuracy(xp, A, B, X, w, block: int = 1024) -> dict:
    """residual ||A X - B X diag(w)||_F / (n ||A||_F ||X||_F eps) and B-orthogonality
    ||X^T B X - I||_F / (k eps), as hpccoll_eigensolver.metrics defines them, by column blocks
    of X (a few n x block temporaries; no n x n one)."""
    n, k = X.shape
    r2 = g2 = a2 = x2 = 0.0
    for j in range(0, n, block):
        a2 += float((A[:, j:j + block] ** 2).sum())
    for j in range(0, k, block):
        Xb = X[:, j:j + block]
        BX = B @ Xb
        R = A @ Xb - BX * w[j:j + block][None, :]
        r2 += float((R * R).sum())
        G = X.T @ BX
        G[xp.arange(j, j + Xb.shape[1]), xp.arange(Xb.shape[1])] -= 1.0
        g2 += float((G * G).sum())
        x2 += float((Xb * Xb).sum())
    den = n * math.sqrt(a2) * math.sqrt(x2) * EPS
    return {"residual": math.sqrt(r2) / den if den else None, "b_orthogonality": math.sqrt(g2) / (k * EPS)}


def rel_error(w, ref) -> float | None:
    """max |w - ref| / max |ref| (hpccoll_eigensolver.metrics.EIGENVALUE_ERROR_DEFINITION)."""
    if ref is None:
        return None
    w, ref = np.asarray(w, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    return float(np.max(np.abs(w - ref)) / (np.max(np.abs(ref)) or 1.0))


def sha(dev: Device, w) -> str:
    return hashlib.sha256(np.ascontiguousarray(dev.host(w), dtype=np.float64).tobytes()).hexdigest()
