"""CPU-side proof of the device code: every source in cuda/ compiles with NVRTC for sm_90 through
the runtime's own compile path, and the SASS of the collective kernels holds no memory barrier
(MEMBAR / FENCE / ERRBAR / cache-invalidating CCTL): "barrier-free" is visible in the binary.

Needs the NVRTC, cuobjdump and nvdisasm wheels of the [test] extra; no GPU."""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys

import pytest

from hpccoll._abi import DTYPE_CODES
from hpccoll.backends.cuda import kernel_names
from hpccoll.backends.cuda.nvrtc import SOURCES, compile_module

BARRIERS = re.compile(r"\b(MEMBAR|FENCE|ERRBAR|CGAERRBAR|CCTL)\b")


def _tool(name: str) -> str:
    for base in sys.path:
        hits = glob.glob(os.path.join(base, "nvidia", "cu1*", "bin", name))
        if hits:
            return hits[0]
    found = shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: pip install -e '.[test]' (brings nvidia-cuda-cuobjdump/-nvdisasm)")
    return found


def expected_kernels(dtype: str, loop: bool = False) -> set[str]:
    return kernel_names(dtype, loop)


@pytest.fixture(scope="module")
def cubins(tmp_path_factory):
    """Compile every (source, dtype) once, into $HPCCOLL_TEST_KERNEL_CACHE when set (tests/run
    keeps one between runs), else a fresh folder.  No stale cubin can pass either way: a cached
    cubin's name holds a digest of every source in cuda/, the NVRTC version and the options."""
    old = os.environ.get("HPCCOLL_CACHE_DIR")
    kept = os.environ.get("HPCCOLL_TEST_KERNEL_CACHE")
    os.environ["HPCCOLL_CACHE_DIR"] = kept or str(tmp_path_factory.mktemp("kcache"))
    try:
        out = {dt: compile_module("collectives.cu", dt, "sm_90") for dt in DTYPE_CODES}
        out["sol"] = compile_module("sol.cu", "float32", "sm_90")
        out["loop"] = compile_module("collectives.cu", "float32", "sm_90", ("-DHC_NRANKS=2", "-DHC_LOOP_FENCE=1"))
        # the library's own builds: one per rank count (backends/cuda/kernels.py)
        for n in (2, 3):
            out[f"float32-nr{n}"] = compile_module("collectives.cu", "float32", "sm_90", (f"-DHC_NRANKS={n}",))
        out["engine-float32-nr2"] = compile_module("persistent.cu", "float32", "sm_90", ("-DHC_NRANKS=2",))
        for dt in ("float32", "bfloat16", "int64"):
            out[f"engine-{dt}"] = compile_module("persistent.cu", dt, "sm_90")
    finally:
        if old is None:
            os.environ.pop("HPCCOLL_CACHE_DIR")
        else:
            os.environ["HPCCOLL_CACHE_DIR"] = old
    return out


def test_every_source_compiles_for_sm90(cubins):
    assert set(SOURCES) == {os.path.basename(p) for p in glob.glob(
        os.path.join(os.path.dirname(__file__), "..", "..", "cuda", "*.cu"))}, "a .cu file is not in nvrtc.SOURCES"
    for name, cubin in cubins.items():
        assert cubin[:4] == b"\x7fELF", f"{name}: NVRTC did not return a cubin"


def _sass_by_function(cubin: bytes, tmp_path) -> dict[str, str]:
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    env = dict(os.environ, PATH=os.path.dirname(_tool("nvdisasm")) + os.pathsep + os.environ.get("PATH", ""))
    sass = subprocess.run([_tool("cuobjdump"), "--dump-sass", str(path)], check=True,
                          capture_output=True, text=True, env=env).stdout
    parts = re.split(r"\n\s*Function : (\S+)\n", "\n" + sass)
    return dict(zip(parts[1::2], parts[2::2]))


@pytest.mark.parametrize("dtype", list(DTYPE_CODES) + ["float32-nr2", "float32-nr3"])
def test_collective_kernels_are_barrier_free(cubins, dtype, tmp_path):
    funcs = _sass_by_function(cubins[dtype], tmp_path)
    assert set(funcs) == expected_kernels(dtype.split("-")[0])
    for name, body in funcs.items():
        hits = [line.strip() for line in body.splitlines() if BARRIERS.search(line)]
        assert not hits, f"{dtype} {name}: memory barrier in SASS: {hits[:3]}"


def test_the_checker_sees_fences(cubins, tmp_path):
    """The SoL kernel times __threadfence(): the same parser must find its MEMBAR."""
    funcs = _sass_by_function(cubins["sol"], tmp_path)
    assert any(BARRIERS.search(line) for line in funcs["hc_sol_fence"].splitlines())


def test_the_in_kernel_loop_module_fences_between_iterations(cubins, tmp_path):
    """The benchmark's in-kernel loops (iters > 1) run from the HC_LOOP_FENCE module: there every
    collective kernel has its fence between iterations (collectives.cu, loopFence), except the
    one-shot LL, which needs none; the library's module (checked above) has none.  The chains of
    captured calls (backends/cuda/fusion.py) live here only, for the same fence between their calls."""
    funcs = _sass_by_function(cubins["loop"], tmp_path)
    assert set(funcs) == expected_kernels("float32", loop=True)
    assert {n for n in funcs if n.endswith("_chain")} == {
        f"hc_allreduce_oneshot_{p}_{op}_chain" for p in ("ll", "sentinel") for op in ("sum", "prod", "max", "min")}
    for name, body in funcs.items():
        fenced = any(BARRIERS.search(line) for line in body.splitlines())
        if name.startswith("hc_allreduce_oneshot_ll_"):
            # LL slots are never re-armed and one thread owns a slot across iterations
            # (collectives.cu, oneShotLoopFence): no fence needed, none there
            assert not fenced, f"{name}: a fence in the one-shot LL loop"
        else:
            assert fenced, f"{name}: no fence in the loop module"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int64", "float32-nr2"])
def test_the_engine_module_holds_only_the_engine_and_its_one_fence(cubins, dtype, tmp_path):
    """persistent.cu includes collectives.cu for its device code but none of its entry points;
    the engine fences exactly once (every block's release before its completion word:
    cuda/persistent.cu; a block's acquire is its doorbell's load), nothing inside the Allreduce."""
    funcs = _sass_by_function(cubins[f"engine-{dtype}"], tmp_path)
    assert set(funcs) == {"hc_engine"}
    membars = [line for line in funcs["hc_engine"].splitlines() if "MEMBAR" in line]
    assert len(membars) == 1, f"{dtype}: expected the engine's one fence, found {membars}"
