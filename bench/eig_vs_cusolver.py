"""The eigensolver against cuSOLVER on one GPU, in one process and on the same matrices:
hpccoll_eigensolver's sygvd at P = 1 (one-stage and two-stage reduction; all eigenpairs, the
eigenvalues only, the lowest n/10 pairs) against cusolverDnDsygvd / cusolverDnDsygvdx called
directly (bench/cusolver_direct.py), with the GPU's own DGEMM rate and memory bandwidth measured
in the same run as the denominators of every rate.  --mpi: P ranks sharing the GPU (MPS).

Each case is timed on its last of --calls calls at the same n (default 2: the first is a
warm-up, and its pool high-water mark is the case's memory), after one call of every case at
--warmup-n; device syncs around each call and each phase.  Rows are printed and the JSON and
markdown rewritten as each case ends, so a killed run keeps what it did; --budget-s skips the
cases that would start later, naming them.

Rates.  TFLOP/s of a solve: the useful-flop count (LAPACK's, the same for every solver of one
output: potrf n^3/3, sygst n^3, sytrd 4n^3/3, with vectors ormtr 2n^2 k and trsm n^2 k for k
eigenvectors) over its seconds.  A phase's rate counts that phase's own work (FLOP_MODEL).
Peak memory: CuPy's pool high-water mark over the first call (free_all_blocks before it; the
inputs A and B included), and the drop of cudaMemGetInfo's free bytes over it (memory outside
the pool too; under MPS the whole GPU's)."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cusolver_direct as cd
from eig_measure import (CASES, COLUMNS, DEFAULT_WHAT, FLOP_MODEL, MPI_COLUMNS, MPI_WHAT, SAME_B, Device, machine,
                         PhaseClock, accuracy, build_problem, fingerprint, format_sol, int_list, mpi_cells,
                         parse_what, phase_lines, phase_rates, rel_error, report_md, row_cells, sha,
                         speed_of_light, subset_k, table_line, two_stage_band, useful_flops, vectors_of,
                         write_outputs)

EPILOG = """one GPU, every step (bench/eig_vs_cusolver.sh runs them and tars the outputs):
  python bench/eig_vs_cusolver.py --n 8192,16384 --out OUT --budget-s 500
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p /tmp/mps-pipe /tmp/mps-log && nvidia-cuda-mps-control -d
  mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 python bench/eig_vs_cusolver.py --mpi --n 8192 --out OUT
  mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 4 python bench/eig_vs_cusolver.py --mpi --n 8192 --out OUT
  echo quit | nvidia-cuda-mps-control
