"""hpccoll-eigensolver compare: solve (and the reference solvers) for several --comm paths and
rank counts, each configuration under its own mpiexec, then the report of their directory.
A configuration that fails or runs past --config-timeout is recorded (failed_*.json) and the
others go on."""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
import time

from .runs import FAILURE_SCHEMA, CliError, check_out_dir, problem_tag


def find_mpiexec() -> list[str]:
    """mpiexec next to sys.executable, else on PATH; with Open MPI's root/oversubscribe flags."""
    import shutil
    import subprocess

    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    exe = here if os.path.exists(here) else shutil.which("mpiexec")
    if exe is None:
        raise CliError("compare: no mpiexec next to python or on PATH: pip install mpich")
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
    argv = ["--n", str(args.n), "--problem", args.problem, "--cond-b", repr(args.cond_b),
            "--seed", str(args.seed), "--nb", str(args.nb), "--repeat", str(args.repeat),
            "--out", args.out, "--save-vectors", args.save_vectors]
    for flag in ("no_reference", "overwrite", "gather_vectors"):
        if getattr(args, flag):
            argv.append("--" + flag.replace("_", "-"))
    if args.symmetry_tol is not None:
        argv += ["--symmetry-tol", repr(args.symmetry_tol)]
    return argv


def _solve_only_argv(args) -> list[str]:
    """solve's options that the reference solvers (anchors) do not take: they solve every
    eigenpair once."""
    argv = []
    if getattr(args, "subset", None) is not None:
        argv += ["--subset", f"{args.subset[0]}:{args.subset[1]}"]
    if getattr(args, "scf", None) is not None:
        argv += ["--scf", str(args.scf), "--scf-step", repr(args.scf_step)]
    return argv


def failure_path(args, label: str) -> str:
    opts = hashlib.sha256(json.dumps(_problem_argv(args) + _solve_only_argv(args) +
                                     [label, str(args.ranks), args.stedc]).encode())
    return os.path.join(args.out, f"failed_{problem_tag(args.problem)}_n{args.n}_p{args.ranks}_{label}_"
                                  f"{opts.hexdigest()[:10]}.json")


def _launch(label: str, cmd: list[str], args) -> bool:
    """Run one configuration; on failure record it (failed_*.json) and return False."""
    import subprocess

    print(f"== {label}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    limit = args.config_timeout
    # with a limit, its own process group: past the limit the launcher and every rank it started
    # are stopped (without one it stays in compare's group, which a Ctrl-C in the terminal reaches)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=limit is not None)
    try:
        output, _ = proc.communicate(timeout=limit)
        code, why = proc.returncode, f"exit {proc.returncode}"
    except subprocess.TimeoutExpired:
        output, code, why = _stop_group(proc), None, f"still running after --config-timeout {limit:g} s; stopped"
    except KeyboardInterrupt:  # its own group does not get the terminal's SIGINT: pass it on
        if limit is not None:
            _stop_group(proc)
        raise
    sys.stdout.write(output)
    if code == 0:
        return True
    rec = {"schema": FAILURE_SCHEMA, "comm": label, "ranks": args.ranks, "n": args.n,
           "problem": args.problem, "returncode": code, "command": cmd, "reason": why,
           "error": output[-4000:], "seconds": time.perf_counter() - t0}
    path = failure_path(args, label)
    with open(path, "w") as f:
        json.dump(rec, f, indent=1)
    print(f"== {label} failed ({why}); recorded in {path}", flush=True)
    return False


def _stop_group(proc) -> str:
    """SIGTERM to a configuration's process group (the launcher forwards it to the ranks), SIGKILL
    to what is left after 10 s; returns its output so far."""
    import signal
    import subprocess

    for sig, grace in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return proc.communicate(timeout=grace)[0] or ""
        except subprocess.TimeoutExpired:
            continue
    return ""


@contextlib.contextmanager
def _mps_for(ranks: int):
    """MPS around the runs where `ranks` ranks (one node) outnumber the GPUs: started here and
    stopped at the end unless it runs already (hpccoll.mps.mps_where_needed); refused, before any
    run, where it cannot be started."""
    from hpccoll import HpccollError, mps

    try:
        with mps.mps_where_needed(ranks, mps.visible_gpus()) as what:
            print(f"== {what}", flush=True)
            yield
    except HpccollError as exc:
        raise CliError(f"compare: {exc}") from None


def cmd_compare(args) -> int:
    from .report import build_report

    if not args.out:
        raise CliError("compare: pass --out DIR (the runs and the report go there)")
    check_out_dir(args.out)
    mpiexec = find_mpiexec()
    per_count = list(args.comm) + (["cusolvermp"] if args.cusolvermp else [])  # run at each rank count
    runs = [(ranks, label) for ranks in args.ranks for label in per_count] + \
        ([(1, "single-gpu")] if args.single_gpu else [])
    at = {r: argparse.Namespace(**{**vars(args), "ranks": r}) for r in dict.fromkeys(r for r, _ in runs)}
    for ranks, label in runs:   # a stale failure record would outlive a now-successful configuration
        old = failure_path(at[ranks], label)
        if os.path.exists(old):
            if not args.overwrite:
                raise CliError(f"--out {args.out}: {os.path.basename(old)} exists from an earlier compare of the "
                               "same configuration: pass --overwrite to rerun it, or another --out")
            os.remove(old)
    me = [sys.executable, "-m", "hpccoll_eigensolver.cli"]
    solve_opts = ["--stedc", args.stedc, "--sytrd", args.sytrd, "--host-threads", str(args.host_threads)] + \
        (["--no-sync-collectives"] if args.no_sync_collectives else []) + \
        (["--no-trace-memory"] if args.no_trace_memory else []) + \
        (["--reduction", args.reduction] if getattr(args, "reduction", "auto") != "auto" else []) + \
        _solve_only_argv(args)
    failed = []
    with _mps_for(max(args.ranks)):
        for ranks, label in runs:
            if label == "single-gpu":
                cmd = me + ["anchor", "single-gpu"]
            elif label == "cusolvermp":
                cmd = mpiexec + ["-n", str(ranks)] + me + ["anchor", "cusolvermp"]
            else:
                cmd = mpiexec + ["-n", str(ranks)] + me + ["solve", "--comm", label] + solve_opts
            if not _launch(label, cmd + _problem_argv(args), at[ranks]):
                failed.append(label if len(args.ranks) == 1 or label == "single-gpu" else f"{label} at {ranks} ranks")
    paths = build_report(args.out)
    print("report: " + ", ".join(paths))
    if failed:
        raise CliError(f"compare: {len(failed)} of {len(runs)} configurations failed ({', '.join(failed)}); "
                       f"see failed_*.json and the report in {args.out}", code=1)
    return 0
