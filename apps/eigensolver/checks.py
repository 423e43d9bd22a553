"""Input checks before a solve, on every rank, with one verdict for all of them.

check_input(A_loc, B_loc, desc, mpi_comm) looks at this rank's columns (finite, real, B's
diagonal positive) and at the pairs of transposed tiles (tiles.asymmetry: symmetric within
`sym_tol`), then combines the findings of all ranks with one allgather: every rank raises the
same InputError (or none), so no rank enters the solver while another has left.  That B is
positive definite is decided by the solver's Cholesky factorization, which fails on every
rank alike (solver.NotPositiveDefinite); the positive diagonal checked here is the cheap
necessary condition that names the offending entry."""
from __future__ import annotations

import numpy as np

from .linalg import driver
from .linalg._xp import get_xp, to_host

#: default symmetry tolerance: max|M - M^T| <= SYM_TOL * max|M| (relative to the largest entry)
SYM_TOL = 1e-10


InputError = driver.InputError  # (the solver's: A, B or an argument it must not be given)


def _first_bad(mask_host: np.ndarray, cols: np.ndarray) -> tuple[int, int] | None:
    idx = np.argwhere(mask_host)
    if idx.size == 0:
        return None
    i, k = idx[0]
    return int(i), int(cols[k])


#: columns looked at a time (bounds the temporaries of a check to ~CHUNK_BYTES)
CHUNK_BYTES = 64 * 2**20


def _blocks(M):
    step = max(1, CHUNK_BYTES // max(1, 8 * M.shape[0]))
    for k in range(0, M.shape[1], step):
        yield k, M[:, k:k + step]


def _local_findings(name: str, M, cols: np.ndarray, xp) -> list[str]:
    if M.dtype.kind == "c":
        return [f"{name} is complex ({M.dtype}): the solver takes real symmetric matrices"]
    if M.dtype.kind not in "biuf":
        return [f"{name} has dtype {M.dtype}: use float64"]
    for k, blk in _blocks(M):
        finite = xp.isfinite(blk)
        if not bool(finite.all()):
            i, j = _first_bad(to_host(~finite), cols[k:])
            value = float(M[i, int(np.searchsorted(cols, j))])
            return [f"{name}[{i}, {j}] = {value}: {name} must be finite (no NaN or Inf)"]
    return []


def _max_abs(M, xp) -> float:
    return max((float(abs(blk).max()) for _, blk in _blocks(M) if blk.size), default=0.0)


def check_input(A_loc, B_loc, desc, mpi_comm, *, sym_tol: float = SYM_TOL, check_symmetry: bool = True) -> dict:
    """Raise InputError on every rank when A or B is unusable; return what was measured
    ({'asymmetry_A': max|A - A^T| / max|A|, 'asymmetry_B': ...}, None where not checked).

    Collective over mpi_comm.  check_symmetry=False skips the tile exchange (for matrices that
    are symmetric by construction, e.g. the generated problems after problems.symmetrize)."""
    from mpi4py import MPI

    from .tiles import asymmetry

    xp = get_xp(A_loc, B_loc)
    rank = mpi_comm.Get_rank()
    cols = desc.local_cols(rank)
    findings = _local_findings("A", A_loc, cols, xp) + _local_findings("B", B_loc, cols, xp)
    if not findings and cols.size:
        diag = to_host(B_loc[xp.asarray(cols), xp.arange(cols.size)])
        bad = np.flatnonzero(~(diag > 0))
        if bad.size:
            j = int(cols[bad[0]])
            findings.append(f"B[{j}, {j}] = {diag[bad[0]]:g} <= 0: B must be positive definite "
                            "(its diagonal must be positive)")
    everyone = mpi_comm.allgather(findings)
    problems = [f for per_rank in everyone for f in per_rank]
    if problems:   # the first in rank order names the entry; the count says there is more
        more = len(problems) - 1
        raise InputError(problems[0] + (f" (and {more} more finding{'s' if more > 1 else ''} on other "
                                        "columns)" if more else ""))
    measured = {"asymmetry_A": None, "asymmetry_B": None, "symmetry_tolerance": sym_tol}
    if not check_symmetry:
        return measured
    for name, M in (("A", A_loc), ("B", B_loc)):
        scale = mpi_comm.allreduce(_max_abs(M, xp), op=MPI.MAX)
        worst = asymmetry(M, desc, mpi_comm)
        rel = worst / scale if scale else 0.0
        measured[f"asymmetry_{name}"] = rel
        if rel > sym_tol:
            raise InputError(f"{name} is not symmetric: max|{name} - {name}^T| = {worst:.3g} is "
                             f"{rel:.3g} x max|{name}| > the tolerance {sym_tol:g} (--symmetry-tol); "
                             f"symmetrize it, e.g. ({name} + {name}.T) / 2")
    return measured
