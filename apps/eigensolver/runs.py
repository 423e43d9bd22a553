"""What one eigensolver run writes and checks: result names (a stem given with --name, else
digests of the problem and the options), refusal to overwrite, the output directory's check,
the run's JSON, eigenvalues and eigenvectors, its printed line, the problem's columns on each
rank, and the helpers that make every rank agree before it raises (so an error on one rank is an
error on every rank).  Shared by the commands (solve.py) and the reference solvers (anchors.py,
cusolvermp.py).

Per run r of a stem STEM, in the output directory: STEM_runRRR.json (the record),
STEM_runRRR_w.npy (the eigenvalues, 1-D float64 ascending) and, unless vectors are off,
STEM_runRRR_X.npy (n x n float64, Fortran order, column j the B-normalized eigenvector of w[j];
n x k with a subset of k eigenpairs).  With --scf K, solve j of run r writes the same three
files under the stem STEM_runRRR_sJJJ."""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import time

import numpy as np

from .runinfo import DEVICE_PEAK_KEYS

PROG = "hpccoll-eigensolver"
SCIPY_REFERENCE_MAX_N = 4096
RUN_SCHEMA = "hpccoll-eigensolver/run/2"
FAILURE_SCHEMA = "hpccoll-eigensolver/failure/2"
#: where solve writes its results without --out (relative to the working directory)
DEFAULT_OUT = "hpccoll-eigensolver-runs"
EXIT_ERROR = 2   # arguments, input or output directory rejected (argparse's status too)
EXIT_FAILED = 1  # a solve that ran and failed (NaN or Inf in its result), or a failed compare configuration
#: --scf's perturbation of A, relative to max|A|, unless --scf-step is given
DEFAULT_SCF_STEP = 1e-3

