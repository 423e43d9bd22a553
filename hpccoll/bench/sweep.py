"""`hpccoll bench`: the sweep of one collective over sizes and algorithms, every row checked and
timed in every mode that applies, beside the SoL model and the baselines.

    mpiexec -n N hpccoll bench allreduce [--sizes 8:64M] [--dtype float32] [--algorithms all]
                                         [--iters K] [--deterministic] [--baselines]
                                         [--persistent [--engine-order caller]]
                                         [--json out.json] [--plot out.png]

The columns, per (size, algorithm), in µs per op (median over repetitions, then the MAX over
ranks of each rank's median; every timed region starts aligned: timing.py):

  eager           one Python call + stream synchronize per iteration (perf_counter)
  eager_persistent  (--persistent) the same with the eager engine running
                  (backends/cuda/engine.py): Allreduce rows of 'auto' / 'oneshot_ll' up to the
                  engine's 256 KiB
  eager_request   (--persistent) the same call as a persistent request (Allreduce_init once,
                  then Start + Wait per iteration: MPI-4's persistent collectives), engine running
                  (--engine-order caller: the engine skips its stream query, the bench having
                  synchronized before every call: start_persistent's order="caller")
  graph           G back-to-back calls captured in a CUDA graph, R replays timed with events
                  (hpccoll: one-shot calls captured back to back run as one node:
                  backends/cuda/fusion.py)
  graph_unfused   (hpccoll one-shot rows) the same graph with the capture fusion off: a kernel
                  node per call, as the baselines have
  graph_group     one group (Communicator.group) of G Allreduce calls into G outputs, captured
                  in a CUDA graph (hpccoll fuses them; NCCL: an NCCL group), up to 4 MiB
  in_kernel       collectives inside one kernel launch (hpccoll algorithms only): the slope
                  between launches of K and 4K of them, so the launch's own cost drops out
  blocking        graph of (op, device barrier) minus a graph of barriers alone (`barrier_us`)

Without a GPU (host backend) only `eager` runs, algorithm "mpi".  Every GPU-only piece
(SoL model, graphs, baselines) that fails is skipped with its reason printed and recorded in
the JSON (`skipped`), never crashing the sweep: ranks agree on success before timing, so
one rank's failure cannot leave the others waiting in a kernel."""
from __future__ import annotations

import sys

import numpy as np

from .baselines import bench_nccl, torch_baselines_first, unicast_only
from .cases import Case
from .collectives import algorithm_list
from .ranks import Skip, describe, guarded, say
from ..config import git_commit
from .report import machine_info, now
from .rows import bench_hpccoll
from .sizes import fmt_bytes, parse_sizes
from .sol import measure_sol, sol_us_for
from .timing import GRAPH_OPS, set_aligner


def run_sweep(opts, log=None) -> dict:
    """The whole benchmark (collective over MPI.COMM_WORLD); returns the result on every rank.

    opts: collective, sizes (a spec or a list of bytes), dtype, algorithms, iters,
    deterministic, persistent, engine_order, and baselines: False, True (NCCL, torch symmetric
    memory and host-staged MPI) or "nccl" (NCCL only: hpccoll tune's fallback candidate)."""
    import hpccoll
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    log = log or (lambda *m: say(world.Get_rank(), *m))
    sizes = parse_sizes(opts.sizes) if isinstance(opts.sizes, str) else list(opts.sizes)
    torch_rows: dict = {}   # bytes -> torch rows, measured before hpccoll opens the GPU
    torch_skip = None
    all_baselines = opts.baselines and opts.baselines != "nccl"
    if all_baselines:
        unicast_only()
    if all_baselines and opts.collective == "allreduce":
        torch_rows, torch_skip = torch_baselines_first(
            opts, sizes, world, log, lambda r: say(world.Get_rank(), progress_line(r)))
    comm = hpccoll.Communicator(backend="auto", check=False)
    # device buffers (flat CUDA backend, or hierarchical on GPUs): on every rank or none (the
    # nodes of a hierarchical communicator may have fallen back to the host backend alone)
    gpu = all(world.allgather(comm.device is not None))
    flat = comm.backend == "cuda"     # one node: SoL, in-kernel, blocking and baselines apply
    skipped: dict = {}
    result = {"machine": machine_info(comm), "commit": git_commit(), "date": now(), "ranks": comm.size,
              "backend": comm.backend, "collective": opts.collective, "dtype": opts.dtype,
              "deterministic": bool(opts.deterministic), "iters": opts.iters, "graph_ops": GRAPH_OPS,
              "engine_order": opts.engine_order, "command": " ".join(["hpccoll"] + sys.argv[1:]),
              "sol_us": None, "sol": {}, "rows": [], "skipped": skipped, "aligned_start": flat}
    if not gpu:
        log("hpccoll bench: no usable GPU / CUDA backend: host backend, eager mode, algorithm 'mpi' only")
    if flat:
        try:
            result["sol"] = measure_sol(comm, log)
            result["sol_us"] = result["sol"].get("sol_us")
        except Exception as exc:  # noqa: BLE001 - the model is context, not the measurement
            skipped["sol"] = str(exc) if isinstance(exc, Skip) else describe(exc)
            log(f"SoL model skipped: {skipped['sol']}")
    peer_atomics = bool(comm.backends.main.peer_atomics) if flat else False
    algos = algorithm_list(opts.collective, opts.algorithms, opts.dtype, opts.deterministic,
                           peer_atomics, gpu) if flat or not gpu else ["auto"]
    nccl_comm, host_comm = _open_baselines(comm, opts, gpu, flat, torch_skip, skipped, log)
    xp = np
    if gpu:
        import cupy as xp  # noqa: F811
    progress = _Progress(comm.rank, len(sizes) * (len(algos) + (nccl_comm is not None) + (host_comm is not None)),
                         f"bench {opts.collective}", log)
    log = progress.log
    rows = result["rows"]
    if flat:
        device = comm.backends.main
        set_aligner(lambda h: device.barrier(stream=h, sync=False))
    try:
        for nbytes in sizes:
            try:
                case = guarded(comm.mpi_comm, lambda: Case(opts.collective, nbytes, opts.dtype, comm.rank,
                                                           comm.size, xp))
            except Skip as exc:  # e.g. a dtype this array library lacks
                raise SystemExit(f"hpccoll bench: cannot make {opts.dtype} buffers of "
                                 f"{fmt_bytes(nbytes)} on the {comm.backend} backend: {exc}") from None
            for algo in algos:
                progress.start(f"{fmt_bytes(nbytes)} {algo}")
                rows.append(progress.done(bench_hpccoll(comm, case, algo, opts, gpu, log)))
            if nccl_comm is not None:
                rows.append(progress.done(bench_nccl(nccl_comm, comm, case, opts, log)))
            rows.extend(torch_rows.get(nbytes, []))
            if host_comm is not None:
                rows.append(progress.done(bench_hpccoll(host_comm, case, "mpi", opts, False, log)))
            del case
    finally:
        set_aligner(None)
        progress.close()
        for c in (nccl_comm, host_comm):
            if c is not None:
                c.Free()
        comm.Free()
    for r in rows:
        annotate(r, result, result["ranks"])
    return result


