"""The divide-and-conquer tridiagonal eigensolver (hpccoll_eigensolver.linalg.stedc) on one
process: eigenvalues against LAPACK, orthogonality and residual in units of n*eps*|T|, on the
matrices that break D&C codes (clusters, Wilkinson, graded, glued, zero couplings), with small
leaves so that every test merges several levels; bitwise reproducible; columns delivered in a
requested order; the solver's stedc="dc" path.  The distributed solve (rows over ranks) is
tested under MPI (tests/mpi/test_eigensolver_mpi.py)."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

from hpccoll_eigensolver.linalg.stedc import eigh_tridiagonal_dc

EPS = np.finfo(np.float64).eps


def _seed():
    return int(np.random.SeedSequence().entropy % (1 << 32))  # fresh each run, printed on failure


def _matrices(rng):
    n = 300
    wil = np.abs(np.arange(-50, 51)).astype(float)
    glued_d = np.tile(wil, 3)
    glued_e = np.ones(glued_d.size - 1)
    glued_e[wil.size - 1::wil.size] = 1e-10
    return {
        "random": (rng.standard_normal(n), rng.standard_normal(n - 1)),
        "random_odd": (rng.standard_normal(131), rng.standard_normal(130)),
        "tiny_couplings": (np.ones(257), np.full(256, 1e-3) * (1 + rng.random(256))),
        "wilkinson": (wil, np.ones(wil.size - 1)),
        "glued_wilkinson": (glued_d, glued_e),
        "clustered": (np.repeat([1.0, 2.0, 3.0], 100) + 1e-14 * rng.standard_normal(300), np.full(299, 1e-9)),
        "graded": (10.0 ** -np.arange(150.0), 0.5 * 10.0 ** -np.arange(149.0)),
        "zero_couplings": (rng.standard_normal(200), np.zeros(199)),
        "laplacian": (np.zeros(300), np.ones(299)),
        "random_signs_e": (rng.standard_normal(200), rng.choice([-1.0, 1.0], 199) * rng.random(199)),
    }


@pytest.mark.parametrize("leaf", [4, 16, 64])
def test_accuracy_against_lapack(leaf):
    seed = _seed()
    for name, (d, e) in _matrices(np.random.default_rng(seed)).items():
        n = d.size
        w, Z = eigh_tridiagonal_dc(d, e, leaf=leaf)
        T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
        nt = max(np.abs(d).max(), np.abs(e).max())
        ref = sl.eigh_tridiagonal(d, e, eigvals_only=True)
        msg = f"{name} n={n} leaf={leaf} seed={seed}"
        assert np.all(np.diff(w) >= 0), msg
        assert np.abs(w - ref).max() <= 10 * n * EPS * nt, msg
        assert np.linalg.norm(Z.T @ Z - np.eye(n)) <= 10 * n * EPS, msg
        # LAPACK's dstevd reaches ~0.5 n eps on these; this code 0.1-13 n eps (the Laplacian is
        # the worst): a bug shows as 1e3 or more
        assert np.linalg.norm(T @ Z - Z * w) <= 50 * n * EPS * nt, msg


@pytest.mark.parametrize("n", [1, 2, 3, 5, 64, 65, 129])
def test_small_and_boundary_sizes(n):
    rng = np.random.default_rng(n)
    d, e = rng.standard_normal(n), rng.standard_normal(max(n - 1, 0))
    w, Z = eigh_tridiagonal_dc(d, e, leaf=4)
    T = np.diag(d) + (np.diag(e, 1) + np.diag(e, -1) if n > 1 else 0)
    np.testing.assert_allclose(w, np.linalg.eigvalsh(T), atol=1e-12 * n)
    np.testing.assert_allclose(T @ Z, Z * w, atol=1e-12 * n)


def test_bitwise_reproducible_and_scale_invariant_zero():
    rng = np.random.default_rng(_seed())
    d, e = rng.standard_normal(250), rng.standard_normal(249)
    w1, Z1 = eigh_tridiagonal_dc(d, e, leaf=16)
    w2, Z2 = eigh_tridiagonal_dc(d.copy(), e.copy(), leaf=16)
    assert w1.tobytes() == w2.tobytes() and Z1.tobytes() == Z2.tobytes()
    w0, Z0 = eigh_tridiagonal_dc(np.zeros(7), np.zeros(6))
    assert np.all(w0 == 0) and np.array_equal(Z0, np.eye(7))


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="e has 5 entries, d has 5"):
        eigh_tridiagonal_dc(np.ones(5), np.ones(5))


def test_solver_with_stedc_dc_on_the_host():
    from hpccoll import Communicator
    from hpccoll_eigensolver import BlockCyclic, distribute, metrics, sygvd
    from hpccoll_eigensolver.problems import make_problem

    prob = make_problem("clustered", 150, cond_b=1e2, seed=3)
    with Communicator(backend="host", deterministic=True) as comm:
        if comm.size != 1:
            pytest.skip("single-process test")
        desc = BlockCyclic(150, 150, 16, 1)
        w, X = sygvd(distribute(prob.A, desc, 0), distribute(prob.B, desc, 0), desc, comm, stedc="dc")
        w_ref, _ = sygvd(distribute(prob.A, desc, 0), distribute(prob.B, desc, 0), desc, comm, stedc="host")
    assert metrics.eigenvalue_error(w, w_ref) < 1e-12
    assert metrics.residual(prob.A, prob.B, X, w) < 10
    assert metrics.b_orthogonality(prob.B, X) < 100


def test_deflation_rotations_in_one_gemm_equal_the_sequence():
    """_rotate applies chains of Givens rotations as one block-diagonal GEMM, in place: the same
    columns as dlaed2's one-at-a-time DROTs (column a <- c a + s b, b <- c b - s a)."""
    from hpccoll_eigensolver.linalg.stedc.deflation import _rotate

    rng = np.random.default_rng(_seed())
    Q = rng.standard_normal((40, 30))
    rots, k = [], 0
    while k < 28:  # chains of random length, with gaps between them
        length = int(rng.integers(1, 5))
        for i in range(length):
            if k + 1 >= 30:
                break
            th = rng.uniform(0, 2 * np.pi)
            rots.append((k, k + 1, np.cos(th), np.sin(th)))
            k += 1
        k += int(rng.integers(1, 3))
    want = Q.copy()
    for a, b, c, s in rots:
        qa, qb = want[:, a].copy(), want[:, b].copy()
        want[:, a] = c * qa + s * qb
        want[:, b] = c * qb - s * qa
    got = _rotate(Q, rots, np)
    assert got is Q
    np.testing.assert_allclose(Q, want, atol=1e-14)


