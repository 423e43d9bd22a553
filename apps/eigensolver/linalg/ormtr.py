"""Back-transformation by the tridiagonalization's reflectors, Q Z (ormtr), with the
reflectors distributed like C (sytrd.py leaves them in C's columns).

Q Z = H_0 H_1 ... H_{n-2} Z on the owned columns of Z, blocks of reflectors last to first.  Each
block (a few panels) reaches every rank by one Bcast per panel from its owner; then
H_p0 ... H_p1-1 = I - Vb T Vb^T with T^-1 = diag(1/tau) + striu(Vb^T Vb) (the UT transform: the
inverse of LAPACK larft's recurrence), applied with one triangular solve.

The reflectors can be packed first (pack_reflectors): the rows ormtr reads, copied out of C (on
one rank each block's, on several each owned panel's), about half of C's memory, so that C can
be freed before the tridiagonal solver allocates the eigenvectors (the two-stage path, whose Q2
reflectors would otherwise sit beside the whole of C)."""
from __future__ import annotations

from ._xp import gemm_acc, is_device, to_host, trsm
from .layout import BlockCyclic, panel_bcast

ORMTR_BLOCK = 128    # reflectors per compact-WY block (rounded to whole panels): Vb is n x this
ORMTR_BLOCK_DEVICE = 512  # the same on the GPU: the update GEMMs' inner dimension (at 128 their
                          # arithmetic intensity is only about a GPU's flop/byte balance)
ORMTR_COLUMNS = 128  # columns of Z per update GEMM on the host: its product is a temporary of n x this


def ormtr_block(device: bool) -> int:
    """ormtr's default reflectors per block on the GPU or the host."""
    return ORMTR_BLOCK_DEVICE if device else ORMTR_BLOCK


class PackedReflectors:
    """The reflectors as ormtr reads them (pack_reflectors).  One rank (nprocs 1): blocks[p0] is
    block p0's Vb, its rows from `top` on (ormtr's), masked where tau = 0.  Several: blocks[q0]
    is owned panel q0's rows q0 + offset .. (what its Bcast sends).  block and offset as packed."""

    def __init__(self, blocks: dict, block: int, offset: int, nprocs: int = 1):
        self.blocks, self.block, self.offset, self.nprocs = blocks, block, offset, nprocs

    @property
    def nbytes(self) -> int:
        return sum(v.nbytes for v in self.blocks.values())


