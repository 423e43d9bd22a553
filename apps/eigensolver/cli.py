"""hpccoll-eigensolver: solve / compare / report.

  mpiexec -n P hpccoll-eigensolver solve --n 4096 --problem known --comm mpi --repeat 3 --out DIR
  hpccoll-eigensolver compare --n 4096 --ranks 3 --repeat 5 --comm sentinel,ll128,nccl,mpi --out DIR
  hpccoll-eigensolver report DIR
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from .runinfo import COMM_CHOICES

SCIPY_REFERENCE_MAX_N = 4096


# -- shared by solve and the anchors ---------------------------------------------------
def add_problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=int, default=1024, help="matrix order (ignored for file:)")
    p.add_argument("--problem", default="known",
                   help="known | clustered | wilkinson | random | file:A.npy,B.npy (default known)")
    p.add_argument("--cond-b", type=float, default=1e3, help="2-norm condition number of B (default 1e3)")
    p.add_argument("--seed", type=int, default=0, help="problem seed (default 0)")
    p.add_argument("--nb", type=int, default=64, help="block size (default 64)")
    p.add_argument("--repeat", type=int, default=1, help="solves of the same problem (default 1)")
    p.add_argument("--out", default=None, help="directory for one JSON per run (rank 0 writes)")
    p.add_argument("--save-vectors", choices=("auto", "yes", "no"), default="auto",
                   help="also write the gathered X as .npy (auto: when n <= 4096)")
    p.add_argument("--no-reference", action="store_true",
                   help=f"skip scipy.linalg.eigh(A, B) (done by default when n <= {SCIPY_REFERENCE_MAX_N})")


def problem_tag(problem: str) -> str:
    return "file" if problem.startswith("file:") else problem


def run_stem(args, n: int, ranks: int, comm: str, r: int) -> str:
    return f"{problem_tag(args.problem)}_n{n}_p{ranks}_{comm}_run{r:03d}"


def load_problem_on_root(args, rank: int, mpi_comm):
    """The Problem on rank 0 (None elsewhere) and n everywhere; a failure raises on every rank."""
    prob, err = None, None
    if rank == 0:
        try:
            prob = make_problem_cached(args)
        except Exception as exc:  # noqa: BLE001 - forwarded to every rank
            err = f"{type(exc).__name__}: {exc}"
    n, err = mpi_comm.bcast((prob.n if prob is not None else None, err), root=0)
    if err:
        raise SystemExit(f"hpccoll-eigensolver: problem {args.problem!r}: {err}")
    return prob, n


def make_problem_cached(args):
    """The problem of args, read from $HPCCOLL_EIG_PROBLEM_CACHE when set (see problems.cached_problem)."""
    from .problems import cached_problem

    return cached_problem(args.problem, args.n, cond_b=args.cond_b, seed=args.seed,
                          cache_dir=os.environ.get("HPCCOLL_EIG_PROBLEM_CACHE") or None)


def reference_eigenvalues(prob, args):
    """(scipy.linalg.eigh(A, B) eigenvalues or None, seconds) on the host."""
    if args.no_reference or prob.n > SCIPY_REFERENCE_MAX_N:
        return None, None
    from scipy.linalg import eigh

    t0 = time.perf_counter()
    w = eigh(prob.A, prob.B, eigvals_only=True)
    return w, time.perf_counter() - t0


def accuracy(xp, A, B, X, w, known, ref) -> dict:
    from . import metrics

    return {"residual": metrics.residual(A, B, X, w),
            "b_orthogonality": metrics.b_orthogonality(B, X),
            "eigenvalue_error": metrics.eigenvalue_error(w, known),
            "eigenvalue_error_vs_scipy": metrics.eigenvalue_error(w, ref),
            "eigenvalue_error_definition": metrics.EIGENVALUE_ERROR_DEFINITION}


def write_run(out: str | None, stem: str, record: dict, X=None) -> str | None:
    """Write stem.json (and stem_X.npy when X is given) under out; returns the JSON path."""
    if not out:
        return None
    os.makedirs(out, exist_ok=True)
    if X is not None:
        from ._xp import to_host

        np.save(os.path.join(out, stem + "_X.npy"), np.ascontiguousarray(to_host(X), dtype=np.float64))
        record["eigenvectors_file"] = stem + "_X.npy"
    path = os.path.join(out, stem + ".json")
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return path


def save_vectors(args, n: int) -> bool:
    return args.save_vectors == "yes" or (args.save_vectors == "auto" and n <= SCIPY_REFERENCE_MAX_N)


def progress(total: int, desc: str, enabled: bool):
    """A tqdm bar on rank 0 when stderr is a terminal, else None."""
    if not (enabled and sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, leave=False, file=sys.stderr)


def print_run(rec: dict) -> None:
    ph = " ".join(f"{k} {v:.3f}" for k, v in rec["phases"].items())
    coll = rec.get("collectives") or {}
    ev = rec.get("eigenvalue_error")
    ref = rec.get("eigenvalue_error_vs_scipy")
    print(f"[{rec['comm']} {rec['ranks']}r run {rec['repeat_index']}] n={rec['n']} solve {rec['solve_seconds']:.3f}s "
          f"({ph}); collectives {coll.get('count', 0)} calls {coll.get('bytes', 0) / 2**20:.1f} MiB "
          f"{100 * (coll.get('share_of_solve') or 0):.1f}% of time; residual {rec['residual']:.3g} "
          f"B-orth {rec['b_orthogonality']:.3g} eig-err(known) {ev if ev is None else f'{ev:.3g}'} "
          f"eig-err(scipy) {ref if ref is None else f'{ref:.3g}'}; w {rec['eigenvalues_sha256'][:16]} "
          f"X {rec['eigenvectors_sha256'][:16]}", flush=True)


# -- solve ---------------------------------------------------------------------------------
def cmd_solve(args) -> int:
    from mpi4py import MPI

    from hpccoll import HpccollError

    from . import metrics
    from ._xp import sync, to_host
    from .counting import CountingComm, PhaseTimer
    from .layout import BlockCyclic, distribute, gather
    from hpccoll.bench import git_commit

    from .runinfo import machine_info, make_communicator, select_device
    from .solver import PHASES, sygvd

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    xp, dev = select_device(world)
    if xp.__name__ == "cupy":
        from .warmup import warm_up

        from .solver import stedc_choice

        # compile CuPy's kernels before the communicator opens (the solver the solve will use)
        warm_up(stedc=stedc_choice(args.stedc, args.n, device=True))
    try:
        comm = make_communicator(args.comm, world, dev)
    except HpccollError as exc:
        if rank == 0:
            print(f"hpccoll-eigensolver: --comm {args.comm} cannot run here: {exc}", file=sys.stderr)
        return 2
    prob, n = load_problem_on_root(args, rank, world)
    # Setup traffic goes through the plain communicator (host arrays) and is not counted.
    A = np.ascontiguousarray(prob.A) if rank == 0 else np.empty((n, n))
    B = np.ascontiguousarray(prob.B) if rank == 0 else np.empty((n, n))
    comm.Bcast(A, root=0)
    comm.Bcast(B, root=0)
    desc = BlockCyclic(n, n, args.nb, size)
    A_loc = xp.asarray(distribute(A, desc, rank))
    B_loc = xp.asarray(distribute(B, desc, rank))
    ref, ref_s = reference_eigenvalues(prob, args) if rank == 0 else (None, None)
    if rank == 0:
        A_d, B_d = xp.asarray(A), xp.asarray(B)
        info = machine_info(xp)
        commit = git_commit()
    del A, B
    from .sytrd_device import mode_for
    sytrd_mode = mode_for(comm, n) if xp.__name__ == "cupy" else "ops"
    for r in range(args.repeat):
        cc = CountingComm(comm, sync_each=not args.no_sync_collectives)
        bar = progress(len(PHASES), f"{args.comm} run {r}", rank == 0)
        timer = PhaseTimer(xp, cc, bar)
        world.Barrier()
        t0 = time.perf_counter()
        w, X = sygvd(A_loc, B_loc, desc, cc, timer=timer, stedc=args.stedc)
        sync(xp)
        solve_s = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        Xg = gather(X, desc, comm)
        mine = (metrics.sha256(w), metrics.sha256(xp.ascontiguousarray(X)))
        digests = world.gather(mine, root=0)
        if rank != 0:
            del Xg
            continue
        summary = cc.summary()
        total = summary.get("total", {})
        count = sum(v["count"] for v in total.values())
        nbytes = sum(v["bytes"] for v in total.values())
        secs = sum(v["seconds"] for v in total.values())
        rec = {
            "schema": "hpccoll-eigensolver/run/1",
            "n": n, "nb": args.nb, "ranks": size, "comm": args.comm, "backend": comm.backend,
            "stedc": args.stedc,
            "sytrd_mode": sytrd_mode,
            "device": "gpu" if xp.__name__ == "cupy" else "cpu",
            "problem": args.problem, "cond_b": args.cond_b, "seed": args.seed,
            "repeat_index": r, "repeat": args.repeat,
            "eigenvalues_sha256": metrics.sha256(w),
            "eigenvectors_sha256": metrics.sha256(Xg),
            "per_rank": [{"rank": i, "eigenvalues_sha256": dw, "local_eigenvectors_sha256": dx}
                         for i, (dw, dx) in enumerate(digests)],
            "ranks_agree_on_eigenvalues": len({dw for dw, _ in digests}) == 1,
            **accuracy(xp, A_d, B_d, Xg, w, prob.eigenvalues, ref),
            "reference_seconds": ref_s,
            "phases": dict(timer.seconds), "solve_seconds": solve_s,
            "collectives": {"count": count, "bytes": nbytes, "seconds": secs,
                            "share_of_solve": secs / solve_s if solve_s else None,
                            "timed_with_device_sync": cc.sync_each,
                            # phases whose collectives ran inside CUDA graphs: their seconds are
                            # n x (time per collective in a graph of that collective alone)
                            "estimated_in_phases": sorted(cc.estimated),
                            "by_phase": {k: v for k, v in summary.items() if k != "total"},
                            "by_name": total, "sizes": cc.size_histogram()},
            "machine": info, "git_commit": commit,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "eigenvalues": [float(x) for x in to_host(w)],
            "eigenvectors_file": None,
        }
        print_run(rec)
        path = write_run(args.out, run_stem(args, n, size, args.comm, r), rec,
                         Xg if save_vectors(args, n) else None)
        if path:
            print(f"  wrote {path}", flush=True)
        del Xg
    if sytrd_mode == "fused":
        from .sytrd_device import release_fused

        release_fused(comm)  # the fused transfers' IPC-mapped workspace, before the communicator's
    comm.Free()
    return 0


# -- compare / report --------------------------------------------------------------------------
def find_mpiexec() -> list[str]:
    """mpiexec next to sys.executable, else on PATH; with Open MPI's root/oversubscribe flags."""
    import shutil
    import subprocess

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else shutil.which("mpiexec")
    if exe is None:
        raise SystemExit("hpccoll-eigensolver compare: no mpiexec next to python or on PATH: pip install mpich")
    try:
        ver = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
        text = ver.stdout + ver.stderr
    except (OSError, subprocess.SubprocessError):
        text = ""
    if "Open MPI" in text or "OpenRTE" in text or "open-mpi" in text.lower():
        # --bind-to none: Open MPI binds each of <= 2 ranks to one core by default, which would
        # leave rank 0's LAPACK/BLAS work (problem setup, stedc on the host) one thread.
        return [exe, "--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]
    return [exe]


def _problem_argv(args) -> list[str]:
    return ["--n", str(args.n), "--problem", args.problem, "--cond-b", repr(args.cond_b),
            "--seed", str(args.seed), "--nb", str(args.nb), "--repeat", str(args.repeat),
            "--out", args.out, "--save-vectors", args.save_vectors] + (
        ["--no-reference"] if args.no_reference else [])


def _launch(label: str, cmd: list[str], args) -> None:
    import subprocess

    print(f"== {label}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        os.makedirs(args.out, exist_ok=True)
        rec = {"schema": "hpccoll-eigensolver/failure/1", "comm": label, "ranks": args.ranks, "n": args.n,
               "problem": args.problem, "returncode": proc.returncode, "command": cmd,
               "error": proc.stdout[-4000:], "seconds": time.perf_counter() - t0}
        path = os.path.join(args.out, f"failed_{problem_tag(args.problem)}_n{args.n}_p{args.ranks}_{label}.json")
        with open(path, "w") as f:
            json.dump(rec, f, indent=1)
        print(f"== {label} failed (exit {proc.returncode}); recorded in {path}", flush=True)


def cmd_compare(args) -> int:
    from .report import build_report

    mpiexec = find_mpiexec()
    me = [sys.executable, "-m", "hpccoll_eigensolver.cli"]
    solve_opts = ["--stedc", args.stedc] + (["--no-sync-collectives"] if args.no_sync_collectives else [])
    for choice in [c.strip() for c in args.comm.split(",") if c.strip()]:
        if choice not in COMM_CHOICES:
            raise SystemExit(f"compare: --comm {choice!r}: use a comma list of {', '.join(COMM_CHOICES)}")
        _launch(choice, mpiexec + ["-n", str(args.ranks)] + me + ["solve", "--comm", choice]
                + solve_opts + _problem_argv(args), args)
    if args.cusolvermp:
        _launch("cusolvermp", mpiexec + ["-n", str(args.ranks)] + me + ["anchor", "cusolvermp"]
                + _problem_argv(args), args)
    if args.single_gpu:
        _launch("single-gpu", me + ["anchor", "single-gpu"] + _problem_argv(args), args)
    paths = build_report(args.out)
    print("report: " + ", ".join(paths))
    return 0


def cmd_report(args) -> int:
    from .report import build_report

    paths = build_report(args.dir)
    print("report: " + ", ".join(paths))
    return 0


def cmd_anchor(args) -> int:
    if args.which == "single-gpu":
        from .anchors import run_single_gpu

        return run_single_gpu(args)
    from .cusolvermp import run_cusolvermp

    return run_cusolvermp(args)


def add_solve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-sync-collectives", action="store_true",
                   help="do not sync the device around each collective: the solve is timed as it runs "
                        "in production, the collectives' own times are then launch times only")
    p.add_argument("--stedc", choices=("auto", "host", "gpu", "dc"), default="auto",
                   help="how the tridiagonal eigenproblem is solved: host: LAPACK dstevd on rank 0; gpu: "
                        "cuSOLVER syevd of the dense tridiagonal on rank 0 (device arrays only); dc: "
                        "hpccoll_eigensolver's divide and conquer on the arrays' device (tridiag_dc.py), "
                        "its two halves on ranks 0 and 1, the top merge on every rank; "
                        "auto (default) = on GPUs dc from n=4096 (3.5x faster than gpu at n=8192 on H200, "
                        "bench/results/eigensolver), gpu below; host without GPUs")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hpccoll-eigensolver",
                                description="Distributed generalized symmetric eigensolver (sygvd) on hpccoll")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solve", help="solve A x = lambda B x under mpiexec; one JSON per run")
    add_problem_args(s)
    s.add_argument("--comm", choices=tuple(COMM_CHOICES), default="auto",
                   help="collective path: mpi (host backend), nccl, sentinel, ll, ll128, auto")
    add_solve_args(s)
    s.set_defaults(fn=cmd_solve)
    c = sub.add_parser("compare", help="run solve for several --comm paths under mpiexec, then report")
    add_problem_args(c)
    c.add_argument("--ranks", type=int, default=2, help="MPI ranks per configuration (default 2)")
    c.add_argument("--comm", default="sentinel,ll128,nccl,mpi", help="comma list of --comm paths")
    add_solve_args(c)
    c.add_argument("--cusolvermp", action="store_true", help="also run cuSOLVERMp sygvd (GPU)")
    c.add_argument("--single-gpu", action="store_true", help="also run the one-GPU CuPy anchor")
    c.set_defaults(fn=cmd_compare)
    r = sub.add_parser("report", help="(re)build report.md / report.json / plots from a directory of runs")
    r.add_argument("dir")
    r.set_defaults(fn=cmd_report)
    a = sub.add_parser("anchor", help="(used by compare) run a GPU reference solver")
    a.add_argument("which", choices=("single-gpu", "cusolvermp"))
    add_problem_args(a)
    a.set_defaults(fn=cmd_anchor)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "n", 1) < 1:
        raise SystemExit("--n must be >= 1")
    if getattr(args, "nb", 1) < 1:
        raise SystemExit("--nb must be >= 1")
    return int(args.fn(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