@pytest.mark.parametrize("n,leaf", [(1, 4), (9, 4), (64, 64), (131, 16)])
def test_columns_in_the_requested_place(n, leaf):
    """stedc_rows(place=...) stores the eigenvector of w[p] in column place[p], with the bits of
    the natural order (what the solver's Alltoallv wants: the columns grouped by owner)."""
    from hpccoll_eigensolver.linalg.stedc import stedc_rows

    rng = np.random.default_rng(_seed())
    d, e = rng.standard_normal(n), rng.standard_normal(n - 1)
    w, Z = eigh_tridiagonal_dc(d, e, leaf=leaf)
    place = rng.permutation(n)
    res = stedc_rows(d, e, None, np, leaf=leaf, place=place)
    assert res.row_starts == [0, n] and res.w.tobytes() == w.tobytes()
    rows = res.take_rows()
    assert res.rows is None and rows.flags.f_contiguous
    assert rows[:, place].tobytes() == np.asfortranarray(Z).tobytes()


def test_work_arrays_stay_in_chunks(monkeypatch):
    """The secular equation, z-hat and the eigenvector columns work in chunks of CHUNK_HOST
    roots, rows or columns (the memory model's constant): chunks of 3 give the same eigenvalues
    bit for bit and the same vectors to rounding."""
    from hpccoll_eigensolver.linalg.stedc import common

    rng = np.random.default_rng(_seed())
    d, e = rng.standard_normal(200), rng.standard_normal(199)
    w, Z = eigh_tridiagonal_dc(d, e, leaf=16)
    monkeypatch.setattr(common, "CHUNK_HOST", 3)
    w2, Z2 = eigh_tridiagonal_dc(d, e, leaf=16)
    assert w2.tobytes() == w.tobytes()
    np.testing.assert_allclose(Z2, Z, atol=1e-13)


