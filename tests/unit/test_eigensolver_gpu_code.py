"""GPU-only pieces of the eigensolver that can be checked without a GPU: the fused CuPy
ElementwiseKernel bodies compile with NVRTC (sm_90), and the host twin of each fused step
computes what LAPACK's formulas say."""
from __future__ import annotations

import numpy as np
import pytest

from hpccoll_eigensolver.linalg import _xp, householder


def _compile(src, options=()):
    """hpccoll.ext.compile_cubin, or skip where no NVRTC is installed."""
    import hpccoll.ext
    from hpccoll import HpccollError

    try:
        return hpccoll.ext.compile_cubin(src, options)
    except HpccollError as exc:
        if "NVRTC not found" in str(exc):
            pytest.skip(str(exc))
        raise


def test_fused_kernel_bodies_compile():
    # What cupy.ElementwiseKernel generates, reduced: the parameters become locals of the body.
    src = ("extern \"C\" __global__ void hh(const double* a_, const double* x_, const double* d_, double* o_) {\n"
           "  double alpha = a_[0], xn2 = x_[0], din = d_[0]; double tau, beta, scale, dout, one;\n"
           + householder.HH_SCALARS_BODY + "\n  o_[0] = tau; o_[1] = beta; o_[2] = scale; o_[3] = dout; o_[4] = one; }\n"
           "extern \"C\" __global__ void wu(const double* w_, const double* v_, double t, double dot, double* o_) {\n"
           "  int i = threadIdx.x; double w = w_[i], v = v_[i]; double out;\n  " + householder.W_UPDATE_BODY
           + "\n  o_[i] = out; }\n")
    assert _compile(src)[:4] == b"\x7fELF"


@pytest.mark.parametrize("m", [1, 2, 7])
def test_householder_reflects_onto_e1(m):
    rng = np.random.default_rng(m)
    col = rng.standard_normal(m + 1)
    buf, scale = np.zeros(m + 3), np.zeros(1)
    householder.householder(np, col, buf, scale)
    v, d, tau, beta = buf[:m], buf[m], buf[m + 1], buf[m + 2]
    assert d == col[0] and v[0] == 1.0
    H = np.eye(m) - tau * np.outer(v, v)
    np.testing.assert_allclose(H @ col[1:], np.r_[beta, np.zeros(m - 1)], atol=1e-14)


def test_householder_of_a_zero_tail_is_the_identity():
    col = np.array([2.0, -3.0, 0.0, 0.0])
    buf, scale = np.zeros(6), np.zeros(1)
    householder.householder(np, col, buf, scale)
    assert buf[4] == 0.0 and buf[5] == -3.0  # tau = 0, beta = alpha


def test_w_update_matches_latrd():
    rng = np.random.default_rng(0)
    w, v = rng.standard_normal(9), rng.standard_normal(9)
    t = np.array([0.7])
    out = np.empty(9)
    householder.w_update(np, w, t, v, out)
    np.testing.assert_array_equal(out, w + (-0.5 * t * (w @ v)) * v)


# -- the GPU column step (sytrd_step.cu) and its host twin ---------------------------------------
def test_sytrd_step_kernels_compile():
    """sytrd_step.cu compiles with NVRTC for sm_90 with raw_module's options (sytrd_abi.h and
    hpccoll's headers on the include path)."""
    from pathlib import Path

    assert _compile(Path(_xp.HERE) / "sytrd_step.cu", _xp.module_options())[:4] == b"\x7fELF"