class CliError(Exception):
    """An error every rank (or the driver) sees alike: printed once, exit status `code`."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


def check_out_dir(path: str) -> None:
    """Create `path` if missing and prove it writable (a file created and removed there); raise
    CliError naming the problem."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"--out {path}: exists and is not a directory: pass a directory")
    try:
        os.makedirs(path, exist_ok=True)
        probe = os.path.join(path, f".hpccoll-write-test-{os.getpid()}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise CliError(f"--out {path}: cannot write there ({exc.strerror or exc}): pass a writable directory") \
            from None


def problem_tag(problem: str) -> str:
    return "file" if problem.startswith("file:") else problem


def config_identity(args, problem_digest: str, ranks: int, comm: str, device: str) -> dict:
    """The options that make a run's bits, besides the machine: they name its files."""
    identity = {"problem_digest": problem_digest, "n": args.n, "nb": args.nb, "ranks": ranks, "comm": comm,
                "stedc": getattr(args, "stedc", None), "device": device}
    if getattr(args, "reduction", "auto") == "two-stage":   # (one-stage: the digests runs had before)
        identity["reduction"] = "two-stage"
    if getattr(args, "subset", None) is not None:           # (all eigenpairs: the digests runs had before)
        identity["subset"] = list(args.subset)
    return identity


def config_digest(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


#: the characters of a --name stem (it becomes part of file names)
STEM_CHARS = re.compile(r"[A-Za-z0-9._-]+")
#: what each run writes, after its stem STEM_runRRR
RESULT_SUFFIXES = ("_w.npy", "_X.npy", ".json")


def check_stem(text: str) -> str:
    """A --name stem: letters, digits, '.', '_' and '-'; ValueError otherwise."""
    if not STEM_CHARS.fullmatch(text) or text in (".", ".."):
        raise ValueError(f"{text!r}: use letters, digits, '.', '_' and '-' only (it names the files "
                         "STEM_runRRR.json, STEM_runRRR_w.npy and STEM_runRRR_X.npy)")
    return text


def base_stem(args, n: int, ranks: int, comm: str, digest: str) -> str:
    """--name, else {problem}_n{n}_p{ranks}_{comm}_{the configuration digest's first 10 hex digits}."""
    return getattr(args, "name", None) or f"{problem_tag(args.problem)}_n{n}_p{ranks}_{comm}_{digest[:10]}"


def run_stem(args, n: int, ranks: int, comm: str, r: int, digest: str, solve: int | None = None) -> str:
    """The stem of run r's files: base_stem + _runRRR; of its solve j with --scf: + _sJJJ."""
    stem = f"{base_stem(args, n, ranks, comm, digest)}_run{r:03d}"
    return stem if solve is None else f"{stem}_s{solve:03d}"


def refuse_overwrite(out: str | None, stems: list[str], overwrite: bool) -> None:
    """CliError when a result of these stems exists in out and overwrite is off."""
    if not out or overwrite:
        return
    for stem in stems:
        for name in (stem + suffix for suffix in RESULT_SUFFIXES):
            if os.path.exists(os.path.join(out, name)):
                raise CliError(f"--out {out}: {name} exists (a result of the same problem and options): "
                               "pass --overwrite to replace it, or another --out")


def save_vectors(args) -> bool:
    """Whether runs write STEM_runRRR_X.npy: an output directory, --save-vectors yes (the default)
    and eigenvectors computed (no --eigvals-only)."""
    return bool(args.out) and args.save_vectors != "no" and not getattr(args, "eigvals_only", False)


def progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on rank 0 when stderr is a terminal, else None."""
    if not (enabled and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr)


METRICS_LEGEND = ("metrics: residual = ||AX - BXW||_F/(n ||A||_F ||X||_F eps) and B-orth = ||X^T B X - I||_F/(n eps), "
                  "both in units of n eps (O(1) is a correct solve); eig-err = max|w - ref|/max|ref| against the "
                  "constructed spectrum (known) and scipy.linalg.eigh (scipy); memory = peak RSS (host) or CuPy "
                  "pool high-water mark of the solve (GPU), max over ranks")


def _fmt(x, spec=".3g"):
    return "-" if x is None else format(x, spec)


def _gc_text(rec: dict) -> str:
    """The slowest rank's garbage-collector pauses in the solve: 'N ms (C full)', '-' if not recorded."""
    ranks = (rec.get("host_gc") or {}).get("per_rank") or []
    if not ranks:
        return "-"
    worst = max(ranks, key=lambda g: sum(g["seconds"]))
    return f"{1e3 * sum(worst['seconds']):.1f} ms ({worst['collections'][2]} full)"


def print_run(rec: dict) -> None:
    ph = " ".join(f"{k} {v:.3f}" for k, v in rec["phases"].items())
    coll = rec.get("collectives") or {}
    mem = (rec.get("memory") or {}).get("per_rank") or []
    keys = DEVICE_PEAK_KEYS if rec.get("device") == "gpu" else ("peak_rss_bytes",)
    peaks = [next((m[k] for k in keys if m.get(k) is not None), None) for m in mem]
    peaks = [p for p in peaks if p is not None]
    subset, scf = rec.get("subset"), rec.get("scf")
    what = (f" solve {scf['index']}" if scf else "") + (f" subset {subset[0]}:{subset[1]}" if subset else "")
    print(f"[{rec['comm']} {rec['ranks']}r run {rec['repeat_index']}{what}] n={rec['n']} "
          f"solve {rec['solve_seconds']:.3f}s "
          f"({ph}); collectives {coll.get('count', 0)} calls {coll.get('bytes', 0) / 2**20:.1f} MiB "
          f"{100 * (coll.get('share_of_solve') or 0):.1f}% of time; residual {_fmt(rec['residual'])} n·eps "
          f"B-orth {_fmt(rec['b_orthogonality'])} n·eps eig-err(known) {_fmt(rec.get('eigenvalue_error'))} "
          f"eig-err(scipy) {_fmt(rec.get('eigenvalue_error_vs_scipy'))}; memory "
          f"{_fmt(max(peaks) / 2**20 if peaks else None, '.0f')} MiB; gc {_gc_text(rec)}; w {rec['eigenvalues_sha256'][:16]} "
          f"X {(rec.get('eigenvectors_sha256') or '-')[:16]}", flush=True)


# -- collective error handling (under MPI) -----------------------------------------------------------
def agree(ctl, fn, what: str, everywhere: bool = True):
    """Run fn() on this rank; if it raised on any rank, raise CliError on every rank (one message,
    naming the ranks when only some failed; everywhere=False: fn does work on rank 0 only, the
    ranks go unnamed) - for local work that other ranks must not wait past."""
    try:
        value, err = fn(), None
    except CliError as exc:
        value, err = None, str(exc)
    except Exception as exc:  # noqa: BLE001 - forwarded to every rank
        value, err = None, f"{type(exc).__name__}: {exc}"
    errs = ctl.allgather(err)
    failed = [(r, e) for r, e in enumerate(errs) if e]
    if failed:
        msgs = list(dict.fromkeys(e for _, e in failed))
        where = "" if len(failed) == len(errs) or not everywhere else f" (on rank{'s' if len(failed) > 1 else ''} " \
            f"{', '.join(str(r) for r, _ in failed)})"
        raise CliError(f"{what}{where}: {'; '.join(msgs)}")
    return value


def fail_together(ctl, message: str, timeout: float = 30.0):
    """Called by a rank that failed where the others may be inside a collective of the library:
    if every rank fails alike within `timeout`, raise CliError everywhere (printed once);
    otherwise print this rank's error and abort the job."""
    from mpi4py import MPI

    one = np.ones(1, dtype=np.int32)
    total = np.zeros(1, dtype=np.int32)
    req = ctl.Iallreduce(one, total, op=MPI.SUM)
    t0 = time.monotonic()
    while not req.Test():
        if time.monotonic() - t0 > timeout:
            sys.stderr.write(f"{PROG}: rank {ctl.Get_rank()}: {message}\n{PROG}: the other ranks did not fail "
                             "alike; aborting the job\n")
            sys.stderr.flush()
            MPI.COMM_WORLD.Abort(EXIT_ERROR)
        time.sleep(0.01)
    raise CliError(message)


# -- X on disk, by columns ---------------------------------------------------------------------------
def _npy_create(path: str, m: int, n: int) -> int:
    """An m x n float64 Fortran-order .npy of zeros' size (sparse); returns the data offset."""
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f8", "fortran_order": True, "shape": (m, n)})
        offset = f.tell()
        f.truncate(offset + 8 * m * n)
    return offset


def write_vectors(path: str, X_loc, desc, ctl, gather_to_root: bool = False) -> None:
    """X, an m x n matrix in desc's layout (n x n; n x k for a subset of k eigenpairs), as a
    float64 .npy (Fortran order) at path, never whole in one process's memory.

    By default every rank writes its own columns into the file rank 0 created (the directory
    must be shared); gather_to_root: the columns travel to rank 0 block by block and it writes
    them.  Written under a temporary name and renamed when complete.  Collective over ctl."""
    from .linalg._xp import to_host
    from .problems import _runs

    rank, size, m = ctl.Get_rank(), ctl.Get_size(), desc.m
    tmp = f"{path}.part"
    offset = agree(ctl, lambda: _npy_create(tmp, m, desc.n) if rank == 0 else None, f"writing {path}", False)
    offset = ctl.bcast(offset, root=0)

    def put(fd, cols, block):
        for pos, c0, length in _runs(cols):
            data = np.asfortranarray(block[:, pos:pos + length], dtype="<f8").tobytes(order="F")
            os.pwrite(fd, data, offset + 8 * m * c0)

    step = max(1, (32 * 2**20) // (8 * max(1, m)))

    def mine():
        cols = desc.local_cols(rank)
        fd = os.open(tmp, os.O_WRONLY)
        try:
            for k in range(0, cols.size, step):
                put(fd, cols[k:k + step], to_host(X_loc[:, k:k + step]))
        finally:
            os.close(fd)

    def gathered():
        fd = os.open(tmp, os.O_WRONLY) if rank == 0 else None
        try:
            for q in range(size):
                cols = desc.local_cols(q)
                for k in range(0, cols.size, step):
                    c = min(step, cols.size - k)
                    if q == rank == 0:
                        put(fd, cols[k:k + c], to_host(X_loc[:, k:k + c]))
                    elif rank == q:
                        ctl.Send(np.asfortranarray(to_host(X_loc[:, k:k + c])), dest=0, tag=29)
                    elif rank == 0:
                        buf = np.empty((m, c), order="F")
                        ctl.Recv(buf, source=q, tag=29)
                        put(fd, cols[k:k + c], buf)
        finally:
            if fd is not None:
                os.close(fd)

    if gather_to_root:
        gathered()  # point-to-point in a fixed order: a failure on one rank aborts the job
        agree(ctl, lambda: None, f"writing {path}")
    else:
        agree(ctl, mine, f"writing {path} (every rank writes its columns: put --out on a filesystem all "
                         "ranks share, or pass --gather-vectors)")
    agree(ctl, lambda: os.replace(tmp, path) if rank == 0 else None, f"writing {path}", False)


def write_eigenvalues(out: str, stem: str, w) -> str:
    """w as STEM_w.npy (1-D float64), written under a temporary name and renamed; returns its path."""
    from .linalg._xp import to_host

    path = os.path.join(out, stem + "_w.npy")
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        np.save(f, np.ascontiguousarray(to_host(w), dtype=np.float64))
    os.replace(tmp, path)
    return path


def write_json(out: str, stem: str, record: dict) -> str:
    path = os.path.join(out, stem + ".json")
    tmp = path + ".part"
    with open(tmp, "w") as f:
        json.dump(record, f, indent=1)
    os.replace(tmp, path)
    return path


# -- solve ------------------------------------------------------------------------------------------
def reference_eigenvalues(A, B):
    """(scipy.linalg.eigh(A, B) eigenvalues, seconds, error text) on the host."""
    from scipy.linalg import eigh

    t0 = time.perf_counter()
    try:
        w = eigh(A, B, eigvals_only=True)
    except Exception as exc:  # noqa: BLE001 - recorded, not fatal: the solve's own checks decide
        return None, time.perf_counter() - t0, f"{type(exc).__name__}: {exc}"
    return w, time.perf_counter() - t0, None


def reference_on_root(args, A_loc, B_loc, desc, ctl):
    """(eigenvalues, seconds, error text) of scipy's eigh(A, B) on rank 0, the problem gathered
    there for it (collective); (None, None, None) elsewhere, with --no-reference, or above
    SCIPY_REFERENCE_MAX_N."""
    if args.no_reference or desc.n > SCIPY_REFERENCE_MAX_N:
        return None, None, None
    from .problems import gather_problem_on_root

    Ag, Bg = gather_problem_on_root(A_loc, B_loc, desc, ctl)
    return reference_eigenvalues(Ag, Bg) if ctl.Get_rank() == 0 else (None, None, None)


def in_column_order(desc, per_rank) -> list:
    """One list over the n columns from each rank's list over its own columns (rank 0's gather)."""
    out = [None] * desc.n
    for q, items in enumerate(per_rank):
        for j, item in zip(desc.local_cols(q), items):
            out[j] = item
    return out


def rank_records(gathered) -> tuple[list, list]:
    """(per-rank digests, per-rank memory) of the run records, from rank 0's gather of
    (eigenvalue digest, eigenvector digest, column digests, memory) per rank."""
    per_rank = [{"rank": i, "eigenvalues_sha256": g[0], "local_eigenvectors_sha256": g[1]}
                for i, g in enumerate(gathered)]
    return per_rank, [dict(rank=i, **g[3]) for i, g in enumerate(gathered)]


def build_local_problem(spec, desc, ctl, xp):
    """This rank's (A_loc, B_loc, per-column digests or None): local work agreed on, then the
    collective symmetrization of generated problems."""
    from .problems import generated_columns, read_columns
    from .tiles import symmetrize

    rank = ctl.Get_rank()
    cols = desc.local_cols(rank)

    def local():
        if spec.kind == "file":
            dA, dB = [], []
            A = read_columns(spec.files[0], cols, xp, spec.file_info[0], dA)
            B = read_columns(spec.files[1], cols, xp, spec.file_info[1], dB)
            return A, B, (dA, dB)
        A, B = generated_columns(spec, cols, xp)
        return A, B, None

    what = "file:" + ",".join(spec.files) if spec.kind == "file" else spec.kind
    A, B, digests = agree(ctl, local, f"--problem {what}")
    if spec.kind != "file":
        symmetrize(A, desc, ctl)
        symmetrize(B, desc, ctl)
    return A, B, digests


def _content_digest(ctl, desc, local_digests):
    """SHA-256 over A's and then B's column digests in column order (rank 0; None elsewhere)."""
    from . import metrics

    everyone = ctl.gather(local_digests, root=0)
    if ctl.Get_rank() != 0:
        return None
    return metrics.combine_digests([*in_column_order(desc, [per[0] for per in everyone]),
                                    *in_column_order(desc, [per[1] for per in everyone])])


def _visible(out: str) -> None:
    if not os.path.isdir(out):
        raise CliError(f"--out {out} is not visible here: put it on a filesystem all ranks share, or pass "
                       "--gather-vectors")
