"""Shared test setup: abort every rank when one fails under MPI; skip `gpu` tests without a GPU.

MPI tests run with `mpiexec -n N python -m pytest --with-mpi tests/mpi` (pytest-mpi skips
them without --with-mpi).  A failed assertion on one rank would leave the others waiting in
the next collective forever, so the first failure prints its report and aborts the job."""
from __future__ import annotations

import functools
import os
import socket
import sys

import numpy as np
import pytest

#: element counts every collective test runs: odd, and around power-of-two boundaries
COUNTS = (1, 7, 1023, 4097)


def _mpi_world():
    """MPI.COMM_WORLD if MPI is initialized with more than one rank, else None."""
    try:
        from mpi4py import MPI
    except ImportError:
        return None
    if not MPI.Is_initialized() or MPI.Is_finalized():
        return None
    world = MPI.COMM_WORLD
    return world if world.Get_size() > 1 else None


def pytest_runtest_logreport(report):
    """A failure on one rank must not leave the other ranks hanging: report it, then Abort."""
    if not report.failed:
        return
    world = _mpi_world()
    if world is None:
        return
    sys.stderr.write(f"\n[rank {world.Get_rank()}/{world.Get_size()}] FAILED {report.nodeid} "
                     f"({report.when}):\n{report.longreprtext}\n"
                     f"[rank {world.Get_rank()}] aborting the MPI job so the other ranks do not hang\n")
    sys.stderr.flush()
    sys.stdout.flush()
    world.Abort(1)


@functools.lru_cache(maxsize=None)
def gpu_unavailable_reason() -> str | None:
    """None when CuPy imports and sees at least one GPU, else why `gpu` tests are skipped."""
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError or a broken CUDA install
        return f"CuPy is not importable ({exc.__class__.__name__})"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # noqa: BLE001
        return f"no usable CUDA driver ({exc.__class__.__name__})"
    return None if n > 0 else "no GPU"