CPU dry run (NumPy; scipy.linalg.eigh(A, B) for dsygvd): add --host, e.g. --host --n 200,300 --nb 16
(and mpiexec -n 2 ... --mpi --host)."""


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int_list, default=[8192, 16384], help="matrix orders (default 8192,16384)")
    ap.add_argument("--what", default=None, help=f"cases, in order (default {DEFAULT_WHAT}; 'all' adds the anchors; "
                    f"with --mpi default {MPI_WHAT}); dsygvd and the anchors run first at each n")
    ap.add_argument("--problems", default="random,known",
                    help="random: A = (G + G^T)/2, B = Q diag(logspace(0, log10 cond_b, n)) Q^T, Q of a QR of a "
                         "Gaussian, on the device; known: hpccoll_eigensolver.problems (default both)")
    ap.add_argument("--known-max-n", type=int, default=16384, help="largest n of the known problem (default 16384)")
    ap.add_argument("--cond-b", type=float, default=1e3, help="condition number of B (default 1e3)")
    ap.add_argument("--seed", type=int, default=0, help="the problems' seed (default 0)")
    ap.add_argument("--nb", type=int, default=64, help="the solver's block size (default 64)")
    ap.add_argument("--comm", default=None, help="hpccoll-eigensolver's --comm choice (default sentinel; mpi with --host)")
    ap.add_argument("--sytrd", default="auto", help="sygvd's sytrd= (default auto)")
    ap.add_argument("--stedc", default="auto", help="sygvd's stedc= (default auto)")
    ap.add_argument("--calls", type=int, default=2, help="calls per case at each n; the last is timed (default 2)")
    ap.add_argument("--warmup-n", type=int, default=1024, help="every case runs once at this n first (0: not)")
    ap.add_argument("--sol-n", type=int_list, default=None, help="DGEMM orders (default 8192,16384; host 256)")
    ap.add_argument("--sol-gib", type=float, default=None, help="bandwidth array size in GiB (default 2; host 1/32)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no case after this many seconds (default 540)")
    ap.add_argument("--out", default="eig-vs-cusolver", help="output folder (default ./eig-vs-cusolver)")
    ap.add_argument("--host", action="store_true", help="NumPy on the CPU (a dry run of every step)")
    ap.add_argument("--mpi", "--ranks-child", dest="mpi", action="store_true",
                    help="under mpiexec: the solves on P ranks (per-rank memory, time, agreement with P = 1)")
    args = ap.parse_args(argv)
    try:
        args.cases = parse_what(args.what or (MPI_WHAT if args.mpi else DEFAULT_WHAT), args.mpi)
    except ValueError as exc:
        ap.error(str(exc))
    args.problems = [p.strip() for p in args.problems.split(",") if p.strip()]
    bad = [p for p in args.problems if p not in ("random", "known")]
    if bad or not args.problems:
        ap.error(f"--problems {','.join(args.problems)!r}: use random, known or both")
    if args.calls < 1:
        ap.error("--calls: give 1 or more")
    args.comm = args.comm or ("mpi" if args.host else "sentinel")
    args.sol_n = args.sol_n or ([256] if args.host else [8192, 16384])
    args.sol_gib = args.sol_gib or (1 / 32 if args.host else 2.0)
    return args




# -- what every run shares -----------------------------------------------------------------------
def new_result(args, dev: Device, ranks: int) -> dict:
    from hpccoll.config import git_commit

    band, source = two_stage_band(args.nb)
    return {"schema": "eig-vs-cusolver/1", "command": " ".join(sys.argv), "ranks": ranks,
            "mode": "gpu" if dev.gpu else "host", "commit": git_commit(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(dev),
            "args": dict(vars(args)),
            "models": {"flops": FLOP_MODEL, "two_stage_band": band, "two_stage_band_source": source,
                       "useful_flops": "potrf n^3/3 + sygst n^3 + sytrd 4n^3/3 + ormtr 2n^2 k + trsm n^2 k",
                       "memory": "pool_peak_bytes: CuPy's default pool reserved bytes after the first call, "
                                 "free_all_blocks before it (inputs A, B included: pool_inputs_bytes); "
                                 "mem_get_info_drop_bytes: cudaMemGetInfo free bytes before minus after"},
            "metric_definitions": {
                "error": "max |w - w_ref| / max |w_ref|, w_ref = the first reference row of the (n, problem) "
                         "with all eigenvalues (dsygvd, else the anchor), its first k for a subset",
                "error_known": "the same against the spectrum the known problem was built with",
                "residual": "||A X - B X diag(w)||_F / (n ||A||_F ||X||_F eps), by column blocks",
                "b_orthogonality": "||X^T B X - I||_F / (k eps)",
                "ratio": "seconds / seconds of the reference of the same output (dsygvd, dsygvd-w, "
                         "dsygvdx-sub; the anchor where dsygvd failed)"},
            "sol": {}, "problems": [], "rows": [], "skipped": [], "complete": False}


def open_comm(args, dev: Device, mpi_comm):
    """The hpccoll Communicator of --comm over mpi_comm; on the GPU after warm_up (as the solve
    command does: no kernel compiles once the communicator is open)."""
    from hpccoll_eigensolver.runinfo import make_communicator

    device = None
    if dev.gpu:
        from hpccoll_eigensolver import warm_up

        warm_up(nb=args.nb, stedc=args.stedc)
        device = dev.xp.cuda.Device().id
    comm = make_communicator(args.comm, mpi_comm, device)
    if dev.gpu:
        comm.prepare(("float64",))
    return comm


def close_comm(comm, dev: Device) -> None:
    """Free the communicator, after the one-stage reduction's fused transfers' IPC-mapped memory
    where the library keeps such (as the solve command does)."""
    if dev.gpu:
        try:
            from hpccoll_eigensolver.linalg.sytrd_device import release_fused
        except ImportError:
            release_fused = None
        if release_fused is not None:
            release_fused(comm)
    comm.Free()


def solver_call(name: str, dev: Device, A, B, desc, comm, args, clock):
    """run() of case `name` on (A, B): cuSOLVER, the anchor, or sygvd (desc: its layout)."""
    solver, output, reduction = CASES[name]
    k = subset_k(desc.n)
    if solver == "cusolver":
        return (cd.prepare_sygvdx(dev.xp, A, B, 0, k - 1) if output == "subset"
                else cd.prepare_sygvd(dev.xp, A, B, output == "full"))
    if solver == "anchor":
        return cd.prepare_anchor(dev.xp, A, B, output == "full", clock)
    from hpccoll_eigensolver import GeneralizedSolver, sygvd

    if name in SAME_B:       # B factored here, before the timed call: only solve() is timed
        solver = GeneralizedSolver(B, desc, comm, reduction=reduction, sytrd=args.sytrd, stedc=args.stedc)
        return lambda: solver.solve(A, timer=clock)
    kw = {"reduction": reduction, "sytrd": args.sytrd, "stedc": args.stedc, "timer": clock}
    if output == "values":
        kw["eigvals_only"] = True
    if output == "subset":
        kw["subset_by_index"] = (0, k - 1)
    return lambda: sygvd(A, B, desc, comm, **kw)


def measure(dev: Device, prepare, calls: int, go_on, before=lambda: None):
    """Run prepare(clock)() `calls` times (go_on(seconds of the last call): whether another fits);
    returns (record, the last call's (w, X)).  Memory is the first call's; time the last's."""
    rec, out = {"calls": []}, None
    for c in range(calls):
        if c and not go_on(rec["calls"][-1]["seconds"]):
            rec["note"] = f"timed on call {c} of {calls}: the next would pass --budget-s"
            break
        out = None                     # the previous call's results go back to the pool first
        if c == 0:
            dev.pool_reset()
            used0, free0 = dev.pool()[0], dev.free_bytes()
        clock = PhaseClock(dev)
        run = prepare(clock)
        if c == 0 and hasattr(run, "workspace_bytes"):
            rec["workspace_bytes"] = run.workspace_bytes      # cuSOLVER's, from its bufferSize
        before()
        dev.sync()
        t0 = time.perf_counter()
        out = run()
        dev.sync()
        seconds = time.perf_counter() - t0
        del run
        if c == 0:
            rec["memory"] = {"pool_peak_bytes": dev.pool()[1], "pool_inputs_bytes": used0,
                             "mem_get_info_drop_bytes": None if free0 is None else free0 - dev.free_bytes()}
        rec["calls"].append({"seconds": seconds, "phases": dict(clock.seconds), "w_sha256": sha(dev, out[0])})
    rec.update(seconds=rec["calls"][-1]["seconds"], phases=rec["calls"][-1]["phases"],
               same_bits_every_call=len({c["w_sha256"] for c in rec["calls"]}) == 1)
    return rec, out


def skip(res: dict, why: str) -> None:
    res["skipped"].append(why)
    print(f"skipped {why}", flush=True)


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]


