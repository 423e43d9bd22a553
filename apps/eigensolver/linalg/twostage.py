"""The two-stage tridiagonalization C = Q1 Q2 T Q2^T Q1^T and its back-transformation Q1 Q2 Z.

  sy2sb   dense -> band of half-bandwidth b, BLAS-3, distributed (sy2sb.py): per panel of b
          columns one Bcast and one Allreduce.
  sb2st   band -> tridiagonal by bulge chasing (sb2st.py) on rank 0: one Allgather brings it
          the band ((b + 1) x n), one Bcast gives every rank d and e.  Q2's reflectors (about
          n^2 / 2 numbers, in groups of g sweeps) are kept until the back-transformation: on one
          rank all of them; on P ranks rank 0 sends each group to its owner (group_owner: ranks
          1 .. P - 1 in turn; one Bcast per group, spread_groups), so that each of them holds about
          n^2 / (2 (P - 1)) and rank 0, which held all of them during the bulge chasing, none; on
          GPUs each group is then its own allocation (sb2st_device separate=True), freed once sent.
  Q1 Q2 Z Q2 by compact-WY blocks of g sweeps, group by group (sb2st.apply_q2; on the GPU
          q2_device: one rank's all groups by apply_q2_device, several ranks' one group at a time
          by apply_q2_group), each group reaching the ranks by one Bcast from its owner (n / g in
          all); then Q1 by ormtr.ormtr with offset b (one Bcast per panel of reflectors, as the
          one-stage path).  Each rank packs its Q1 reflectors out of C once the bulge chasing
          and the spreading of Q2 are done (ormtr.pack_reflectors: the rows ormtr reads, about
          half of C), so that C is freed once the reduction returns: on one rank Q2's n^2 / 2
          take the place of C's other half.

The choice of b: the band reduction's GEMMs have inner dimension b (larger is faster), the bulge
chasing's steps number about n^2 / (2 b) with O(b^2) work each, and Q2's blocks cost (b + g) / b
times the flops of Q2 applied alone.  On the host, b = 64 gave the shortest reduction plus
back-transformation of 16, 32 and 64 at n = 1500 on a 2-core host (bench/host_solver.py
--sweep-band re-runs it): TWO_STAGE_BAND.  The GPU's: TWO_STAGE_BAND_DEVICE."""
from __future__ import annotations

import numpy as np

from ._xp import is_device, to_host
from .layout import BlockCyclic
from .ormtr import ormtr, pack_reflectors
from .q2_device import GROUP_MAX
from .sb2st import _groups, apply_q2, group_shape, sb2st
from .sy2sb import check_band, gather_band, sy2sb

#: the largest half-bandwidth the two-stage reduction uses: b is the largest divisor of the
#: layout's nb not above it (sy2sb needs b | nb)
TWO_STAGE_BAND = 64
#: the GPU's: at n = 16384 on an H100 the reduction (sy2sb + bulge chasing) took 0.92 s at b = 64
#: against 1.11 s at b = 32 (the band reduction's panels cost more at b = 32 than the bulge chasing
#: saves), and Q2 on n x n eigenvectors (g = b) 0.71 s against 1.77 s: b = 64 whatever the
#: eigenvector columns (docs/performance.md); bench/twostage_parts.py times every part per b
TWO_STAGE_BAND_DEVICE = 64


def device_band(nb: int) -> int:
    """The GPU's half-bandwidth for layout block nb."""
    return band_width(nb, TWO_STAGE_BAND_DEVICE)


def band_width(nb: int, target: int = TWO_STAGE_BAND) -> int:
    """The half-bandwidth for layout block nb: the largest divisor of nb that is <= target."""
    return max(d for d in range(1, min(nb, target) + 1) if nb % d == 0)


class TwoStageQ:
    """Q = Q1 Q2 of a two-stage tridiagonalization, applied by apply(Z)."""

    def __init__(self, V1, tau1, b: int, g: int, refl, desc: BlockCyclic, comm, xp):
        self.V1, self.tau1, self.b, self.g = V1, tau1, b, g
        # Q2's reflectors: on one rank all groups (the GPU's flat array, group_offsets, or the
        # host's list); on several, {q: group q's array} of the groups this rank owns
        # (spread_groups, group_owner), each sent to every rank when Q2 reaches it
        self.refl = refl
        self.desc, self.comm, self.xp = desc, comm, xp

    def apply(self, Z):
        """Z <- Q1 Q2 Z on the owned columns Z (every rank calls it)."""
        xp, comm, n, b, g = self.xp, self.comm, self.desc.n, self.b, self.g
        refl, self.refl = self.refl, None      # released as it is used
        nranks, rank = comm.Get_size(), comm.Get_rank()

        def group(q):
            if nranks == 1:
                R, refl[q] = refl[q], None
                return R
            shape, owner = group_shape(n, b, g, q), group_owner(q, nranks)
            R = refl.pop(q) if owner == rank else xp.empty(shape, dtype=xp.float64)
            if shape[0]:
                comm.Bcast(R, root=owner)
            return R

        if is_device(xp):
            from .q2_device import apply_q2_device, apply_q2_group

            if nranks == 1:
                apply_q2_device(refl, n, b, g, Z)
            else:
                for q in reversed(range(_groups(n, g))):
                    apply_q2_group(group(q), n, b, g, q, Z)
        else:
            apply_q2(group, n, b, g, Z, xp)
        del refl
        V1, self.V1 = self.V1, None            # released as it is used
        ormtr(V1, self.tau1, Z, self.desc, comm, xp, offset=b)
        return Z


