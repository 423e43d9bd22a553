"""Distributed generalized symmetric-definite eigensolver A x = lambda B x (sygvd), float64.

Layout: 1-D column block-cyclic (layout.BlockCyclic); a local block holds full columns.  Every
phase works on that layout: no rank holds an n x n matrix at any time (docs/eigensolver.md has
the memory model).  Steps and their collectives (P ranks, n columns, block nb):

  potrf   Cholesky B = L L^T, right-looking; L stays distributed like B (potrf.py).
          One Bcast per panel (n / nb).  On one GPU rank potrf and trsm are single in-place
          cuSOLVER / cuBLAS calls on the whole matrix, and sygst steps through wider panels
          (potrf.panel_desc: every column is local, the layout is the same).
  sygst   C = L^-1 A L^-T by LAPACK's blocked algorithm, C's lower triangle only: one Bcast per
          panel for the symmetric trailing updates, then one per panel of L for the deferred
          forward substitution (sygst.py).
  sytrd   Householder tridiagonalization, LAPACK latrd style: per column one Bcast of
          [v, d_j, tau, e_j] from the owner and one Allreduce of the partial products C v (from
          the lower triangle; rows j+1.. from an even row, so device buffers stay 16-byte
          aligned).  The reflectors are kept where the reduced columns were (sytrd.py).
          On the GPU the column step is device kernels with the column index in device
          memory, one CUDA graph per panel (sytrd_device.py; fixed-size collectives).
          reduction="two-stage" instead: dense -> band by blocked Householder (one Bcast and one
          Allreduce per panel of b columns), band -> tridiagonal by bulge chasing on rank 0
          (twostage.py; its ormtr applies Q2's reflectors by groups, then Q1's).
  stedc   tridiagonal eigensolver.  "dc" (the default): divide and conquer over the ranks,
          each computing a block of rows of the eigenvectors (stedc/: per tree level
          one Allreduce and one Allgather of O(n) numbers), then one Alltoallv delivers them by
          columns.  "host" (LAPACK dstevd) or "gpu" (cuSOLVER syevd of the dense tridiagonal):
          on rank 0, which then holds n x n eigenvectors for a moment; one Bcast of w and one
          Alltoallv deal the columns.
  ormtr   back-transformation Q Z with compact-WY blocks; one Bcast per panel of reflectors
          (ormtr.py).
  trsm    X = L^-T (Q Z), backward substitution; one Bcast per panel of L (potrf.py).

Before potrf one Allgather of a fixed-size record per rank (the arguments, checked alike on
every rank, and the largest |A| and |B|, from which A and B are scaled by powers of two:
scaling.py); after trsm one Allgather of a flag per rank (its X finite).

Scalars stay in arrays (no per-column host sync); on GPU the host syncs are the phase
boundaries (where the timer syncs, as the app's PhaseTimer does), the positive-definiteness check after potrf, the divide and conquer's per-level
decisions (deflation: a scan of k numbers on the host) and (if the counting proxy is asked to)
one around each collective."""
from __future__ import annotations

import warnings

import numpy as np

from . import scaling
from ._xp import get_xp, is_device, sync, to_host
from .layout import BlockCyclic, column_order, rows_to_columns
from .ormtr import ormtr
from .potrf import NotPositiveDefinite, back_transform, panel_desc, potrf
from .stedc import Early, tridiagonal_eigh, tridiagonal_matrix
from .sygst import sygst, sygst_desc
from .sytrd import sytrd as householder_sytrd
from .sytrd_device import MODES
from .timer import NoTimer, Timer
from .twostage import two_stage

PHASES = ("potrf", "sygst", "sytrd", "stedc", "ormtr", "trsm")
STEDC_CHOICES = ("auto", "dc", "host", "gpu")
REDUCTION_CHOICES = ("auto", "one-stage", "two-stage")
SYTRD_CHOICES = MODES  # sytrd_device.py (imports without CuPy)


class InputError(ValueError):
    """sygvd's arguments are wrong on some rank or differ between ranks (raised on every rank
    alike, naming the rank)."""


class NonFiniteResult(ArithmeticError):
    """The solve produced NaN or Inf in w or X (inputs that pass the checks should not; an
    eigenvalue beyond the float64 range does): raised on every rank alike, nothing returned."""


