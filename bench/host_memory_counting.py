"""What counting the host solve's memory costs: the same `hpccoll-eigensolver solve` on the
host backend with NumPy's array memory counted by the memory handler (the extension _npmem),
by tracemalloc (the fallback where the extension is not built) and not at all
(--no-trace-memory), interleaved over several rounds; the median solve time of each process's
later solves (its first pays one-time costs).  Prints a table and writes
host_memory_counting.json.  CPU only.

    python3 bench/host_memory_counting.py --ranks 2 --n 1024 --rounds 3 --out /tmp/hmc
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

MODES = ("handler", "tracemalloc", "off")
# run the CLI with the handler's extension hidden, so that the meter falls back to tracemalloc
_TRACEMALLOC = ("import sys, hpccoll_eigensolver.runinfo as r; r._npmem = None; "
                "from hpccoll_eigensolver.cli import main; sys.argv[0] = 'hpccoll-eigensolver'; sys.exit(main())")


def one(mode: str, args, out: Path) -> dict:
    sibling = Path(sys.executable).with_name("mpiexec")  # the venv's MPI (the mpich wheel) first
    mpiexec = str(sibling) if sibling.exists() else shutil.which("mpiexec") or "mpiexec"
    py = [sys.executable, "-c", _TRACEMALLOC] if mode == "tracemalloc" else [sys.executable, "-m",
                                                                             "hpccoll_eigensolver.cli"]
    cmd = [mpiexec, "-n", str(args.ranks), *py, "solve", "--n", str(args.n), "--problem", args.problem,
           "--repeat", str(args.repeat), "--no-reference", "--save-vectors", "no", "--comm", "mpi",
           "--out", str(out), "--overwrite"] + (["--no-trace-memory"] if mode == "off" else [])
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    subprocess.run(cmd, check=True, capture_output=True, text=True, env=env)
    recs = [json.loads(p.read_text()) for p in sorted(out.glob("*_run*.json"))]
    mem = recs[-1]["memory"]["per_rank"]
    return {"mode": mode, "solve_s": [r["solve_seconds"] for r in recs],
            "numpy_peak_bytes": max((m.get("numpy_peak_bytes") or 0) for m in mem) or None,
            "tracemalloc_peak_bytes": max((m.get("tracemalloc_peak_bytes") or 0) for m in mem) or None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--n", type=int, default=1024)
    p.add_argument("--problem", default="known")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("host_memory_counting"))
    args = p.parse_args()
    rows = []
    for r in range(args.rounds):
        for mode in MODES:
            rows.append(dict(one(mode, args, args.out / f"{mode}-{r}"), round=r))
    print(f"host solve, n={args.n}, {args.ranks} ranks, --comm mpi, {args.rounds} rounds of {args.repeat} solves "
          f"(median of each process's solves after its first)")
    print(f"{'memory counting':<14} {'median solve s':>15} {'per round':>30} {'NumPy peak MiB':>15} "
          f"{'tracemalloc MiB':>16}")
    summary = {}
    for mode in MODES:
        mine = [row for row in rows if row["mode"] == mode]
        per = [statistics.median(row["solve_s"][1:]) for row in mine]
        summary[mode] = statistics.median(per)
        npk, tmk = mine[-1]["numpy_peak_bytes"], mine[-1]["tracemalloc_peak_bytes"]
        print(f"{mode:<14} {summary[mode]:>15.3f} {' '.join(f'{x:.3f}' for x in per):>30} "
              f"{'-' if npk is None else f'{npk / 2**20:.1f}':>15} {'-' if tmk is None else f'{tmk / 2**20:.1f}':>16}")
    for mode in ("handler", "tracemalloc"):
        print(f"{mode} / off: {summary[mode] / summary['off']:.2f}x")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "host_memory_counting.json").write_text(json.dumps(
        {"n": args.n, "ranks": args.ranks, "repeat": args.repeat, "rounds": args.rounds, "runs": rows,
         "median_solve_s": summary, "cpus": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
