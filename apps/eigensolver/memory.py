"""The solver's memory model: the bytes one rank holds at the peak of each phase, as a function
of n, nb and the rank count P (docs/eigensolver.md explains each term).

With u = n * local_n doubles (the rank's share of one n x n matrix, about n^2 / P) every phase
holds the caller's A_local and B_local (2u) plus:

  potrf   B's copy (becoming L) (host: + one chunk's update product)  u   + panel
  sygst   L, C (host: + one chunk's update product)                   2u  + 2 panels
  sytrd   L, C (becoming the reflectors V)                            2u  + panel work (6 nb n)
          (one rank: + the divide and conquer's early subtrees, ~u / 3)
  stedc   L, V, two copies of the rank's rows of the eigenvectors     2u + 2 h n + chunks
          (h = rows ~ n / P; the Alltoallv then holds sent and
          received shares, and the assembled columns: at most 2u)
  ormtr   L, V, Z                                                     3u  + Vb (n x 128; GPU: n x 512 and two
                                                                              512 x local_n), host: a product (n x 128)
  trsm    L, Z                                                        2u  + panel

so the peak is about 6 n^2 / P doubles plus terms of n * nb: no n x n matrix anywhere.  The
trailing updates of potrf and sygst run in chunks of potrf.UPDATE_COLS local columns: on
the host NumPy forms one chunk's product (at most n x UPDATE_COLS), on the GPU cuBLAS
accumulates in place (none; so do sytrd's trailing update and ormtr's).  On the GPU the same
arrays are device arrays, and the CUDA context, cuBLAS/cuSOLVER workspaces and CuPy's pool add
a constant."""
from __future__ import annotations

from .linalg.layout import BlockCyclic


def memory_model(n: int, nb: int, nprocs: int, rank: int = 0, *, device: bool = False) -> dict:
    """{phase: bytes} rank `rank` holds at the peak of each phase (float64), and "peak": their
    maximum.  Counts the arrays of size n * something; O(n) vectors are left out.  device: the
    GPU path (CuPy arrays; the CUDA context and library workspaces not included)."""
    from .linalg import ormtr, potrf, sygst
    from .linalg.stedc import common as stedc

    desc = BlockCyclic(n, n, nb, nprocs)
    w = desc.local_n(rank)
    u = n * w
    b = min(potrf.panel_desc(desc).nb, n)  # potrf's and trsm's panel width
    bs = min(sygst.sygst_desc(desc, device).nb, n)  # sygst's
    h = _dc_rows(n, nprocs, rank, device)
    k_chunk = stedc.CHUNK_DEVICE if device else stedc.CHUNK_HOST * n
    update = 0 if device else n * min(potrf.UPDATE_COLS, w)  # one chunk's product (host)
    bw = ormtr.ormtr_block(device)
    model = {
        "potrf": 2 * u + u + update + b * n,
        "sygst": 2 * u + 2 * u + update + 4 * bs * n,
        "sytrd": 2 * u + 2 * u + 6 * min(nb, n) * n + _early(n, nprocs, device),
        "stedc": 2 * u + 2 * u + max(2 * h * n + 3 * k_chunk, h * n + u, 2 * u),
        "ormtr": 2 * u + 3 * u + (n * bw + 2 * bw * w if device else n * (bw + ormtr.ORMTR_COLUMNS)),
        "trsm": 2 * u + 2 * u + b * n,
    }
    out = {phase: 8 * int(v) for phase, v in model.items()}
    out["peak"] = max(out.values())
    return out


def _early(n: int, nprocs: int, device: bool) -> int:
    """One rank: the eigenvectors of the divide and conquer's early subtrees, solved during sytrd
    (stedc.Early: about n^2 / 3 doubles in all, n^2/4 + n^2/16 + ...); several ranks: 0."""
    from .linalg.stedc import early_ranges

    return sum((b - a) ** 2 for a, b in early_ranges(n, device=device)) if nprocs == 1 else 0


def _dc_rows(n: int, nprocs: int, rank: int, device: bool) -> int:
    """Rows of the eigenvectors rank `rank` computes in the divide and conquer."""
    from .linalg.stedc import row_starts_of

    starts = row_starts_of(n, nprocs, device=device)
    return starts[rank + 1] - starts[rank]


def largest_n(nprocs: int, gpu_bytes: int = 139 * 2**30, reserve_bytes: int = 3 * 2**30, nb: int = 256,
              factor: float = 1.0, step: int = 256) -> int:
    """The largest n (a multiple of `step`) whose device peak per rank, the model's times
    `factor`, fits a GPU of `gpu_bytes` less `reserve_bytes` (CUDA context, library workspaces),
    one rank per GPU.  factor > 1 stands for what the model leaves out (CuPy's pool keeps freed
    blocks, whose fragmentation the measured high-water marks show)."""
    cap = gpu_bytes - reserve_bytes

    def fits(n: int) -> bool:
        return factor * max(memory_model(n, nb, nprocs, r, device=True)["peak"] for r in range(nprocs)) <= cap

    lo, hi = step, step
    while fits(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo
