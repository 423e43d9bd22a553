"""Symmetric tridiagonal eigensolver by divide and conquer (Cuppen; Gu-Eisenstat eigenvectors),
written once for NumPy and CuPy (`xp`), on one process or over the ranks of a communicator
that each compute a contiguous block of rows of the eigenvector matrix: the stedc step of the
solver without a dense solve and without an n x n matrix on any rank.

    T = [T1 0; 0 T2] + rho v v^T,   v = e_m + s e_{m+1},  s = sign(beta), rho = |beta|
    (beta = e[m-1]; T1, T2 with rho subtracted from their touching diagonal entries)
    T1 = Q1 L1 Q1^T, T2 = Q2 L2 Q2^T (recursively; leaves: dense eigh)
    T = Q (L + rho z z^T) Q^T,  z = Q^T v = [last row of Q1; s * first row of Q2]

The rank-one problem: deflation as LAPACK dlaed2 (tiny z components; nearly equal diagonal
entries, joined by Givens rotations), the secular equation f(lam) = 1 + rho sum z_i^2/(d_i - lam)
solved per root by bisection in coordinates relative to the nearer pole (so d_i - lam is
formed without cancellation), and the eigenvectors from z recomputed from the roots
(Gu-Eisenstat, as dlaed3), which keeps them numerically orthogonal.  Same arithmetic on host
and device, no atomics, reductions in a fixed order: bitwise reproducible run to run.

T is scaled to |T| ~ 1 (as dstedc: the merges' tolerances are then absolute) and torn at every
leaf boundary; the leaves are merged pairwise, bottom-up, left to right (an odd block out waits
for the next level).

Distributed (stedc_rows with a communicator): the leaves are dealt to the P ranks in contiguous
groups, and rank r keeps rows [row_starts[r], row_starts[r+1]) of every block's eigenvector
matrix on the way up: its leaves' eigenvectors, then its rows of each merge.  A merge needs
only the children's eigenvalues (replicated) and z, two rows of the children's Q.  Per level:

  one Allreduce of the level's z rows (each entry from the one rank that holds it, zeros from
  the others: an exact sum); at the first level it carries the leaves' eigenvalues too;
  the deflation, a sequential scan of k numbers, on every rank (the same bits in, the same
  decisions out);
  the secular equation's roots dealt to the ranks, one Allgather: every root is computed
  once, so every rank has the same eigenvalues, bit for bit;
  each rank its rows of the merged eigenvectors: (its rows x k) @ (k x k), the right factor
  generated from the roots in chunks of columns and never stored whole.

A rank holds at most two copies of its rows (rows x n at the top merge) and work arrays of
k x chunk_width(k) elements; the solver then delivers the eigenvectors by columns with one
Alltoallv (layout.rows_to_columns).

The steps, one module each, named as LAPACK's: tree.py (dlaed0: tear, leaves, levels of
merges), leaves.py (the dense leaf solves), merge.py (dlaed1: one level of merges),
deflation.py (dlaed2), secular.py (dlaed4), vectors.py (dlaed3), early.py (subtrees solved
before T is whole), common.py (what they share), dc_kernels.cu (their device kernels)."""
from .common import merge_tree, row_starts_of
from .early import Early, early_ranges, solve_range
from .leaves import tridiagonal_eigh, tridiagonal_matrix
from .tree import Rows, eigh_tridiagonal_dc, stedc_rows

# (the tunables - LEAF, CHUNK_*, LEAVES, EARLY_* - are read where they are defined, common.py,
# leaves.py and early.py: set them there)
__all__ = ["Early", "Rows", "early_ranges", "eigh_tridiagonal_dc", "merge_tree", "row_starts_of", "solve_range", "stedc_rows",
           "tridiagonal_eigh", "tridiagonal_matrix"]
