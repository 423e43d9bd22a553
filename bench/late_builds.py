"""Which CuPy kernels a solve still builds after warm_up: runs `hpccoll-eigensolver` (any
subcommand and options) in this process, with every kernel build that follows warm_up printed
with its time, the kernel's name and the eigensolver frames of its call stack.

    CUPY_CACHE_DIR=$(mktemp -d) mpiexec -n 1 python3 bench/late_builds.py solve --n 8192 --comm sentinel ...

With an empty kernel cache each build is an NVRTC compile (about 0.1 s each on one H200), and
one that lands in a timed solve shows up in its time; "late builds: 0" at the end is the goal.
A build is counted where CuPy asks for a module (cupy.cuda.compiler._compile_module_with_cache,
once per kernel and process, cached on disk or not)."""
from __future__ import annotations

import re
import sys
import time
import traceback


def main() -> int:
    import cupy.cuda.compiler as compiler

    import hpccoll_eigensolver.warmup as warmup

    state = {"after": False, "count": 0}
    build = compiler._compile_module_with_cache

    def logged(source, *args, **kwargs):
        t0 = time.perf_counter()
        out = build(source, *args, **kwargs)
        if state["after"]:
            state["count"] += 1
            names = re.findall(r"__global__\s+void\s+(\w+)", source)[:3]
            frames = [f"{f.filename.rsplit('/', 1)[-1]}:{f.lineno}:{f.name}" for f in traceback.extract_stack()[:-1]
                      if ("/apps/" in f.filename or "/cupy" in f.filename) and "late_builds" not in f.filename][-9:]
            print(f"LATE BUILD {(time.perf_counter() - t0) * 1e3:.0f} ms {names} <- {' | '.join(frames)}", flush=True)
        return out

    compiler._compile_module_with_cache = logged
    warm = warmup.warm_up

    def timed_warm_up(*args, **kwargs):
        t0 = time.perf_counter()
        warm(*args, **kwargs)
        print(f"warm_up {time.perf_counter() - t0:.1f} s", flush=True)
        state["after"] = True

    warmup.warm_up = timed_warm_up   # the CLI imports it when it runs
    from hpccoll_eigensolver.cli import main as cli_main

    rc = cli_main(sys.argv[1:])
    print(f"late builds: {state['count']}", flush=True)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
