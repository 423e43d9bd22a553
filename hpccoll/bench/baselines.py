"""What hpccoll is measured against, in the same processes: NCCL (hpccoll's NCCL backend),
torch symmetric memory's one-shot and two-shot allreduce, and the host-staged MPI path (the
host backend, timed as an hpccoll row: rows.bench_hpccoll)."""
from __future__ import annotations

import datetime
import os
import socket
import statistics
import types

import numpy as np

from .ranks import Skip, agree, guarded, max_over_ranks
from .rows import blocking, check_once, new_row, run_mode, time_graph_group
from .sizes import fmt_bytes
from .timing import GRAPH_OPS, REPS, align, time_eager, time_graph

TORCH_BASELINES = ("torch_one_shot", "torch_two_shot")


def unicast_only() -> None:
    """NCCL and torch symmetric memory without multicast (NVLS), as hpccoll's kernels run; call
    it before either is imported or opens a communicator (they read these at start-up)."""
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    os.environ["NCCL_NVLS_ENABLE"] = "0"


def bench_nccl(nccl_comm, cuda_comm, case, opts, log) -> dict:
    """The NCCL row of one size: eager (unwatched), graph, group and - with hpccoll's barrier
    between the ops (`cuda_comm`) - blocking."""
    mpi = nccl_comm.mpi_comm
    row = new_row(opts.collective, "nccl", opts.dtype, case)
    sync = lambda: nccl_comm.synchronize()  # noqa: E731
    if not check_once(row, case, mpi, lambda: (case.call(nccl_comm), sync()), log):
        return row
    run_mode(row, "eager_us", lambda: _unwatched(nccl_comm, lambda: time_eager(mpi, case.bound(nccl_comm), sync,
                                                                                opts.iters, True)), log)
    run_mode(row, "graph_us", lambda: time_graph(mpi, lambda s: case.call(nccl_comm, stream=s), opts.iters), log)
    if case.collective == "allreduce":
        run_mode(row, "graph_group_us", lambda: time_graph_group(nccl_comm, case, opts.iters), log)
    if cuda_comm is not None:
        blocking(cuda_comm, row, lambda s: case.call(nccl_comm, stream=s), opts, log)
    return row


def _unwatched(nccl_comm, fn):
    """fn() with the NCCL backend's watchdog off, so that eager calls time NCCL itself: its
    events and polling wait add microseconds per call (bench/nccl_watchdog_cost.py).  The row's
    check ran watched, and captured calls are never watched."""
    backend = nccl_comm.backends.main
    backend.watch = False
    try:
        return fn()
    finally:
        backend.watch = True


