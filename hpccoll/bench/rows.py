"""One row of a sweep: hpccoll's own calls of one (size, algorithm), checked once and then timed
in every mode that applies - eager, eager with the engine running and as a persistent request,
graph (fused and unfused), group, in-kernel, blocking.  A mode that cannot run records why
(row["skipped"]) instead of a number."""
from __future__ import annotations

from ..config import setting
from .collectives import COLLECTIVE_CALL
from .ranks import Skip, guarded, max_over_ranks
from .sizes import MiB, fmt_bytes
from .timing import EAGER_WARMUP, GRAPH_OPS, in_kernel_slope, time_eager, time_graph

ROW_KEYS = ("collective", "algorithm", "dtype", "bytes", "count", "eager_us", "eager_persistent_us",
            "eager_request_us", "graph_us", "graph_unfused_us", "graph_group_us", "in_kernel_us",
            "blocking_us", "barrier_us", "ok")
GROUP_MAX_BYTES = 4 * MiB  # the group mode's largest size (GRAPH_OPS outputs of it are allocated)


def new_row(collective, algorithm, dtype, case, **kw) -> dict:
    """A row with every key of ROW_KEYS, the times None until measured."""
    row = {"collective": collective, "algorithm": algorithm, "dtype": dtype, "bytes": case.nbytes,
           "count": case.count, **dict.fromkeys(k for k in ROW_KEYS if k.endswith("_us")), "ok": None}
    row.update(kw)
    return row


def run_mode(row: dict, key: str, fn, log) -> None:
    """row[key] = fn(); a Skip records its reason in row["skipped"] instead of a number."""
    try:
        row[key] = fn()
    except Skip as exc:
        row.setdefault("skipped", {})[key] = str(exc)
        log(f"  {row['algorithm']} {fmt_bytes(row['bytes'])}: {key} skipped: {exc}")


def check_once(row: dict, case, mpi, run_and_wait, log) -> bool:
    """The first call, checked (it also compiles the kernel); False, with the reason recorded,
    when it failed on any rank."""
    try:
        case.reset()
        guarded(mpi, run_and_wait)
        row["ok"] = case.check(mpi, case.host_result())
        return True
    except Skip as exc:
        row["ok"] = False
        row.setdefault("skipped", {})["all"] = str(exc)
        log(f"  {row['algorithm']} {fmt_bytes(case.nbytes)}: failed: {exc}")
        return False


def rerun_checks(mpi_comm, case, rerun, wait, outs=None) -> list:
    """Zero the outputs (the case's own, or `outs`), rerun(), wait(), then check each output
    against the reference; the verdicts, the same on every rank (collective: every output is
    checked on every rank and the verdicts agreed)."""
    import cupy

    if outs is None:
        case.reset(full=True)
    else:
        for out in outs:
            out[...] = 0
    cupy.cuda.Device().synchronize()
    rerun()
    wait()
    return [case.check(mpi_comm, case.host_result(out)) for out in (outs or [None])]


