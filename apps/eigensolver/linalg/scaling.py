"""Scaling by powers of two, as LAPACK's drivers scale a matrix into a safe range (dsyev's
anrm against rmin / rmax, applied by dlascl): A x = lambda B x is solved as
(sigma A) x' = lambda' (tau B) x' with

    lambda = (tau / sigma) lambda',   x = sqrt(tau) x'.

sigma and tau are powers of two (tau an even one, so sqrt(tau) is one too): multiplying by them
is exact for every entry that stays in the normal range, adds no rounding and keeps the result
bitwise reproducible.  A matrix whose largest magnitude lies in [2^-SAFE_EXP, 2^SAFE_EXP] is
left as it is (factor 1, the bits of an unscaled solve); one outside is brought to a largest
magnitude in [1/4, 1).  With both A and B inside the range, the reduced C = L^-1 A L^-T is at
most 2^(2 SAFE_EXP) cond(B) / ||B|| in size, and with cond(B) < 1/eps (solver: Cholesky pivot
ratio) its squares, which sytrd's reflectors form without further scaling, stay finite."""
from __future__ import annotations

import math

import numpy as np

#: largest magnitudes in [2^-SAFE_EXP, 2^SAFE_EXP] are not scaled
SAFE_EXP = 200
#: one multiplication by 2^k at most this |k| (2^1023 is the largest finite power of two)
_STEP = 1000


def exponent(max_abs: float, even: bool = False, safe: int | None = SAFE_EXP) -> int:
    """k such that max_abs * 2^k is the matrix's largest magnitude after scaling: 0 inside the
    range [2^-safe, 2^safe] (or for a zero or non-finite max_abs), else the k bringing it to
    [1/4, 1) (even k if `even`); safe=None: always the latter."""
    if not max_abs or not math.isfinite(max_abs):
        return 0
    if safe is not None and 2.0 ** -safe <= max_abs <= 2.0 ** safe:
        return 0
    _, e = math.frexp(max_abs)                   # max_abs = m 2^e, m in [1/2, 1)
    return -e - (e % 2 if even else 0)


def scale(M, k: int):
    """M *= 2^k in place (exact where the result stays normal); nothing for k = 0.  Returns M."""
    with np.errstate(over="ignore", under="ignore"):   # a result past the range is the caller's to judge
        while k:
            step = max(-_STEP, min(_STEP, k))
            M *= math.ldexp(1.0, step)
            k -= step
    return M


def scaled(x: float, k: int) -> float:
    """x * 2^k for a Python float (inf or 0 where it leaves the float64 range)."""
    try:
        return math.ldexp(x, k)
    except OverflowError:
        return math.copysign(math.inf, x)


def max_abs(M, xp):
    """max |M| for a 2-D array M of xp, as a 0-d float64 array of xp (NaN where M holds a NaN; 0
    for an empty M); no host sync.  max(max M, -min M) from the maxima and minima along M's
    contiguous axis (each a short vector): one read of M per reduction and no M-sized temporary;
    on the GPU one CUDA block per column (CuPy without its CUB accelerator reduces a whole array
    to one value in a single block, about 20 GB/s on an H100)."""
    if M.size == 0:
        return xp.zeros((), dtype=xp.float64)
    axis = 1 if M.flags.c_contiguous and not M.flags.f_contiguous else 0
    hi = xp.max(M, axis=axis).astype(xp.float64).max()
    lo = xp.min(M, axis=axis).astype(xp.float64).min()
    return xp.maximum(hi, -lo)
