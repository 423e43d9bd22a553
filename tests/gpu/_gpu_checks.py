"""Helpers shared by the GPU test files (pytest puts this folder on sys.path).

Importing this module (every GPU test file does, at collection) also imports, before any GPU
work, the modules that the tests or CuPy import lazily later: on some GPU machines a process
that had done GPU work read source files back with NUL bytes; modules imported before the first
GPU call were never hit."""
import contextlib

import numpy as np
import pytest

for _name in ("numpy.testing", "scipy.sparse", "scipy.linalg", "cupyx", "cupyx.scipy.linalg",
              "cupyx.scipy.sparse", "torch"):
    with contextlib.suppress(Exception):  # absent modules: the tests that need them skip
        __import__(_name)


def assert_close(got, ref, rtol, atol, err_msg=""):
    """np.testing.assert_allclose without numpy.testing (whose import failed on a GPU machine)."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    ok = np.isclose(got, ref, rtol=rtol, atol=atol, equal_nan=True)
    if not ok.all():
        bad = np.flatnonzero(~ok)
        raise AssertionError(f"{err_msg}: {bad.size} of {ok.size} elements differ beyond rtol={rtol}, "
                             f"atol={atol}; first {bad[:5]}: got {got.ravel()[bad[:5]]}, want {ref.ravel()[bad[:5]]}")


def random_data(rng, dtype: str, n: int, op: str):
    """Fresh data; PROD gets values near 1 (and small ints) so products stay finite."""
    from hpccoll.ops import np_dtype

    if dtype.startswith("int"):
        hi = 3 if op == "PROD" else 1 << 20
        return rng.integers(-hi, hi, n).astype(dtype)
    x = rng.standard_normal(n)
    if op == "PROD":
        x = 1.0 + 0.01 * x
    return x.astype(np_dtype(dtype))


def bits(a):
    """The raw bits of an array, as unsigned integers of its element width."""
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


def check_bitwise(got, ref, what):
    """got == ref bit for bit, and the same bits on every rank (a digest compared across them)."""
    import hashlib

    bad = np.flatnonzero(bits(got) != bits(ref))
    assert bad.size == 0, f"{what}: {bad.size} elements differ (first: {bad[:5]})"
    digest = hashlib.sha256(np.ascontiguousarray(got).tobytes()).hexdigest()
    assert len(set(world().allgather(digest))) == 1, f"{what}: results differ across ranks"


def world():
    from mpi4py import MPI

    return MPI.COMM_WORLD


@pytest.fixture(scope="module")
def cc():
    """A CUDA-backend Communicator over MPI.COMM_WORLD, one per test module (import it into the
    module: a tests/gpu/conftest.py would shadow tests/conftest.py, which tests/mpi imports)."""
    import hpccoll

    c = hpccoll.Communicator(backend="cuda")
    assert c.backend == "cuda", "the CUDA backend did not open"
    yield c
    c.Free()
