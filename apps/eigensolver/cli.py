"""hpccoll-eigensolver: solve / compare / report.

  mpiexec -n P hpccoll-eigensolver solve --n 4096 --problem known --comm mpi --repeat 3 --out DIR
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
import contextlib
import hashlib
import json
import math
import os
import sys
import time

from .report import GUARANTEE, METRIC_DEFINITIONS
from .runinfo import COMM_CHOICES, launcher_rank
from .runs import (DEFAULT_OUT, EXIT_FAILED, FAILURE_SCHEMA, METRICS_LEGEND, PROG, RUN_SCHEMA, SAVE_VECTORS_MAX_N,
                   SCIPY_REFERENCE_MAX_N, CliError, _content_digest, _visible, agree, build_local_problem,
                   check_out_dir, config_digest, config_identity, fail_together, in_column_order, print_run,
                   problem_tag, progress, rank_records, reference_on_root, refuse_overwrite, run_stem, save_vectors,
                   write_json, write_vectors)

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
                   help="directory for one JSON per run (rank 0 writes it; created if missing, checked "
                        f"before the solve); solve's default: ./{DEFAULT_OUT}")
    p.add_argument("--overwrite", action="store_true",
                   help="replace results of the same problem and options already in --out (default: refuse)")
    p.add_argument("--save-vectors", choices=("auto", "yes", "no"), default="auto",
                   help=f"also write X as an n x n .npy (auto: when n <= {SAVE_VECTORS_MAX_N}); every rank "
                        "writes its own columns into it, so --out must be visible from every rank")
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


def _input_fingerprint(args) -> dict:
    """What every rank of a solve must be given alike: the options that shape the solve and,
    for file: problems, each file's shape, dtype, order and size (paths may differ by node)."""
    spec = args.spec
    fp = {"--n": args.n, "--nb": args.nb, "--repeat": args.repeat, "--comm": args.comm, "--stedc": args.stedc,
          "--sytrd": args.sytrd, "--symmetry-tol": args.symmetry_tol}
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


def cmd_solve(args) -> int:
    from mpi4py import MPI

    from hpccoll import HpccollError

    from .checks import InputError
    from .runinfo import MixedDevices, limit_host_threads, make_communicator, select_device
    from .linalg.driver import NonFiniteResult, NotPositiveDefinite

    world = MPI.COMM_WORLD
    ctl = world.Dup()  # the CLI's own agreements: never matched against the library's collectives
    rank = ctl.Get_rank()
    args.host_threads_record = limit_host_threads(ctl, args.host_threads)
    if args.out:
        agree(ctl, lambda: check_out_dir(args.out) if rank == 0 else None, "output directory", False)
        if save_vectors(args, args.n) and not args.gather_vectors:
            agree(ctl, lambda: _visible(args.out), "output directory")
    try:
        xp, dev = select_device(world)
    except MixedDevices as exc:   # raised on every rank alike
        raise CliError(str(exc)) from None
    device = "gpu" if xp.__name__ == "cupy" else "cpu"
    if device == "cpu" and args.stedc == "gpu":
        raise CliError("--stedc gpu needs GPUs (CuPy and a device): use --stedc host or dc")
    if device == "gpu":
        from .warmup import warm_up

        # compile CuPy's kernels before the communicator opens (the solver the solve will use;
        # warm_up resolves "auto" as sygvd does)
        warm_up(nb=args.nb, stedc=args.stedc)
    try:
        comm = make_communicator(args.comm, world, dev)
    except HpccollError as exc:
        fail_together(ctl, f"--comm {args.comm} cannot run here: {exc}")
    if device == "gpu":
        # hpccoll's kernels for this rank count too (a cold compile is seconds per dtype, and it
        # would land in the first timed collective); every collective of the solve is float64
        comm.prepare(("float64",))
    sytrd_mode = "ops"
    # The teardown is collective: only where every rank comes to it.  An exception raised on one
    # rank alone (a full disk when rank 0 writes, memory) skips it, so that the abort hook ends
    # the job instead of this rank waiting in Free for peers that wait in the next solve.
    alike = True
    try:
        if device == "gpu":
            from .linalg.sytrd_device import mode_for

            sytrd_mode = mode_for(comm, args.n, args.sytrd)
        return _solve_runs(args, ctl, comm, xp, device, sytrd_mode)
    except NotPositiveDefinite as exc:   # raised by every rank alike (every panel of L is broadcast)
        raise CliError(str(exc)) from None
    except InputError as exc:            # raised by every rank alike (checks.check_input, sygvd)
        raise CliError(f"input rejected: {exc}") from None
    except NonFiniteResult as exc:       # raised by every rank alike (sygvd); nothing written
        raise CliError(f"the solve failed: {exc}", code=EXIT_FAILED) from None
    except CliError:                     # runs.agree: raised by every rank alike
        raise
    except BaseException:                # any other: this rank's alone
        alike = False
        raise
    finally:
        if alike:
            if sytrd_mode == "fused":
                from .linalg.sytrd_device import release_fused

                release_fused(comm)  # the fused transfers' IPC-mapped workspace, before the communicator's
            comm.Free()
            ctl.Free()


