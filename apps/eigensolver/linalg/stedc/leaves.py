"""The leaves of the divide and conquer (LAPACK dstedc's dense solves at the bottom of the tree):
the eigenpairs of each torn diagonal block, batched; and the dense solves of a whole
tridiagonal (stedc="host" / "gpu")."""
from __future__ import annotations

import numpy as np

from .._xp import has_cusolver, kept_streams, syev_batched, to_host

# Where a GPU solve computes its leaves: "batched" (every equal-size leaf in one
# cusolverDnXsyevBatched, where the loaded cuSOLVER has it; else as "device"), "device" (cuSOLVER
# syevd, one leaf per call on STREAMS streams) or "host" (LAPACK's MRRR tridiagonal solver per
# leaf, then one upload).
LEAVES = "batched"
# Device leaves go round-robin over this many streams: one syevd of a leaf is a chain of small
# kernels that leaves most of the GPU idle, and the leaves are independent (the same bits on
# any stream).
STREAMS = 4


def _leaves(d, e, bounds, xp):
    """(w, Q) of every leaf [bounds[i], bounds[i+1]) of the torn (d, e), in order (bounds[0] = 0):
    on the host, or on the GPU by cuSOLVER or (LEAVES = "host") by LAPACK."""
    if xp is not np and LEAVES == "host":
        return _leaves_on_host(d, e, bounds, xp)
    return _dense_batch(d, e, bounds, xp)


def _dense(d, e, xp):
    return xp.linalg.eigh(tridiagonal_matrix(xp, d, e))


def _dense_batch(d, e, bounds, xp):
    """eigh of every leaf [bounds[i], bounds[i+1]) (d already torn): the equal-size leaves in one
    batched call - on the host NumPy's, on the GPU below 33 rows CuPy's (syevjBatched), above
    it cusolverDnXsyevBatched (LEAVES = "batched", where cuSOLVER has it) - and one call each
    otherwise (a shorter last leaf; on the GPU LEAVES = "device": one syevd per leaf on STREAMS
    streams)."""
    out = []
    sizes = [bounds[i + 1] - bounds[i] for i in range(len(bounds) - 1)]
    m = sizes[0]                                  # every leaf but maybe the last has m rows
    nb = len(sizes) if sizes[-1] == m else len(sizes) - 1
    if xp is np or m <= 32:
        how = "eigh"
    elif LEAVES == "batched" and has_cusolver("cusolverDnXsyevBatched"):
        how = "syev_batched"
    else:
        how = None
    if how and m >= 2:
        T = xp.zeros((nb, m, m))
        idx = xp.arange(m)
        T[:, idx, idx] = d[:nb * m].reshape(nb, m)
        ep = xp.concatenate([e, xp.zeros(1)])            # e has n - 1 entries: pad the last leaf's
        ee = ep[:nb * m].reshape(nb, m)[:, :m - 1]
        T[:, idx[1:], idx[:-1]] = ee
        T[:, idx[:-1], idx[1:]] = ee
        w, Q = xp.linalg.eigh(T) if how == "eigh" else syev_batched(xp, T)
        out = [(w[i], Q[i]) for i in range(nb)]
        rest = range(nb, len(sizes))
    else:
        rest = range(len(sizes))
    ranges = [(bounds[i], bounds[i + 1]) for i in rest]
    if xp is not np and STREAMS > 1 and len(ranges) > 1:
        return out + _dense_on_streams(d, e, ranges, xp)
    for a, b in ranges:
        out.append(_dense(d[a:b], e[a:b - 1], xp))
    return out


def _dense_on_streams(d, e, ranges, xp):
    """_dense of every (a, b) leaf, round-robin over STREAMS streams that start after the
    current stream's work and that it then waits for (no host sync)."""
    cur = xp.cuda.get_current_stream()
    streams = kept_streams("dc leaves", STREAMS)
    ready = cur.record()
    used = streams[:len(ranges)]
    for s in used:
        s.wait_event(ready)
    out = []
    for i, (a, b) in enumerate(ranges):
        with used[i % len(used)]:
            out.append(_dense(d[a:b], e[a:b - 1], xp))
    for s in used:
        cur.wait_event(s.record())
    return out


def _leaves_on_host(d, e, bounds, xp):
    """(w, Q) per leaf [bounds[i], bounds[i+1]) of the torn T, by LAPACK on the host (MRRR,
    scipy.linalg.eigh_tridiagonal), uploaded in one copy."""
    import scipy.linalg as sl

    dh, eh = to_host(d), to_host(e)
    parts = [sl.eigh_tridiagonal(dh[a:b], eh[a:b - 1]) if b - a > 1 else (dh[a:b], np.ones((1, 1)))
             for a, b in zip(bounds[:-1], bounds[1:])]
    flat = xp.asarray(np.concatenate([np.concatenate([w, Q.ravel()]) for w, Q in parts]))
    out, at = [], 0
    for w, Q in parts:
        m = w.size
        out.append((flat[at:at + m], flat[at + m:at + m + m * m].reshape(m, m)))
        at += m + m * m
    return out


def tridiagonal_matrix(xp, d, e):
    """The dense symmetric tridiagonal matrix with diagonal d and off-diagonal e."""
    T = xp.diag(d)
    if d.shape[0] > 1:
        i = xp.arange(d.shape[0] - 1)
        T[i + 1, i] = e
        T[i, i + 1] = e
    return T


def tridiagonal_eigh(d: np.ndarray, e: np.ndarray):
    """Eigenvalues (ascending) and eigenvectors of the symmetric tridiagonal (d, e): LAPACK dstevd
    (divide and conquer, the 'stedc' step), on the host, float64."""
    from scipy.linalg.lapack import dstevd

    n = d.size
    if n == 1:
        return d.copy(), np.ones((1, 1))
    w, z, info = dstevd(np.array(d, dtype=np.float64), np.array(e, dtype=np.float64), compute_v=1)
    if info != 0:
        raise RuntimeError(f"dstevd failed with info={info}")
    return w, z
