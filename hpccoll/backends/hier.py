"""Hierarchical collectives for communicators that span several nodes.

Every collective runs in phases: inside each node on the node's backends (hpccoll's LLBuffer
kernels on GPUs, MPI on the host backend), between nodes on the backends of a "stripe" that
joins the ranks with the same node-local rank (MPI with host staging; NCCL for
non-deterministic device calls when available), then inside the node again.  The factory
(factory.py) opens those backends; a phase builds its Call and routes it once (hpccoll._routes).

Layout: ranks are grouped by node (`MPI_Comm_split_type(SHARED)`), nodes ordered by their
lowest rank, ranks in a node by rank.  Every node must hold the same number of ranks.
`HPCCOLL_NODE_SIZE=k` treats consecutive groups of k ranks as nodes (testing on one machine).

Allreduce has two variants, chosen per call by message size (so the same on every rank):
  "ar" (below RSAG_BYTES, latency first): node Allreduce, then inter-node Allreduce of
      the whole message on every stripe;
  "rsag" (RSAG_BYTES and up, bandwidth first): node Reduce_scatter (local rank i gets shard i
      of the node's result; shards of ceil(count / ranks per node) elements, zero-padded at the
      end, the padding dropped),
      inter-node Allreduce of shard i on stripe i (all stripes at once, each carrying
      1/per_node of the message), node Allgather of the shards.
The variant is policy.hier_variant's choice; HPCCOLL_HIER_RSAG_BYTES=b sets its threshold (0:
always "rsag"; the same on every rank, checked).  One rank per node, or a node-phase kernel
named by the caller (algorithm= other than auto/mpi/host), always runs "ar".

Determinism (deterministic=True): for a fixed layout (nodes × ranks per node) and a fixed
message size every rank gets the same bits in every run.  Every element is reduced per node in
local-rank order, then over nodes in node order: ((x[n0,l0] op x[n0,l1] ...) op (x[n1,l0] op
...)) ...  Both Allreduce variants reduce each element in exactly that order (their phases are
elementwise and each follows ops.reduce_in_rank_order), so with deterministic=True they return
the same bits, and the threshold changes speed, not results.  That order differs from the flat
rank-order sum, so results change bits when the layout changes (other node count or node
size), exactly as they would with any other reduction tree.  Without deterministic=True no
bits are promised: the phases use MPI's or NCCL's own reductions, whose order may depend on the
message size, so the two variants may round differently from each other (and from run to
run).  Reduce_scatter_block returns the same bits as the corresponding slice of Allreduce."""
from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from functools import cached_property

from mpi4py import MPI

from .. import _routes, policy
from .._buffers import IN_PLACE, Buf, is_in_place
from .._fastpath import FastCall
from .._validate import Call
from ..errors import CollectiveTimeout, HpccollError
from ..ops import dtype_name
from .base import Backend, Capabilities, Route
from .streams import stream_ptr

log = logging.getLogger("hpccoll")


@dataclass(frozen=True)
class NodeLayout:
    nodes: int
    per_node: int
    node: int                        # my node index
    local: int                       # my rank inside the node
    rank_of: tuple[tuple[int, ...], ...]  # rank_of[node][local] -> rank

    @cached_property
    def contiguous(self) -> bool:
        """Ranks numbered node by node (the usual launch): gathers land in rank order as they are."""
        return all(r == n * self.per_node + l for n, row in enumerate(self.rank_of) for l, r in enumerate(row))


def node_layout(mpi_comm, node_size: int | None = None) -> NodeLayout | None:
    """The node layout of `mpi_comm` (collective), or None when it is a single node.
    node_size: simulated nodes of that many consecutive ranks (HPCCOLL_NODE_SIZE)."""
    rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
    if node_size:
        k = node_size
        if size % k:
            raise ValueError(f"HPCCOLL_NODE_SIZE={k} does not divide the {size} ranks: use a divisor of {size}")
        node_id = rank // k
    else:
        shared = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
        node_id = shared.allreduce(rank, op=MPI.MIN)  # named by its lowest rank
        shared.Free()
    ids = mpi_comm.allgather(node_id)
    order = sorted(set(ids))
    if len(order) == 1:
        return None
    members = [[r for r in range(size) if ids[r] == nid] for nid in order]
    per = {len(m) for m in members}
    if len(per) != 1:
        log.warning("hpccoll: nodes hold different numbers of ranks (%s): hierarchical collectives "
                    "need equal nodes; using flat MPI collectives", sorted(len(m) for m in members))
        return None
    node = order.index(node_id)
    return NodeLayout(len(order), per.pop(), node, members[node].index(rank),
                      tuple(tuple(m) for m in members))