def _gpu_id(xp) -> str:
    """This rank's GPU: its host and PCI bus id (the same bus id on two nodes is two GPUs)."""
    import socket

    return f"{socket.gethostname()}/{xp.cuda.Device().pci_bus_id}"


def _solve_runs(args, ctl, comm, xp, device, sytrd_mode) -> int:
    from . import metrics
    from .linalg._xp import sync, to_host
    from .checks import SYM_TOL, check_input
    from .counting import CountingComm, PhaseTimer
    from .linalg.layout import BlockCyclic
    from .problems import spectrum
    from hpccoll.config import git_commit

    from .linalg.stedc import early as tridiag_dc
    from .runinfo import GcPauses, MemoryMeter, machine_info
    from .linalg.driver import PHASES, solves_early, stedc_choice, sygvd

    rank, size = ctl.Get_rank(), ctl.Get_size()
    spec, n = args.spec, args.n
    desc = BlockCyclic(n, n, args.nb, size)
    t0 = time.perf_counter()
    A_loc, B_loc, col_digests = build_local_problem(spec, desc, ctl, xp)
    sync(xp)
    build_s = time.perf_counter() - t0
    sym_tol = SYM_TOL if args.symmetry_tol is None else args.symmetry_tol
    input_checks = check_input(A_loc, B_loc, desc, ctl, sym_tol=sym_tol, check_symmetry=spec.kind == "file")
    content = _content_digest(ctl, desc, col_digests) if col_digests is not None else None
    # rank 0's view names the files (a file's modification time may read differently elsewhere)
    problem_identity, problem_digest = ctl.bcast((spec.identity(device), spec.digest(device)) if rank == 0
                                                 else None, root=0)
    identity = config_identity(args, problem_digest, size, args.comm, device)
    if solves_early(stedc_choice(args.stedc, device == "gpu"), True, size):
        # the subtrees are scaled by their own |T|: another minimum size gives other bits
        identity["dc_early_leaves"] = tridiag_dc.EARLY_LEAVES
    digest = config_digest(identity)
    stems = [run_stem(args, n, size, args.comm, r, digest) for r in range(args.repeat)]
    agree(ctl, lambda: refuse_overwrite(args.out, stems, args.overwrite) if rank == 0 else None, "results",
          False)

    ref, ref_s, ref_err = reference_on_root(args, A_loc, B_loc, desc, ctl)
    known = spectrum(spec) if rank == 0 else None
    gpus = ctl.gather(_gpu_id(xp) if device == "gpu" else None, root=0)
    if rank == 0:
        info, commit = machine_info(xp), git_commit()
        if device == "gpu":
            info["gpus_used"] = len(set(gpus))  # ranks sharing a GPU (MPS) count it once
        info["blas"]["host_threads"] = args.host_threads_record
        print(f"{PROG}: n={n} P={size} nb={args.nb} comm={args.comm} ({comm.backend}) problem={args.problem} "
              f"on {device}; built in {build_s:.2f} s; results {os.path.join(args.out, stems[0][:-7])}_run*",
              flush=True)
        print(METRICS_LEGEND, flush=True)
        if ref_err:
            print(f"{PROG}: scipy reference failed ({ref_err}); eig-err(scipy) not recorded", flush=True)

    meter = MemoryMeter(xp, trace=device == "cpu" and not args.no_trace_memory)
    for r in range(args.repeat):
        cc = CountingComm(comm, sync_each=not args.no_sync_collectives)
        bar = progress(len(PHASES), f"{args.comm} run {r}", rank == 0)
        timer = PhaseTimer(xp, cc, bar)
        meter.start()
        ctl.Barrier()
        with GcPauses() as pauses:
            t0 = time.perf_counter()
            w, X = sygvd(A_loc, B_loc, desc, cc, timer=timer, stedc=args.stedc, sytrd=sytrd_mode)
            sync(xp)
            solve_s = time.perf_counter() - t0
        meter.solve_done()
        if bar is not None:
            bar.close()
        t1 = time.perf_counter()
        # host arrays: plain MPI (a metric needs no rank-order sums); device arrays: the hpccoll
        # communicator, which moves device buffers
        acc = metrics.distributed_accuracy(A_loc, B_loc, X, w, desc, ctl if device == "cpu" else comm)
        col = metrics.column_digests(X)
        metrics_s = time.perf_counter() - t1
        memory = meter.stop()
        w_digest = metrics.sha256(w)
        gathered = ctl.gather((w_digest, metrics.combine_digests(col), col, memory, pauses.record()), root=0)
        del col
        stem = stems[r]
        if save_vectors(args, n):
            write_vectors(os.path.join(args.out, stem + "_X.npy"), X, desc, ctl, args.gather_vectors)
        del X
        if rank != 0:
            continue
        all_cols = in_column_order(desc, [g[2] for g in gathered])
        per_rank, memory_per_rank = rank_records(gathered)
        summary = cc.summary()
        total = summary.get("total", {})
        count = sum(v["count"] for v in total.values())
        nbytes = sum(v["bytes"] for v in total.values())
        secs = sum(v["seconds"] for v in total.values())
        rec = {
            "schema": RUN_SCHEMA,
            "n": n, "nb": args.nb, "ranks": size, "comm": args.comm, "backend": comm.backend,
            "stedc": args.stedc, "sytrd_mode": sytrd_mode, "device": device,
            "problem": args.problem, "cond_b": args.cond_b, "seed": args.seed,
            "problem_digest": problem_digest, "problem_identity": problem_identity,
            "problem_sha256": content, "config_digest": digest, "config": identity,
            "repeat_index": r, "repeat": args.repeat,
            "eigenvalues_sha256": w_digest,
            "eigenvectors_sha256": metrics.combine_digests(all_cols),
            "per_rank": per_rank,
            "ranks_agree_on_eigenvalues": len({g[0] for g in gathered}) == 1,
            "residual": acc["residual"], "b_orthogonality": acc["b_orthogonality"],
            "eigenvalue_error": metrics.eigenvalue_error(w, known),
            "eigenvalue_error_vs_scipy": metrics.eigenvalue_error(w, ref),
            "eigenvalue_error_definition": metrics.EIGENVALUE_ERROR_DEFINITION,
            "reference_seconds": ref_s, "reference_error": ref_err,
            "input_checks": input_checks, "problem_build_seconds": build_s,
            "phases": dict(timer.seconds), "solve_seconds": solve_s, "metrics_seconds": metrics_s,
            "collectives": {"count": count, "bytes": nbytes, "seconds": secs,
                            "share_of_solve": secs / solve_s if solve_s else None,
                            "timed_with_device_sync": cc.sync_each,
                            # phases whose collectives ran inside CUDA graphs: their seconds are
                            # n x (time per collective in a graph of that collective alone)
                            "estimated_in_phases": sorted(cc.estimated),
                            "by_phase": {k: v for k, v in summary.items() if k != "total"},
                            "by_name": total, "sizes": cc.size_histogram()},
            "memory": {"per_rank": memory_per_rank},
            "host_gc": {"per_rank": [dict(rank=i, **g[4]) for i, g in enumerate(gathered)]},
            "machine": info, "git_commit": commit,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "eigenvalues": [float(x) for x in to_host(w)],
            "eigenvectors_file": stem + "_X.npy" if save_vectors(args, n) else None,
            "eigenvectors_layout": "float64 n x n .npy, Fortran order, column j = eigenvector of eigenvalues[j]",
            "metric_definitions": METRIC_DEFINITIONS,
            "reproducibility": GUARANTEE,
        }
        print_run(rec)
        if args.out:
            print(f"  wrote {write_json(args.out, stem, rec)}", flush=True)
    return 0


# -- compare / report --------------------------------------------------------------------------------
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


def failure_path(args, label: str) -> str:
    opts = hashlib.sha256(json.dumps(_problem_argv(args) + [label, str(args.ranks), args.stedc]).encode())
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
        (["--no-trace-memory"] if args.no_trace_memory else [])
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
    from .linalg.driver import STEDC_CHOICES, SYTRD_CHOICES

    p.add_argument("--host-threads", type=_host_threads, default="auto", help=HOST_THREADS_HELP)
    p.add_argument("--no-sync-collectives", action="store_true",
                   help="do not sync the device around each collective: the solve is timed as it runs "
                        "in production, the collectives' own times are then launch times only")
    p.add_argument("--no-trace-memory", action="store_true",
                   help="CPU path: do not count the peak of NumPy's array memory during the solve (a NumPy "
                        "memory handler, within noise of none; where its extension was not built, "
                        "tracemalloc, which made host solves 2-3x slower)")
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


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Distributed generalized symmetric eigensolver (sygvd) on hpccoll")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("solve", help="solve A x = lambda B x under mpiexec; one JSON per run")
    add_problem_args(s)
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