def ordered(cases: list[str]) -> list[str]:
    """The references (cuSOLVER, the anchor) first, each group in the order asked."""
    return [c for c in cases if CASES[c][0] != "hpccoll"] + [c for c in cases if CASES[c][0] == "hpccoll"]


def w_path(out: str, kind: str, n: int, name: str) -> str:
    return os.path.join(out, f"w-{kind}-n{n}-{name}.npy")


# -- P = 1 ---------------------------------------------------------------------------------------
def run_one(args, t_start: float) -> int:
    from hpccoll_eigensolver import BlockCyclic
    from mpi4py import MPI

    dev = Device(args.host)
    deadline = t_start + args.budget_s
    os.makedirs(args.out, exist_ok=True)
    res = new_result(args, dev, 1)
    band = res["models"]["two_stage_band"]
    cases = [c for c in args.cases if c != "sol"]
    print(f"{res['machine'].get('gpu') or res['machine'].get('cpu')}; commit {res['commit']}; {res['date']}",
          flush=True)
    if "sol" in args.cases:
        res["sol"] = speed_of_light(dev, args.sol_n, args.sol_gib)
        print(format_sol(res["sol"]), flush=True)
    comm = open_comm(args, dev, MPI.COMM_SELF)
    try:
        if args.warmup_n:
            warm(dev, cases, args, comm, BlockCyclic)
        print(table_line(COLUMNS), flush=True)
        for n in args.n:
            for kind in args.problems:
                if kind == "known" and n > args.known_max_n:
                    skip(res, f"n={n} known: above --known-max-n {args.known_max_n}")
                    continue
                if time.monotonic() > deadline:
                    skip(res, f"n={n} {kind}: every case (--budget-s {args.budget_s:g} passed)")
                    continue
                one_problem(dev, res, n, kind, cases, args, comm, BlockCyclic(n, n, args.nb, 1), band, deadline)
    finally:
        close_comm(comm, dev)
    res["complete"] = True
    write_outputs(res, args.out, "eig-vs-cusolver-p1")
    print("\n" + report_md(res), flush=True)
    print(f"wrote {os.path.join(args.out, 'eig-vs-cusolver-p1')}.{{json,md}}", flush=True)
    return 0


