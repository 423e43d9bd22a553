"""The device-extension API (hpccoll/ext.py) on the GPU: docs/examples/fused_allreduce.py, a
custom collective written on the LLBuffer headers and compiled with CuPy, gives bit for bit what
the unfused calls give (comm.Allreduce, then + bias + residual), on fresh data every call, at
odd sizes, over many calls (both parities of the double buffering, the epochs advancing on the
device), and a lost peer ends in CollectiveTimeout instead of a hang.

    mpiexec -n 2 python -m pytest --with-mpi tests/gpu/test_ext_gpu.py"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from _gpu_checks import bits as _bits
from _gpu_checks import cc  # noqa: F401 - the module's Communicator fixture
from _gpu_checks import world as _world

import hpccoll
import hpccoll.ext

pytestmark = [pytest.mark.gpu, pytest.mark.mpi(min_size=2)]

EXAMPLE = Path(__file__).resolve().parents[2] / "docs" / "examples" / "fused_allreduce.py"


def _example():
    spec = importlib.util.spec_from_file_location("fused_allreduce", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_example_is_short():
    """The paper's point: a custom collective is a few dozen lines on the primitives."""
    src = _example().SOURCE
    body = [line for line in src.splitlines() if line.strip() and not line.strip().startswith("//")]
    assert len(body) < 40, f"the example kernel has {len(body)} lines"


def test_fused_allreduce_bias_residual_is_bitwise_the_unfused_calls(cc):
    import cupy as cp

    ex = _example()
    fused = ex.FusedAllreduceResidual(cc, max_count=1 << 17)
    try:
        assert fused.sym.epoch() == 0
        calls = 0
        for it, n in enumerate([1, 3, 4, 7, 1023, 4096, 65537, 1 << 17] * 3):
            rng = np.random.default_rng([cc.rank, it, 5])
            x = cp.asarray(rng.standard_normal(n).astype(np.float32))
            common = np.random.default_rng([it, 6])  # bias and residual: the same on every rank
            bias = cp.asarray(common.standard_normal(n).astype(np.float32))
            residual = cp.asarray(common.standard_normal(n).astype(np.float32))
            out = cp.full(n, np.nan, dtype=cp.float32)
            fused(x, bias, residual, out)
            calls += 1
            t = cp.empty_like(x)
            cc.Allreduce(x, t, deterministic=True)
            want = (t + bias) + residual
            cc.synchronize()
            fused.sym.check()
            got, ref = cp.asnumpy(out), cp.asnumpy(want)
            bad = np.flatnonzero(_bits(got) != _bits(ref))
            assert bad.size == 0, f"n={n} call {it}: {bad.size} elements differ from the unfused calls"
            digests = _world().allgather(got.tobytes())
            assert len(set(digests)) == 1, f"n={n}: ranks differ"
        assert fused.sym.epoch() == calls, "one epoch per call, counted on the device"
    finally:
        fused.free()


def test_extension_api_errors():
    with pytest.raises(ValueError, match="compile_options: dtype='int8'"):
        hpccoll.ext.compile_options("int8")
    with pytest.raises(ValueError, match="nranks=9"):
        hpccoll.ext.compile_options("float32", 9)
    from mpi4py import MPI

    with hpccoll.Communicator(MPI.COMM_WORLD, backend="host") as host:
        with pytest.raises(hpccoll.HpccollError, match="needs a communicator on hpccoll's single-node cuda backend"):
            hpccoll.ext.SymmetricMemory(host, 1024)


def test_a_lost_peer_is_a_timeout_not_a_hang():
    """Rank 0 never launches: every other rank's kernel gives up after the timeout, check()
    raises CollectiveTimeout naming rank 0."""
    import cupy as cp

    ex = _example()
    c = hpccoll.Communicator(backend="cuda", timeout=2.0)
    fused = ex.FusedAllreduceResidual(c, max_count=4096)
    try:
        x = cp.ones(4096, dtype=cp.float32)
        if c.rank != 0:
            fused(x, x, x, cp.empty_like(x))
            cp.cuda.get_current_stream().synchronize()
            with pytest.raises(hpccoll.CollectiveTimeout, match="for rank 0") as info:
                fused.sym.check()
            assert info.value.peer == 0
        _world().Barrier()
    finally:
        fused.free()
        c.Free()
