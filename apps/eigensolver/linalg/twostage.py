"""The two-stage tridiagonalization C = Q1 Q2 T Q2^T Q1^T and its back-transformation Q1 Q2 Z.

  sy2sb   dense -> band of half-bandwidth b, BLAS-3, distributed (sy2sb.py): per panel of b
          columns one Bcast and one Allreduce.
  sb2st   band -> tridiagonal by bulge chasing (sb2st.py) on rank 0: one Allgather brings it
          the band ((b + 1) x n), one Bcast gives every rank d and e.  Rank 0 keeps Q2's
          reflectors (about n^2 / 2 numbers) until the back-transformation.
  Q1 Q2 Z Q2 by compact-WY blocks of g sweeps (sb2st.apply_q2), each group reaching the ranks by
          one Bcast from rank 0 (n / g in all); then Q1 by ormtr.ormtr with offset b (one Bcast
          per panel of reflectors, as the one-stage path).

The choice of b: the band reduction's GEMMs have inner dimension b (larger is faster), the bulge
chasing's steps number about n^2 / (2 b) with O(b^2) work each, and Q2's blocks cost (b + g) / b
times the flops of Q2 applied alone.  On the host, b = 64 gave the shortest reduction plus
back-transformation of 16, 32 and 64 at n = 1500 (bench/host_solver.py --sweep-band;
bench/results/2026-12-05-cpu2-152c23d-host-solver.txt): TWO_STAGE_BAND.  The GPU's b is to
be measured the same way."""
from __future__ import annotations

import numpy as np

from ._xp import to_host
from .layout import BlockCyclic
from .ormtr import ormtr
from .sb2st import apply_q2, group_shape, sb2st
from .sy2sb import check_band, gather_band, sy2sb

#: the largest half-bandwidth the two-stage reduction uses: b is the largest divisor of the
#: layout's nb not above it (sy2sb needs b | nb)
TWO_STAGE_BAND = 64


def band_width(nb: int, target: int = TWO_STAGE_BAND) -> int:
    """The half-bandwidth for layout block nb: the largest divisor of nb that is <= target."""
    return max(d for d in range(1, min(nb, target) + 1) if nb % d == 0)


class TwoStageQ:
    """Q = Q1 Q2 of a two-stage tridiagonalization, applied by apply(Z)."""

    def __init__(self, V1, tau1, b: int, g: int, refl, desc: BlockCyclic, comm, xp):
        self.V1, self.tau1, self.b, self.g = V1, tau1, b, g
        self.refl = refl                       # Q2's groups on rank 0, None elsewhere
        self.desc, self.comm, self.xp = desc, comm, xp

    def apply(self, Z):
        """Z <- Q1 Q2 Z on the owned columns Z (every rank calls it)."""
        xp, comm, n = self.xp, self.comm, self.desc.n
        refl, self.refl = self.refl, None      # rank 0's copy goes as its groups are used

        def group(q):
            shape = group_shape(n, self.b, self.g, q)
            buf = xp.empty(shape, dtype=xp.float64)
            if comm.Get_rank() == 0:
                buf[...] = xp.asarray(refl[q])
                refl[q] = None
            if comm.Get_size() > 1:
                comm.Bcast(buf, root=0)
            return buf

        apply_q2(group, n, self.b, self.g, Z, xp)
        ormtr(self.V1, self.tau1, Z, self.desc, comm, xp, offset=self.b)
        return Z


def two_stage(C, desc: BlockCyclic, comm, xp, b: int | None = None, g: int | None = None):
    """Tridiagonalize the distributed symmetric C (lower triangle, strict upper zero) in two
    stages.  Returns (d, e, Q): T's diagonals (replicated, arrays of xp) and a TwoStageQ; C's
    columns then hold Q1's reflectors."""
    b = band_width(desc.nb) if b is None else b
    check_band(desc, b)
    g = b if g is None else g
    band, tau1 = sy2sb(C, desc, comm, xp, b)
    full = gather_band(band, desc, comm, xp)
    n = desc.n
    de = xp.empty(2 * n, dtype=xp.float64)
    refl = None
    if comm.Get_rank() == 0:
        d, e, refl = sb2st(np.ascontiguousarray(to_host(full)), g)
        de[:n] = xp.asarray(d)
        de[n:2 * n - 1] = xp.asarray(e)
        de[2 * n - 1:] = 0.0
    comm.Bcast(de, root=0)
    return de[:n], de[n:2 * n - 1], TwoStageQ(C, tau1, b, g, refl, desc, comm, xp)


__all__ = ["two_stage", "TwoStageQ", "band_width", "TWO_STAGE_BAND"]