def bench_hpccoll(comm, case, algo, opts, gpu: bool, log) -> dict:
    """One (size, algorithm) row of hpccoll itself (or 'mpi' on the host backend)."""
    mpi = comm.mpi_comm
    det = opts.deterministic
    row = new_row(opts.collective, algo, opts.dtype, case)
    sync = (lambda: comm.synchronize()) if gpu else (lambda: None)
    flat = comm.backend == "cuda"  # single node: kernel-level modes apply; hierarchical: eager, graph
    if flat and algo == "auto":
        try:
            call = case.prepare()
            op = call.op.name if call.op else None
            row["resolved"] = comm.backends.main.resolve(call.name, call.recv.dtype, op, call.send.nbytes, det,
                                                         "auto")
        except Exception:  # noqa: BLE001 - the row only loses its label; the call reports errors
            pass
    if not check_once(row, case, mpi, lambda: (case.call(comm, algo, det), sync()), log):
        return row
    run_mode(row, "eager_us", lambda: time_eager(mpi, case.bound(comm, algo, det), sync, opts.iters, gpu), log)
    if not gpu:
        return row
    if opts.persistent and flat and _engine_takes(opts, algo, case):
        run_mode(row, "eager_persistent_us", lambda: _eager_persistent(comm, case, algo, det, opts, row, log), log)

    def graph_check(g, s):
        """One replay into a zeroed output, checked like the eager result."""
        if not all(rerun_checks(mpi, case, lambda: g.launch(s), s.synchronize)):
            raise RuntimeError("wrong result after a graph replay")

    def graph():
        return time_graph(mpi, lambda s: case.call(comm, algo, det, stream=s), opts.iters, check=graph_check)

    run_mode(row, "graph_us", graph, log)
    one_shot = flat and algo in ("auto", "oneshot_sentinel", "oneshot_ll") and case.collective == "allreduce"
    if one_shot and comm.config.fuse:
        def unfused():
            plain = _unfused(comm)
            try:
                return time_graph(mpi, lambda s: case.call(plain, algo, det, stream=s), opts.iters, check=graph_check)
            finally:
                plain.Free()

        run_mode(row, "graph_unfused_us", unfused, log)
    if one_shot:
        run_mode(row, "graph_group_us", lambda: time_graph_group(
            comm, case, opts.iters, algorithm=algo, deterministic=det), log)
    if not flat:
        row.setdefault("skipped", {})["in_kernel"] = "hierarchical communicator: several launches and MPI/NCCL per call"
        return row
    run_mode(row, "in_kernel_us", lambda: _in_kernel(comm, case, algo, det, opts, row), log)
    blocking(comm, row, lambda s: case.call(comm, algo, det, stream=s), opts, log)
    return row


def _unfused(comm):
    """A communicator like `comm` with capture fusion off: its Dup reads HPCCOLL_FUSE=0 (every
    rank sets it alike, as the setting must be)."""
    with setting("HPCCOLL_FUSE", "0"):
        return comm.Dup()


def _in_kernel(comm, case, algo, det, opts, row) -> float:
    """in_kernel_us: the slope of loops of K and 4K calls in one launch, then one more loop into
    a zeroed output, checked (every collective of it reads the same input)."""
    import cupy

    mpi, b = comm.mpi_comm, comm.backends.main
    call = case.prepare()
    route = b.route(call, algo, det)
    s = cupy.cuda.Stream(non_blocking=True)
    guarded(mpi, lambda: (b.run(call, route, s, iters=1), comm.synchronize(s)))
    t = in_kernel_slope(mpi, s, lambda k: b.run(call, route, s, iters=k), opts.iters)
    comm.synchronize(s)
    ok = all(rerun_checks(mpi, case, lambda: b.run(call, route, s, iters=opts.iters),
                          lambda: comm.synchronize(s)))
    if not ok:  # (agreed: each check is every rank's verdict)
        row["ok"] = False
        raise Skip("wrong result after an in-kernel loop")
    return t


def time_graph_group(comm, case, iters: int, **kw) -> float:
    """graph_group_us: per-op µs of a graph holding ONE group (Communicator.group) of GRAPH_OPS
    Allreduce calls, each from the case's input into an output of its own (a group's calls must
    not overlap each other's outputs).  hpccoll fuses them into launches of up to 32 calls; NCCL
    runs them as an NCCL group.  Checked after capture: every output of one replay."""
    if case.collective != "allreduce" or case.nbytes > GROUP_MAX_BYTES:
        raise Skip(f"allreduce up to {fmt_bytes(GROUP_MAX_BYTES)} only")
    import cupy

    mpi = comm.mpi_comm
    outs = getattr(case, "group_outs", None)
    if outs is None:
        outs = case.group_outs = [cupy.empty_like(case.recv) for _ in range(GRAPH_OPS)]

    def group(s):
        with comm.group():
            for out in outs:
                comm.Allreduce(case.send, out, stream=s, **kw)

    def check(g, s):
        oks = rerun_checks(mpi, case, lambda: g.launch(s), s.synchronize, outs)
        if not all(oks):
            raise RuntimeError(f"wrong result in {oks.count(False)} of {len(oks)} outputs after a group replay")

    return time_graph(mpi, group, iters, check=check, calls=1)


