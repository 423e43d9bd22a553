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
  subset  with subset_by_index, instead of stedc: bisection and inverse iteration (stein.py on
          the host, stein_device.py on GPUs); eigvals_only: T's eigenvalues on rank 0 (LAPACK
          on the host, bisection on the GPU), one Bcast.
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
from ._xp import get_xp, is_device, release_cached, sync, to_host
from .layout import BlockCyclic, column_order, rows_to_columns
from .ormtr import ormtr
from .potrf import NotPositiveDefinite, back_transform, panel_desc, potrf
from .stedc import Early, tridiagonal_eigh, tridiagonal_matrix
from .stein import stein_subset, subset_problem, subset_record
from .stein_device import bisect_device, stein_subset_device
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
          subset_by_index: tuple[int, int] | None = None, timer: Timer | None = None, stedc: str = "auto",
          sytrd: str = "auto", eigvecs: bool | None = None, reduction: str = "auto"):
    """Eigenvalues w (ascending, replicated on every rank) and local columns of X with
    A X = B X diag(w), X^T B X = I, for block-cyclic A_local, B_local (numpy or cupy).

    Returns (w, X_local); (w, None) with eigvals_only=True (scipy.linalg.eigh's keyword; None
    means False), which computes no tridiagonal eigenvectors and no back-transformation.
    eigvecs: the older name, eigvecs=False meaning eigvals_only=True (a DeprecationWarning;
    both given: TypeError).  subset_by_index=(lo, hi) (scipy.linalg.eigh's keyword: inclusive,
    0-based): only w[lo..hi] and their k = hi - lo + 1 vectors, X_local then the rank's columns
    of the n x k matrix in BlockCyclic(n, k, nb, P) (stein.py: bisection and inverse iteration,
    cost proportional to k).  A_local and B_local are not
    modified.  `comm` is an hpccoll Communicator (or anything with its buffer methods).
    stedc: the tridiagonal eigensolver of a full solve, "dc" (divide and conquer over the ranks on the arrays'
    device; "auto" means it), "host" (LAPACK dstevd on rank 0) or "gpu" (cuSOLVER on rank 0's
    GPU; device arrays only); "host" and "gpu" hold n x n eigenvectors on rank 0 for a moment.
    sytrd: how the GPU runs the tridiagonalization's column step, "auto" (fused transfers
    on hpccoll's deterministic sentinel communicator up to sytrd_device.FUSED_MAX_N, else
    collectives replayed in CUDA graphs), "fused", "graph", "eager" or "ops" (CuPy operations);
    the host always runs the array operations.
    reduction: the tridiagonalization, "one-stage" (sytrd) or "two-stage" (dense -> band ->
    tridiagonal, twostage.py; sytrd= does not apply to it); "auto": reduction_for's choice
    (two-stage on one GPU rank from n = AUTO_TWO_STAGE_MIN_N with eigenvalues only or at most n/2
    eigenvectors, from AUTO_TWO_STAGE_ALL_MIN_N with more; else one-stage).

    sygvd(A, B, ...) is GeneralizedSolver(B, ...).solve(A, ...): the same code, the same bits.
    A and B are scaled by powers of two into a safe range first and the results scaled back
    (scaling.py), so any magnitudes whose eigenvalues fit float64 solve alike.  Errors are
    raised on every rank alike: InputError (a ValueError) for arrays or arguments that
    differ from the descriptor or between ranks, or A or B not finite, or a subset_by_index
    that is not 0 <= lo <= hi < n; NotPositiveDefinite (a
    ValueError) for a B that is not numerically positive definite; NonFiniteResult (an
    ArithmeticError) where w or X would hold NaN or Inf."""
    vectors = not eigvals_only_from(eigvals_only, eigvecs, "sygvd")
    with GeneralizedSolver(B_local, desc, comm, stedc=stedc, sytrd=sytrd, reduction=reduction, timer=timer,
                           name="sygvd") as solver:
        return solver.solve(A_local, eigvals_only=not vectors, subset_by_index=subset_by_index)


