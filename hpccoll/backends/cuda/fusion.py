"""Capture fusion: Allreduce calls captured back to back on one stream become one graph node.

In a CUDA graph every kernel node costs its launch and completion, about a microsecond before
any work (docs/performance.md), more than the collective itself at small sizes.
While a stream is being captured, a one-shot Allreduce whose stream depends on nothing but the
node of this communicator's previous one (nothing captured in between: no user kernel, copy,
event wait, fork or join) is appended to that node instead of becoming one: the node's kernel
(hc_allreduce_oneshot_<proto>_<op>_chain, cuda/collectives.cu) runs the calls one after the
other, each its own epoch, with the ordering of the in-kernel loop.  Results are those of the
same calls launched one by one, bit for bit.

A call joins the node only when it has the node's dtype, op, algorithm and element count (one
grid: pack p of every call is handled by one thread, which is what orders a call's input
after an earlier call's output, and the slots' reuse) and each of its buffers is one of the
node's buffers or disjoint from all of them; at most CHAIN_MAX calls per node.  Anything else
starts a new node.  The one effect visible outside: work forked from the stream after call j
(an event recorded there) now also waits for the calls fused after j.

HPCCOLL_FUSE=0 turns it off (then every captured call is a node of its own).  Which one-shot a
call runs in a chain is policy.chain_algorithm's decision."""
from __future__ import annotations

import ctypes

from ... import policy
from ..._abi import CHAIN_MAX, Args, Chain, const
from ...ops import np_dtype
from . import launch
from .driver import CaptureInfo, Launcher, check, libcuda

SRC_LOAD, SRC_KEEP, SRC_FWD = const("HC_SRC_LOAD"), const("HC_SRC_KEEP"), const("HC_SRC_FWD")


class Node:
    """One captured chain node: its kernel, launch configuration and calls (the launcher is
    set by Fuser when it captures the node)."""

    __slots__ = ("cid", "handle", "key", "fn", "grid", "block", "args", "chain", "nbytes", "bases", "launcher")

    def __init__(self, key, fn, args: Args, grid: tuple[int, int], count: int, nbytes: int):
        self.cid = self.handle = 0
        self.key, self.fn = key, fn
        self.grid, self.block = grid
        self.args = Args.from_buffer_copy(args)
        self.args.in_ = self.args.out = None
        self.args.count, self.args.iters = count, 1
        self.chain = Chain(count=count, n=0)
        self.nbytes = nbytes
        self.bases: set[int] = set()
        self.launcher = None

    def takes(self, key, in_ptr: int, out_ptr: int) -> bool:
        """Whether a call with these buffers may join (the same or disjoint buffers only)."""
        if key != self.key or self.chain.n >= CHAIN_MAX:
            return False
        nb = self.nbytes
        for p in (in_ptr, out_ptr):
            if p not in self.bases and any(abs(p - b) < nb for b in self.bases):
                return False
        return in_ptr == out_ptr or abs(in_ptr - out_ptr) >= nb

    def add(self, in_ptr: int, out_ptr: int) -> None:
        c = self.chain
        j = c.n
        if j == 0:
            src = SRC_LOAD
        elif in_ptr == c.out[j - 1]:
            src = SRC_FWD
        elif in_ptr == c.in_[j - 1]:
            src = SRC_KEEP
        else:
            src = SRC_LOAD
        c.in_[j], c.out[j], c.src[j] = in_ptr, out_ptr, src
        c.n = j + 1
        self.bases.update((in_ptr, out_ptr))


class Fuser:
    """The capture fusion of one communicator (CudaBackend.fuser): `site` its launches' Site
    (launch.py), `table` its tuning table."""

    def __init__(self, pdl: bool, site=None, table=None):
        self._info = CaptureInfo()
        self._pdl = pdl
        self.site, self.table = site, table
        self._nodes: dict[int, Node] = {}  # stream -> its last chain node
        self.fused = 0  # calls appended to a node so far (the tests and the benchmark read it)

    def capture(self, stream: int, key, in_ptr: int, out_ptr: int, node_spec) -> bool:
        """Capture one Allreduce on `stream` (key: its (dtype, algorithm, op, count)): appended
        to the stream's chain node when it may join, else launched as a new chain node, whose
        (kernel, Args, grid, bytes per call) node_spec() gives.  False when the stream is not
        capturing (the caller launches it as usual)."""
        cid, dep = self._info.query(stream)
        if not cid:
            self._nodes.pop(stream, None)
            return False
        node = self._nodes.get(stream)
        if node is not None and node.cid == cid and dep is not None and dep == node.handle \
                and node.takes(key, in_ptr, out_ptr):
            node.add(in_ptr, out_ptr)
            self._info.set_kernel_params(node.handle, node.fn, node.grid, node.block, node.launcher.params)
            self.fused += 1
            return True
        fn, args, grid, nbytes = node_spec()
        node = Node(key, fn, args, grid, key[-1], nbytes)
        node.add(in_ptr, out_ptr)
        node.launcher = Launcher(fn, node.args, pdl=self._pdl, extra=node.chain)
        node.launcher(node.grid, node.block, stream)
        cid, dep = self._info.query(stream)
        if dep is None:
            self._nodes.pop(stream, None)
        else:
            node.cid, node.handle = cid, dep
            self._nodes[stream] = node
        return True

    def chain_algorithm(self, requested: str, algo: str, nbytes: int) -> str | None:
        """policy.chain_algorithm with this communicator's table and one-shot capacities."""
        layout = self.site.layout
        return policy.chain_algorithm(self.table, requested, algo, nbytes, lambda a: layout.allreduce[a][0])

    def capture_allreduce(self, s: int, dtype: str, algo: str, op: str, in_ptr: int, out_ptr: int,
                          count: int) -> bool:
        """`capture` for an Allreduce of `count` elements running the one-shot `algo`."""
        site = self.site

        def node_spec():  # (kernel, Args to copy, grid, bytes per call): only for a new node
            esize = np_dtype(dtype).itemsize
            base, _cap = launch.allreduce_launcher(site, dtype, algo, op)
            fn = site.kernels.module(dtype, loop=True).fn(f"hc_allreduce_{algo}_{launch.OPS[op]}_chain")
            return fn, base.args, launch.allreduce_grid(site, algo, count, esize), count * esize

        return self.capture(s, (dtype, algo, op, count), in_ptr, out_ptr, node_spec)

    def forget(self) -> None:
        self._nodes.clear()


def nodes_of(graph_ptr: int) -> int:
    """The node count of a CUDA graph (cuGraphGetNodes): the tests' proof that calls fused."""
    n = ctypes.c_size_t()
    check(libcuda().cuGraphGetNodes(ctypes.c_void_p(graph_ptr), None, ctypes.byref(n)), "cuGraphGetNodes")
    return n.value
