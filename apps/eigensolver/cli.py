"""hpccoll-eigensolver: solve / compare / report - the parser and main; the commands are in
solve.py and compare.py.

  mpiexec -n P hpccoll-eigensolver solve --n 4096 --problem known --comm mpi --repeat 3 --out DIR
  mpiexec -n P hpccoll-eigensolver solve --n 4096 --subset 0:99 --scf 5 --out DIR
  hpccoll-eigensolver compare --n 4096 --ranks 3 --repeat 5 --comm sentinel,ll128,nccl,mpi --out DIR
  hpccoll-eigensolver report DIR

Every argument is checked when parsed; solve's arguments and input files then on every rank
and agreed in one allgather (agree_solve_args); the output directory (default DEFAULT_OUT for
solve) before any work.  Under MPI, errors that every rank sees alike (arguments, input files
and matrices, B not numerically positive definite) are printed once, by rank 0, and every rank
exits with status 2; a solve whose result is not finite exits 1 with nothing written; any other
exception on one rank aborts the whole job (runinfo.install_abort_hook), so no rank is left
waiting."""
from __future__ import annotations

import argparse
import math
import os
import sys

from .compare import cmd_compare
from .runinfo import COMM_CHOICES, launcher_rank
from .runs import DEFAULT_OUT, DEFAULT_SCF_STEP, PROG, SCIPY_REFERENCE_MAX_N, CliError, check_stem
from .solve import cmd_solve

# -- argument types: every value checked at parse time -------------------------------------------
def _int_at_least(low: int, what: str):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer ({what})") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value}: {what} must be >= {low}")
        return value
    return parse


def _finite_float(low: float, what: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number ({what})") from None
        if not math.isfinite(value) or value < low:
            raise argparse.ArgumentTypeError(f"{text}: {what} must be a finite number >= {low:g}")
        return value
    return parse


def _host_threads(text: str) -> str | int:
    from .runinfo import parse_host_threads

    try:
        return parse_host_threads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _rank_list(text: str) -> list[int]:
    """--ranks: one rank count or a comma list of them (each >= 1), in the order given."""
    one = _int_at_least(1, "--ranks (MPI ranks per configuration)")
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"{text!r}: give a rank count or a comma list of them (e.g. 2,3,4)")
    return list(dict.fromkeys(one(t) for t in items))


def _comm_list(text: str) -> list[str]:
    items = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in items if c not in COMM_CHOICES]
    if not items or bad:
        raise argparse.ArgumentTypeError(f"{text!r}: use a comma list of {', '.join(COMM_CHOICES)}")
    return list(dict.fromkeys(items))


def _subset(text: str) -> tuple[int, int]:
    """--subset LO:HI: two integers, 0 <= LO <= HI (0-based, both inclusive: scipy.linalg.eigh's
    subset_by_index); HI < n is checked once n is known (finish_args)."""
    parts = text.split(":")
    try:
        lo, hi = (int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give LO:HI, two integers 0 <= LO <= HI (0-based, both "
                                         "inclusive: 0:9 is the 10 lowest eigenpairs; one eigenpair i is i:i)") \
            from None
    if lo < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: LO = {lo} is negative: the eigenpairs are numbered from 0")
    if lo > hi:
        raise argparse.ArgumentTypeError(f"{text!r}: LO = {lo} > HI = {hi}: give LO:HI with LO <= HI "
                                         "(both inclusive)")
    return lo, hi


def _positive_float(what: str):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number ({what})") from None
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"{text}: {what} must be a finite number > 0")
        return value
    return parse