def warm(dev: Device, cases, args, comm, BlockCyclic, rank: int = 0, nprocs: int = 1) -> None:
    """One call of every case at --warmup-n (kernels built and loaded before any timed call)."""
    from hpccoll_eigensolver import distribute

    n = args.warmup_n
    A, B, _ = build_problem(dev, "random", n, args.seed + 1, args.cond_b)
    desc = BlockCyclic(n, n, args.nb, nprocs)
    if nprocs > 1:
        A, B = distribute(A, desc, rank), distribute(B, desc, rank)
    for name in cases:
        t0 = time.perf_counter()
        try:
            solver_call(name, dev, A, B, desc, comm, args, PhaseClock(dev))()
            dev.sync()
            msg = f"{time.perf_counter() - t0:.2f} s"
        except Exception as exc:  # noqa: BLE001 - reported; the timed run meets it again
            msg = f"failed ({_why(exc)})"
        if rank == 0:
            print(f"warm-up n={n} {name}: {msg}", flush=True)
    dev.pool_reset()


def one_problem(dev: Device, res: dict, n: int, kind: str, cases, args, comm, desc, band: int, deadline) -> None:
    """Every case on one (n, problem), references first; a row per case as it ends."""
    t0 = time.perf_counter()
    try:
        A, B, known = build_problem(dev, kind, n, args.seed, args.cond_b)
        dev.sync()
    except Exception as exc:  # noqa: BLE001 - memory, most likely: the next order may fit
        dev.pool_reset()
        skip(res, f"n={n} {kind}: every case (the problem was not built: {_why(exc)})")
        return
    res["problems"].append({"n": n, "problem": kind, "build_seconds": time.perf_counter() - t0,
                            "fingerprint": fingerprint(dev, A, B)})
    refs, wref = {}, None        # output -> its reference row; the reference eigenvalues (host)
    queue, done = ordered(cases), set()
    while queue:
        name = queue.pop(0)
        done.add(name)
        solver, output, reduction = CASES[name]
        if time.monotonic() > deadline:
            skip(res, f"n={n} {kind} {name}: --budget-s {args.budget_s:g} passed")
            continue
        row = {"n": n, "problem": kind, "what": name, "solver": solver, "output": output, "reduction": reduction,
               "k": vectors_of(output, n), "status": "ok"}
        try:
            rec, (w, X) = measure(dev, lambda clock, name=name: solver_call(name, dev, A, B, desc, comm, args, clock),
                                  args.calls, lambda s: time.monotonic() + s <= deadline)
        except Exception as exc:  # noqa: BLE001 - a row that says why; the next case runs
            row["status"] = f"failed: {_why(exc)}"
            fallback = {"full": "anchor", "values": "anchor-w"}.get(output) if solver == "cusolver" else None
            if fallback and fallback not in done and fallback not in queue:
                queue.insert(0, fallback)
                row["fallback"] = fallback
            finish_row(res, row, args)
            dev.pool_reset()
            continue
        row.update(rec)
        wh = dev.host(w)
        if solver != "hpccoll":
            refs.setdefault(output, row)
            if wref is None and output != "subset":
                wref, row["w_reference"] = wh, "self"
        ref = refs.get(output)
        row["ratio_to"] = None if ref is None else ref["what"]
        row["ratio"] = None if ref is None else row["seconds"] / ref["seconds"]
        row["error"] = None if row.get("w_reference") == "self" or wref is None else rel_error(wh, wref[:wh.size])
        row["error_known"] = None if known is None else rel_error(wh, known[:wh.size])
        if X is not None:
            row.update(accuracy(dev.xp, A, B, X, w))
        k = vectors_of(output, n)
        row["tflops"] = useful_flops(n, k) / row["seconds"] / 1e12
        row["pct_dgemm"] = (100 * row["tflops"] / res["sol"]["dgemm_tflops"]
                            if res["sol"].get("dgemm_tflops") else None)
        row["phase_rates"] = phase_rates(row["phases"], n, k, reduction, band, res["sol"])
        if solver == "hpccoll":
            np.save(w_path(args.out, kind, n, name), wh)
        del w, X
        finish_row(res, row, args)
        dev.pool_reset()