def test_sytrd_constants_have_one_source():
    """sytrd_abi.h is the one source of the constants sytrd_step.cu and sytrd_device.py share:
    the .cu includes it and defines none of them again, Python reads them from it (no literal
    copy), and the parser reads every #define of the header."""
    import ast
    import re
    from pathlib import Path

    from hpccoll_eigensolver.linalg import sytrd_device as sd

    here = Path(_xp.HERE)
    header = (here / sd.ABI_HEADER).read_text()
    names = re.findall(r"^#define\s+(\w+)\s", header, re.M)
    assert names and set(names) == set(sd.ABI)
    assert sd.ABI["TPB"] == 256 and sd.ABI["NW"] == 8 and sd.ABI["SY_U"] == 8
    cu = (here / "sytrd_step.cu").read_text()
    assert '#include "sytrd_abi.h"' in cu
    redefined = set(re.findall(r"^\s*#\s*define\s+(\w+)", cu, re.M)) & set(names)
    assert not redefined, f"sytrd_step.cu defines {sorted(redefined)} again: they are sytrd_abi.h's"
    assert not re.search(r"^\s*#\s*if(n?def)?\b", cu, re.M), "sytrd_step.cu has compile-time switches"
    for name in ("TPB", "SY_R", "SY_C", "SY_MAXCH"):
        assert getattr(sd, name) == sd.ABI[name]
    tree = ast.parse(Path(sd.__file__).read_text())
    literal = [t.id for node in ast.walk(tree) if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
               and isinstance(node.value.value, int) for t in node.targets if isinstance(t, ast.Name) and t.id in names]
    assert not literal, f"sytrd_device.py assigns {literal} a literal: read them from sytrd_abi.h"
    assert sd.read_abi("#define A 4\n#define B (A * 2 + 1)  // nine\n#define C (B / 2)\n") == {"A": 4, "B": 9, "C": 4}