def _open_baselines(comm, opts, gpu: bool, flat: bool, torch_skip, skipped: dict, log):
    """(NCCL communicator or None, host communicator or None) for the baselines asked for;
    what cannot run is recorded in `skipped` (collective)."""
    import hpccoll

    if not opts.baselines:
        return None, None
    if gpu and not flat:
        skipped["baselines"] = "hierarchical communicator: run the baselines on a single-node layout"
        log("baselines skipped: hierarchical communicator")
        return None, None
    if not gpu:
        skipped["baselines"] = "no GPU: the host run is the MPI path itself"
        log("baselines skipped: no GPU (the host run is the MPI path itself)")
        return None, None
    nccl_comm = None
    try:
        nccl_comm = guarded(comm.mpi_comm, lambda: hpccoll.Communicator(backend="nccl", check=False))
    except Skip as exc:
        skipped["nccl"] = str(exc)
        log(f"nccl baseline skipped: {exc}")
    if opts.baselines == "nccl":
        return nccl_comm, None
    if opts.collective != "allreduce":
        skipped["torch"] = "torch symm_mem baselines are allreduce only"
    elif torch_skip:
        skipped["torch"] = torch_skip
    return nccl_comm, hpccoll.Communicator(backend="host", check=False)


def progress_line(r: dict) -> str:
    return (f"# {r['bytes']} B {r['algorithm']}: eager {r.get('eager_us')} graph {r.get('graph_us')} "
            f"group {r.get('graph_group_us')} in-kernel {r.get('in_kernel_us')} ok {r.get('ok')}")


class _Progress:
    """Rank 0's progress: a tqdm bar on a terminal (where tqdm is installed), else one line per
    row.  `log` prints above the bar while it is up."""

    def __init__(self, rank: int, total: int, desc: str, log):
        self.rank, self._log, self.bar = rank, log, None
        if rank == 0 and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, desc=desc, unit="run", leave=False)
            except ImportError:
                pass

    def log(self, *msg) -> None:
        if self.bar is None:
            self._log(*msg)
        elif self.rank == 0:
            self.bar.write(" ".join(str(x) for x in msg))

    def start(self, what: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(what)

    def done(self, row: dict) -> dict:
        if self.bar is not None:
            self.bar.update(1)
        else:
            say(self.rank, progress_line(row))
        return row

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def annotate(row: dict, result: dict, nranks: int) -> None:
    """busbw, x SoL, speed-ups vs NCCL and the best torch baseline (graph / graph)."""
    t = row.get("graph_us") or row.get("eager_us")
    b = row["bytes"]
    coll = row["collective"]
    if t:
        if coll == "allreduce":
            bus = b * 2 * (nranks - 1) / nranks
        elif coll in ("allgather", "reduce_scatter"):
            bus = b * nranks * (nranks - 1) / nranks
        else:
            bus = b
        row["busbw_GBps"] = bus / (t * 1e3)
    sol = sol_us_for(result.get("sol"), b)
    row["sol_us"] = sol
    row["ratio_to_sol"] = (row["in_kernel_us"] / sol) if (sol and row.get("in_kernel_us")) else None

    def graph_of(name, key="graph_us"):
        return [r[key] for r in result["rows"]
                if r["algorithm"] == name and r["bytes"] == b and r.get(key)]

    g = row.get("graph_us")
    nccl = graph_of("nccl")
    torch = graph_of("torch_one_shot") + graph_of("torch_two_shot")
    row["speedup_vs_nccl"] = (nccl[0] / g) if (g and nccl) else None
    row["speedup_vs_torch"] = (min(torch) / g) if (g and torch) else None
    gg = row.get("graph_group_us")
    nccl_group = graph_of("nccl", "graph_group_us")
    row["group_speedup_vs_nccl"] = (nccl_group[0] / gg) if (gg and nccl_group) else None