def group_owner(q: int, nranks: int) -> int:
    """The rank that keeps group q of Q2's reflectors between the bulge chasing and Q2: ranks
    1 .. P - 1 in turn (rank 0, which holds all of them while the bulge chasing runs, keeps none
    on several ranks: its peak is then that of the bulge chasing, not that plus a share)."""
    return 0 if nranks == 1 else 1 + q % (nranks - 1)


def spread_groups(refl, n: int, b: int, g: int, comm, xp) -> dict:
    """Rank 0's Q2 reflectors (refl: its list of groups, sb2st's or sb2st_device's with
    separate=True; None elsewhere) to their owners (group_owner), one Bcast per group.  Returns
    this rank's {q: group q's (K_q, b + 1, g) array}.  Ranks 1 .. P - 1 then hold about n^2 / (2 (P - 1))
    of the n^2 / 2 numbers each; rank 0 drops refl as it goes."""
    nranks, rank = comm.Get_size(), comm.Get_rank()
    mine = {}
    for q in range(_groups(n, g)):
        shape, owner = group_shape(n, b, g, q), group_owner(q, nranks)
        if not shape[0]:
            if owner == rank:
                mine[q] = xp.empty(shape, dtype=xp.float64)
            continue
        if rank == 0:
            R, refl[q] = xp.ascontiguousarray(refl[q]), None     # each group freed once sent
        else:
            R = xp.empty(shape, dtype=xp.float64)
        comm.Bcast(R, root=0)
        if owner == rank:
            mine[q] = R
        del R
    return mine


def two_stage(C, desc: BlockCyclic, comm, xp, b: int | None = None, g: int | None = None, vectors: bool = True):
    """Tridiagonalize the distributed symmetric C (lower triangle, strict upper zero) in two
    stages.  Returns (d, e, Q): T's diagonals (replicated, arrays of xp) and a TwoStageQ (None
    with vectors=False: Q2's reflectors are then dropped as they are made); C's columns then
    hold Q1's reflectors, of which Q holds a packed copy (C is not needed after).  On the GPU the
    bulge chasing runs on rank 0's device (sb2st_device.py); with vectors on several ranks
    spread_groups shares Q2's reflectors out.  b: the half-bandwidth (default: TWO_STAGE_BAND on
    the host, device_band on the GPU)."""
    device = is_device(xp)
    if b is None:
        b = device_band(desc.nb) if device else band_width(desc.nb, TWO_STAGE_BAND)
    check_band(desc, b)
    g = b if g is None else g
    if device and vectors and comm.Get_size() > 1 and max(b, g) > GROUP_MAX:
        raise ValueError(f"two_stage: b = {b}, g = {g}: on several GPU ranks Q2 goes group by group "
                         f"(q2_device.apply_q2_group), which needs b, g <= {GROUP_MAX}")
    band, tau1 = sy2sb(C, desc, comm, xp, b)
    full = gather_band(band, desc, comm, xp)
    del band
    n, root = desc.n, comm.Get_rank() == 0
    de = xp.empty(2 * n, dtype=xp.float64)
    refl = None
    if root:   # the bulge chasing: the GPU kernel, or NumPy on the host
        if device:
            from .sb2st_device import sb2st_device

            # several ranks: each group its own allocation, sent to its owner and freed one by one
            d, e, refl = sb2st_device(full, g, reflectors=vectors, separate=comm.Get_size() > 1)
        else:
            d, e, refl = sb2st(np.ascontiguousarray(to_host(full)), g)
        de[:n], de[n:2 * n - 1] = xp.asarray(d), xp.asarray(e)
        de[2 * n - 1:] = 0.0
        del d, e
    del full
    comm.Bcast(de, root=0)
    if vectors and comm.Get_size() > 1:   # each rank its share of Q2's reflectors
        refl = spread_groups(refl, n, b, g, comm, xp)
    V1 = pack_reflectors(C, tau1, desc, xp, offset=b, rank=comm.Get_rank()) if vectors else None
    Q = TwoStageQ(V1, tau1, b, g, refl, desc, comm, xp) if vectors else None
    return de[:n], de[n:2 * n - 1], Q


__all__ = ["two_stage", "TwoStageQ", "spread_groups", "group_owner", "band_width", "device_band", "TWO_STAGE_BAND", "TWO_STAGE_BAND_DEVICE"]
