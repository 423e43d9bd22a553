"""`hpccoll-eigensolver` (any subcommand and options) in this process with the host time of each
of the divide and conquer's early subtrees printed as sytrd's loop solves it (one rank; the
subtree's kernels are queued on the caller's stream, so the time is the host's: its Python,
its deflation, and any wait, such as a kernel's first load):

    mpiexec -n 1 python3 bench/early_hook_times.py solve --n 8192 --comm sentinel --repeat 3 ...

prints `[early] rows [a, b): host S s` before each run's line (the first lines are warm_up's own
small solve)."""
from __future__ import annotations

import sys
import time


def main() -> int:
    from hpccoll_eigensolver import tridiag_dc
    from hpccoll_eigensolver.cli import main as cli_main

    made = tridiag_dc.Early._solver

    def timed_solver(self, a: int, b: int):
        solve = made(self, a, b)

        def timed(d, e):
            t0 = time.perf_counter()
            solve(d, e)
            print(f"[early] rows [{a}, {b}): host {time.perf_counter() - t0:.4f} s", flush=True)
        return timed

    tridiag_dc.Early._solver = timed_solver
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