def finish_row(res: dict, row: dict, args) -> None:
    res["rows"].append(row)
    print(table_line(row_cells(row)), flush=True)
    for line in phase_lines(row):
        print(line, flush=True)
    write_outputs(res, args.out, "eig-vs-cusolver-p1")


# -- P ranks (--mpi) -------------------------------------------------------------------------------
def run_ranks(args, t_start: float) -> int:
    """The solves on the ranks of MPI.COMM_WORLD (sharing the GPU under MPS): per rank its time and
    CuPy pool high-water mark; the eigenvalues' bits across ranks and against P = 1's w files."""
    from hpccoll_eigensolver import BlockCyclic
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    ctl = world.Dup()                  # this script's own agreements, apart from the solver's traffic
    rank, size = ctl.Get_rank(), ctl.Get_size()
    if args.host:
        dev = Device(True)
    else:
        from hpccoll_eigensolver.runinfo import select_device

        if select_device(ctl)[0] is np:
            raise SystemExit("eig_vs_cusolver --mpi: no GPU here (CuPy and a device): add --host for the CPU")
        dev = Device(False)
    deadline = t_start + args.budget_s
    stem = f"eig-vs-cusolver-mpi-p{size}"   # apart from the P = 1 run's file, also at size 1
    res = new_result(args, dev, size) if rank == 0 else None
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        print(f"P={size}: {res['machine'].get('gpu') or res['machine'].get('cpu')}; commit {res['commit']}", flush=True)
    p1 = read_p1(args.out) if rank == 0 else None
    if rank == 0 and p1:               # the denominators P = 1 measured on this GPU
        res["sol"] = dict(p1.get("sol") or {}, measured_by="the P = 1 run in --out")
    comm = open_comm(args, dev, world)
    try:
        if args.warmup_n:
            warm(dev, args.cases, args, comm, BlockCyclic, rank, size)
        if rank == 0:
            print(table_line(MPI_COLUMNS), flush=True)
        for n in args.n:
            for kind in args.problems:
                why = None
                if kind == "known" and n > args.known_max_n:
                    why = f"n={n} known: above --known-max-n {args.known_max_n}"
                elif time.monotonic() > deadline:
                    why = f"n={n} {kind}: every case (--budget-s {args.budget_s:g} passed)"
                why = ctl.bcast(why, root=0)
                if why:
                    if rank == 0:
                        skip(res, why)
                    continue
                if not ranks_problem(dev, res, p1, n, kind, args, ctl, comm, BlockCyclic(n, n, args.nb, size),
                                     deadline, stem):
                    break
    finally:
        close_comm(comm, dev)
    if rank == 0:
        res["complete"] = True
        write_outputs(res, args.out, stem)
        print("\n" + report_md(res), flush=True)
    ctl.Free()
    return 0


def read_p1(out: str) -> dict | None:
    path = os.path.join(out, "eig-vs-cusolver-p1.json")
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        return json.load(fh)


