"""What CUDA's eager module loading costs and buys a process that solves a few times: the same
`hpccoll-eigensolver solve` (one rank) in fresh processes with CUDA_MODULE_LOADING=LAZY (CUDA's
default) and EAGER, interleaved, several rounds; per process: its wall time from start to exit,
each solve's time, the GPU memory nvidia-smi gives the process after the last solve and CuPy's
pool peak.  Prints a table and writes module_loading.json.

    python3 bench/module_loading.py --n 8192 --rounds 2 --repeat 3 --out /tmp/ml
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("LAZY", "EAGER")


def gib(x) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def one(mode: str, args, out: Path) -> dict:
    env = dict(os.environ, CUDA_MODULE_LOADING=mode)
    cmd = [sys.executable, "-m", "hpccoll_eigensolver.cli", "solve", "--n", str(args.n), "--comm", args.comm,
           "--problem", args.problem, "--repeat", str(args.repeat), "--no-reference", "--save-vectors", "no",
           "--out", str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{mode}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    recs = sorted((json.loads(p.read_text()) for p in out.glob("*_run[0-9][0-9][0-9].json")),
                  key=lambda r: r["repeat_index"])
    mem = recs[-1]["memory"]["per_rank"][0]
    return {"mode": mode, "process_wall_s": wall, "solve_s": [r["solve_seconds"] for r in recs],
            "problem_build_s": recs[0]["problem_build_seconds"],
            "nvidia_smi_used_bytes": mem.get("nvidia_smi_used_bytes"),
            "device_pool_peak_bytes": mem.get("device_pool_peak_bytes"),
            "eigenvalues_sha256": [r["eigenvalues_sha256"] for r in recs]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--comm", default="sentinel")
    ap.add_argument("--problem", default="known")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=240)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    runs = []
    for r in range(args.rounds):
        for mode in MODES if r % 2 == 0 else MODES[::-1]:
            runs.append(dict(one(mode, args, args.out / f"{mode.lower()}-{r}"), round=r))
            x = runs[-1]
            print(f"round {r} {mode:5s}: process {x['process_wall_s']:.2f} s, solves "
                  + " ".join(f"{s:.3f}" for s in x["solve_s"])
                  + f" s, nvidia-smi {gib(x['nvidia_smi_used_bytes'])} GiB", flush=True)
    print(f"\nn = {args.n}, one rank, --comm {args.comm}, --problem {args.problem}, {args.repeat} solves per "
          f"process, {args.rounds} rounds interleaved (medians over rounds)")
    print("| CUDA_MODULE_LOADING | process wall (s) | first solve (s) | later solves (s) | nvidia-smi after (GiB) |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        xs = [x for x in runs if x["mode"] == mode]
        later = [s for x in xs for s in x["solve_s"][1:]]
        print(f"| {mode} | {statistics.median(x['process_wall_s'] for x in xs):.2f} | "
              f"{statistics.median(x['solve_s'][0] for x in xs):.3f} | "
              f"{statistics.median(later) if later else float('nan'):.3f} | "
              f"{gib(statistics.median(x['nvidia_smi_used_bytes'] or 0 for x in xs) or None)} |")
    same = len({tuple(x["eigenvalues_sha256"]) for x in runs}) == 1 and \
        all(len(set(x["eigenvalues_sha256"])) == 1 for x in runs)
    print(f"eigenvalues bitwise identical in every solve of every process: {same}")
    (args.out / "module_loading.json").write_text(json.dumps({"n": args.n, "comm": args.comm, "runs": runs,
                                                              "identical": same}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