def _standard_form(n, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    return (a + a.T) / 2


@pytest.mark.parametrize("n,nb,nprocs", [(1, 4, 1), (2, 4, 1), (37, 8, 1), (37, 8, 3), (64, 16, 2), (50, 7, 4)])
def test_sytrd_twin_matches_the_array_version(n, nb, nprocs):
    """The kernels' formulation (absolute rows, zero masks, fixed-size buffers, C v from the lower
    triangles), run for all ranks in one process, gives the tridiagonal and reflectors of
    householder.sytrd_ops on one rank; both read C's lower triangle only (the twin gets junk
    above the diagonal)."""
    from hpccoll import Communicator
    from hpccoll_eigensolver import BlockCyclic, distribute
    from hpccoll_eigensolver.linalg.sytrd import sytrd_ops
    from hpccoll_eigensolver.linalg.sytrd_device import sytrd_twin

    C = _standard_form(n, seed=n * 10 + nprocs)
    junk = np.triu(np.random.default_rng().standard_normal((n, n)), 1)
    desc = BlockCyclic(n, n, nb, nprocs)
    d, e, V, tau = sytrd_twin([distribute(np.tril(C) + junk, desc, r) for r in range(nprocs)], desc)
    with Communicator(backend="host", deterministic=True) as comm:
        if comm.size != 1:
            pytest.skip("single-process reference")
        one = BlockCyclic(n, n, nb, 1)
        V1 = np.asfortranarray(np.tril(C))            # overwritten by the reflectors
        d1, e1, tau1 = sytrd_ops(V1, one, comm, np)
    scale = np.abs(C).max()
    np.testing.assert_allclose(d, d1, atol=1e-12 * scale * n)
    np.testing.assert_allclose(e, e1, atol=1e-12 * scale * n)
    np.testing.assert_allclose(tau, tau1, atol=1e-12 * n)
    np.testing.assert_allclose(V, V1, atol=1e-10 * n)
    assert np.array_equal(V1, np.tril(V1, -1))        # column j: zeros above row j + 1
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    np.testing.assert_allclose(np.linalg.eigvalsh(T), np.linalg.eigvalsh(C), atol=1e-11 * scale * n)


def test_sytrd_twin_with_a_zero_column():
    """A column that is already reduced (zero tail: tau = 0) and an all-zero matrix."""
    from hpccoll_eigensolver import BlockCyclic, distribute
    from hpccoll_eigensolver.linalg.sytrd_device import sytrd_twin

    n = 9
    C = np.zeros((n, n))
    C[np.arange(n), np.arange(n)] = np.arange(n) + 1.0
    C[3, 4] = C[4, 3] = 2.0
    desc = BlockCyclic(n, n, 4, 2)
    d, e, V, tau = sytrd_twin([distribute(C, desc, r) for r in range(2)], desc)
    T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
    np.testing.assert_allclose(np.linalg.eigvalsh(T), np.linalg.eigvalsh(C), atol=1e-13)
    assert np.isfinite(V).all() and np.isfinite(tau).all()
    z = sytrd_twin([distribute(np.zeros((n, n)), desc, r) for r in range(2)], desc)
    assert all(np.all(x == 0) for x in (z[0], z[1], z[3]))


def test_local_comm_runs_a_solve():
    """The one-rank communicator used to compile the GPU kernels before the real communicator
    opens (warmup.py) carries a whole solve: checked here on the host path."""
    from hpccoll_eigensolver import BlockCyclic, distribute, gather, metrics, sygvd
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.warmup import local_comm

    prob = make_problem("known", 29, cond_b=10.0, seed=1)
    desc = BlockCyclic(29, 29, 8, 1)
    with local_comm() as comm:
        w, X = sygvd(distribute(prob.A, desc, 0), distribute(prob.B, desc, 0), desc, comm)
        assert metrics.eigenvalue_error(w, prob.eigenvalues) < 1e-12
        assert metrics.residual(prob.A, prob.B, gather(X, desc, comm), w) < 10


@pytest.mark.parametrize("nb,nprocs", [(1, 1), (4, 1), (7, 3), (16, 2), (64, 2), (5, 4)])
def test_layout_arithmetic_matches_the_column_table(nb, nprocs):
    """sytrd_step.cu computes local-to-global columns and the first local column after j with
    arithmetic (Layout); its twins give desc.local_cols and a search of it, for every j."""
    from hpccoll_eigensolver import BlockCyclic
    from hpccoll_eigensolver.linalg.sytrd_device import layout_first_after, layout_glob

    n = 3 * nb * nprocs + nb // 2 + 1
    desc = BlockCyclic(n, n, nb, nprocs)
    for rank in range(nprocs):
        cols = desc.local_cols(rank)
        assert [layout_glob(c, nb, nprocs, rank) for c in range(cols.size)] == cols.tolist()
        for j in range(n):
            assert layout_first_after(j, nb, nprocs, rank) == int(np.searchsorted(cols, j, side="right")), (rank, j)


def _symv_column(n, nb, nprocs, rank, j, SY_R, SY_C, SY_WIDE, SY_WIDER=0):
    """sytrd_symv's shape of column j on a rank: (local columns, row tiles, first trailing tile,
    first trailing local column, chunk width, chunks)."""
    from hpccoll_eigensolver.linalg.layout import numroc
    from hpccoll_eigensolver.linalg.sytrd_device import layout_first_after

    nloc = numroc(n, nb, rank, nprocs)
    lo = layout_first_after(j, nb, nprocs, rank)
    m = nloc - lo
    cw = 4 * SY_C if SY_WIDER and m >= SY_WIDER else 2 * SY_C if m >= SY_WIDE else SY_C
    return nloc, -(-n // SY_R), j // SY_R, lo, cw, max(1, -(-m // cw))


def _symv_units(n, nb, nprocs, rank, j, SY_R=256, SY_C=64, SY_WIDE=2048, SY_WIDER=0):
    """The work units of sytrd_symv for column j, as its code enumerates them: {(tile, chunk):
    (rows, columns)} of the busy units, and the ticket counts each busy unit computes."""
    from hpccoll_eigensolver.linalg.sytrd_device import layout_first_after as fa, layout_glob as glob

    nloc, NT, t0, lo, cw, nch = _symv_column(n, nb, nprocs, rank, j, SY_R, SY_C, SY_WIDE, SY_WIDER)
    units = {}
    for b in range((NT - t0) * nch):
        a, ch = t0 + b % (NT - t0), b // (NT - t0)
        rbase, tile_end = a * SY_R, min(n, a * SY_R + SY_R) - 1
        c0, c1 = lo + ch * cw, min(nloc, lo + ch * cw + cw)
        row_units = -(-(fa(tile_end, nb, nprocs, rank) - lo) // cw)
        if ch >= row_units:
            continue
        col_units = NT - max(t0, glob(c0, nb, nprocs, rank) // SY_R)
        cells = {(r, glob(c, nb, nprocs, rank)) for c in range(c0, c1) for r in range(rbase, tile_end + 1)
                 if r >= glob(c, nb, nprocs, rank)}
        units[(a, ch)] = (cells, row_units, col_units)
    return units


def _persistent_items(n, nb, nprocs, rank, j, SY_R=256, SY_C=64, SY_WIDE=2048, SY_WIDER=0):
    """sytrd_symv's persistent work list for column j, as its code builds it (chunkPrefix, then
    each unit's chunk by search and tile by offset): [(tile, chunk)] after the 2nb dots."""
    from hpccoll_eigensolver.linalg.sytrd_device import layout_glob as glob

    nloc, NT, t0, lo, cw, nch = _symv_column(n, nb, nprocs, rank, j, SY_R, SY_C, SY_WIDE, SY_WIDER)
    first_tile = [t0] + [glob(lo + ch * cw, nb, nprocs, rank) // SY_R for ch in range(1, nch)]
    pre = np.concatenate([[0], np.cumsum([NT - t for t in first_tile])])
    items = []
    for u in range(int(pre[-1])):
        ch = int(np.searchsorted(pre, u, side="right")) - 1
        items.append((first_tile[ch] + u - int(pre[ch]), ch))
    return items


@pytest.mark.parametrize("wide,wider", [(2048, 0), (100, 0), (100, 300)])
@pytest.mark.parametrize("n,nb,nprocs", [(1100, 64, 2), (77, 16, 2), (600, 32, 3), (700, 64, 1)])
def test_symv_persistent_list_is_the_busy_units(n, nb, nprocs, wide, wider):
    """The persistent launch's work list holds each busy unit of the rectangle launch once, plus
    chunk 0's units on the tiles no trailing column reaches (they zero their rows of y), and
    nothing else: no unit above the diagonal, none twice, its first item (t0, 0)."""
    for rank in range(nprocs):
        for j in sorted({0, 1, nb - 1, nb, 255, 256, 257, n // 2, n - 2, n - 1} & set(range(n))):
            items = _persistent_items(n, nb, nprocs, rank, j, SY_WIDE=wide, SY_WIDER=wider)
            busy = set(_symv_units(n, nb, nprocs, rank, j, SY_WIDE=wide, SY_WIDER=wider))
            zeroing = {(a, 0) for a in range(j // 256, -(-n // 256))} - busy
            assert len(items) == len(set(items)) and set(items) == busy | zeroing, (rank, j)
            assert items[0] == (j // 256, 0)


@pytest.mark.parametrize("wide,wider", [(2048, 0), (100, 0), (100, 300)])
@pytest.mark.parametrize("n,nb,nprocs", [(1100, 64, 2), (77, 16, 2), (600, 32, 3), (700, 64, 1)])
def test_symv_units_cover_the_lower_triangle_once(n, nb, nprocs, wide, wider):
    """sytrd_symv's units (enumerated as its code does) cover every lower-triangle element (i >= g)
    of the trailing local columns g > j exactly once, and the tickets each unit takes count the
    busy units of its tile and of its chunk (a wrong count would hang a finalizer or skip it)."""
    from hpccoll_eigensolver.linalg.layout import numroc
    from hpccoll_eigensolver.linalg.sytrd_device import layout_glob

    for rank in range(nprocs):
        nloc = numroc(n, nb, rank, nprocs)
        for j in sorted({0, 1, nb - 1, nb, 255, 256, 257, n // 2, n - 2, n - 1} & set(range(n))):
            units = _symv_units(n, nb, nprocs, rank, j, SY_WIDE=wide, SY_WIDER=wider)
            seen = [cell for cells, _, _ in units.values() for cell in cells]
            want = {(i, g) for g in (layout_glob(c, nb, nprocs, rank) for c in range(nloc)) if g > j
                    for i in range(g, n)}
            assert len(seen) == len(set(seen)) and set(seen) == want, (rank, j)
            for (a, ch), (_, row_units, col_units) in units.items():
                assert row_units == sum(1 for (a2, _c) in units if a2 == a), (rank, j, a)
                assert col_units == sum(1 for (_a, c2) in units if c2 == ch), (rank, j, ch)


def test_sytrd_mode_policy(monkeypatch):
    """Which column step auto picks: the fused transfers only on hpccoll's CUDA backend with the
    deterministic sentinel algorithm, one rank per GPU, more than one rank and n up to
    FUSED_MAX_N; CUDA graphs on the other device communicators; eager on the host; and a clear error
    where fused is asked for but cannot run, or the mode is unknown."""
    from types import SimpleNamespace

    from hpccoll_eigensolver.linalg import sytrd_device as sd

    import hpccoll.ext

    def comm(backend="cuda", algorithm="oneshot_sentinel", deterministic=True, per_gpu=1, size=2):
        return SimpleNamespace(backend=backend, algorithm=algorithm, deterministic=deterministic, per_gpu=per_gpu,
                               size=size)

    monkeypatch.setattr(hpccoll.ext, "ranks_per_gpu", lambda c: c.per_gpu)  # (no GPU: the fake's own count)

    big = sd.FUSED_MAX_N + 1
    assert sd.mode_for(comm(), 4096) == "fused"
    assert sd.mode_for(comm(), sd.FUSED_MAX_N) == "fused"
    assert sd.mode_for(comm(), big) == "graph"
    assert sd.mode_for(comm(size=1), 4096) == "graph"                # one rank: no transfers to fuse
    assert sd.mode_for(comm(algorithm="twoshot_ll128", deterministic=False), 4096) == "graph"
    assert sd.mode_for(comm(algorithm="twoshot_sentinel"), 4096) == "fused"
    assert sd.mode_for(comm(algorithm="oneshot_ll"), 4096) == "graph"
    assert sd.mode_for(comm(algorithm="auto"), 4096) == "graph"      # auto may pick LL: its own collectives
    assert sd.mode_for(comm(deterministic=False), 4096) == "graph"
    assert sd.mode_for(comm(per_gpu=2), 4096) == "graph"
    assert sd.mode_for(comm(backend="nccl"), 4096) == "graph"
    assert sd.mode_for(comm(backend="host"), 4096) == "eager"
    wrapped = SimpleNamespace(uncounted=comm(), backend="cuda")   # a CountingComm-like proxy
    assert sd.mode_for(wrapped, 4096) == "fused"
    assert sd.mode_for(comm(), big, "fused") == "fused"            # asked for: any n
    with pytest.raises(ValueError, match="share a GPU"):
        sd.mode_for(comm(per_gpu=2), 4096, "fused")
    with pytest.raises(ValueError, match="cuda backend"):
        sd.mode_for(comm(backend="nccl"), 4096, "fused")
    assert sd.mode_for(comm(), 4096, "graph") == "graph"
    assert sd.mode_for(comm(backend="host"), 4096, "graph") == "eager"
    assert sd.mode_for(comm(), 4096, "ops") == "ops"
    with pytest.raises(ValueError, match="sytrd='fast'"):
        sd.mode_for(comm(), 4096, "fast")


def test_secular_kernel_offsets_match_the_host_iteration():
    """dc_kernels.cu's dc_secular solves roots j0 .. j1-1 (a rank's share) into outputs 0 ..
    j1-j0-1; its host twin _secular on a slice gives the roots of the whole solve, bit for bit
    (a root's iteration does not depend on the others), so a rank's share is the whole
    solve's."""
    from hpccoll_eigensolver.linalg.stedc.secular import _secular

    rng = np.random.default_rng()
    k = 57
    d = np.sort(rng.standard_normal(k))
    z = rng.standard_normal(k)
    z /= np.linalg.norm(z)
    o_all, t_all = _secular(d, z, 0.7, np)
    for j0, j1 in [(0, 20), (20, 40), (40, 57), (56, 57)]:
        o, t = _secular(d, z, 0.7, np, j0, j1)
        assert o.tolist() == o_all[j0:j1].tolist() and t.tobytes() == t_all[j0:j1].tobytes()
    # the launch in _secular passes (d, z2, k, j0, rho, wlast, eps, steps, origin, tau)
    import re
    from pathlib import Path

    src = (Path(_xp.HERE) / "stedc" / "dc_kernels.cu").read_text()
    params = re.search(r"void dc_secular\(([^)]*)\)", src).group(1)
    names = [p.split()[-1].lstrip("*") for p in params.split(",")]
    assert names == ["d", "z2", "k", "j0", "rho", "wlast", "eps", "steps", "originOut", "tauOut"]


def test_dc_kernels_compile():
    """dc_kernels.cu (the divide and conquer's secular equation and z-hat) compiles with NVRTC
    for sm_90."""
    from pathlib import Path

    assert _compile(Path(_xp.HERE) / "stedc" / "dc_kernels.cu")[:4] == b"\x7fELF"


def test_sentinel_algorithms_are_hpccoll_names():
    """sytrd_device.SENTINEL_ALGORITHMS names hpccoll's algorithms (policy.ALGORITHMS, listed in
    docs/api.md) whose protocol is the sentinel's, every one of them."""
    from hpccoll import policy

    from hpccoll_eigensolver.linalg.sytrd_device import SENTINEL_ALGORITHMS

    assert set(SENTINEL_ALGORITHMS) == {a for a in policy.ALGORITHMS if "sentinel" in a}