def test_rotation_chains_recognized():
    """dc_rotate's precondition (stedc.deflation._chained): every column the b of at most one rotation
    and untouched before it, every a the previous b or untouched."""
    from hpccoll_eigensolver.linalg.stedc.deflation import _chained

    r = 0.6, 0.8
    assert _chained([])
    assert _chained([(0, 3, *r), (3, 5, *r), (1, 2, *r)])
    assert not _chained([(0, 1, *r), (0, 2, *r)])        # an a seen before, not the previous b
    assert not _chained([(0, 1, *r), (2, 1, *r)])        # a b rotated twice
    assert not _chained([(0, 1, *r), (1, 2, *r), (3, 1, *r)])
    assert not _chained([(4, 4, *r)])


def _deflate_scan(D, z, rho, tol):
    """dlaed2's deflation as a plain scan over every pole: the oracle of _deflate."""
    import math
    D, z = list(D), list(z)
    keep, gone, rots, prev = [], [], [], -1
    for j in range(len(D)):
        if rho * abs(z[j]) <= tol:
            gone.append(j)
            continue
        if prev >= 0:
            t = math.hypot(z[j], z[prev])
            c, s = z[j] / t, -z[prev] / t
            if abs((D[j] - D[prev]) * c * s) <= tol:
                z[j], z[prev] = t, 0.0
                rots.append((prev, j, c, s))
                D[prev], D[j] = D[prev] * c * c + D[j] * s * s, D[prev] * s * s + D[j] * c * c
                gone.append(prev)
                prev = j
                continue
            keep.append(prev)
        prev = j
    if prev >= 0:
        keep.append(prev)
    return keep, gone, rots, D, z


def test_deflation_equals_the_scan_bit_for_bit():
    """_deflate (tests on whole arrays, a loop only through chains of rotations) makes the
    decisions, rotations and updated poles of the scan over every pole, bit for bit, on poles
    that rotate in long chains, in short ones, not at all, with tiny z components between."""
    from hpccoll_eigensolver.linalg.stedc.deflation import _deflate

    rng = np.random.default_rng(_seed())
    chains = 0
    for trial in range(400):
        n = int(rng.integers(1, 200))
        D = {0: rng.standard_normal(n),
             1: np.round(rng.standard_normal(n), 1) + 1e-16 * rng.standard_normal(n),
             2: rng.integers(0, 4, n) + 1e-15 * rng.standard_normal(n),
             3: rng.standard_normal(n)}[trial % 4]
        D = np.sort(D)
        z = rng.standard_normal(n) * np.where(rng.random(n) < 0.3, 10.0 ** rng.integers(-24, -1, n), 1.0)
        z /= max(np.linalg.norm(z), 1e-300)
        rho = float(rng.uniform(0.1, 2.0))
        tol = 8 * EPS * max(np.abs(D).max(), np.abs(z).max())
        Dg, zg = D.copy(), z.copy()
        keep, gone, rots = _deflate(Dg, zg, rho, tol)
        k2, g2, r2, D2, z2 = _deflate_scan(D, z, rho, tol)
        assert (keep, gone, rots) == (k2, g2, r2), trial
        assert Dg.tolist() == D2 and zg.tolist() == z2, trial
        chains += len(rots) > 1
    assert chains > 50   # the chains were exercised


