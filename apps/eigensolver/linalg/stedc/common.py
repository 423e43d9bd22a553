"""What the steps of the divide and conquer share: the leaf size and the tree of merges, the
ranks of a solve and its collectives, the work arrays' chunk width, dc_kernels.cu."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._xp import raw_module, to_host

LEAF = 64            # leaf size on the host (LAPACK eigh of each, batched by NumPy)
# Leaf size on the GPU (the leaves by LEAVES below): larger leaves make their batched eigensolves
# slower, smaller ones add merge levels; 256 rows balances the two.
LEAF_DEVICE = 256
# The work arrays of a merge with k poles (roots x poles in the secular equation, poles x
# columns of the eigenvectors) are k x chunk_width(k): on the host CHUNK_HOST roots or columns
# at a time, on the GPU about CHUNK_DEVICE elements.  A constant of the memory model
# (docs/eigensolver.md): it does not shrink with the rank count, so it is kept small.
CHUNK_HOST = 64
CHUNK_DEVICE = 1 << 22
EPS = float(np.finfo(np.float64).eps)
TPB = 256  # dc_kernels.cu's block


def dc_kernel(name: str):
    """The kernel `name` of dc_kernels.cu, compiled once per device."""
    return raw_module("stedc/dc_kernels.cu").get_function(name)


def chunk_width(k: int, xp) -> int:
    """Roots, rows or columns per work array of a merge with k poles."""
    return CHUNK_HOST if xp is np else max(1, CHUNK_DEVICE // max(k, 1))


@dataclass
class _Node:
    a: int            # rows and columns [a, b) of T
    b: int
    w: object         # eigenvalues (host, ascending; scaled), None until shared
    Q: object         # this rank's rows of the eigenvectors, rows [max(a, r0), min(b, r1)), or None


class _Team:
    """The ranks of a solve (comm None: this process alone) and the two collectives it uses."""

    def __init__(self, comm, xp):
        self.comm, self.xp = comm, xp
        self.rank, self.size = (comm.Get_rank(), comm.Get_size()) if comm is not None else (0, 1)

    def sum_disjoint(self, x):
        """x summed over the ranks, where every entry is nonzero on at most one rank (exact);
        the result is where x is (host or device)."""
        if self.size == 1:
            return x
        out = _module_of(x, self.xp).empty_like(x)
        self.comm.Allreduce(x, out)
        return out

    def gather(self, x):
        """(size, x.size): every rank's x, in rank order, where x is (host or device)."""
        if self.size == 1:
            return x[None]
        out = _module_of(x, self.xp).empty((self.size, x.size), dtype=x.dtype)
        self.comm.Allgather(x, out)
        return out


def _to_host_each(arrays, xp) -> list:
    """Host copies of the 1-D arrays (of xp), in one transfer for all of them."""
    if not arrays:
        return []
    flat = to_host(arrays[0] if len(arrays) == 1 else xp.concatenate(arrays))
    cuts = np.cumsum([a.size for a in arrays])[:-1]
    return np.split(flat, cuts)


def _module_of(x, xp):
    """numpy for a host array, else xp (the solve's array module)."""
    return np if isinstance(x, np.ndarray) else xp


def merge_tree(bounds) -> list:
    """The nodes (a, b) that enter each level of stedc_rows's merges, for leaf bounds `bounds`:
    pairs left to right, an odd last node passed up to the next level."""
    level = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    levels = [level]
    while len(level) > 1:
        up = [(level[i][0], level[i + 1][1]) for i in range(0, len(level) - 1, 2)]
        level = up + ([level[-1]] if len(level) % 2 else [])
        levels.append(level)
    return levels


def row_starts_of(n: int, nranks: int, *, device: bool = False, leaf: int | None = None) -> list:
    """The row blocks stedc_rows gives the ranks: rank r computes rows [starts[r], starts[r+1])."""
    leaf = _leaf_size(leaf, None if device else np, n, nranks)
    bounds = list(range(0, n, leaf)) + [n]
    return [bounds[i] for i in _first_leaves(len(bounds) - 1, nranks)]


def _first_leaves(nleaves: int, nranks: int) -> list:
    """The first leaf of each rank (and nleaves): contiguous groups, as even as they go."""
    return [(r * nleaves) // nranks for r in range(nranks + 1)]


def _leaf_size(leaf, xp, n: int, nranks: int) -> int:
    """Rows per leaf: the default of the array module, at most n / nranks (every rank gets a
    leaf), at least 2 (no diagonal entry is torn twice)."""
    if leaf is None:
        leaf = LEAF if xp is np else LEAF_DEVICE
    return max(min(int(leaf), -(-n // nranks)), 2)   # (xp None: the GPU's)