def _blocks(n: int, nb: int, block: int, offset: int, device: bool):
    """ormtr's blocks of reflectors, last first: (p0, p1, top), top Z's (and Vb's) first row.
    On the GPU the block's rows start at row p0 with a zero first row of Vb (row p0 of Z takes
    part with weight 0), so that the GEMMs' operands start 16-byte aligned (n even), for one more
    row of work.  Host: from row p0 + 1, as LAPACK."""
    if block < 1:
        raise ValueError(f"ormtr: block={block}: use a positive number of reflectors")
    bw = max(nb, block // nb * nb)
    lead = offset - 1 if device else offset
    for p0 in reversed(range(0, max(n - offset, 0), bw)):
        yield p0, min(p0 + bw, n), p0 + lead


def _alone_block(V, lives, live_h, p0: int, p1: int, top: int):
    """One rank's block p0 of reflectors as ormtr applies it: V's rows top.. of columns p0..p1,
    a view, or a masked copy where the block has a reflector with tau = 0 (live_h: the host's
    lives)."""
    Vb = V[top:, p0:p1]
    return Vb if live_h[p0:p1].all() else Vb * lives[p0:p1][None, :]


def pack_reflectors(V, tau, desc: BlockCyclic, xp, block: int | None = None, offset: int = 1,
                    rank: int = 0) -> PackedReflectors:
    """The reflectors in rank `rank`'s local columns V (sytrd's or sy2sb's C) as ormtr reads
    them, each piece copied into an F-order array of its own: on one rank each block's Vb, zeroed
    where tau = 0 (about n^2 / 2 + n block / 2 numbers); on several each owned panel's rows from
    q0 + offset (about half of V).  V is then no longer needed: ormtr(packed, tau, Z, ...) gives
    the bits ormtr(V, tau, Z, ...) gives, with the same block and offset."""
    block = ormtr_block(is_device(xp)) if block is None else block
    if desc.nprocs > 1:
        panels = {}
        for q0 in range(0, max(desc.n - offset, 0), desc.nb):
            if desc.owner(q0) == rank:
                lj = desc.local_index(q0)
                panels[q0] = xp.array(V[q0 + offset:, lj:lj + min(desc.nb, desc.n - q0)], order="F", copy=True)
        return PackedReflectors(panels, block, offset, desc.nprocs)
    lives, live_h = tau != 0, to_host(tau) != 0
    blocks = {p0: xp.array(_alone_block(V, lives, live_h, p0, p1, top), order="F", copy=True)
              for p0, p1, top in _blocks(desc.n, desc.nb, block, offset, is_device(xp))}
    return PackedReflectors(blocks, block, offset)


def ormtr(V, tau, Z, desc: BlockCyclic, comm, xp, block: int | None = None, offset: int = 1):
    """Overwrite the owned columns Z with Q Z, Q = H_0 H_1 ... H_{n-2}; V: the local columns
    holding the reflectors (sytrd's C), tau replicated.  offset: reflector j's vector starts at
    row j + offset (1: sytrd's; b: the band reduction's, sy2sb.py).

    Blocks of `block` reflectors (rounded to whole panels) last to first; per block, one Bcast
    per panel gives every rank the unit lower trapezoidal Vb, and Z[p0+1:] -= Vb (M^-1 (Vb^T Z))
    with M = T^-1 upper triangular.  A reflector with tau = 0 is the identity: its column of Vb
    is zeroed and its diagonal of M set to 1, which leaves it out.  One rank holds every column
    in order, so Vb is a view of V's columns (copied only where a block has such a reflector):
    no Bcasts and no copies; or V is pack_reflectors' PackedReflectors (its block and offset
    then stand)."""
    n, nb = desc.n, desc.nb
    packed = V if isinstance(V, PackedReflectors) else None
    if packed is not None:
        block, offset = packed.block, packed.offset
    if block is None:
        block = ormtr_block(is_device(xp))
    device = is_device(xp)
    alone = desc.nprocs == 1
    if packed is not None and packed.nprocs != desc.nprocs:
        raise ValueError(f"ormtr: reflectors packed for {packed.nprocs} ranks; the layout has {desc.nprocs}")
    live_h = to_host(tau) != 0 if alone and packed is None else None  # which blocks need a masked Vb
    # per reflector, once: is it live, and M's diagonal (1/tau; 1 where tau = 0); the blocks slice them
    lives = tau != 0
    diag = 1.0 / xp.where(lives, tau, 1.0)
    eye = None
    for p0, p1, top in _blocks(n, nb, block, offset, device):
        live = lives[p0:p1]
        if alone:  # V's columns p0..p1 hold the block's reflectors, zero above each one's 1
            if not Z.shape[1]:
                continue
            Vb = packed.blocks[p0] if packed is not None else _alone_block(V, lives, live_h, p0, p1, top)
        else:
            Vb = xp.zeros((n - top, p1 - p0), dtype=xp.float64, order="F")
            for q0 in range(p0, min(p1, n - offset), nb):
                q1 = min(q0 + nb, p1)
                Vb[q0 + offset - top:, q0 - p0:q1 - p0] = (
                    panel_bcast(V, desc, comm, q0, q0 + offset) if packed is None
                    else panel_bcast(tau, desc, comm, q0, q0 + offset, owned=packed.blocks.get(q0)))
            if not Z.shape[1]:
                continue
            Vb *= live[None, :]
        M = xp.ascontiguousarray(xp.triu(Vb.T @ Vb, 1))
        M.reshape(-1)[::p1 - p0 + 1] = diag[p0:p1]       # its diagonal, through a strided view
        Zb = Z[top:]
        if device:  # Vb^T Zb read through Z's strides (CuPy's matmul would copy the rows Zb)
            VtZ = xp.zeros((p1 - p0, Zb.shape[1]), dtype=xp.float64, order="F")
            gemm_acc(xp, VtZ, Vb.T, Zb, alpha=1.0)
            # Y = M^-1 VtZ as T VtZ with T = M^-1 (LAPACK larft's T) from one small solve: a
            # GEMM instead of a triangular solve with n right-hand sides, which runs well below a
            # GEMM's rate
            if eye is None or eye.shape[0] != p1 - p0:
                eye = xp.eye(p1 - p0)                 # (solve_triangular does not write it)
            Y = trsm(xp, M, eye, lower=False) @ VtZ
        else:
            VtZ = Vb.T @ Zb
            Y = trsm(xp, M, VtZ, lower=False)
        del VtZ
        step = Zb.shape[1] if device else ORMTR_COLUMNS  # (the GPU accumulates in place)
        for c0 in range(0, Zb.shape[1], step):
            gemm_acc(xp, Zb[:, c0:c0 + step], Vb, Y[:, c0:c0 + step])
    return Z
