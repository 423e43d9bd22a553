"""`hpccoll-eigensolver` (any subcommand and options) in this process with the divide and
conquer's early subtrees set to another minimum size (linalg.stedc.early.EARLY_LEAVES; 0: none, so
that stedc runs whole after sytrd), to time a one-rank solve with and without them in one job:

    mpiexec -n 1 python3 bench/early_dc.py 0 solve --n 8192 --comm sentinel --out DIR ...
    mpiexec -n 1 python3 bench/early_dc.py 2@0.75 solve ...   # and EARLY_START = 0.75

The runs record the minimum (config.dc_early_leaves: it changes the bits); EARLY_START only
moves when the subtrees run, so give each start its own --out directory (same names)."""
from __future__ import annotations

import sys


def main() -> int:
    from hpccoll_eigensolver.linalg.stedc import early
    from hpccoll_eigensolver.cli import main as cli_main

    leaves, _, start = sys.argv[1].partition("@")
    early.EARLY_LEAVES = int(leaves)
    if start:
        early.EARLY_START = float(start)
    print(f"stedc.early.EARLY_LEAVES = {early.EARLY_LEAVES}, EARLY_START = {early.EARLY_START}", flush=True)
    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