def blocking(comm, row, fn_on_stream, opts, log) -> None:
    """blocking_us = per-op time of a graph of (op, device barrier) minus a barrier's; `comm`
    is the hpccoll communicator whose barrier kernel separates the ops."""
    b = comm.backends.main

    def both(s):
        fn_on_stream(s)
        b.barrier(stream=s, sync=False)

    def run():
        bar = time_graph(comm.mpi_comm, lambda s: b.barrier(stream=s, sync=False), opts.iters)
        tot = time_graph(comm.mpi_comm, both, opts.iters)
        row["barrier_us"] = bar
        return tot - bar

    run_mode(row, "blocking_us", run, log)


# -- the eager engine (backends/cuda/engine.py) ---------------------------------------------
def _engine_takes(opts, algo: str, case) -> bool:
    from .. import policy
    from ..backends.cuda.workspace import S_ENGINE

    return policy.engine_takes(COLLECTIVE_CALL[opts.collective], algo, case.nbytes, S_ENGINE)


def _eager_persistent(comm, case, algo, det, opts, row, log) -> float:
    """eager_us with the eager engine running: checked once, then timed the same way; the
    engine must have served every call.  Then, with the engine still up, the same call as a
    persistent request (row's eager_request_us), checked and counted the same way.  Up to the
    engine's largest call (256 KiB), beyond start_persistent's default (64 KiB), to show where
    it stops paying.  The engine is start_persistent's default (4 blocks) where that takes the
    call (<= 128 KiB), else the fewest blocks that do: what a user of the defaults gets."""
    from ..backends.cuda.engine import BYTES_PER_BLOCK, DEFAULT_BLOCKS
    from ..ops import dtype_name

    mpi = comm.mpi_comm
    # clearing the output runs CuPy's fill kernel now, loaded before the engine starts: loading a
    # kernel while an engine runs may synchronize the context, which waits for the engine forever
    case.reset(full=True)
    blocks = max(DEFAULT_BLOCKS, -(-case.nbytes // BYTES_PER_BLOCK))
    guarded(mpi, lambda: comm.start_persistent(opts.dtype, blocks=blocks, max_bytes=blocks * BYTES_PER_BLOCK,
                                               order=opts.engine_order))
    try:
        eng = comm.backends.main.engines.engines()[dtype_name(opts.dtype)]
        guarded(mpi, lambda: (case.call(comm, algo, det), comm.synchronize()))
        if not case.check(mpi, case.host_result()):
            raise Skip("wrong result through the eager engine")
        t = _time_on_engine(mpi, eng, case.bound(comm, algo, det), comm.synchronize, opts, "calls")
        run_mode(row, "eager_request_us", lambda: _eager_request(comm, case, algo, det, opts, eng), log)
        return t
    finally:
        comm.stop_persistent()


def _eager_request(comm, case, algo, det, opts, eng) -> float:
    """One blocking call as Start + Wait of a persistent request (Communicator.Allreduce_init):
    checked once into a cleared output, then timed like eager_us; the engine must serve it."""
    mpi = comm.mpi_comm
    req = comm.Allreduce_init(case.send, case.recv, algorithm=algo, deterministic=det)
    try:
        case.reset(full=True)
        comm.synchronize()
        guarded(mpi, lambda: (req.Start(), req.Wait()))
        if not case.check(mpi, case.host_result()):
            raise Skip("wrong result through a persistent request")
        return _time_on_engine(mpi, eng, req.Start, req.Wait, opts, "Starts")
    finally:
        req.Free()


def _time_on_engine(mpi, eng, fn, sync, opts, what: str) -> float:
    """time_eager of blocking calls the running engine `eng` must serve, every one of them."""
    before = eng.calls
    t = time_eager(mpi, fn, sync, opts.iters, True, device_wide=False)
    served = max_over_ranks(mpi, eng.calls - before)
    if served != opts.iters + min(EAGER_WARMUP, opts.iters):
        raise Skip(f"the engine served {served} of the timed {what}")
    return t
