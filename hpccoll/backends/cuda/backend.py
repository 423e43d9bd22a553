"""CUDA backend: hpccoll's barrier-free kernels over symmetric memory on one node.

This module holds the backend's state and its Backend interface (run, resolve, plan, run_group,
synchronize, barrier, free); the focused modules beside it do the work: workspace.py (symmetric
memory and its regions), kernels.py (modules, launchers, grids), launch.py (each collective's
launches), plans.py (prepared launches), groups.py, engines.py / engine.py (the eager engine),
fusion.py (capture fusion), streams.py.  Algorithms come from hpccoll.policy."""
from __future__ import annotations

import logging

from ... import policy
from ..._abi import COLLECTIVE_NAMES, MAX_RANKS
from ..._validate import Call
from ...config import Config, timeout_ns
from ...errors import CollectiveTimeout
from ..base import Backend, Capabilities, Route, agreed_device, release_together
from . import launch
from .driver import p2p_native_atomics
from .engines import EngineSet
from .fusion import Fuser
from .groups import run_group
from .kernels import Kernels, aligned, grid_block_cap
from ..topology import ranks_sharing_gpus
from .plans import make_plan
from ..streams import stream_ptr, synchronize_stream
from .workspace import CudaUnavailable, Layout, Workspace

log = logging.getLogger("hpccoll")

CAPS = Capabilities(
    device=True, collectives=frozenset({"Allreduce", "Bcast", "Allgather", "Reduce_scatter_block", "Alltoall"}),
    algorithms=tuple(policy.ALGORITHMS), plans=True, groups=True, engine=True, asynchronous=True, extension=True)


def gpu_numbering_mismatch(devices, buses) -> str | None:
    """Why ranks of one node cannot share peer memory by GPU ordinal, from every rank's GPU
    ordinal and PCI bus id (None when every ordinal names one GPU on every rank): ranks given
    different CUDA_VISIBLE_DEVICES number their GPUs differently (one GPU each: all are GPU 0)."""
    ordinals: dict[int, set] = {}
    numbers: dict[str, set] = {}
    for d, b in zip(devices, buses):
        ordinals.setdefault(d, set()).add(b)
        numbers.setdefault(b, set()).add(d)
    if all(len(v) == 1 for v in ordinals.values()) and all(len(v) == 1 for v in numbers.values()):
        return None
    seen = ", ".join(f"rank {r}: GPU {d} = {b}" for r, (d, b) in enumerate(zip(devices, buses)))
    return (f"the ranks of this node number their GPUs differently ({seen}): CUDA_VISIBLE_DEVICES differs "
            "between them. hpccoll's kernels map the peers' GPU memory and name GPUs by ordinal, so every "
            "rank must see the node's GPUs alike: give every rank the same CUDA_VISIBLE_DEVICES (Slurm: "
            "--gpus-per-node, no --gpus-per-task or --gpu-bind), and choose a rank's GPU with "
            "Communicator(device=...) or leave it to the node-local rank")


