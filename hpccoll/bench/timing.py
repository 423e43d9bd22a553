"""How a latency is taken: eager (a blocking call timed on the host), graph (calls captured in a
CUDA graph, replays timed with events), in-kernel (the slope between loops of K and 4K
collectives in one launch).  Each figure is the median over repetitions of one rank, then the
MAX over ranks.

Every timed region starts after a device synchronize and an MPI barrier, then - where an
aligner is set (`set_aligner`) - a device barrier kernel queued on the timed stream: the MPI
barrier releases the ranks tens of µs apart, and without the device barrier that skew lands
in the first op of the region and inflates every per-op figure."""
from __future__ import annotations

import statistics
import time

from .ranks import guarded, max_over_ranks

GRAPH_OPS = 20       # collectives per captured graph (G)
REPS = 5             # timed repetitions per mode; the median is reported
EAGER_WARMUP = 100   # untimed calls before eager timing: the first ones run slower (caches, engine)

_aligner = None      # aligner(stream_handle): queues a device barrier on that stream


def set_aligner(fn) -> None:
    """Queue fn(stream_handle) - a device barrier - before every timed region; None: no barrier."""
    global _aligner
    _aligner = fn


def align(stream_handle: int) -> bool:
    """Queue the device barrier on the stream about to be timed; False when no aligner is set."""
    if _aligner is None:
        return False
    _aligner(stream_handle)
    return True


def sync_all(mpi_comm, gpu: bool, device_wide: bool = True) -> None:
    """Device work done, then an MPI barrier.  device_wide=False: the current stream only (while
    an eager engine runs, a device synchronize would wait for the engine forever)."""
    if gpu:
        import cupy

        if device_wide:
            cupy.cuda.runtime.deviceSynchronize()
        else:
            cupy.cuda.get_current_stream().synchronize()
    mpi_comm.Barrier()


def time_eager(mpi_comm, fn, sync, iters: int, gpu: bool, device_wide: bool = True) -> float:
    """Median µs of one blocking call (fn(); sync()), MAX over ranks, after EAGER_WARMUP calls."""
    for _ in range(min(EAGER_WARMUP, iters)):
        fn()
        sync()
    sync_all(mpi_comm, gpu, device_wide)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return max_over_ranks(mpi_comm, statistics.median(times) * 1e6)


def capture_graph(fn_on_stream, calls: int):
    """(graph, stream): `calls` calls of fn_on_stream(s) captured on a fresh stream, after one
    call outside the capture (the first call compiles) and followed by one untimed replay (which
    uploads the graph)."""
    import cupy

    s = cupy.cuda.Stream(non_blocking=True)
    fn_on_stream(s)
    s.synchronize()
    with s:
        s.begin_capture()
        try:
            for _ in range(calls):
                fn_on_stream(s)
        except BaseException:
            try:
                s.end_capture()
            except Exception:  # noqa: BLE001 - the capture's own error is the one to report
                pass
            raise
        g = s.end_capture()
    g.launch(s)
    s.synchronize()
    return g, s


def time_events(mpi_comm, stream, launch, ops_per_launch: int, launches: int) -> float:
    """Median over REPS of event time / (launches * ops_per_launch), in µs; MAX over ranks."""
    import cupy

    per = []
    for _ in range(REPS):
        sync_all(mpi_comm, True)
        align(stream.ptr)
        e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
        e0.record(stream)
        for _ in range(launches):
            launch()
        e1.record(stream)
        e1.synchronize()
        per.append(cupy.cuda.get_elapsed_time(e0, e1) * 1e3 / (launches * ops_per_launch))
    return max_over_ranks(mpi_comm, statistics.median(per))


def in_kernel_slope(mpi_comm, stream, launch_k, k: int) -> float:
    """Per-op µs inside one launch without the launch's own cost: loops of K and 4K collectives,
    timed like every mode (time_events), and the slope (T(4K) - T(K)) / 3K.  Divided by K
    alone, a launch of K would also carry the host's launch call and the kernel's set-up, start
    and end, which do not belong to any one op."""
    t1 = time_events(mpi_comm, stream, lambda: launch_k(k), k, 1) * k
    t4 = time_events(mpi_comm, stream, lambda: launch_k(4 * k), 4 * k, 1) * 4 * k
    return (t4 - t1) / (3 * k)


def time_graph(mpi_comm, fn_on_stream, iters: int, *, check=None, calls: int = GRAPH_OPS) -> float:
    """Per-op µs of a graph of GRAPH_OPS ops (`calls` calls of fn_on_stream: one call may issue
    several ops, a group all of them), replayed max(1, iters // GRAPH_OPS) times.
    check(g, s), if given, runs after capture on every rank and raises when the replay is wrong."""
    def capture():
        g, s = capture_graph(fn_on_stream, calls)
        if check is not None:
            check(g, s)
        return g, s

    g, s = guarded(mpi_comm, capture, "graph capture failed: ")
    return time_events(mpi_comm, s, lambda: g.launch(s), GRAPH_OPS, max(1, iters // GRAPH_OPS))
