"""Where the eager (one Python call) time goes: each layer of an Allreduce timed alone.

    mpiexec -n 2 python bench/profile_eager.py        (GPU machine)

Prints µs per call (median of 5 runs of 2000 calls), rank 0."""
from __future__ import annotations

import ctypes
import statistics
import time

import cupy as cp

import hpccoll
from hpccoll._validate import prepare
from hpccoll.backends.cuda import launch
from hpccoll.backends.cuda.driver import Module, launch_raw
from hpccoll.backends.cuda.nvrtc import compile_module


def main() -> None:
    c = hpccoll.Communicator(backend="cuda")
    b = c._backend
    x = cp.ones(1024, cp.float32)
    y = cp.empty_like(x)
    algo = "oneshot_sentinel"
    call = prepare("Allreduce", c.size, x, y, op=hpccoll.SUM)
    c.Allreduce(x, y, algorithm=algo, deterministic=True)
    c.synchronize()
    lau = launch.allreduce_launcher(b, "float32", algo, "SUM")[0]  # (its Args hold this call's buffers)
    blocks, block = launch.allreduce_grid(b, algo, x.size, 4)
    s = cp.cuda.get_current_stream()

    def t(label, fn, n=2000):
        runs = []
        for _ in range(5):
            for _ in range(50):
                fn()
            cp.cuda.runtime.deviceSynchronize()
            c.mpi_comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            runs.append((time.perf_counter() - t0) / n * 1e6)
            cp.cuda.runtime.deviceSynchronize()
        if c.rank == 0:
            print(f"{label:45s} {statistics.median(runs):8.2f} us", flush=True)

    t("hasattr(x, '__cuda_array_interface__')", lambda: hasattr(x, "__cuda_array_interface__"))
    t("prepare (validation)", lambda: prepare("Allreduce", c.size, x, y, op=hpccoll.SUM))
    t("cupy.cuda.get_current_stream()", cp.cuda.get_current_stream)
    t("ExternalStream(ptr)", lambda: cp.cuda.ExternalStream(s.ptr))
    t("stream.synchronize() (idle)", s.synchronize)
    t("backend.resolve", lambda: b.resolve("Allreduce", "float32", "SUM", 4096, True, algo))
    # the floor of any blocking call on this machine: an (almost) empty kernel + stream sync
    f_empty = Module(compile_module("sol.cu", "float32", b.arch)).fn("hc_sol_fence")
    scratch = cp.zeros(4, cp.uint64)
    p_out, p_zero = ctypes.c_void_p(scratch.data.ptr), ctypes.c_int(0)
    t("empty kernel launch (ctypes)", lambda: launch_raw(f_empty, 1, 1, s.ptr, p_out, p_zero))
    t("empty kernel launch + stream sync", lambda: (launch_raw(f_empty, 1, 1, s.ptr, p_out, p_zero),
                                                    s.synchronize()))
    t("raw ctypes launch", lambda: lau(blocks, block, s.ptr))
    t("raw ctypes launch + stream sync", lambda: (lau(blocks, block, s.ptr), s.synchronize()))
    t("backend.run", lambda: b.run(call, True, algo, None))
    t("Communicator.Allreduce", lambda: c.Allreduce(x, y, algorithm=algo, deterministic=True))
    t("Communicator.Allreduce + stream sync",
      lambda: (c.Allreduce(x, y, algorithm=algo, deterministic=True), s.synchronize()))
    t("Communicator.Allreduce + c.synchronize()",
      lambda: (c.Allreduce(x, y, algorithm=algo, deterministic=True), c.synchronize()))
    c.Free()


if __name__ == "__main__":
    main()
