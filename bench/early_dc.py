"""`hpccoll-eigensolver` (any subcommand and options) in this process with the divide and
conquer's early subtrees set to another minimum size (tridiag_dc.EARLY_LEAVES; 0: none, so
that stedc runs whole after sytrd), to time a one-rank solve with and without them in one job:

    mpiexec -n 1 python3 bench/early_dc.py 0 solve --n 8192 --comm sentinel --out DIR ...

Give the variant its own --out directory (its results have the default's names)."""
from __future__ import annotations

import sys


def main() -> int:
    from hpccoll_eigensolver import tridiag_dc
    from hpccoll_eigensolver.cli import main as cli_main

    tridiag_dc.EARLY_LEAVES = int(sys.argv[1])
    print(f"tridiag_dc.EARLY_LEAVES = {tridiag_dc.EARLY_LEAVES}", flush=True)
    return cli_main(sys.argv[2:])


if __name__ == "__main__":
    raise SystemExit(main())
