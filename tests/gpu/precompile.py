"""Compile the library's kernels for the GPU runs ahead of the tests, in parallel, into the
kernel cache (HPCCOLL_CACHE_DIR): the rank-count modules the tests open, every dtype, the
launched, loop (chains, in-kernel loops) and engine modules.  Each test process then loads
cubins instead of compiling them one by one.

    python tests/gpu/precompile.py --ranks 2,3,4 [--arch sm_90]"""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ProcessPoolExecutor

from hpccoll._abi import DTYPE_CODES
from hpccoll.backends.cuda.kernels import LOOP_FENCE


def _one(job):
    from hpccoll.backends.cuda.nvrtc import compile_module

    source, dtype, arch, defines = job
    compile_module(source, dtype, arch, defines)
    return job


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="2,3")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--jobs", type=int, default=os.cpu_count())
    a = p.parse_args()
    jobs = [("sol.cu", "float32", a.arch, ())]
    for n in (int(r) for r in a.ranks.split(",")):
        nr = (f"-DHC_NRANKS={n}",)
        for dtype in DTYPE_CODES:
            jobs += [("collectives.cu", dtype, a.arch, nr), ("collectives.cu", dtype, a.arch, nr + (LOOP_FENCE,)),
                     ("persistent.cu", dtype, a.arch, nr)]
    t0 = time.time()
    with ProcessPoolExecutor(a.jobs) as pool:
        for _ in pool.map(_one, jobs):
            pass
    print(f"precompiled {len(jobs)} modules in {time.time() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