def _stem(text: str) -> str:
    try:
        return check_stem(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _yes_no(text: str) -> str:
    """--save-vectors: yes or no; auto is accepted and means yes."""
    return "yes" if text == "auto" else text


class _Parser(argparse.ArgumentParser):
    """Prints usage, help and errors from one process of an MPI job (launcher rank 0) only."""

    def _print_message(self, message, file=None):
        if launcher_rank() == 0:
            super()._print_message(message, file)


# -- shared by solve, compare and the anchors ------------------------------------------------------
def add_problem_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--n", type=_int_at_least(1, "--n (the matrix order)"), default=1024,
                   help="matrix order (ignored for file:)")
    p.add_argument("--problem", default="known",
                   help="known | clustered | wilkinson | random | file:A.npy,B.npy (default known)")
    p.add_argument("--cond-b", type=_finite_float(1.0, "--cond-b (the 2-norm condition number of B)"),
                   default=1e3, help="2-norm condition number of B, finite and >= 1 (default 1e3)")
    p.add_argument("--seed", type=_int_at_least(0, "--seed"), default=0, help="problem seed (default 0)")
    p.add_argument("--nb", type=_int_at_least(1, "--nb (the block size)"), default=64, help="block size (default 64)")
    p.add_argument("--repeat", type=_int_at_least(1, "--repeat (solves of the problem)"), default=1,
                   help="solves of the same problem (default 1)")
    p.add_argument("--out", default=None,
                   help="directory for the results, per run r: STEM_runRRR.json (the record), STEM_runRRR_w.npy "
                        "(the eigenvalues) and STEM_runRRR_X.npy (the eigenvectors); created if missing, checked "
                        f"before the solve; solve's default: ./{DEFAULT_OUT}")
    p.add_argument("--overwrite", action="store_true",
                   help="replace results of the same problem and options already in --out (default: refuse)")
    p.add_argument("--save-vectors", type=_yes_no, choices=("yes", "no"), default="yes",
                   help="write the eigenvectors X as STEM_runRRR_X.npy (n x n float64, Fortran order; default "
                        "yes; auto is accepted and means yes); every rank writes its own columns into it, so "
                        "--out must be visible from every rank")
    p.add_argument("--gather-vectors", action="store_true",
                   help="write X from rank 0 only, its columns sent there block by block (for an --out "
                        "that only rank 0's node sees)")
    p.add_argument("--no-reference", action="store_true",
                   help=f"skip scipy.linalg.eigh(A, B) (by default done when n <= {SCIPY_REFERENCE_MAX_N}, "
                        "on rank 0, with A and B gathered there)")
    p.add_argument("--symmetry-tol", type=_finite_float(0.0, "--symmetry-tol"), default=None,
                   help="file: problems must satisfy max|M - M^T| <= tol * max|M| for M = A, B "
                        "(default 1e-10)")


def finish_args(args) -> None:
    """Checks that need several arguments (the problem spec); raises CliError.  solve without
    --out writes into DEFAULT_OUT."""
    from .problems import ProblemError, parse_problem

    if getattr(args, "cmd", None) == "solve" and args.out is None:
        args.out = DEFAULT_OUT

    if hasattr(args, "problem"):
        try:
            args.spec = parse_problem(args.problem, args.n, cond_b=args.cond_b, seed=args.seed)
        except ProblemError as exc:
            raise CliError(str(exc)) from None
        if args.spec.kind == "file":
            args.n = args.spec.n
    if getattr(args, "out", None) is not None and not args.out:
        raise CliError("--out '': give a directory")
    subset = getattr(args, "subset", None)
    if subset is not None and subset[1] >= args.n:
        raise CliError(f"--subset {subset[0]}:{subset[1]}: HI = {subset[1]} is past the last eigenpair of the "
                       f"n = {args.n} problem: pass 0 <= LO <= HI <= {args.n - 1}")
    if getattr(args, "scf_step", None) is not None and getattr(args, "scf", None) is None:
        raise CliError(f"--scf-step {args.scf_step:g} without --scf: pass --scf K (K solves with one B), or drop "
                       "--scf-step")
    if getattr(args, "scf", None) is not None and args.scf_step is None:
        args.scf_step = DEFAULT_SCF_STEP


def _input_fingerprint(args) -> dict:
    """What every rank of a solve must be given alike: the options that shape the solve and,
    for file: problems, each file's shape, dtype, order and size (paths may differ by node)."""
    spec = args.spec
    fp = {"--n": args.n, "--nb": args.nb, "--repeat": args.repeat, "--comm": args.comm, "--stedc": args.stedc,
          "--sytrd": args.sytrd, "--reduction": args.reduction, "--symmetry-tol": args.symmetry_tol,
          "--subset": args.subset, "--scf": args.scf, "--scf-step": args.scf_step,
          "--eigvals-only": args.eigvals_only, "--save-vectors": args.save_vectors,
          "--gather-vectors": args.gather_vectors}
    if spec.kind == "file":
        fp["--problem"] = "file:" + ",".join(
            f"{name} {'x'.join(map(str, shape))} {dtype} {'F' if fortran else 'C'} order {os.path.getsize(path)} B"
            for name, path, (shape, fortran, dtype, _) in zip("AB", spec.files, spec.file_info))
    else:
        fp.update({"--problem": spec.kind, "--cond-b": spec.cond_b, "--seed": spec.seed})
    return fp


