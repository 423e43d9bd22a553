"""hpccoll-eigensolver solve: under mpiexec, the runs of one problem and configuration.

cmd_solve opens the device and the communicator and tears them down; _solve_runs builds the
problem's columns on every rank, checks them, solves it --repeat times and writes each run's
results (runs.py names them).  Errors that every rank sees alike are raised as CliError on
every rank; any other exception is this rank's alone and ends the job (runinfo's abort hook)."""
from __future__ import annotations

import math
import os
import time

from .report import GUARANTEE, METRIC_DEFINITIONS
from .runs import (EXIT_FAILED, METRICS_LEGEND, PROG, RUN_SCHEMA, CliError, _content_digest, _visible, agree,
                   build_local_problem, base_stem, check_out_dir, config_digest, config_identity, fail_together,
                   in_column_order, print_run, progress, rank_records, reference_on_root, refuse_overwrite,
                   run_stem, save_vectors, write_eigenvalues, write_json, write_vectors)


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
        if save_vectors(args) and not args.gather_vectors:
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
    from mpi4py import MPI

    from . import metrics
    from .linalg._xp import sync, to_host
    from .checks import SYM_TOL, check_input
    from .counting import CountingComm, PhaseTimer
    from .linalg import scaling
    from .linalg.layout import BlockCyclic
    from .problems import scf_operand, spectrum
    from hpccoll.config import git_commit

    from .runinfo import GcPauses, MemoryMeter, machine_info
    from .linalg.driver import PHASES, GeneralizedSolver

    rank, size = ctl.Get_rank(), ctl.Get_size()
    spec, n, subset = args.spec, args.n, args.subset
    desc = BlockCyclic(n, n, args.nb, size)
    x_desc = desc if subset is None else BlockCyclic(n, subset[1] - subset[0] + 1, args.nb, size)   # X's layout
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
    vectors = not args.eigvals_only
    plan = _plan(args, problem_identity, problem_digest, size, device, vectors)
    scf = args.scf is not None
    # --scf: one stem for the loop's files (solve j adds _sJJJ), named by the step too
    stem_digest = config_digest({**plan[0][2], "scf_step": args.scf_step}) if scf else plan[0][3]
    base = base_stem(args, n, size, args.comm, stem_digest)
    stems = [[run_stem(args, n, size, args.comm, r, stem_digest, j if scf else None) for j in range(len(plan))]
             for r in range(args.repeat)]
    agree(ctl, lambda: refuse_overwrite(args.out, sum(stems, []), args.overwrite) if rank == 0 else None,
          "results", False)
    scale = None
    if scf:   # the perturbations' size: step max|A|, max over every rank's columns (exact, any order)
        a_max = ctl.allreduce(float(scaling.max_abs(A_loc, xp)), op=MPI.MAX)
        scale = args.scf_step * (a_max if a_max > 0 else 1.0)
        if not math.isfinite(scale):
            raise CliError(f"--scf-step {args.scf_step:g}: step x max|A| = {args.scf_step:g} x {a_max:g} overflows: "
                           "pass a smaller --scf-step")

    known = spectrum(spec) if rank == 0 else None
    gpus = ctl.gather(_gpu_id(xp) if device == "gpu" else None, root=0)
    if rank == 0:
        info, commit = machine_info(xp), git_commit()
        if device == "gpu":
            info["gpus_used"] = len(set(gpus))  # ranks sharing a GPU (MPS) count it once
        info["blas"]["host_threads"] = args.host_threads_record
        what = (f" subset={subset[0]}:{subset[1]}" if subset else "") + \
            (f" scf={args.scf} (step {args.scf_step:g})" if scf else "")
        print(f"{PROG}: n={n} P={size} nb={args.nb} comm={args.comm} ({comm.backend}) problem={args.problem}{what} "
              f"on {device}; built in {build_s:.2f} s; results {os.path.join(args.out, base)}_run*",
              flush=True)
        print(METRICS_LEGEND, flush=True)
        if subset:
            print(f"subset {subset[0]}:{subset[1]}: the metrics of its k = {x_desc.n} pairs (B-orth in units of k eps; "
                  f"eig-err against the references' w[{subset[0]}..{subset[1]}], on the scale of all of w)", flush=True)

    meter = MemoryMeter(xp, trace=device == "cpu" and not args.no_trace_memory)
    refs = [None] * len(plan)   # rank 0: scipy's (eigenvalues, seconds, error) of each solve's pair
    written = []                # rank 0: each solve's files
    cols = desc.local_cols(rank)
    for r in range(args.repeat):
        cc = CountingComm(comm, sync_each=not args.no_sync_collectives)
        solver, times = None, []
        try:
            for j, (p_identity, p_digest, identity, digest) in enumerate(plan):
                A_j = A_loc if j == 0 else scf_operand(A_loc, cols, j, scale, spec.seed, xp)
                if r == 0:
                    refs[j] = reference_on_root(args, A_j, B_loc, desc, ctl)
                    if rank == 0 and refs[j][2]:
                        print(f"{PROG}: scipy reference failed ({refs[j][2]}); eig-err(scipy) not recorded", flush=True)
                cc.restart()   # solve j's collectives only (solve 0's: B's agreement and potrf too)
                label = f"{args.comm} run {r}" + (f" solve {j}" if scf else "")
                bar = progress(len(PHASES) - (solver is not None), label, rank == 0)
                timer = PhaseTimer(xp, cc, bar)
                meter.start()
                ctl.Barrier()
                with GcPauses() as pauses:
                    t0 = time.perf_counter()
                    if solver is None:   # B factored once per run: sygvd is this solver's one solve
                        solver = GeneralizedSolver(B_loc, desc, cc, stedc=args.stedc, sytrd=sytrd_mode,
                                                   reduction=args.reduction, timer=timer, name="sygvd")
                    w, X = solver.solve(A_j, eigvals_only=not vectors, subset_by_index=subset, timer=timer)
                    sync(xp)
                    solve_s = time.perf_counter() - t0
                meter.solve_done()
                if bar is not None:
                    bar.close()
                times.append((solve_s, timer.seconds.get("potrf")))
                t1 = time.perf_counter()
                # host arrays: plain MPI (a metric needs no rank-order sums); device arrays: the hpccoll
                # communicator, which moves device buffers
                if vectors:
                    acc = metrics.distributed_accuracy(A_j, B_loc, X, w, desc, ctl if device == "cpu" else comm,
                                                       x_desc=x_desc)
                    col = metrics.column_digests(X)
                else:
                    acc, col = {"residual": None, "b_orthogonality": None}, None
                metrics_s = time.perf_counter() - t1
                del A_j
                memory = meter.stop()
                w_digest = metrics.sha256(w)
                gathered = ctl.gather((w_digest, metrics.combine_digests(col) if vectors else None, col, memory,
                                       pauses.record()), root=0)
                del col
                stem = stems[r][j]
                files = []
                if save_vectors(args):
                    files.append(os.path.join(args.out, stem + "_X.npy"))
                    write_vectors(files[-1], X, x_desc, ctl, args.gather_vectors)
                del X
                if rank != 0:
                    continue
                if args.out:
                    files.insert(0, write_eigenvalues(args.out, stem, w))
                ref, ref_s, ref_err = refs[j]
                per_rank, memory_per_rank = rank_records(gathered)
                summary = cc.summary()
                total = summary.get("total", {})
                count = sum(v["count"] for v in total.values())
                nbytes = sum(v["bytes"] for v in total.values())
                secs = sum(v["seconds"] for v in total.values())
                rec = {
                    "schema": RUN_SCHEMA,
                    "n": n, "nb": args.nb, "ranks": size, "comm": args.comm, "backend": comm.backend,
                    "stedc": args.stedc, "sytrd_mode": sytrd_mode, "reduction": args.reduction, "device": device,
                    "problem": args.problem, "cond_b": args.cond_b, "seed": args.seed,
                    "problem_digest": p_digest, "problem_identity": p_identity,
                    "problem_sha256": content if j == 0 else None, "config_digest": digest, "config": identity,
                    "repeat_index": r, "repeat": args.repeat,
                    "subset": list(subset) if subset else None,
                    "scf": _scf_record(args, j, scale, times[0][1], problem_digest, content) if scf else None,
                    "eigenvalues_sha256": w_digest,
                    "eigenvectors_sha256": metrics.combine_digests(in_column_order(x_desc, [g[2] for g in gathered]))
                    if vectors else None,
                    "per_rank": per_rank,
                    "ranks_agree_on_eigenvalues": len({g[0] for g in gathered}) == 1,
                    "residual": acc["residual"], "b_orthogonality": acc["b_orthogonality"],
                    "eigenvalue_error": metrics.eigenvalue_error(w, known if j == 0 else None, subset),
                    "eigenvalue_error_vs_scipy": metrics.eigenvalue_error(w, ref, subset),
                    "eigenvalue_error_definition": metrics.SUBSET_EIGENVALUE_ERROR_DEFINITION if subset
                    else metrics.EIGENVALUE_ERROR_DEFINITION,
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
                    "eigenvalues_file": stem + "_w.npy" if args.out else None,
                    "eigenvectors_file": stem + "_X.npy" if save_vectors(args) else None,
                    "eigenvectors_layout": ("float64 n x n .npy, Fortran order, column j = eigenvector of "
                                            "eigenvalues[j]" if subset is None else
                                            f"float64 n x k .npy, k = {x_desc.n}, Fortran order, column j = "
                                            f"eigenvector of eigenvalues[j], eigenpair {subset[0]} + j of the "
                                            "ascending spectrum"),
                    "metric_definitions": METRIC_DEFINITIONS,
                    "reproducibility": GUARANTEE,
                }
                print_run(rec)
                if args.out:
                    written.append(files + [write_json(args.out, stem, rec)])
        finally:
            if solver is not None:
                solver.free()
        if scf and rank == 0:
            print(_scf_summary(r, times), flush=True)
    for files in written:
        print("wrote " + ", ".join(files), flush=True)
    return 0