@pytest.mark.parametrize("n,leaf", [(2, 4), (64, 4), (65, 4), (300, 16), (517, 32), (1000, 64), (4096, 256), (10000, 256)])
def test_early_ranges_are_subtrees_before_the_last_leaf(n, leaf):
    """early_ranges: consecutive from row 0, each a node of merge_tree below the root with at
    least EARLY_LEAVES leaves, none reaching the last leaf; the halves first for 2^k leaves."""
    from hpccoll_eigensolver.linalg.stedc import early_ranges, merge_tree
    from hpccoll_eigensolver.linalg.stedc.early import EARLY_LEAVES

    bounds = tuple(range(0, n, leaf)) + (n,)
    levels = merge_tree(bounds)
    assert levels[-1] == [(0, n)] and levels[0] == list(zip(bounds[:-1], bounds[1:]))
    got = early_ranges(n, device=False, leaf=leaf)
    nodes = {node for level in levels[:-1] for node in level}
    assert all(r in nodes and r[1] <= bounds[-2] and (r[1] - r[0]) // leaf >= EARLY_LEAVES for r in got)
    assert all(a == b for (_, a), (b, _) in zip([(0, 0)] + got, got))
    if n % leaf == 0 and n // leaf in (16, 64):   # 2^k equal leaves: [0, n/2), [n/2, 3n/4), ...
        assert got[:2] == [(0, n // 2), (n // 2, 3 * n // 4)]
    assert early_ranges(n, device=False, leaf=leaf, min_leaves=0) == []


@pytest.mark.parametrize("leaf", [4, 16])
def test_early_subtrees_join_the_tree(leaf):
    """stedc_rows(early=...) with every subset of early_ranges solved ahead by solve_range (the
    one-rank solver's overlap with sytrd): the same accuracy against LAPACK as the plain solve,
    eigenvalues within rounding of it, bitwise reproducible."""
    from hpccoll_eigensolver.linalg.stedc import early_ranges, solve_range, stedc_rows

    seed = _seed()
    for name, (d, e) in _matrices(np.random.default_rng(seed)).items():
        n = d.size
        ranges = early_ranges(n, device=False, leaf=leaf, min_leaves=1)
        T = np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
        nt = max(np.abs(d).max(), np.abs(e).max())
        w0, _ = eigh_tridiagonal_dc(d, e, leaf=leaf)
        for subset in (ranges, ranges[:1], ranges[1::2]):
            msg = f"{name} n={n} leaf={leaf} early={subset} seed={seed}"
            runs = []
            for _ in range(2):
                early = {r: solve_range(d, e, *r, leaf=leaf) for r in subset}
                res = stedc_rows(d, e, None, np, leaf=leaf, early=early)
                runs.append((res.w, res.take_rows()))
            (w, Z), (w2, Z2) = runs
            assert w.tobytes() == w2.tobytes() and Z.tobytes() == Z2.tobytes(), msg
            assert np.all(np.diff(w) >= 0), msg
            assert np.abs(w - w0).max() <= 10 * n * EPS * nt, msg
            assert np.linalg.norm(Z.T @ Z - np.eye(n)) <= 10 * n * EPS, msg
            assert np.linalg.norm(T @ Z - Z * w) <= 50 * n * EPS * nt, msg


def test_early_subtrees_bad_input():
    """Early subtrees that are not subtrees, overlap, have the wrong shape, or come with
    several ranks are refused by name; solve_range checks its rows."""
    from hpccoll_eigensolver.linalg.stedc import solve_range, stedc_rows
    from hpccoll_eigensolver.linalg.stedc.tree import _early_nodes

    rng = np.random.default_rng(_seed())
    d, e = rng.standard_normal(64), rng.standard_normal(63)
    ok = solve_range(d, e, 0, 32, leaf=8)
    with pytest.raises(ValueError, match=r"\[0, 24\) are not a subtree"):
        stedc_rows(d, e, None, np, leaf=8, early={(0, 24): solve_range(d, e, 0, 24, leaf=8)})
    with pytest.raises(ValueError, match=r"\[0, 64\) are not a subtree below the root"):
        stedc_rows(d, e, None, np, leaf=8, early={(0, 64): solve_range(d, e, 0, 64, leaf=8)})
    with pytest.raises(ValueError, match="overlap"):
        stedc_rows(d, e, None, np, leaf=8, early={(0, 32): ok, (0, 16): solve_range(d, e, 0, 16, leaf=8)})
    with pytest.raises(ValueError, match=r"eigenvectors of rows \[0, 32\) are \(16, 16\)"):
        stedc_rows(d, e, None, np, leaf=8, early={(0, 32): solve_range(d, e, 0, 16, leaf=8)})
    with pytest.raises(ValueError, match="one rank"):
        _early_nodes({(0, 32): ok}, tuple(range(0, 65, 8)), 1.0, 2, np)
    with pytest.raises(ValueError, match=r"rows \[40, 70\) are not inside T's 64"):
        solve_range(d, e, 40, 70)


def test_solver_early_subtrees_are_scheduling_only():
    """sygvd on one rank solves the divide and conquer's early subtrees from sytrd's hooks: the
    same bits as a solve that runs every hook after the tridiagonalization, and accurate."""
    from hpccoll import Communicator
    from hpccoll_eigensolver import BlockCyclic
    from hpccoll_eigensolver.counting import PhaseTimer
    from hpccoll_eigensolver.problems import make_problem
    from hpccoll_eigensolver.linalg.driver import _stedc, sygvd, tridiagonalize
    from hpccoll_eigensolver.linalg.stedc import Early, early_ranges

    rng = np.random.default_rng(_seed())
    n, nb = int(rng.integers(300, 420)), int(rng.choice([16, 32]))
    prob = make_problem("known", n, cond_b=1e3, seed=int(rng.integers(1 << 30)), xp=np)
    A, B = np.asfortranarray(prob.A), np.asfortranarray(prob.B)
    desc = BlockCyclic(n, n, nb, 1)
    with Communicator(backend="host", deterministic=True) as comm:
        w, X = sygvd(A, B, desc, comm)
        early = Early(n, np)
        assert early.hooks, "n >= 256 has early subtrees"
        d, e, _, _, _ = tridiagonalize(A, B, desc, comm, np, PhaseTimer(np, comm))
        for _, fn in early.hooks:
            fn(d, e)
        assert set(early.solved) == set(early_ranges(n, device=False))
        w2, _ = _stedc(d, e, desc, comm, np, True, "dc", early.solved)
    assert np.asarray(w).tobytes() == np.asarray(w2).tobytes()
    ref = prob.eigenvalues
    np.testing.assert_allclose(w, ref, rtol=0, atol=1e-11 * np.abs(ref).max())


@pytest.mark.parametrize("start", [0.0, 0.3, 0.75, 1.0])
def test_early_hooks_wait_for_the_start_share(monkeypatch, start):
    """Early's hooks ask for a subtree's rows, and with EARLY_START for at least that share of
    T's rows too (never more than n): the same subtrees, solved later, the same bits."""
    from hpccoll_eigensolver.linalg.stedc import Early, early_ranges, stedc_rows
    from hpccoll_eigensolver.linalg.stedc import early as early_module

    rng = np.random.default_rng(_seed())
    n = int(rng.integers(600, 1100))
    d, e = rng.standard_normal(n), rng.standard_normal(n - 1)
    monkeypatch.setattr(early_module, "EARLY_START", start)
    early = Early(n, np)
    ranges = early_ranges(n, device=False)
    assert [rows for rows, _ in early.hooks] == [min(n, max(b, int(np.ceil(start * n)))) for _, b in ranges]
    for _, fn in early.hooks:
        fn(d, e)
    res = stedc_rows(d, e, None, np, early=early.solved)
    monkeypatch.setattr(early_module, "EARLY_START", 0.0)
    again = Early(n, np)
    for _, fn in again.hooks:
        fn(d, e)
    res0 = stedc_rows(d, e, None, np, early=again.solved)
    assert res.w.tobytes() == res0.w.tobytes() and res.take_rows().tobytes() == res0.take_rows().tobytes()