def agree_solve_args(args) -> None:
    """solve: every rank checks its own arguments and input files (finish_args: each file's
    header and size), then one allgather of (error, fingerprint) per rank, before any other
    collective: an error on any rank, or inputs that differ between ranks, raise the same
    CliError on every rank (printed once; exit status 2) naming the ranks and the files."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        finish_args(args)
        mine = (None, _input_fingerprint(args))
    except CliError as exc:
        mine = (str(exc), None)
    except OSError as exc:   # a file gone or unreadable between its checks
        mine = (f"{exc.filename}: {exc.strerror or exc}", None)
    everyone = world.allgather(mine)
    failed = [(r, e) for r, (e, _) in enumerate(everyone) if e]
    if failed:
        if len(failed) == len(everyone) and len({e for _, e in failed}) == 1:
            raise CliError(failed[0][1])
        raise CliError("; ".join(f"on rank {r}: {e}" for r, e in failed))
    prints = [fp for _, fp in everyone]
    differ = [k for k in prints[0] if len({repr(fp.get(k)) for fp in prints}) > 1]
    if differ:
        seen = "; ".join(f"{k}: " + ", ".join(f"rank {r} {fp.get(k)}" for r, fp in enumerate(prints)) for k in differ)
        raise CliError(f"the ranks were given different inputs ({seen}): give every rank the same arguments "
                       "and the same files")


def cmd_report(args) -> int:
    from .report import build_report, load_runs

    if not os.path.isdir(args.dir):
        raise CliError(f"report {args.dir}: no such directory: pass the --out directory of solve or compare")
    if not os.access(args.dir, os.W_OK):
        raise CliError(f"report {args.dir}: not writable (report.md and report.json go there)")
    runs, failures = load_runs(args.dir)
    if not runs and not failures:
        raise CliError(f"report {args.dir}: no runs there (no *_run*.json of solve, no failed_*.json of compare): "
                       "pass the --out directory of solve or compare")
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
    from .runinfo import HOST_THREADS_HELP
    from .linalg.driver import (AUTO_TWO_STAGE_ALL_MIN_N, AUTO_TWO_STAGE_MIN_N, REDUCTION_CHOICES, STEDC_CHOICES,
                                SYTRD_CHOICES)

    p.add_argument("--host-threads", type=_host_threads, default="auto", help=HOST_THREADS_HELP)
    p.add_argument("--no-sync-collectives", action="store_true",
                   help="do not sync the device around each collective: the solve is timed as it runs "
                        "in production, the collectives' own times are then launch times only")
    p.add_argument("--no-trace-memory", action="store_true",
                   help="CPU path: do not count the peak of NumPy's array memory during the solve (a NumPy "
                        "memory handler, which adds little; where its extension was not built, "
                        "tracemalloc, which traces every allocation and slows host solves several times)")
    p.add_argument("--stedc", choices=STEDC_CHOICES, default="auto",
                   help="how the tridiagonal eigenproblem is solved: dc: the divide and conquer distributed "
                        "over the ranks (linalg/stedc: each rank computes its rows of the eigenvectors, "
                        "delivered by columns); host: LAPACK dstevd on rank 0; gpu: cuSOLVER syevd of the "
                        "dense tridiagonal on rank 0 (device arrays only; host and gpu hold n x n on rank 0 "
                        "for a moment); auto (default): see solver.stedc_choice")
    p.add_argument("--sytrd", choices=SYTRD_CHOICES, default="auto",
                   help="the tridiagonalization's column step on GPUs: fused (device kernels that move the "
                        "column's data themselves, on the deterministic sentinel communicator), graph (the "
                        "column's kernels and collectives replayed as CUDA graphs), eager (the same kernels "
                        "launched one by one), ops (array operations); auto (default): fused where it can run "
                        "and n <= sytrd_device.FUSED_MAX_N, else graph; host arrays always take ops")
    p.add_argument("--subset", type=_subset, default=None, metavar="LO:HI",
                   help="only eigenpairs LO..HI of the ascending spectrum (scipy.linalg.eigh's subset_by_index: "
                        "0-based, both inclusive; 0:9 is the 10 lowest, one eigenpair i is i:i): k = HI - LO + 1 "
                        "eigenvalues, an n x k STEM_runRRR_X.npy, metrics of those k pairs (default: all)")
    p.add_argument("--scf", type=_int_at_least(1, "--scf (solves with one B)"), default=None, metavar="K",
                   help="K solves with one B, factored once (GeneralizedSolver, as in an SCF loop): solve 0 of "
                        "the problem's A, solve j >= 1 of A + step max|A| Z_j (Z_j symmetric, entries uniform in "
                        "[-1, 1) from --seed and j); solve j writes STEM_runRRR_sJJJ.json, _w.npy and _X.npy")
    p.add_argument("--scf-step", type=_positive_float("--scf-step (the perturbation of A, relative to max|A|)"),
                   default=None, metavar="STEP",
                   help=f"--scf: the size of each A's perturbation relative to max|A| (default {DEFAULT_SCF_STEP:g})")
    p.add_argument("--reduction", choices=REDUCTION_CHOICES, default="auto",
                   help="the tridiagonalization: one-stage (Householder, one column at a time: sytrd) or "
                        "two-stage (dense -> band by blocked Householder, band -> tridiagonal by bulge "
                        "chasing; --sytrd does not apply); auto (default): two-stage on one GPU rank from "
                        f"n = {AUTO_TWO_STAGE_MIN_N} with --eigvals-only or a --subset of at most n/2, from "
                        f"n = {AUTO_TWO_STAGE_ALL_MIN_N} with more eigenvectors, else one-stage")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Distributed generalized symmetric eigensolver (sygvd) on hpccoll")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solve", help="solve A x = lambda B x under mpiexec; per run STEM_runRRR.json, "
                                     "STEM_runRRR_w.npy and STEM_runRRR_X.npy in --out")
    add_problem_args(s)
    s.add_argument("--name", type=_stem, default=None, metavar="STEM",
                   help="the results' stem: letters, digits, '.', '_' and '-' (default "
                        "{problem}_n{n}_p{ranks}_{comm}_{config}, config the first 10 hex digits of the digest of "
                        "the problem and the options that change the result's bits)")
    s.add_argument("--eigvals-only", action="store_true",
                   help="eigenvalues only: no eigenvectors of the tridiagonal matrix, no back-transformation, "
                        "no STEM_runRRR_X.npy; the record's eigenvector metrics are null")
    s.add_argument("--comm", choices=tuple(COMM_CHOICES), default="auto",
                   help="collective path: mpi (host backend), nccl, sentinel, ll, ll128, auto")
    add_solve_args(s)
    s.set_defaults(fn=cmd_solve)
    c = sub.add_parser("compare", help="run solve for several --comm paths under mpiexec, then report; "
                                       "exits 1 when a configuration failed")
    add_problem_args(c)
    c.add_argument("--ranks", type=_rank_list, default=[2],
                   help="MPI ranks per configuration, or a comma list of rank counts to run every "
                        "configuration at each (e.g. 2,3,4; default 2)")
    c.add_argument("--comm", type=_comm_list, default=_comm_list("sentinel,ll128,nccl,mpi"),
                   help="comma list of --comm paths")
    add_solve_args(c)
    c.add_argument("--cusolvermp", action="store_true", help="also run cuSOLVERMp sygvd (GPU)")
    c.add_argument("--single-gpu", action="store_true", help="also run the one-GPU CuPy anchor")
    c.add_argument("--config-timeout", type=_finite_float(1.0, "--config-timeout (seconds)"), default=None,
                   help="seconds one configuration may run; past them it is stopped (its launcher and ranks) "
                        "and recorded as failed, and compare goes on (default: no limit; hpccoll's collectives, "
                        "through NCCL too, time out on a lost peer; cuSOLVERMp's do not)")
    c.set_defaults(fn=cmd_compare)
    r = sub.add_parser("report", help="(re)build report.md / report.json / plots from a directory of runs")
    r.add_argument("dir")
    r.set_defaults(fn=cmd_report)
    a = sub.add_parser("anchor", help="(used by compare) run a GPU reference solver")
    a.add_argument("which", choices=("single-gpu", "cusolvermp"))
    add_problem_args(a)
    a.set_defaults(fn=cmd_anchor, stedc=None)
    return p


def _printing_rank() -> int:
    """0 for the process that prints shared errors: MPI rank 0 once MPI runs, else the launcher's."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        return mpi.COMM_WORLD.Get_rank()
    return launcher_rank()


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.cmd in ("solve", "anchor"):
        from .runinfo import install_abort_hook

        install_abort_hook(PROG)
    try:
        if args.cmd == "solve":
            agree_solve_args(args)   # under MPI: on every rank at once
        else:
            finish_args(args)
        return int(args.fn(args) or 0)
    except CliError as exc:
        if _printing_rank() == 0:
            print(f"{PROG} {args.cmd}: error: {exc}", file=sys.stderr, flush=True)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
