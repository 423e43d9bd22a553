"""Subtrees of a one-rank divide and conquer solved before T is whole, while the
tridiagonalization reduces the rest of it."""
from __future__ import annotations

import math

import numpy as np

from .common import _leaf_size, merge_tree
from .tree import eigh_tridiagonal_dc

# One rank can start the divide and conquer before T is whole: the tridiagonalization finishes
# T's rows in order, so a subtree of the merge tree whose rows [a, b) are done can be solved
# while the rest of T is still being reduced (driver.sygvd, from sytrd's host loop while the GPU
# works on the last columns), and joins the tree at its level.  The subtrees are the left
# children along the path from the root to the last leaf, [0, n/2), [n/2, 3n/4), ... for 2^k
# leaves: whole subtrees before the last leaf, each finished once T's rows up to its end are.
# EARLY_LEAVES: the fewest leaves of a subtree solved early (0: none early).  EARLY_START: the
# share of T's rows sytrd must have finished before any subtree is solved (0: each as soon as
# its rows are done; later starts leave sytrd's bandwidth-bound columns to themselves, at the
# risk of work left for after sytrd).
EARLY_LEAVES = 2
EARLY_START = 0.0


def early_ranges(n: int, *, device: bool, leaf: int | None = None, min_leaves: int | None = None) -> list:
    """The subtrees [a, b) of a one-rank stedc_rows that can be solved before T is whole (the
    comment above EARLY_LEAVES), in the order T's rows complete them; those of at least
    min_leaves leaves (default EARLY_LEAVES; 0: none)."""
    min_leaves = EARLY_LEAVES if min_leaves is None else min_leaves
    if n < 2 or min_leaves <= 0:
        return []
    leaf = _leaf_size(leaf, None if device else np, n, 1)
    levels = merge_tree(tuple(range(0, n, leaf)) + (n,))
    out, node = [], levels[-1][0]
    for below in reversed(levels[:-1]):
        if node in below:                           # passed up unmerged at this level
            continue
        i = next(i for i, x in enumerate(below) if x[0] == node[0])
        left, node = below[i], below[i + 1]
        if (left[1] - left[0]) // leaf >= min_leaves:
            out.append(left)
    return out


def solve_range(d, e, a: int, b: int, xp=np, leaf: int | None = None):
    """(w, Q) of rows [a, b) of T = (d, e) torn from its neighbours as stedc_rows tears it (the
    couplings' |e| subtracted from the end rows): a subtree for stedc_rows(early=...).  w is in
    T's units (stedc_rows scales it with the whole T); Q is (b - a) x (b - a)."""
    n = int(d.shape[0])
    if not 0 <= a < b <= n:
        raise ValueError(f"solve_range: rows [{a}, {b}) are not inside T's {n}")
    dd = xp.array(d[a:b], dtype=xp.float64, copy=True)
    if a > 0:
        dd[0] -= abs(e[a - 1])
    if b < n:
        dd[-1] -= abs(e[b - 1])
    return eigh_tridiagonal_dc(dd, e[a:b - 1], xp, leaf=leaf)


class Early:
    """The early subtrees of one one-rank solve of order n: `hooks` for the tridiagonalization,
    [(rows, fn)] with fn(d, e) to be called once T's first `rows` rows are final (d[:rows] and
    e[:rows], the coupling to the next row included: the reduction of column rows - 1 gives
    both), each solving its subtree on the caller's stream; `solved` then goes to
    stedc_rows(early=...)."""

    def __init__(self, n: int, xp, leaf: int | None = None):
        self.xp, self.leaf, self.solved = xp, leaf, {}
        ranges = early_ranges(n, device=xp is not np, leaf=leaf)
        start = min(n, math.ceil(EARLY_START * n))
        self.hooks = [(max(b, start), self._solver(a, b)) for a, b in ranges]

    def _solver(self, a: int, b: int):
        def solve(d, e):
            self.solved[(a, b)] = solve_range(d, e, a, b, self.xp, self.leaf)
        return solve