def physical_device(mpi_comm, layout: NodeLayout, simulated: bool) -> int | None:
    """This rank's GPU from its place on the PHYSICAL machine (collective).  Simulated nodes
    (HPCCOLL_NODE_SIZE) share one machine's GPUs: with a GPU per rank every rank gets its own;
    with fewer GPUs each simulated node takes one GPU (node % GPUs), so the ranks of one
    inter-node group sit on different GPUs whenever there are at least as many GPUs as nodes."""
    shared = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED, key=mpi_comm.Get_rank())
    here, local = shared.Get_size(), shared.Get_rank()
    shared.Free()
    try:
        import cupy

        ndev = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy or no driver: the host backend decides later
        return None
    if ndev < 1:
        return None
    if ndev >= here or not simulated:
        return local % ndev
    return layout.node % ndev


def nccl_between_reason(stripe_mpi, node) -> str | None:
    """Why the stripe cannot run device calls on NCCL, or None (collective over the stripe: the
    nodes' backends may differ).  node: this rank's node backends (hpccoll.backends.factory).
    GPUs are told apart as NCCL does, by host and PCI bus: on separate nodes the same ordinal
    is another GPU."""
    from .nccl import nccl_unavailable_reason
    from .topology import nccl_identity, shared_gpus

    why = nccl_unavailable_reason() if node.name == "cuda" else f"a node runs the {node.name} backend"
    gathered = stripe_mpi.allgather((why, nccl_identity(node.main.device_id) if why is None else None))
    whys = [w for w, _ in gathered if w]
    shared = shared_gpus([gpu for _, gpu in gathered])
    if shared:
        whys.append(f"in one inter-node group {shared} (NCCL needs one GPU per rank)")
    return whys[0] if whys else None


def _xp(buf):
    if buf.is_device:
        import cupy

        return cupy
    import numpy

    return numpy


def _on_stream(buf, stream):
    """Context for array work (copies, allocations) of a device call: on the call's stream, so
    that it follows the stream's earlier work (CuPy's current stream may not be ordered with it)
    and the node and stripe phases follow it."""
    if not buf.is_device:
        return contextlib.nullcontext()
    import cupy

    return cupy.cuda.ExternalStream(stream_ptr(stream))


def _phase_buf(arr, dtype: str) -> Buf:
    """A Buf of a 1-D contiguous array: a flat view of the validated call's buffers, or an array
    made here (no checks: the outer call was validated once)."""
    return Buf(arr, arr, dtype, arr.size, arr.data.device_id if _is_device(arr) else None)


def _is_device(arr) -> bool:
    return type(arr).__module__.startswith("cupy")