def _plan(args, problem_identity: dict, problem_digest: str, ranks: int, device: str, vectors: bool) -> list:
    """Per solve of a run (one; K with --scf): (problem identity, problem digest, configuration
    identity, configuration digest).  Solve 0 is the problem itself, the same configuration as a
    plain solve of it (the same bits); solve j >= 1 of --scf solves A_j (problems.scf_operand)."""
    import hashlib
    import json

    from .linalg.driver import solves_early, stedc_choice
    from .linalg.stedc import early as tridiag_dc
    from .problems import scf_identity

    plan = []
    for j in range(args.scf or 1):
        p_identity = scf_identity(problem_identity, j, args.scf_step)
        p_digest = problem_digest if j == 0 else \
            hashlib.sha256(json.dumps(p_identity, sort_keys=True).encode()).hexdigest()
        identity = config_identity(args, p_digest, ranks, args.comm, device)
        if args.subset is None and solves_early(stedc_choice(args.stedc, device == "gpu"), vectors, ranks):
            # the subtrees are scaled by their own |T|: another minimum size gives other bits (a
            # subset solves no tridiagonal eigenproblem whole: no subtrees)
            identity["dc_early_leaves"] = tridiag_dc.EARLY_LEAVES
        if not vectors:   # the eigenvalues then come from LAPACK on rank 0 (all) or bisection (subset)
            identity["eigvals_only"] = True
        plan.append((p_identity, p_digest, identity, config_digest(identity)))
    return plan