class CudaBackend(Backend):
    name = "cuda"
    caps = CAPS

    def __init__(self, mpi_comm, device=None, config: Config | None = None, open_nccl=None):
        """Collective.  open_nccl(mpi_comm, device, timeout): opens the NCCL fallback where the
        tuning table wants it (hpccoll.backends.factory passes its own)."""
        import cupy
        from mpi4py import MPI

        config = config or Config.from_env()
        self.config = config
        self.comm = mpi_comm
        node = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
        try:
            nodes = mpi_comm.allreduce(1 if node.Get_rank() == 0 else 0)
            if nodes > 1:
                raise CudaUnavailable(f"communicator spans {nodes} nodes; the device path is single-node")
            if node.Get_size() > MAX_RANKS:
                raise CudaUnavailable(f"{node.Get_size()} ranks on this node; the kernels support {MAX_RANKS}")
        except CudaUnavailable:
            node.Free()
            raise
        self.node = node
        self.rank, self.size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        ndev = cupy.cuda.runtime.getDeviceCount()
        try:
            self.device_id = agreed_device(mpi_comm, device, node.Get_rank() % ndev, ndev)
        except ValueError:
            node.Free()
            raise
        cupy.cuda.Device(self.device_id).use()
        props = cupy.cuda.runtime.getDeviceProperties(self.device_id)
        name = props["name"]
        self.gpu_name = name.decode() if isinstance(name, bytes) else name
        self.sms = int(props["multiProcessorCount"])
        self.arch = f"sm_{props['major']}{props['minor']}"
        pdl = config.pdl and int(props["major"]) >= 9  # PDL: scheduled while the previous kernel runs
        bus = cupy.cuda.Device(self.device_id).pci_bus_id
        devices, sms, buses = zip(*mpi_comm.allgather((self.device_id, self.sms, bus)))  # per rank
        why = gpu_numbering_mismatch(devices, buses)
        if why:
            node.Free()
            raise CudaUnavailable(why)
        # Launch configurations must be the same on every rank: so the most ranks any GPU
        # serves and the fewest SMs, not this rank's own (a rank alone on its GPU with a larger
        # grid would wait for blocks its peers never run).
        self.ranks_per_gpu, self.base_cap = grid_block_cap(devices, sms)
        self.min_sms = min(sms)
        self.peer_atomics = self._agree(all(
            d == self.device_id or p2p_native_atomics(self.device_id, d) for d in devices))
        access = all(d == self.device_id or cupy.cuda.runtime.deviceCanAccessPeer(self.device_id, d)
                     for d in devices)
        if not self._agree(access):
            raise CudaUnavailable("some GPUs of this node cannot access each other (no P2P)")
        self.timeout_ns = timeout_ns(config.timeout)  # (the device polls compare u64 nanoseconds)
        self.layout = Layout(self.size)
        self.ws = Workspace(mpi_comm, self.layout.total)
        self.layout.arm(self.ws)
        cupy.cuda.runtime.deviceSynchronize()
        self.ws.probe_peers(mpi_comm)
        # Every choice drawn from the table (algorithm by size, fusion limits, the NCCL fallback)
        # must be the same on every rank: rank 0's table serves all (a rank may read another
        # file: a per-rank HOME or HPCCOLL_TUNING, or a table rewritten meanwhile)
        tables = mpi_comm.allgather(policy.load_table(self.gpu_name, config.tuning_path()))
        self.table = tables[0]
        differ = [r for r, t in enumerate(tables) if t != tables[0]]
        if differ:
            log.warning("hpccoll: ranks %s loaded another tuning table than rank 0 (HPCCOLL_TUNING, "
                        "~/.cache/hpccoll/tuning.json); every rank uses rank 0's",
                        ", ".join(map(str, differ)))
        self.kernels = Kernels(self.device_id, self.arch, self.size, self.ws.kernel_args(self.timeout_ns), pdl,
                               config.small_block)
        self.site = launch.Site(self.kernels, self.layout, self.rank, self.size)
        self.engines = EngineSet(self)
        self.set_grid_cap()
        self.broken: str | None = None
        self._nccl = self._open_nccl_fallback(mpi_comm, open_nccl)
        self.fuser = Fuser(pdl, self.site, self.table) if config.fuse else None
        self.is_capturing = cupy.cuda.runtime.streamIsCapturing  # CuPy's binding: a direct C call
        mpi_comm.Barrier()  # nobody writes into a workspace before its owner initialised it

    def _open_nccl_fallback(self, mpi_comm, open_nccl):
        """NCCL for the sizes where the tuning table prefers it (collective; None otherwise).
        Opt-in (HPCCOLL_NCCL_FALLBACK=1, the same on every rank): by default hpccoll's own
        kernels serve every size."""
        if not policy.wants_nccl(self.table, self.size):
            return None
        if not self.config.nccl_fallback:
            log.info("hpccoll: the tuning table prefers NCCL for large Allreduce; the NCCL fallback "
                     "is opt-in (HPCCOLL_NCCL_FALLBACK=1): hpccoll's kernels serve those sizes")
            return None
        from ..nccl import nccl_unavailable_reason

        shared = ranks_sharing_gpus(mpi_comm, self.device_id)  # (every rank)
        why = nccl_unavailable_reason() or (f"{shared}, which NCCL does not support" if shared else None)
        if not self._agree(why is None):
            log.info("hpccoll: the tuning table prefers NCCL for large Allreduce but it is "
                     "unavailable (%s): hpccoll's two-shot kernels serve those sizes", why)
            return None
        nccl = open_nccl(mpi_comm, self.device_id, self.config.timeout)
        nccl.on_abort = lambda why: setattr(self, "broken", why)  # its watchdog's timeout: ours too
        return nccl

    def _agree(self, ok: bool) -> bool:
        return all(self.comm.allgather(bool(ok)))

    def set_grid_cap(self) -> None:
        """Launches leave the engines' SMs free: the whole grid must be resident."""
        self.kernels.grid_cap = min(self.base_cap, self.min_sms // self.ranks_per_gpu - self.engines.blocks_used())

    @property
    def grid_cap(self) -> int:
        return self.kernels.grid_cap

    # -- errors ---------------------------------------------------------------------------
    def check_error(self) -> None:
        if self.broken:
            if self._nccl is not None:  # (its watchdog broke us: raise once its abort stopped NCCL)
                self._nccl.wait_aborted()
            raise CollectiveTimeout(self.broken)
        if self.ws.host_error():
            import cupy

            self.engines.stop_all()  # their blocks still polling a doorbell leave; device sync can return
            cupy.cuda.runtime.deviceSynchronize()
            coll = COLLECTIVE_NAMES.get(self.ws.error_record()["collective"], "?")
            exc = self.ws.timeout_error(self.rank, coll, coll, "This communicator is unusable: Free() it (raise "
                                        "HPCCOLL_TIMEOUT if ranks are legitimately that far apart)")
            self.broken = str(exc)
            raise exc

    def synchronize(self, stream=None) -> None:
        eng = self.engines
        if eng.active:
            # engine calls have finished when they return: only launches need waiting for
            if eng.pending:
                s = stream_ptr(stream)
                if s in eng.pending:
                    import cupy

                    cupy.cuda.runtime.streamSynchronize(s)
                    eng.pending.discard(s)
            if self.broken or self.ws.err_word.value:
                self.check_error()
            return
        synchronize_stream(stream)
        self.check_error()

    # -- the Backend interface ----------------------------------------------------------------
    def route(self, call: Call, algorithm: str, deterministic: bool) -> Route:
        """The kernel policy.pick gives the call (`resolve`), and for an Allreduce the one-shot
        it runs in a captured chain node (`chain_algorithm`)."""
        nbytes = call.send.nbytes
        algo = self.resolve(call.name, call.recv.dtype, call.op.name if call.op else None, nbytes, deterministic,
                            algorithm)
        chain = self.chain_algorithm(algorithm, algo, nbytes) if call.name == "Allreduce" else None
        return Route(self, algorithm, algo, deterministic, chain)

    def run(self, call: Call, route: Route, stream, iters: int = 1) -> None:
        """Issue one call; `iters` > 1 runs that many back to back in one launch (the benchmark's
        in-kernel mode, from the loop module)."""
        self.check_error()
        if call.recv.device != self.device_id:
            raise ValueError(f"{call.name}: buffers are on GPU {call.recv.device} but this rank's "
                             f"communicator uses GPU {self.device_id}: allocate them there")
        op = call.op.name if call.op else None
        s = stream_ptr(stream)
        if self.engines.active:
            eng = self.engines.for_call(call, route.requested) if iters == 1 else None
            if eng is not None and not eng.capturing(s):
                if not self.engines.call(eng, call, op, s):
                    self.check_error()  # a poll timed out: raises CollectiveTimeout with its record
                return
            self.engines.pending.add(s)
        algo = route.algorithm
        if algo == "nccl":
            self._nccl.run(call, route, stream, iters)
            return
        if call.name == "Allreduce":
            chain = route.chain if iters == 1 else None
            if chain is not None and s and self._fused_call(call, chain, op, s):
                return
            launch.allreduce(self.site, call, algo, op, s, iters)
            return
        launch.RUN[call.name](self.site, call, algo, op, s, iters)

    def resolve(self, collective, dtype, op, nbytes, deterministic, algorithm) -> str:
        """The algorithm policy.pick gives this call with this node's table (unknown or unfit
        names raise)."""
        return policy.pick(self.table, collective, dtype, op, nbytes, self.size, deterministic,
                           self.peer_atomics, algorithm, nccl=self._nccl is not None)

    def plan(self, call: Call, route: Route):
        return make_plan(self, call, route)

    def run_group(self, items, check: bool = False) -> None:
        run_group(self, items, check)

    def prepare(self, dtypes) -> None:
        from concurrent.futures import ThreadPoolExecutor

        from ...errors import HpccollError
        from .nvrtc import compile_module

        loops = (False, True) if self.fuser is not None else (False,)  # True: captured chains (fusion.py)
        k = self.kernels
        wanted = [(dtype, loop) for dtype in dtypes for loop in loops if not k.loaded(dtype, loop)]
        if wanted and self.engines.active:
            # (loading a module may synchronize the context, which waits for a running engine)
            raise HpccollError(f"prepare: {', '.join(sorted({d for d, _ in wanted}))} not loaded yet while an eager "
                               f"engine runs: call prepare before start_persistent, or stop_persistent first")
        # compiled side by side into the disk cache (NVRTC runs without the GIL and needs no CUDA
        # context), then loaded here, on this thread's context
        with ThreadPoolExecutor(max(1, len(wanted))) as pool:
            list(pool.map(lambda w: compile_module("collectives.cu", w[0], k.arch, k.defines_for(w[1])), wanted))
        for dtype, loop in wanted:
            k.module(dtype, loop)

    def barrier(self, stream=None, iters: int = 1, sync: bool = True) -> None:
        self.check_error()
        s = stream_ptr(stream)
        launch.barrier(self.site, s, iters)
        self.engines.note_launch(s)
        if sync:
            self.synchronize(stream)

    def free(self) -> None:
        # after a timeout a peer may never come: the waits are bounded by the timeout then
        within = self.timeout_ns / 1e9 if self.broken or self.ws.host_error() else None
        try:
            self.engines.free()
            import cupy

            cupy.cuda.runtime.deviceSynchronize()  # (every poll is bounded: this returns)
            if self._nccl is not None:
                self._nccl.free(within)
            if self.fuser is not None:
                self.fuser.forget()  # (its nodes' parameter blocks)
        finally:  # no peer may still be writing into a workspace we unmap
            self.abandoned = not release_together(self.comm, self._release, within, "Free")

    def _release(self) -> None:
        self.ws.free()
        self.node.Free()

    # -- capture fusion (fusion.py) --------------------------------------------------------------
    def chain_algorithm(self, requested: str, algo: str, nbytes: int) -> str | None:
        """The one-shot a captured Allreduce runs in a chain node, or None (policy.chain_algorithm)."""
        return None if self.fuser is None else self.fuser.chain_algorithm(requested, algo, nbytes)

    def _fused_call(self, call: Call, chain: str, op: str, s: int) -> bool:
        """`fused` for a call of 16-byte aligned buffers (others launch through aligned copies)."""
        send, recv = call.send.flat, call.recv.flat
        return (aligned(send) and aligned(recv) and self.is_capturing(s)
                and self.fused(s, call.recv.dtype, chain, op, send.data.ptr, recv.data.ptr, send.size))

    def fused(self, s: int, dtype: str, algo: str, op: str, in_ptr: int, out_ptr: int, count: int) -> bool:
        """Capture this Allreduce into the stream's chain node; False when the stream is not
        capturing after all, or the fusion is off (the caller launches it)."""
        if self.fuser is None or not self.fuser.capture_allreduce(s, dtype, algo, op, in_ptr, out_ptr, count):
            return False
        self.engines.note_launch(s)
        return True