class Hierarchical(Backend):
    """Runs validated calls (hpccoll._validate.Call) in node / stripe / node phases, on the
    backends of the node (`node`) and of the stripe (`stripe`: its host backend; `stripe_nccl`:
    its NCCL, or None), each a hpccoll.backends.factory.Backends opened by the factory.  A phase
    builds its Call directly and routes it once (hpccoll._routes); no phase re-enters a
    Communicator."""

    caps = Capabilities(device=True, host_buffers=True, collectives=frozenset({"Allreduce", "Bcast", "Allgather",
                                                             "Reduce_scatter_block"}),
                        algorithms=("mpi", "host") + tuple(policy.ALGORITHMS), asynchronous=True)

    def __init__(self, layout: NodeLayout, node, stripe, stripe_nccl, rsag_bytes: int, algorithm: str,
                 deterministic: bool):
        """algorithm / deterministic: the communicator's defaults, for the node phases whose
        outer call names none (the phases that follow the node's own choice)."""
        self.layout = layout
        self.node, self.stripe, self.stripe_nccl = node, stripe, stripe_nccl
        self.rank = layout.rank_of[layout.node][layout.local]
        self.rsag_bytes = rsag_bytes
        self.algorithm, self.deterministic = algorithm, deterministic
        self._fast: dict = {}  # (id(backends), collective) -> FastCall of that phase's last call

    @property
    def name(self) -> str:
        between = "nccl|mpi" if self.stripe_nccl else "mpi"
        return f"hier({self.layout.nodes}x{self.layout.per_node}: {self.node.name}+{between})"

    @property
    def device_id(self):
        return self.node.main.device_id

    def _between(self, buf, det: bool, stream):
        """The inter-node backends for this call; device data waits for the node phase.  Its
        calls ask for "auto": a node-phase kernel named by the caller means nothing to MPI or NCCL."""
        if buf.is_device and not det and self.stripe_nccl is not None:
            return self.stripe_nccl
        if buf.is_device:
            self.node.main.synchronize(stream)  # host staging reads the buffer: node phase first
        return self.stripe

    def _phase(self, where, name, send, recv, op=None, root=None, algorithm=None, det=None, stream=None):
        """One phase's collective on `where` (node or stripe backends): its Call built directly
        (send: an array, IN_PLACE or None), routed once (hpccoll._routes), run.  A repeat of the
        phase's last call on the same arrays keeps its route and, once repeated, its prepared
        launch (hpccoll._fastpath), as a communicator's repeated call does."""
        key = self.algorithm if algorithm is None else algorithm
        if det is None:
            det = self.deterministic
        slot = (id(where), name)
        fast = self._fast.get(slot)
        if fast is not None and fast.matches(send, recv, op, root, key, det):
            if fast.plan is not None:
                fast.plan.launch(stream)
            else:
                fast.run(stream)
            return
        dtype = dtype_name(recv.dtype)
        rb = _phase_buf(recv, dtype)
        in_place = send is None or is_in_place(send)
        call = Call(name, rb if in_place else _phase_buf(send, dtype), rb, op, root, in_place)
        route = _routes.route(where.host, where.main, self.algorithm, call, algorithm, det)
        route.backend.run(call, route, stream)
        self._fast[slot] = (FastCall(call, route, send, recv, op, root, key, det)
                            if FastCall.eligible(send, recv, call) else None)

    @property
    def broken(self) -> str | None:
        """Why a phase's backends are unusable (one of their calls timed out), or None."""
        for b in (self.node, self.stripe, self.stripe_nccl):
            why = b is not None and b.broken
            if why:
                return why
        return None

    def _check(self, name: str) -> None:
        """Raise before any phase runs once a phase's backends broke: a node phase on healthy
        peers would otherwise write into the caller's buffers before the broken phase raised."""
        why = self.broken
        if why:
            raise CollectiveTimeout(f"{name}: this communicator timed out earlier and is unusable ({why})",
                                    collective=name)

    def route(self, call, algorithm: str, deterministic: bool) -> Route:
        """An Allreduce's composition (policy.hier_variant) as its algorithm; each phase's own
        route is decided when the phase runs (a name the node cannot run raises there)."""
        path = self.allreduce_variant(call.recv.nbytes, algorithm) if call.name == "Allreduce" else algorithm
        return Route(self, algorithm, path, deterministic)

    def run(self, call, route: Route, stream) -> None:
        self._check(call.name)
        _RUN[call.name](self, call, route.deterministic, route.requested, stream, route.algorithm)

    def allreduce_variant(self, nbytes: int, algo: str) -> str:
        """policy.hier_variant for this layout and threshold."""
        return policy.hier_variant(nbytes, self.layout.per_node, algo, self.rsag_bytes)

    def _allreduce(self, call, det, algo, stream, variant):
        if variant == "rsag":
            self._allreduce_rsag(call, det, algo, stream)
        else:
            self._allreduce_ar(call, det, algo, stream)

    def _allreduce_ar(self, call, det, algo, stream):
        """Latency first: two collectives, each stripe carries the whole message."""
        recv = call.recv.flat
        src = IN_PLACE if call.in_place else call.send.flat
        self._phase(self.node, "Allreduce", src, recv, call.op, algorithm=algo, det=det, stream=stream)
        self._phase(self._between(call.recv, det, stream), "Allreduce", IN_PLACE, recv, call.op, algorithm="auto",
                    det=det, stream=stream)

    def _allreduce_rsag(self, call, det, algo, stream):
        """Bandwidth first: local rank i reduces shard i over its node, then with the local ranks i
        of the other nodes (every stripe at once, each 1/per_node of the message), then the node
        gathers the shards.  Pad elements (count not divisible by per_node) are reduced and dropped."""
        P, xp = self.layout.per_node, _xp(call.recv)
        recv = call.recv.flat
        n = recv.size
        shard_len = -(-n // P)
        padded = shard_len * P != n
        with _on_stream(call.recv, stream):
            src = recv if call.in_place else call.send.flat
            if padded:
                src = xp.concatenate([src, xp.zeros(shard_len * P - n, dtype=recv.dtype)])
            shard = xp.empty(shard_len, dtype=recv.dtype)
        self._phase(self.node, "Reduce_scatter_block", src, shard, call.op, algorithm=algo, det=det, stream=stream)
        self._phase(self._between(call.recv, det, stream), "Allreduce", IN_PLACE, shard, call.op, algorithm="auto",
                    det=det, stream=stream)
        with _on_stream(call.recv, stream):
            gathered = xp.empty(shard_len * P, dtype=recv.dtype) if padded else recv
        self._phase(self.node, "Allgather", shard, gathered, algorithm=algo, stream=stream)
        if padded:
            with _on_stream(call.recv, stream):
                recv[...] = gathered[:n]

    def _bcast(self, call, det, algo, stream, _path=None):
        node, local = self._where(call.root)
        buf = call.recv.flat
        if self.layout.local == local:
            self._phase(self._between(call.recv, True, stream), "Bcast", None, buf, root=node, algorithm="auto",
                        stream=stream)
        self._phase(self.node, "Bcast", None, buf, root=local, stream=stream)

    def _allgather(self, call, det, algo, stream, _path=None):
        L, xp = self.layout, _xp(call.recv)
        recv = call.recv.flat
        n = recv.size // (L.nodes * L.per_node)
        with _on_stream(call.recv, stream):
            mine = recv[self.rank * n:(self.rank + 1) * n].copy() if call.in_place else call.send.flat
            in_node = xp.empty(L.per_node * n, dtype=recv.dtype)
            target = recv if L.contiguous else xp.empty_like(recv)
        self._phase(self.node, "Allgather", mine, in_node, stream=stream)
        self._phase(self._between(call.recv, True, stream), "Allgather", in_node, target, algorithm="auto",
                    stream=stream)
        if not L.contiguous:  # [node][local] blocks -> rank order
            blocks = target.reshape(L.nodes * L.per_node, n)
            out = recv.reshape(-1, n)
            with _on_stream(call.recv, stream):
                for j, row in enumerate(L.rank_of):
                    for l, r in enumerate(row):
                        out[r] = blocks[j * L.per_node + l]

    def _reduce_scatter_block(self, call, det, algo, stream, _path=None):
        L, xp = self.layout, _xp(call.recv)
        size = L.nodes * L.per_node
        src = call.recv.flat if call.in_place else call.send.flat
        n = src.size // size
        blocks = src.reshape(size, n)
        # regroup the blocks as [local l][node j] so the node phase hands local rank l the blocks
        # of every node's rank l, summed over this node (local order)
        order = [L.rank_of[j][l] for l in range(L.per_node) for j in range(L.nodes)]
        with _on_stream(call.recv, stream):  # (after the stream's work that wrote src)
            grouped = blocks[xp.asarray(order)].reshape(-1)
            node_sums = xp.empty(L.nodes * n, dtype=src.dtype)
        self._phase(self.node, "Reduce_scatter_block", grouped, node_sums, call.op, det=det, stream=stream)
        out = call.recv.flat[:n]
        self._phase(self._between(call.recv, det, stream), "Reduce_scatter_block", node_sums, out, call.op,
                    algorithm="auto", det=det, stream=stream)

    def _where(self, rank: int) -> tuple[int, int]:
        for j, row in enumerate(self.layout.rank_of):
            if rank in row:
                return j, row.index(rank)
        raise HpccollError(f"rank {rank} is in no node")  # pragma: no cover - layout covers all ranks

    def prepare(self, dtypes) -> None:
        self.node.main.prepare(dtypes)

    def barrier(self) -> None:
        self._check("Barrier")
        self.node.main.barrier()
        if self.layout.local == 0:
            self.stripe.main.barrier()
        self.node.main.barrier()

    def synchronize(self, stream=None) -> None:
        self.node.main.synchronize(stream)
        if self.stripe_nccl is not None:  # (its stream is idle now: raises if its watchdog aborted NCCL)
            self.stripe_nccl.main.synchronize(stream)

    def free(self) -> None:
        self._fast.clear()
        for b in (self.node, self.stripe, self.stripe_nccl):
            if b is not None:
                b.free()


_RUN = {"Allreduce": Hierarchical._allreduce, "Bcast": Hierarchical._bcast,
        "Allgather": Hierarchical._allgather, "Reduce_scatter_block": Hierarchical._reduce_scatter_block}