def sygvd(A_local, B_local, desc: BlockCyclic, comm, *, eigvals_only: bool | None = None,
          timer: Timer | None = None, stedc: str = "auto", sytrd: str = "auto", eigvecs: bool | None = None,
          reduction: str = "auto"):
    """Eigenvalues w (ascending, replicated on every rank) and local columns of X with
    A X = B X diag(w), X^T B X = I, for block-cyclic A_local, B_local (numpy or cupy).

    Returns (w, X_local); (w, None) with eigvals_only=True (scipy.linalg.eigh's keyword; None
    means False), which computes no tridiagonal eigenvectors and no back-transformation.
    eigvecs: the older name, eigvecs=False meaning eigvals_only=True (a DeprecationWarning;
    both given: TypeError).  A_local and B_local are not
    modified.  `comm` is an hpccoll Communicator (or anything with its buffer methods).
    stedc: the tridiagonal eigensolver, "dc" (divide and conquer over the ranks on the arrays'
    device; "auto" means it), "host" (LAPACK dstevd on rank 0) or "gpu" (cuSOLVER on rank 0's
    GPU; device arrays only); "host" and "gpu" hold n x n eigenvectors on rank 0 for a moment.
    sytrd: how the GPU runs the tridiagonalization's column step, "auto" (fused transfers
    on hpccoll's deterministic sentinel communicator up to sytrd_device.FUSED_MAX_N, else
    collectives replayed in CUDA graphs), "fused", "graph", "eager" or "ops" (CuPy operations);
    the host always runs the array operations.
    reduction: the tridiagonalization, "one-stage" (sytrd; "auto" means it) or "two-stage"
    (dense -> band -> tridiagonal, twostage.py; sytrd= does not apply to it).

    A and B are scaled by powers of two into a safe range first and the results scaled back
    (scaling.py), so any magnitudes whose eigenvalues fit float64 solve alike.  Errors are
    raised on every rank alike: InputError (a ValueError) for arrays or arguments that
    differ from the descriptor or between ranks, or A or B not finite; NotPositiveDefinite (a
    ValueError) for a B that is not numerically positive definite; NonFiniteResult (an
    ArithmeticError) where w or X would hold NaN or Inf."""
    vectors = not eigvals_only_from(eigvals_only, eigvecs, "sygvd")
    xp = get_xp(A_local, B_local)
    size = comm.Get_size()
    a_exp, b_exp = agree_inputs(A_local, B_local, desc, comm, xp, vectors, stedc, sytrd, reduction)
    where = stedc_choice(stedc, is_device(xp))
    timer = timer if timer is not None else NoTimer()
    # one rank: the divide and conquer's subtrees whose rows sytrd has finished are solved while
    # it reduces the rest (stedc.Early; on the GPU they overlap sytrd's last columns)
    early = Early(desc.n, xp) if solves_early(where, vectors, size) else None
    d, e, tau, V, L = tridiagonalize(A_local, B_local, desc, comm, xp, timer, sytrd,
                                     early.hooks if early else (), scale_exponents=(a_exp, b_exp),
                                     reduction=reduction)
    with timer.phase("stedc"):
        w, Z = _stedc(d, e, desc, comm, xp, vectors, where, early.solved if early else None)
    if b_exp != a_exp:                                 # lambda = (tau / sigma) lambda'
        w = xp.array(w, copy=True)
        scaling.scale(w, b_exp - a_exp)
    if not vectors:
        _check_finite(w, None, comm, xp, b_exp - a_exp)
        return w, None
    with timer.phase("ormtr"):
        V.apply(Z) if tau is None else ormtr(V, tau, Z, desc, comm, xp)   # tau None: two-stage's Q
    del V
    with timer.phase("trsm"):
        back_transform(Z, L, panel_desc(desc), comm, xp)
        scaling.scale(Z, b_exp // 2)                   # x = sqrt(tau) x'
        _check_finite(w, Z, comm, xp, b_exp - a_exp)
    return w, Z


def eigvals_only_from(eigvals_only: bool | None, eigvecs: bool | None, who: str) -> bool:
    """eigvals_only, also given as its older name eigvecs (eigvecs=False == eigvals_only=True):
    that name warns (DeprecationWarning), both names raise TypeError."""
    if eigvecs is None:
        return bool(eigvals_only)
    if eigvals_only is not None:
        raise TypeError(f"{who}: pass eigvals_only only (eigvecs is its older name: eigvecs=False is "
                        "eigvals_only=True)")
    warnings.warn(f"{who}: eigvecs= is deprecated: pass eigvals_only={not eigvecs}", DeprecationWarning,
                  stacklevel=3)
    return not eigvecs


#: the per-rank record agree_inputs exchanges (float64 entries)
_FIELDS = ("max_abs_A", "max_abs_B", "n", "m", "nb", "nprocs", "A_rows", "A_cols", "B_rows", "B_cols",
           "own_cols", "A_real", "B_real", "stedc", "sytrd", "eigvals_only", "reduction")


def agree_inputs(A_local, B_local, desc: BlockCyclic, comm, xp, vectors: bool, stedc: str, sytrd: str,
                 reduction: str = "auto"):
    """Check sygvd's arguments on every rank at once: one Allgather of a fixed-size record per
    rank (the descriptor, the arrays' shapes and dtypes, the options, the largest magnitudes of
    A's and B's columns), so that an argument wrong on one rank only, or differing between
    ranks, raises the same InputError on every rank instead of a mismatched collective.
    Returns the scaling exponents (a, b) of A and B (scaling.exponent; b even)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = np.full(len(_FIELDS), -1.0)
    real = [getattr(a, "dtype", np.dtype(object)).kind in "biuf" for a in (A_local, B_local)]
    for i, (a, ok) in enumerate(zip((A_local, B_local), real)):
        if ok and a.ndim == 2:
            mine[6 + 2 * i:8 + 2 * i] = a.shape
    mine[2:6] = desc.n, desc.m, desc.nb, desc.nprocs
    mine[10] = desc.local_n(rank) if rank < desc.nprocs else -1
    mine[11:13] = real
    mine[13] = STEDC_CHOICES.index(stedc) if stedc in STEDC_CHOICES else -1
    mine[14] = SYTRD_CHOICES.index(sytrd) if sytrd in SYTRD_CHOICES else -1
    mine[15] = not vectors
    mine[16] = REDUCTION_CHOICES.index(reduction) if reduction in REDUCTION_CHOICES else -1
    record = xp.asarray(mine)
    shapes_ok = all(mine[6 + 2 * i] == desc.n and mine[7 + 2 * i] == mine[10] for i in range(2))
    if shapes_ok:   # the largest magnitudes (NaN where an entry is NaN), on the device
        record[0] = scaling.max_abs(A_local, xp)
        record[1] = scaling.max_abs(B_local, xp)
    table = xp.empty((size, len(_FIELDS)), dtype=xp.float64)
    comm.Allgather(record, table)
    t = to_host(table)

    def field(name):
        return t[:, _FIELDS.index(name)]

    def fail(message):
        raise InputError(f"sygvd: {message}")

    for names, what in ((("n", "m", "nb", "nprocs"), "descriptor"), (("stedc",), "stedc"), (("sytrd",), "sytrd"),
                        (("eigvals_only",), "eigvals_only"), (("reduction",), "reduction")):
        cols = np.stack([field(k) for k in names], axis=1)
        if (cols != cols[0]).any():
            seen = "; ".join(f"rank {r}: " + ", ".join(f"{k}={_num(v)}" for k, v in zip(names, row))
                             for r, row in enumerate(cols))
            fail(f"the ranks pass different {what} values ({seen}): pass the same on every rank")
    if desc.m != desc.n:
        fail(f"the matrix must be square, the descriptor says {desc.m} x {desc.n}")
    if desc.nprocs != size:
        fail(f"the descriptor is for {desc.nprocs} ranks, the communicator has {size}")
    if sytrd not in SYTRD_CHOICES:
        fail(f"sytrd={sytrd!r}: use {', '.join(map(repr, SYTRD_CHOICES))}")
    if reduction not in REDUCTION_CHOICES:
        fail(f"reduction={reduction!r}: use {', '.join(map(repr, REDUCTION_CHOICES))}")
    stedc_choice(stedc, is_device(xp))          # the same verdict on every rank
    for r in range(size):
        for i, name in enumerate(("A_local", "B_local")):
            if not t[r, 11 + i]:
                fail(f"rank {r}: {name} is not a real array: use float64")
            shape = (_num(t[r, 6 + 2 * i]), _num(t[r, 7 + 2 * i]))
            owns = (desc.n, _num(t[r, 10]))
            if shape != owns:
                fail(f"rank {r}: {name} has shape {shape if -1 not in shape else 'not 2-D'}, rank {r} owns "
                     f"{owns} of BlockCyclic({desc.n}, {desc.n}, {desc.nb}, {desc.nprocs})")
    for i, name in enumerate("AB"):
        bad = [r for r in range(size) if not np.isfinite(t[r, i])]
        if bad:
            fail(f"{name} has NaN or Inf entries (in the columns of rank{'s' if len(bad) > 1 else ''} "
                 f"{', '.join(map(str, bad))}): {name} must be finite")
    a_max, b_max = float(field("max_abs_A").max()), float(field("max_abs_B").max())
    if not b_max > 0:
        raise NotPositiveDefinite("B is not numerically positive definite: B is zero")
    return scaling.exponent(a_max), scaling.exponent(b_max, even=True)


def _num(v: float):
    """A record entry as the int it holds (shapes, counts), else the float."""
    return int(v) if float(v).is_integer() else float(v)


def _check_finite(w, X, comm, xp, w_exp: int) -> None:
    """Raise NonFiniteResult on every rank when w (replicated) or any rank's X holds NaN or
    Inf: with X, one Allgather of a flag per rank."""
    w_ok = bool(xp.isfinite(w).all())
    x_bad = []
    if X is not None:
        flags = xp.empty(comm.Get_size(), dtype=xp.float64)
        comm.Allgather(xp.asarray([0.0 if np.isfinite(float(scaling.max_abs(X, xp))) else 1.0]), flags)
        x_bad = [r for r, f in enumerate(to_host(flags)) if f]
    if w_ok and not x_bad:
        return
    where = [] if w_ok else ["the eigenvalues"]
    if x_bad:
        where.append(f"the eigenvectors (columns of rank{'s' if len(x_bad) > 1 else ''} {', '.join(map(str, x_bad))})")
    hint = (f" (the pair was solved scaled by powers of two, its eigenvalues then multiplied by 2^{w_exp}: "
            "they lie beyond the float64 range)" if w_exp and not w_ok else "")
    raise NonFiniteResult(f"sygvd: NaN or Inf in {' and '.join(where)}{hint}; no result returned")


def tridiagonalize(A_local, B_local, desc: BlockCyclic, comm, xp, timer: Timer, sytrd: str = "auto",
                   notify=(), scale_exponents=(0, 0), reduction: str = "auto"):
    """sygvd's first three phases: potrf, sygst and sytrd on copies of A_local and B_local,
    scaled by 2^a and 2^b for scale_exponents (a, b) (scaling.py).  Returns (d, e, tau, V, L):
    T's diagonals and the reflectors' scalars (replicated), the local columns holding the
    reflectors and those of the Cholesky factor.  notify: sytrd's [(rows, fn)], fn(d, e) called
    once T's first `rows` rows are final (sytrd.sytrd).  reduction "two-stage": (d, e, None, Q,
    L) with Q a twostage.TwoStageQ (Q.apply(Z) is Q Z; notify's functions called at the end)."""
    wide = panel_desc(desc)  # the same layout; wider panels on one rank
    a_exp, b_exp = scale_exponents
    B = xp.array(B_local, dtype=xp.float64, order="F", copy=True)
    scaling.scale(B, b_exp)
    with timer.phase("potrf"):
        L = potrf(B, wide, comm, xp)
    del B
    C = xp.array(A_local, dtype=xp.float64, order="F", copy=True)
    scaling.scale(C, a_exp)
    with timer.phase("sygst"):
        sygst(C, L, sygst_desc(desc, is_device(xp)), comm, xp)
    with timer.phase("sytrd"):
        if reduction == "two-stage":
            d, e, Q = two_stage(C, desc, comm, xp)
            for _, fn in sorted(notify, key=lambda hook: hook[0]):
                fn(d, e)
            return d, e, None, Q, L
        d, e, tau = householder_sytrd(C, desc, comm, xp, sytrd, notify)
    return d, e, tau, C, L                           # the reflectors, where C's columns were


def solves_early(where: str, vectors: bool, nranks: int) -> bool:
    """Whether sygvd solves the divide and conquer's early subtrees during sytrd
    (stedc.Early, their bits their own): one rank, stedc "dc" (resolved), eigenvectors."""
    return where == "dc" and vectors and nranks == 1


def stedc_choice(where: str, device: bool) -> str:
    """The tridiagonal solver stedc=`where` means: "auto" is "dc" on the host and on GPUs."""
    if where not in STEDC_CHOICES:
        raise ValueError(f"sygvd: stedc={where!r}: use {', '.join(map(repr, STEDC_CHOICES))}")
    if where == "gpu" and not device:
        raise ValueError("sygvd: stedc='gpu' needs device (CuPy) arrays: use 'dc' or 'host'")
    return "dc" if where == "auto" else where


def _stedc(d, e, desc: BlockCyclic, comm, xp, vectors: bool, where: str, early=None):
    """w (replicated) and the owned columns of Z (F order; None without vectors) for
    T = Z diag(w) Z^T, T = (d, e) replicated; early: the divide and conquer's subtrees solved
    already (stedc.Early.solved)."""
    n, rank = desc.n, comm.Get_rank()
    if not vectors:   # LAPACK on rank 0 (O(n^2), no vectors), one Bcast
        w = xp.empty(n, dtype=xp.float64)
        if rank == 0:
            from scipy.linalg import eigh_tridiagonal

            dh, eh = to_host(d), to_host(e)
            w[...] = xp.asarray(eigh_tridiagonal(dh, eh, eigvals_only=True) if n > 1 else dh)
        comm.Bcast(w, root=0)
        return w, None
    place = np.empty(n, dtype=np.int64)
    place[column_order(desc)] = np.arange(n)          # eigenvector p -> its column in the rows sent
    if where == "dc":
        from .stedc import stedc_rows

        res = stedc_rows(d, e, comm, xp, place=place, early=early)
        return res.w, rows_to_columns(res.take_rows(), res.row_starts, desc, comm)
    w = xp.empty(n, dtype=xp.float64)
    parts = []
    if rank == 0:
        w[...], Z = _solve_tridiagonal(d, e, xp, where)
        parts.append(xp.empty((n, n), dtype=xp.float64, order="F"))
        parts[0][:, xp.asarray(place)] = Z
        del Z
    else:
        parts.append(xp.empty((0, n), dtype=xp.float64, order="F"))
    comm.Bcast(w, root=0)
    return w, rows_to_columns(parts.pop(), [0] + [n] * comm.Get_size(), desc, comm)


def _solve_tridiagonal(d, e, xp, where: str):
    """(w, Z) of T = (d, e) on this rank alone, as arrays of xp: "gpu" (cuSOLVER syevd of the
    dense tridiagonal) or "host" (LAPACK dstevd)."""
    if where == "gpu" and d.shape[0] > 1:
        return xp.linalg.eigh(tridiagonal_matrix(xp, d, e))
    w, Z = tridiagonal_eigh(to_host(d), to_host(e))
    return xp.asarray(w), xp.asarray(Z)


def solve_distributed(A_global, B_global, comm, *, nb: int = 64, eigvals_only: bool | None = None, timer=None,
                      stedc: str = "auto", sytrd: str = "auto", eigvecs: bool | None = None,
                      reduction: str = "auto"):
    """Convenience for small n: distribute replicated A, B, solve, and return (w, X_local, desc)
    (X_local None with eigvals_only; eigvecs: its older name, as in sygvd)."""
    from .layout import distribute

    eigvals_only = eigvals_only_from(eigvals_only, eigvecs, "solve_distributed")
    desc = BlockCyclic(A_global.shape[0], A_global.shape[1], nb, comm.Get_size())
    rank = comm.Get_rank()
    w, X = sygvd(distribute(A_global, desc, rank), distribute(B_global, desc, rank), desc, comm,
                 eigvals_only=eigvals_only, timer=timer, stedc=stedc, sytrd=sytrd, reduction=reduction)
    return w, X, desc


__all__ = ["sygvd", "tridiagonalize", "solve_distributed", "stedc_choice", "PHASES", "STEDC_CHOICES", "SYTRD_CHOICES", "REDUCTION_CHOICES",
           "NotPositiveDefinite", "NonFiniteResult", "InputError", "sync"]