def _scf_record(args, j: int, scale: float, potrf_s, problem_digest: str, content) -> dict:
    """The "scf" entry of solve j's record."""
    from .problems import PERTURBATION

    return {"solves": args.scf, "index": j, "step": args.scf_step, "scale": scale, "perturbation": PERTURBATION,
            "a": "the problem's A" if j == 0 else f"A + scale Z_{j} (problems.scf_operand)",
            "potrf_seconds": potrf_s, "factored_in": "solve 0 (its phases hold potrf; later solves have none)",
            "base_problem_digest": problem_digest, "base_problem_sha256": content}


def _scf_summary(r: int, times: list) -> str:
    """One line on an --scf run: each solve's time and what factoring B once saved (the later
    solves' potrf, taken as solve 0's)."""
    potrf = times[0][1] or 0.0
    total = sum(t for t, _ in times)
    saved = potrf * (len(times) - 1)
    each = " ".join(f"{t:.3f}" for t, _ in times)
    return (f"scf run {r}: {len(times)} solves with one B, factored once (potrf {potrf:.3f} s, in solve 0); "
            f"solve s: {each}; total {total:.3f} s; saved about {saved:.3f} s against a fresh sygvd each "
            f"({100 * saved / (total + saved) if total + saved else 0:.1f}% of {total + saved:.3f} s)")