def pytest_configure(config):
    """HPCCOLL_TEST_NCCL_LOOPBACK=1 (GPU tests under MPI): each rank presents itself to NCCL as a
    host of its own (NCCL_HOSTID), so NCCL accepts ranks sharing one GPU and joins them through
    its socket transport on the loopback interface: NCCL's paths tested for correctness and
    timeouts on one GPU (their speed means nothing there).  Set before any NCCL communicator:
    NCCL reads its host id once per process."""
    if os.environ.get("HPCCOLL_TEST_NCCL_LOOPBACK") != "1":
        return
    from mpi4py import MPI

    os.environ["NCCL_HOSTID"] = f"{socket.gethostname()}-rank{MPI.COMM_WORLD.Get_rank()}"
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_IB_DISABLE", "1")


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` are skipped, with the reason, where CuPy or a GPU is missing."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {reason}")
    for item in gpu_items:
        item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def host_blas_threads():
    """Under MPI, each rank's host BLAS gets its share of the CPUs it shares with the node's other
    ranks, as hpccoll-eigensolver solve does (--host-threads auto; OMP_NUM_THREADS and the like,
    if set, win).  Unbound ranks that each start a thread per CPU oversubscribe the node: the
    tests' SciPy references took 32 s instead of 0.8 s in each of two ranks on 16 cores."""
    world = _mpi_world()
    if world is None:
        return None
    from hpccoll_eigensolver.runinfo import limit_host_threads

    return limit_host_threads(world, "auto")


@pytest.fixture
def cupy():
    """The cupy module, or skip the test (for GPU tests that are not marked `gpu`)."""
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"needs a GPU: {reason}")
    import cupy as cp

    return cp


@pytest.fixture(scope="module")
def comm():
    """A host-backend Communicator over COMM_WORLD, check mode off (collective; freed after)."""
    import hpccoll

    c = hpccoll.Communicator(backend="host", check=False)
    yield c
    c.Free()


def assert_still_works(c):
    """After a refused call the communicator still computes the right answer (nothing left in flight)."""
    x = np.full(5, c.rank + 1, dtype=np.int64)
    out = np.empty_like(x)
    c.Allreduce(x, out)
    assert np.all(out == c.size * (c.size + 1) // 2)


def assert_as_accurate_as_lapack(prob, w, X, what: str):
    """Residual, B-orthogonality and eigenvalue error within 2x of LAPACK sygvd's (SciPy) on
    `prob` (w, X: the solver's eigenvalues and gathered eigenvectors, on the host).  Eigenvalue
    errors are against the exact spectrum of the stored pair (metrics.stored_spectrum), not the
    one A and B were built from, whose rounding in forming them is as large as a solver's own
    error at large cond(B).  LAPACK's has a floor of n eps (metrics.lapack_reference): below
    that scale a ratio of two errors is rounding noise."""
    from hpccoll_eigensolver import metrics

    exact = metrics.stored_spectrum(prob.A, prob.B)
    res, orth, lapack = metrics.lapack_reference(prob.A, prob.B, exact)
    assert metrics.residual(prob.A, prob.B, X, w) <= 2 * res, what
    assert metrics.b_orthogonality(prob.B, X) <= 2 * orth, what
    ours = metrics.eigenvalue_error(w, exact)
    assert ours <= 2 * lapack, f"{what}: {ours:.3g} vs LAPACK {lapack:.3g} (at least n eps)"


def dtypes():
    """Every supported dtype as a pytest param; bfloat16 is skipped without ml_dtypes."""
    from hpccoll.ops import BFLOAT16

    params = [pytest.param(np.dtype(n), id=n) for n in ("float64", "float32", "float16")]
    params.append(pytest.param(BFLOAT16, id="bfloat16", marks=pytest.mark.skipif(
        BFLOAT16 is None, reason="bfloat16 needs ml_dtypes")))
    params += [pytest.param(np.dtype(n), id=n) for n in ("int32", "int64")]
    return params


# -- special values for reductions: the same data helper for the serial and the MPI tests ---------
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
NAN_BITS = {4: [0x7FC00001, 0xFFC00000, 0x7F800001, 0xFFFAFFFA, 0x7FFFFFFF],
            8: [0x7FF8000000000001, 0xFFF8000000000000, 0x7FF0000000000001, 0xFFFAFFFAFFFAFFFA]}


def special_values(rng, dtype, n):
    """Fresh values of `dtype` (float32/64, int32/64): integers over their whole range (sums and
    products wrap), floats over many magnitudes with signed zeros, infinities, the largest value,
    subnormals and NaNs of different payloads."""
    dt = np.dtype(dtype)
    if dt.kind == "i":
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, n, dtype=dt, endpoint=True)
    x = (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 30, n)).astype(dt)
    for value in (0.0, -0.0, np.inf, -np.inf, np.finfo(dt).max, np.finfo(dt).tiny / 4):
        x[rng.integers(0, n, max(1, n // 20))] = value
    hit = rng.integers(0, n, max(1, n // 10))
    x.view(UINT[dt.itemsize])[hit] = rng.choice(np.array(NAN_BITS[dt.itemsize], UINT[dt.itemsize]), hit.size)
    return x


# -- hpccoll-eigensolver's main in this process on every rank (the MPI and GPU tests of its CLI) --
@pytest.fixture
def cli_main(monkeypatch, capsys):
    """run(argv): main(argv) of hpccoll-eigensolver in this process on every rank; a hang ends the
    process (and so the job) after `timeout` seconds (default 120) instead of blocking the suite.
    Returns (status, stdout, stderr)."""
    import faulthandler

    from hpccoll_eigensolver.cli import main

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)   # main installs the job's abort hook

    def run(argv, timeout: float = 120):
        capsys.readouterr()
        faulthandler.dump_traceback_later(timeout, exit=True, file=sys.__stderr__)
        try:
            code = main([str(a) for a in argv])
        finally:
            faulthandler.cancel_dump_traceback_later()
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def agreed_error():
    """check(code, err, needles): status 2 on every rank; one error line, on rank 0, holding every
    needle."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD

    def check(code, err, needles):
        codes = world.allgather(code)
        lines = world.gather([ln for ln in err.splitlines() if "error:" in ln], root=0)
        assert codes == [2] * world.Get_size(), codes
        if world.Get_rank() == 0:
            assert len(lines[0]) == 1 and not any(lines[1:]), lines
            for needle in needles:
                assert needle in lines[0][0], (needle, lines[0][0])
    return check


# -- hard symmetric tridiagonals: the same cases for the host twin and the GPU kernels ------------
TRIDIAGONAL_CASES = ("random", "odd", "wilkinson", "glued", "tiny_e", "zero_e", "graded", "graded_wide", "cluster",
                     "one", "two", "three")


def hard_tridiagonal(case: str, rng, n: int | None = None):
    """(d, e) of one of TRIDIAGONAL_CASES, fresh random data where it has any; n: odd, 41..89
    unless given (one, two, three: n = 1, 2, 3; wilkinson and glued: their own)."""
    fixed = {"one": 1, "two": 2, "three": 3}
    n = fixed.get(case, n if n is not None else int(rng.integers(40, 90)) | 1)
    d, e = rng.standard_normal(n), rng.standard_normal(n - 1)
    if case == "odd":                             # large diagonal, small couplings
        d, e = rng.uniform(-1, 1, n) * 1e3, rng.uniform(-1, 1, n - 1) * 1e-2
    elif case == "wilkinson":                     # W21+ and larger: pairs agreeing to many digits
        n = 21 + 2 * int(rng.integers(0, 10))
        d, e = np.abs(np.arange(n) - (n - 1) / 2.0), np.ones(n - 1)
    elif case == "glued":                         # W21+ copies glued by tiny off-diagonals
        copies = int(rng.integers(3, 6))
        d = np.tile(np.abs(np.arange(21) - 10.0), copies)
        e = np.ones(21 * copies - 1)
        e[20::21] = 10.0 ** rng.uniform(-14, -8)
    elif case == "tiny_e":                        # splits (LAPACK dstebz's test) among normal couplings
        e[rng.choice(n - 1, 4, replace=False)] = 10.0 ** rng.uniform(-300, -20, 4)
    elif case == "zero_e":
        e[:] = 0.0
        d[rng.integers(0, n, 3)] = d[0]           # equal eigenvalues in different blocks
    elif case == "graded":
        d = np.geomspace(1e-8, 1e8, n) * rng.choice([-1.0, 1.0], n)
    elif case == "graded_wide":                   # the large end splits off in blocks of one row
        d = np.geomspace(1e-300, 1e300, n) * rng.choice([-1.0, 1.0], n)
    elif case == "cluster":                       # spacing ~1e-14: one tight cluster
        d = 1.0 + 1e-14 * np.arange(n) + 1e-15 * rng.standard_normal(n)
        e = 1e-15 * rng.standard_normal(n - 1)
    return d, e


def dense_tridiagonal(d, e):
    return np.diag(d) + np.diag(e, 1) + np.diag(e, -1)