def ranks_problem(dev: Device, res, p1, n: int, kind: str, args, ctl, comm, desc, deadline, stem) -> bool:
    """Every case on one (n, problem) on all ranks; False after a case failed on some rank (the
    communicator may then be unusable: the run ends)."""
    from hpccoll_eigensolver import distribute

    rank, size = ctl.Get_rank(), ctl.Get_size()
    fp = known = A = B = None
    why = None
    for r in range(size):              # in turn: one whole pair on the GPU at a time
        if r == rank:
            try:
                A_all, B_all, known = build_problem(dev, kind, n, args.seed, args.cond_b)
                fp = fingerprint(dev, A_all, B_all)
                A, B = distribute(A_all, desc, rank), distribute(B_all, desc, rank)
                del A_all, B_all
            except Exception as exc:  # noqa: BLE001 - memory, most likely: said by every rank below
                why = f"rank {rank}: {_why(exc)}"
            dev.pool_reset()
        ctl.Barrier()
    whys = [w for w in ctl.allgather(why) if w]
    if whys:
        if rank == 0:
            skip(res, f"n={n} {kind}: every case (the problem was not built: {'; '.join(whys)})")
        return True
    fps = ctl.gather(fp, root=0)
    same_problem = None
    if rank == 0:
        ref = [q["fingerprint"] for q in (p1 or {}).get("problems", []) if (q["n"], q["problem"]) == (n, kind)]
        same_problem = {"ranks_alike": len(set(fps)) == 1, "as_p1": (fps[0] in ref) if ref else None}
    for name in args.cases:
        go = ctl.bcast(time.monotonic() <= deadline if rank == 0 else None, root=0)
        if not go:
            if rank == 0:
                skip(res, f"n={n} {kind} {name}: --budget-s {args.budget_s:g} passed")
            continue
        solver, output, reduction = CASES[name]
        mine, why = None, None
        try:
            rec, (w, _X) = measure(
                dev, lambda clock, name=name: solver_call(name, dev, A, B, desc, comm, args, clock), args.calls,
                lambda s: ctl.bcast(time.monotonic() + s <= deadline if rank == 0 else None, root=0), ctl.Barrier)
            mine = (rec["seconds"], rec["memory"]["pool_peak_bytes"], rec["calls"][-1]["w_sha256"], rec["phases"])
            del _X
        except Exception as exc:  # noqa: BLE001 - every rank reports; the run then ends
            why = _why(exc)
        got = ctl.gather((mine, why), root=0)
        failed = ctl.bcast(any(g[1] for g in got) if rank == 0 else None, root=0)
        if rank == 0:
            row = {"n": n, "problem": kind, "what": name, "ranks": size, "solver": solver, "output": output,
                   "reduction": reduction, "status": "ok", "problem_check": same_problem}
            if failed:
                row["status"] = "failed: " + "; ".join(f"rank {r}: {g[1]}" for r, g in enumerate(got) if g[1])
            else:
                secs = [g[0][0] for g in got]
                peaks = [g[0][1] for g in got]
                wh = dev.host(w)
                row.update(rec, seconds=max(secs), slowest_rank=int(np.argmax(secs)),
                           per_rank=[{"rank": r, "seconds": g[0][0], "pool_peak_bytes": g[0][1], "w_sha256": g[0][2]}
                                     for r, g in enumerate(got)],
                           peak_bytes_max=None if None in peaks else max(peaks),
                           ranks_agree=len({g[0][2] for g in got}) == 1,
                           error_known=None if known is None else rel_error(wh, known[:wh.size]),
                           vs_p1=against_p1(args.out, kind, n, name, wh))
                k = vectors_of(output, n)
                row["phase_rates"] = phase_rates(rec["phases"], n, k, reduction, res["models"]["two_stage_band"],
                                                 res["sol"])
                row["tflops"] = useful_flops(n, k) / row["seconds"] / 1e12
            res["rows"].append(row)
            print(table_line(mpi_cells(row)), flush=True)
            write_outputs(res, args.out, stem)
        if not failed:
            del w
        dev.pool_reset()
        if failed:
            return False
    return True


def against_p1(out: str, kind: str, n: int, name: str, w: np.ndarray) -> dict | None:
    """w against the P = 1 run's w of the same case (its file in --out): None without one."""
    path = w_path(out, kind, n, name)
    if not os.path.exists(path):
        return None
    w1 = np.load(path)
    if w1.shape != w.shape:
        return {"file": os.path.basename(path), "bitwise": False, "max_rel_diff": None,
                "note": f"P = 1 has {w1.size} eigenvalues, here {w.size}"}
    return {"file": os.path.basename(path), "bitwise": bool(np.array_equal(w1, w)), "max_rel_diff": rel_error(w, w1)}


def main(argv=None) -> int:
    t_start = time.monotonic()
    args = parse_args(argv)
    return run_ranks(args, t_start) if args.mpi else run_one(args, t_start)


if __name__ == "__main__":
    sys.exit(main())