class TorchSymm:
    """torch symmetric-memory one-shot / two-shot allreduce in the same processes (its own NCCL
    process group, opened here over TCP on this host unless one is open already)."""

    def __init__(self, comm, dtype: str):
        import torch
        import torch.distributed as dist
        import torch.distributed._symmetric_memory as symm_mem

        self.torch, self.dist, self.symm = torch, dist, symm_mem
        mpi = comm.mpi_comm
        torch.cuda.set_device(comm.device)
        self.device = torch.device("cuda", comm.device)
        port = None
        if comm.rank == 0:
            with socket.socket() as sk:
                sk.bind(("127.0.0.1", 0))
                port = sk.getsockname()[1]
        port = mpi.bcast(port, root=0)
        self.owned = False
        if not dist.is_initialized():
            kw = dict(init_method=f"tcp://127.0.0.1:{port}", rank=comm.rank, world_size=comm.size,
                      timeout=datetime.timedelta(seconds=120))
            try:
                dist.init_process_group("nccl", device_id=self.device, **kw)
            except TypeError:  # a torch without device_id
                dist.init_process_group("nccl", **kw)
            self.owned = True
        self.group = dist.group.WORLD.group_name
        if hasattr(symm_mem, "enable_symm_mem_for_group"):
            try:
                symm_mem.enable_symm_mem_for_group(self.group)
            except Exception:  # noqa: BLE001 - newer torch: not needed
                pass
        want = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
        self.dtype = want.get(dtype, torch.bfloat16)
        self.dtype_name = str(self.dtype).replace("torch.", "")
        self._tick = torch.zeros(1, device=self.device)

    def tensor(self, count: int, rank: int):
        """A symmetric tensor of `count` random elements (rendezvous: collective)."""
        t = self.symm.empty(count, device=self.device, dtype=self.dtype)
        self.symm.rendezvous(t, self.group)
        g = self.torch.Generator(device="cpu").manual_seed(1000 + rank)
        t.copy_(self.torch.rand(count, generator=g, dtype=self.torch.float32).to(self.dtype))
        return t

    def op(self, which: str, t):
        ops = self.torch.ops.symm_mem
        if which == "torch_one_shot":
            return lambda: ops.one_shot_all_reduce(t, "sum", self.group)
        return lambda: ops.two_shot_all_reduce_(t, "sum", self.group)

    def sync(self) -> None:
        self.torch.cuda.current_stream().synchronize()

    def time_graph(self, mpi_comm, fn, iters: int) -> float:
        """timing.time_graph with torch's graphs and events (GRAPH_OPS calls per graph)."""
        torch = self.torch

        def capture():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    fn()
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for _ in range(GRAPH_OPS):
                    fn()
            g.replay()
            torch.cuda.synchronize()
            return g

        g = guarded(mpi_comm, capture, "torch graph capture failed: ")
        launches = max(1, iters // GRAPH_OPS)
        per = []
        for _ in range(REPS):
            torch.cuda.synchronize()
            mpi_comm.Barrier()
            # before hpccoll opens (torch_baselines_first) there is no device barrier of
            # hpccoll's: an NCCL allreduce lines the ranks' streams up instead
            if not align(torch.cuda.current_stream().cuda_stream):
                self.dist.all_reduce(self._tick)
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            for _ in range(launches):
                g.replay()
            e1.record()
            e1.synchronize()
            per.append(e0.elapsed_time(e1) * 1e3 / (launches * GRAPH_OPS))
        return max_over_ranks(mpi_comm, statistics.median(per))

    def close(self) -> None:
        if self.owned:
            try:
                self.dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - at the end of a run: nothing left to do about it
                pass


def bench_torch(ts: TorchSymm, which: str, comm, case, opts, log) -> dict:
    """One torch symmetric-memory row (`which`: torch_one_shot or torch_two_shot) of one size:
    torch's own dtype (bfloat16 where torch lacks the sweep's), checked against an MPI sum."""
    mpi = comm.mpi_comm
    row = new_row(opts.collective, which, ts.dtype_name, case)
    esize = ts.torch.empty(0, dtype=ts.dtype).element_size()
    count = max(1, case.nbytes // esize)
    row.update(count=count, bytes=count * esize)
    try:
        t = guarded(mpi, lambda: ts.tensor(count, comm.rank))
        ref = mpi.allreduce(t.float().cpu().numpy().astype(np.float64))
        fn = ts.op(which, t)
        inp = t.clone()

        def check():
            t.copy_(inp)
            out = fn()
            out = t if out is None else out
            ts.sync()
            return out.float().cpu().numpy()

        res = guarded(mpi, check)
        tol = 2e-2 * comm.size if ts.dtype_name != "float32" else 1e-5 * comm.size
        row["ok"] = agree(mpi, bool(np.allclose(res, ref, rtol=tol, atol=tol * comm.size)))
    except Skip as exc:
        row["ok"] = False
        row.setdefault("skipped", {})["all"] = str(exc)
        log(f"  {which} {fmt_bytes(case.nbytes)}: failed: {exc}")
        return row
    # two_shot_all_reduce_ is in place: values grow over repetitions; latency does not care
    run_mode(row, "eager_us", lambda: time_eager(mpi, fn, ts.sync, opts.iters, True), log)
    run_mode(row, "graph_us", lambda: ts.time_graph(mpi, fn, opts.iters), log)
    return row


def torch_baselines_first(opts, sizes, world, log, progress=lambda row: None) -> tuple[dict, str | None]:
    """torch symmetric memory's rows for every size, in these processes but before hpccoll opens
    anything on the GPU: imported after hpccoll's CUDA backend had opened, torch failed to import
    on every rank of one machine ("source code string cannot contain null bytes").  Returns
    ({bytes: rows}, None) or ({}, why skipped); progress(row) after each row."""
    from mpi4py import MPI

    node = world.Split_type(MPI.COMM_TYPE_SHARED, key=world.Get_rank())
    ts = None
    try:
        def shim():
            import torch

            if not torch.cuda.is_available():
                raise Skip("torch sees no CUDA device")
            dev = node.Get_rank() % torch.cuda.device_count()
            import cupy  # the timing helpers synchronize through CuPy: the same GPU as torch

            cupy.cuda.Device(dev).use()
            return types.SimpleNamespace(rank=world.Get_rank(), size=world.Get_size(), mpi_comm=world, device=dev)

        comm = guarded(world, shim)
        ts = guarded(world, lambda: TorchSymm(comm, opts.dtype))
        rows: dict = {}
        for nbytes in sizes:
            case = types.SimpleNamespace(nbytes=nbytes, count=None)
            rows[nbytes] = [bench_torch(ts, which, comm, case, opts, log) for which in TORCH_BASELINES]
            for r in rows[nbytes]:
                progress(r)
        return rows, None
    except Skip as exc:
        log(f"torch symm_mem baselines skipped: {exc}")
        return {}, str(exc)
    finally:
        if ts is not None:
            ts.close()
        node.Free()