class GeneralizedSolver:
    """A x = lambda B x for many A with one B (an SCF loop): the constructor checks B on every
    rank, scales it and factors it, B = L L^T (potrf), once; each solve(A) then runs sygst,
    the tridiagonalization, the tridiagonal eigensolver, ormtr and trsm with that L, skipping
    potrf and B's checks.  sygvd(A, B) is GeneralizedSolver(B).solve(A): a solve gives the
    same bits as a fresh sygvd of the same pair.

        with GeneralizedSolver(B_local, desc, comm) as s:
            for A_local in ...:
                w, X_local = s.solve(A_local)

    Holds L: one n x desc.local_n(rank) share (the size of B_local), until free() or the end of
    the with block.  stedc, sytrd, reduction and timer as sygvd's (solve may pass its own
    timer); B_local is not modified."""

    def __init__(self, B_local, desc: BlockCyclic, comm, *, stedc: str = "auto", sytrd: str = "auto",
                 reduction: str = "auto", timer: Timer | None = None, name: str = "GeneralizedSolver"):
        self.desc, self.comm, self.stedc, self.sytrd, self.name = desc, comm, stedc, sytrd, name
        self.xp = get_xp(B_local)
        self.timer = timer if timer is not None else NoTimer()
        self.b_exp = agree_factor(B_local, desc, comm, self.xp, stedc, sytrd, name, reduction)
        self.reduction = reduction
        self.where = stedc_choice(stedc, is_device(self.xp))
        self.L = cholesky(B_local, desc, comm, self.xp, self.timer, self.b_exp)

    def solve(self, A_local, *, eigvals_only: bool = False, subset_by_index: tuple[int, int] | None = None,
              timer: Timer | None = None):
        """(w, X_local) of A x = lambda B x, as sygvd(A_local, B_local, desc, comm, ...) returns
        them: w ascending and replicated; X_local the rank's columns of X, in desc's layout, or
        with subset_by_index=(lo, hi) of the n x k matrix in BlockCyclic(n, k, nb, P),
        k = hi - lo + 1; None with eigvals_only=True.  A_local is not modified."""
        if self.L is None:
            raise ValueError(f"{self.name}: solve after free(): make a new solver for B")
        desc, comm, xp = self.desc, self.comm, self.xp
        timer = timer if timer is not None else self.timer
        vectors = not eigvals_only
        a_exp, subset = agree_operand(A_local, desc, comm, xp, vectors, subset_by_index, self.name)
        b_exp = self.b_exp
        # one rank: the divide and conquer's subtrees whose rows sytrd has finished are solved while
        # it reduces the rest (stedc.Early; on the GPU they overlap sytrd's last columns)
        early = (Early(desc.n, xp) if subset is None and solves_early(self.where, vectors, comm.Get_size())
                 else None)
        columns = 0 if not vectors else desc.n if subset is None else subset[1] - subset[0] + 1
        d, e, tau, V, L = tridiagonalize(A_local, None, desc, comm, xp, timer, self.sytrd,
                                         early.hooks if early else (), scale_exponents=(a_exp, b_exp), L=self.L,
                                         reduction=reduction_for(self.reduction, desc, is_device(xp), columns),
                                         vectors=vectors)
        with timer.phase("stedc"):
            if subset is None:
                w, Z = _stedc(d, e, desc, comm, xp, vectors, self.where, early.solved if early else None)
            else:
                subset_solver = stein_subset_device if is_device(xp) else stein_subset
                w, Z = subset_solver(d, e, *subset, desc.nb, comm, xp, vectors)
        if b_exp != a_exp:                                 # lambda = (tau / sigma) lambda'
            w = xp.array(w, copy=True)
            scaling.scale(w, b_exp - a_exp)
        if not vectors:
            _check_finite(w, None, comm, xp, b_exp - a_exp, self.name)
            return w, None
        with timer.phase("ormtr"):
            # tau None: two-stage's Q (Q1 Q2 on any n x k columns, the subset's included)
            V.apply(Z) if tau is None else ormtr(V, tau, Z, desc, comm, xp)
        del V
        with timer.phase("trsm"):
            back_transform(Z, L, panel_desc(desc), comm, xp)
            scaling.scale(Z, b_exp // 2)                   # x = sqrt(tau) x'
            _check_finite(w, Z, comm, xp, b_exp - a_exp, self.name)
        return w, Z

    def free(self) -> None:
        """Drop the Cholesky factor (solve raises afterwards)."""
        self.L = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.free()


#: reduction="auto" takes the two-stage path on one GPU rank from this n on with eigenvalues only
#: or at most n/2 eigenvectors: on one H100 at n = 8192 it took 0.71x the one-stage solve's time
#: with eigenvalues only and 0.85x for the lowest n/10 (0.44x and 0.55x at 16384)
AUTO_TWO_STAGE_MIN_N = 8192
#: ... and from this n on with more eigenvectors: 0.65x the one-stage solve's time at 16384 and
#: 0.61x at 32768 on one H100 (0.88x at 8192 there, 1.03x on an H200), for Q2's n^2/2 reflectors
#: held beside Q1's (a pool peak 0.5 GiB higher at 16384, 2.9 GiB at 32768; docs/performance.md).
#: Ranks sharing a GPU and the host take one stage (rank 0's bulge chasing, the host's NumPy
#: steps).
AUTO_TWO_STAGE_ALL_MIN_N = 16384


def reduction_for(reduction: str, desc: BlockCyclic, device: bool, columns: int | None = None) -> str:
    """The tridiagonalization sygvd runs for `reduction` when `columns` eigenvectors are wanted
    (0: eigenvalues only; None: all n): "auto" is two-stage on one GPU rank with
    n >= AUTO_TWO_STAGE_MIN_N and columns <= n / 2, or n >= AUTO_TWO_STAGE_ALL_MIN_N; else
    one-stage.  The same on every rank."""
    if reduction != "auto":
        return reduction
    columns = desc.n if columns is None else columns
    least = AUTO_TWO_STAGE_MIN_N if 2 * columns <= desc.n else AUTO_TWO_STAGE_ALL_MIN_N
    two = device and desc.nprocs == 1 and desc.n >= least
    return "two-stage" if two else "one-stage"


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


def agree_factor(B_local, desc: BlockCyclic, comm, xp, stedc: str, sytrd: str, who: str = "sygvd",
                 reduction: str = "auto") -> int:
    """Check B_local, the descriptor and the solver's options (stedc, sytrd, reduction) on every
    rank at once (one Allgather of a fixed-size record per rank, _agree); returns B's scaling
    exponent b (scaling.exponent, even)."""
    codes = (("stedc", STEDC_CHOICES.index(stedc) if stedc in STEDC_CHOICES else -1),
             ("sytrd", SYTRD_CHOICES.index(sytrd) if sytrd in SYTRD_CHOICES else -1),
             ("reduction", REDUCTION_CHOICES.index(reduction) if reduction in REDUCTION_CHOICES else -1))
    t = _agree(who, [("B", B_local)], codes, desc, comm, xp)
    if desc.m != desc.n:
        raise InputError(f"{who}: the matrix must be square, the descriptor says {desc.m} x {desc.n}")
    if desc.nprocs != comm.Get_size():
        raise InputError(f"{who}: the descriptor is for {desc.nprocs} ranks, the communicator has {comm.Get_size()}")
    if sytrd not in SYTRD_CHOICES:
        raise InputError(f"{who}: sytrd={sytrd!r}: use {', '.join(map(repr, SYTRD_CHOICES))}")
    if reduction not in REDUCTION_CHOICES:
        raise InputError(f"{who}: reduction={reduction!r}: use {', '.join(map(repr, REDUCTION_CHOICES))}")
    stedc_choice(stedc, is_device(xp))          # the same verdict on every rank
    b_max = float(t["max_abs_B"].max())
    if not b_max > 0:
        raise NotPositiveDefinite("B is not numerically positive definite: B is zero")
    return scaling.exponent(b_max, even=True)


def agree_operand(A_local, desc: BlockCyclic, comm, xp, vectors: bool, subset_by_index, who: str = "sygvd"):
    """Check A_local and a solve's options on every rank at once (one Allgather, _agree);
    returns A's scaling exponent a and the subset (lo, hi) or None."""
    lo, hi = subset_record(subset_by_index)
    t = _agree(who, [("A", A_local)], (("eigvals_only", float(not vectors)), ("subset_by_index lo", lo),
                                       ("subset_by_index hi", hi)), desc, comm, xp, module=xp)
    lo, hi = float(t["subset_by_index lo"][0]), float(t["subset_by_index hi"][0])
    subset = None
    if (lo, hi) != (-1.0, -1.0) or subset_by_index is not None:
        problem = subset_problem(lo, hi, desc.n, subset_by_index)
        if problem:
            raise InputError(f"{who}: {problem}")
        subset = (int(lo), int(hi))
    return scaling.exponent(float(t["max_abs_A"].max())), subset


def _agree(who: str, arrays, options, desc: BlockCyclic, comm, xp, module=None) -> dict:
    """One Allgather of a fixed-size record per rank: each array's largest magnitude (NaN where
    an entry is NaN), shape and realness, the descriptor, the rank's column count and the
    options' codes (floats).  Raises the same InputError on every rank for an argument wrong on
    one rank, differing between ranks, or an array not finite, so that no rank goes on into a
    mismatched collective.  Returns the table's columns by field name.  module: the array
    module the arrays must belong to (a solver's)."""
    rank, size = comm.Get_rank(), comm.Get_size()
    fields = [f"{f}_{name}" for name, _ in arrays for f in ("max_abs", "rows", "cols", "real", "module")]
    fields += ["n", "m", "nb", "nprocs", "own_cols"] + [name for name, _ in options]
    mine = dict.fromkeys(fields, -1.0)
    shapes_ok = True
    for name, a in arrays:
        real = getattr(a, "dtype", np.dtype(object)).kind in "biuf"
        mine[f"real_{name}"] = real
        mine[f"module_{name}"] = module is None or get_xp(a) is module
        if real and a.ndim == 2:
            mine[f"rows_{name}"], mine[f"cols_{name}"] = a.shape
        shapes_ok &= (real and mine[f"module_{name}"] and mine[f"rows_{name}"] == desc.n
                      and mine[f"cols_{name}"] == (desc.local_n(rank) if rank < desc.nprocs else -1))
    mine.update(n=desc.n, m=desc.m, nb=desc.nb, nprocs=desc.nprocs,
                own_cols=desc.local_n(rank) if rank < desc.nprocs else -1)
    mine.update({name: code for name, code in options})
    record = xp.asarray(np.array([mine[f] for f in fields], dtype=np.float64))
    if shapes_ok:   # the largest magnitudes (NaN where an entry is NaN), on the device
        for name, a in arrays:
            record[fields.index(f"max_abs_{name}")] = scaling.max_abs(a, xp)
    table = xp.empty((size, len(fields)), dtype=xp.float64)
    comm.Allgather(record, table)
    host = to_host(table)
    t = {f: host[:, i] for i, f in enumerate(fields)}

    def fail(message):
        raise InputError(f"{who}: {message}")

    for names, what in [(("n", "m", "nb", "nprocs"), "descriptor")] + [((name,), name) for name, _ in options]:
        cols = np.stack([t[k] for k in names], axis=1)
        same = (cols == cols[0]) | (np.isnan(cols) & np.isnan(cols[0]))
        if not same.all():
            seen = "; ".join(f"rank {r}: " + ", ".join(f"{k}={_num(v)}" for k, v in zip(names, row))
                             for r, row in enumerate(cols))
            fail(f"the ranks pass different {what} values ({seen}): pass the same on every rank")
    for r in range(size):
        for name, _ in arrays:
            if not t[f"real_{name}"][r]:
                fail(f"rank {r}: {name}_local is not a real array: use float64")
            if not t[f"module_{name}"][r]:
                fail(f"rank {r}: {name}_local is not an array of the solver's module ({module.__name__}): "
                     f"pass {'CuPy' if is_device(module) else 'NumPy'} arrays")
            shape = (_num(t[f"rows_{name}"][r]), _num(t[f"cols_{name}"][r]))
            owns = (desc.n, _num(t["own_cols"][r]))
            if shape != owns:
                fail(f"rank {r}: {name}_local has shape {shape if -1 not in shape else 'not 2-D'}, rank {r} owns "
                     f"{owns} of BlockCyclic({desc.n}, {desc.n}, {desc.nb}, {desc.nprocs})")
    for name, _ in arrays:
        bad = [r for r in range(size) if not np.isfinite(t[f"max_abs_{name}"][r])]
        if bad:
            fail(f"{name} has NaN or Inf entries (in the columns of rank{'s' if len(bad) > 1 else ''} "
                 f"{', '.join(map(str, bad))}): {name} must be finite")
    return t


def _num(v: float):
    """A record entry as the int it holds (shapes, counts), else the float."""
    return int(v) if float(v).is_integer() else float(v)


def _check_finite(w, X, comm, xp, w_exp: int, who: str = "sygvd") -> None:
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
    raise NonFiniteResult(f"{who}: NaN or Inf in {' and '.join(where)}{hint}; no result returned")


def tridiagonalize(A_local, B_local, desc: BlockCyclic, comm, xp, timer: Timer, sytrd: str = "auto",
                   notify=(), scale_exponents=(0, 0), L=None, reduction: str = "auto", vectors: bool = True):
    """sygvd's first three phases: potrf, sygst and sytrd on copies of A_local and B_local,
    scaled by 2^a and 2^b for scale_exponents (a, b) (scaling.py).  Returns (d, e, tau, V, L):
    T's diagonals and the reflectors' scalars (replicated), the local columns holding the
    reflectors and those of the Cholesky factor.  notify: sytrd's [(rows, fn)], fn(d, e) called
    once T's first `rows` rows are final (sytrd.sytrd).  L: B's factor from cholesky (of B
    scaled by 2^b) when the caller holds it (GeneralizedSolver): no potrf, B_local unused.
    reduction "two-stage": (d, e, None, Q, L) with Q a twostage.TwoStageQ (Q.apply(Z) is Q Z
    for any n x k columns Z, None with vectors=False; notify's functions called after it, in
    the timer's stedc phase)."""
    a_exp, b_exp = scale_exponents
    if L is None:
        L = cholesky(B_local, desc, comm, xp, timer, b_exp)
    C = xp.array(A_local, dtype=xp.float64, order="F", copy=True)
    scaling.scale(C, a_exp)
    with timer.phase("sygst"):
        sygst(C, L, sygst_desc(desc, is_device(xp)), comm, xp)
    with timer.phase("sytrd"):
        if reduction != "two-stage":
            d, e, tau = householder_sytrd(C, desc, comm, xp, sytrd, notify)
            release_cached(xp)                       # the reduction's workspaces, before stedc's
            return d, e, tau, C, L                   # the reflectors, where C's columns were
        d, e, Q = two_stage(C, desc, comm, xp, vectors=vectors)
        del C                                        # Q holds Q1's reflectors packed
        release_cached(xp)
    if notify:                                       # nothing of the reduction left to overlap:
        with timer.phase("stedc"):                   # the hooks' work is the tridiagonal solver's
            for _, fn in sorted(notify, key=lambda hook: hook[0]):
                fn(d, e)
    return d, e, None, Q, L


def cholesky(B_local, desc: BlockCyclic, comm, xp, timer: Timer, b_exp: int = 0):
    """The local columns of L, B 2^b = L L^T (potrf on a copy of B_local scaled by 2^b)."""
    B = xp.array(B_local, dtype=xp.float64, order="F", copy=True)
    scaling.scale(B, b_exp)
    with timer.phase("potrf"):
        return potrf(B, panel_desc(desc), comm, xp)   # the same layout; wider panels on one rank


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
    if not vectors:   # rank 0 (no vectors): LAPACK on the host, bisection on the GPU; one Bcast
        w = xp.empty(n, dtype=xp.float64)
        if rank == 0:
            if is_device(xp):
                w[...] = bisect_device(d, e, 0, n - 1)
            else:
                from scipy.linalg import eigh_tridiagonal

                w[...] = eigh_tridiagonal(d, e, eigvals_only=True) if n > 1 else d
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
                      subset_by_index: tuple[int, int] | None = None, reduction: str = "auto"):
    """Convenience for small n: distribute replicated A, B, solve, and return (w, X_local, desc)
    (X_local None with eigvals_only; eigvecs: its older name, as in sygvd; desc: A's, X_local
    being in BlockCyclic(n, k, nb, P) with a subset of k eigenpairs)."""
    from .layout import distribute

    eigvals_only = eigvals_only_from(eigvals_only, eigvecs, "solve_distributed")
    desc = BlockCyclic(A_global.shape[0], A_global.shape[1], nb, comm.Get_size())
    rank = comm.Get_rank()
    w, X = sygvd(distribute(A_global, desc, rank), distribute(B_global, desc, rank), desc, comm,
                 eigvals_only=eigvals_only, timer=timer, stedc=stedc, sytrd=sytrd, subset_by_index=subset_by_index,
                 reduction=reduction)
    return w, X, desc


__all__ = ["sygvd", "GeneralizedSolver", "tridiagonalize", "solve_distributed", "stedc_choice", "PHASES", "STEDC_CHOICES",
           "SYTRD_CHOICES", "REDUCTION_CHOICES", "AUTO_TWO_STAGE_MIN_N", "AUTO_TWO_STAGE_ALL_MIN_N", "reduction_for",
           "NotPositiveDefinite", "NonFiniteResult", "InputError", "sync"]
