"""Host backend: numpy buffers through mpi4py; device buffers are staged through host memory.

The reference for every other backend, and the path on machines without a GPU.
- Allreduce of float32, float64, int32 or int64 messages of at most SHM_SLOT_BYTES, when every
  rank is on one node: through a shared-memory segment (the extension hpccoll._hostshm, see
  hpccoll/_hostshm.c), barrier-free, without MPI: every rank posts its input and reduces every
  rank's in rank order, ((x0 op x1) op x2) ..., so by default too the result is the
  deterministic one, ops.reduce_in_rank_order bit for bit.  HPCCOLL_HOST_SHM=0, a missing
  extension, several nodes, or one rank: the MPI paths below, with the results ops promises.
- Every other wait is a nonblocking MPI call completed against a deadline (the communicator's
  timeout), and a shared-memory wait is bounded by the same timeout: a peer that never joins,
  or died, makes the call raise CollectiveTimeout naming it; it never hangs.  The communicator
  is unusable afterwards (a pending MPI operation cannot be cancelled; peers arriving late would
  pair with the wrong shared-memory call).
- A nonblocking MPI call reads and writes only memory the library owns, of a bounded size: a
  call runs in rounds, each over a slice of the data (STAGE_BYTES per side; a per-rank-block
  collective, slice r of each of the P blocks, max(STAGE_BYTES / P, MIN_BLOCK_SLICE_BYTES) per
  block), copied into staging allocated once per call (a prepared Allreduce: once per plan),
  completed against the deadline, its result copied out (device buffers: the rounds run over
  their host copy).  Alltoallv's rounds are point-to-point messages, one per pair and direction,
  so the rounds of a pair follow from its count, which both partners know.  A round abandoned by a timeout keeps its request and staging for the life
  of the process (`host_rounds._ABANDONED`, dropped once a late peer completes it), and the caller's buffers
  are never touched again.  A peer arriving late pairs with that round, with the input it had,
  then waits for the next round, which never comes, and raises: a call that returns has the
  right result.  Every operation is elementwise, so the rounds give the bits of one unsliced call.
- On the MPI path results follow hpccoll.ops on every rank, NaNs included: SUM / PROD through
  MPI's reduction (deterministic=False) or an Allgather reduced in rank order (deterministic=True,
  the same bits in every run), then every NaN made canonical; MAX / MIN of floats as an integer
  MAX / MIN of order-preserving keys (exact, the same bits in any reduction order, so both
  policies share it)."""
from __future__ import annotations

import contextlib
import logging
import os
import time

import numpy as np
from mpi4py import MPI

from .._abi import DTYPE_CODES, OP_CODES
from ..errors import CollectiveTimeout, HpccollError
from ..ops import MAX, MIN, reduce_in_rank_order
from .base import Backend, Capabilities, Route, ranks_reasons
from . import host_rounds as rounds
from .host_rounds import (_FLOATS, _MPI_TYPED, STAGE_BYTES, AllreducePlan, _abandon, _block_slice,
                          _bytes, _msg, _Requests, _spans)
from .shmfile import create_segment, reclaim_stale_files

log = logging.getLogger("hpccoll")

_SPINS = 64          # Test() calls between clock reads while waiting
_YIELD_AFTER = 4096  # Test() calls before each one also yields the core (ranks may share cores)
# The shared-memory Allreduce: its dtypes, and the largest message (one slot; larger calls take
# the MPI path).
_SHM_DTYPES = frozenset({"float32", "float64", "int32", "int64"})
SHM_SLOT_BYTES = 32 * 1024
SHM_DIR = "/dev/shm"
_ALLTOALLV_TAG = 0x4863  # the communicator is the library's own Dup: no other point-to-point traffic

try:
    from .. import _hostshm
    _HOSTSHM_ERROR = None
except ImportError as _exc:  # not built (hpccoll installed without a C compiler): MPI serves every call
    _hostshm = None
    _HOSTSHM_ERROR = f"the extension hpccoll._hostshm is not importable ({_exc}): reinstall hpccoll with a C compiler"


def hostshm_unavailable_reason() -> str | None:
    """None when this process can run the shared-memory Allreduce, else why not."""
    if _HOSTSHM_ERROR is None and not os.path.isdir(SHM_DIR):
        return f"{SHM_DIR} does not exist"
    return _HOSTSHM_ERROR


class _Staged:
    """A buffer's data in host memory: a host buffer's array itself, a device buffer's copy,
    fetched (`fetch`) and, for outputs, copied back (`commit`).  MPI never sees this memory: the
    rounds of a call copy slices of it into staging of the library's own (see the module's doc).

    Staging of device buffers is synchronous with respect to EVERY stream of the device: the copy in waits for
    all queued work (the caller may have produced the data on a non-blocking stream, which a
    legacy-stream copy would not wait for), and the copy back completes before returning (a
    pageable host-to-device cudaMemcpy may return before its DMA lands)."""

    __slots__ = ("buf", "host")

    def __init__(self, buf, fetch: bool = True):
        self.buf = buf
        if buf.is_device:
            import cupy

            cupy.cuda.runtime.deviceSynchronize()
            self.host = cupy.asnumpy(buf.flat) if fetch else np.empty(buf.count, buf.flat.dtype)
        else:
            self.host = buf.flat

    def commit(self):
        if self.buf.is_device:
            import cupy

            self.buf.flat.set(self.host)
            cupy.cuda.runtime.deviceSynchronize()


class HostBackend(Backend):
    name = "host"
    caps = Capabilities(device=False, host_buffers=True, algorithms=("mpi", "host"), plans=True)

    def __init__(self, mpi_comm, timeout: float = 30.0, shm: bool = True):
        """Collective.  shm: use the shared-memory Allreduce where it can run (the same on every
        rank: HPCCOLL_HOST_SHM, agreed at the Communicator's construction)."""
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self.timeout = float(timeout)
        self._broken: str | None = None
        #: the shared-memory segment (hpccoll._hostshm.Segment), or None; `shm_off` says why not
        self.shm = None
        self.shm_off: str | None = self._open_shm() if shm else "HPCCOLL_HOST_SHM=0"

    @property
    def broken(self) -> str | None:
        """Why this backend is unusable (a call timed out or was interrupted), or None."""
        if self._broken is None and self.shm is not None and self.shm.broken:
            self._broken = ("Allreduce: a shared-memory Allreduce was interrupted while it waited for its peers "
                            "(a signal handler raised); its peers cannot know how far it got")
        return self._broken

    @broken.setter
    def broken(self, why: str | None) -> None:
        self._broken = why
        if self.shm is not None:
            self.shm.broken = bool(why)  # its prepared calls check this flag, not Python's

    def _open_shm(self) -> str | None:
        """Map the shared-memory segment on every rank (collective), or say why not.

        Nothing is ever left in /dev/shm, whenever the job is killed: rank 0 makes the segment an
        anonymous memory file (memfd_create), and the other ranks open it through
        /proc/<rank 0's pid>/fd/<fd> (ranks of one node, one user: the kernel allows a process
        to open the descriptors of another of its user, ptrace's read access).  It has no name
        anywhere; its memory lives while a rank maps it.  Each rank checks that what it opened is
        rank 0's file (device and inode), since another pid namespace would name another process.
        Where that does not work (no memfd_create, /proc unreadable, ranks in different pid
        namespaces), the segment is a file in SHM_DIR, unlinked as soon as every rank mapped it;
        a job killed in between leaves it, and the next construction on the node reclaims it
        (reclaim_stale_files: its name proves its creator is gone)."""
        if self.size == 1:
            return "one rank"
        comm = self.comm
        shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        one_node = shared.Get_size() == self.size  # the same answer on every rank
        shared.Free()
        if not one_node:
            return "the ranks span several nodes"
        bad = ranks_reasons(comm, hostshm_unavailable_reason())
        if bad:
            return bad
        nbytes = _hostshm.segment_bytes(self.size, SHM_SLOT_BYTES)
        if self.rank == 0:
            reclaim_stale_files(SHM_DIR)
        why_not_memfd = self._map_segment(nbytes, anonymous=True)
        if why_not_memfd is None:
            return None
        log.debug("hpccoll: shared-memory segment through a file in %s (%s)", SHM_DIR, why_not_memfd)
        return self._map_segment(nbytes, anonymous=False)

    def _map_segment(self, nbytes: int, anonymous: bool) -> str | None:
        """Rank 0 creates the segment (an anonymous memory file, or a file in SHM_DIR named by
        shm_file_name), every rank maps it, and once every rank has (the allgather), rank 0
        closes (and unlinks) it; sets self.shm, or says why not (the same on every rank)."""
        comm = self.comm
        fd = offer = error = None
        if self.rank == 0:
            fd, offer, error = create_segment(nbytes, anonymous, SHM_DIR)
        offer, error = comm.bcast((offer, error), root=0)
        seg = None
        if offer is not None:
            path, ident = offer
            try:  # any failure is reported to every rank below, so no rank is left waiting
                mine = os.dup(fd) if self.rank == 0 else os.open(path, os.O_RDWR)
                try:
                    st = os.fstat(mine)
                    if (st.st_dev, st.st_ino) != ident:
                        raise OSError(f"{path} is not rank 0's segment here (another pid namespace?)")
                    seg = _hostshm.Segment(mine, self.rank, self.size, SHM_SLOT_BYTES, self.timeout)
                finally:
                    os.close(mine)
            except Exception as exc:  # noqa: BLE001
                error = f"rank {self.rank} could not map {path} ({exc})"
        errors = comm.allgather(error)  # after this, every rank has mapped the segment (or failed)
        if self.rank == 0 and fd is not None:
            os.close(fd)
            if not anonymous:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(offer[0])
        bad = [e for e in errors if e]
        if bad:
            if seg is not None:
                seg.close()
            return "; ".join(dict.fromkeys(bad))
        self.shm = seg
        return None

    def _shm_takes(self, dtype: str, nbytes: int) -> bool:
        """Whether an Allreduce runs on the shared-memory path: decided from values every rank
        shares (dtype, size, the agreed segment), so every rank takes the same path."""
        return self.shm is not None and dtype in _SHM_DTYPES and nbytes <= SHM_SLOT_BYTES

    def _shm_failed(self, late: int) -> None:
        """A shared-memory call did not run: rank `late` never came (raise CollectiveTimeout), or
        (late = -1) the communicator was broken, freed, or busy before the call."""
        if late >= 0:
            self._timed_out("Allreduce", f"shared-memory Allreduce (rank {late} never posted its input)",
                            "a late peer would pair with the wrong call", peer=late)
        self._check("Allreduce")
        if self.shm is None or self.shm.closed:
            raise HpccollError("Allreduce: this communicator was freed: make a new one (or Dup() before Free())")
        raise HpccollError("Allreduce: another collective is in flight on this communicator "
                           "(one at a time per communicator; use Dup() for another thread)")

    # -- completion against the deadline ------------------------------------------------
    def _timed_out(self, name: str, where: str, why: str, peer=None):
        """Mark this backend unusable and raise CollectiveTimeout for call `name`."""
        self.broken = (f"{name}: rank {self.rank} waited {self.timeout:g} s for its peers in the host "
                       f"backend's {where}; a peer never joined or died. This communicator is unusable "
                       f"({why}): end the job, or raise HPCCOLL_TIMEOUT if ranks are legitimately that far apart")
        raise CollectiveTimeout(self.broken, collective=name, peer=peer, waited_s=self.timeout)

    def _complete(self, req, name: str, *memory) -> None:
        """Wait for a nonblocking MPI request; CollectiveTimeout once `timeout` has passed.
        `memory`: the library's arrays the request reads and writes, kept alive with the request
        when it is abandoned (a late peer still completes it into them)."""
        if req.Test():
            return
        test = req.Test
        n = 0
        deadline = time.monotonic() + self.timeout  # (an infinite timeout: never passes)
        while not test():
            n += 1
            if n % _SPINS == 0:
                if n > _YIELD_AFTER:
                    os.sched_yield()
                if time.monotonic() > deadline:
                    _abandon(req, memory)
                    self._timed_out(name, "MPI call", "the MPI operation cannot be cancelled")

    def _check(self, name: str) -> None:
        if self.broken:
            raise CollectiveTimeout(f"{name}: this communicator timed out earlier and is unusable "
                                    f"({self.broken})", collective=name)

    def route(self, call, algorithm: str, deterministic: bool) -> Route:
        """The call's Route: an Allreduce's path (`_allreduce_path`) as its algorithm."""
        if algorithm not in ("auto", "mpi", "host"):
            self._unknown(call.name, algorithm)
        path = algorithm
        if call.name == "Allreduce":
            path = self._allreduce_path(call.recv.dtype, call.op, call.recv.nbytes, deterministic)
        return Route(self, algorithm, path, deterministic)

    def run(self, call, route: Route, stream=None) -> None:
        self._check(call.name)
        _RUN[call.name](self, call, route)

    # -- collectives ---------------------------------------------------------------------
    def _allreduce_path(self, dtype: str, op, nbytes: int, det: bool) -> str:
        """The one decision tree of an Allreduce, from values every rank shares: "shm" (the
        shared-memory segment), "minmax" (floats' MAX / MIN as an integer MAX / MIN of ordered
        keys), "mpi" (MPI's reduction) or "rank_order" (an Allgather reduced in rank order)."""
        if self._shm_takes(dtype, nbytes):
            return "shm"
        if dtype in _FLOATS and op in (MAX, MIN):
            return "minmax"
        if not det and dtype in _MPI_TYPED:
            return "mpi"
        return "rank_order"

    def _allreduce(self, call, route: Route) -> None:
        """One Allreduce by its route's path: the shared-memory call, or the prepared plan's
        rounds built for this call (device buffers: on their host copies)."""
        send = _Staged(call.send)
        recv = send if call.in_place else _Staged(call.recv, fetch=False)
        if route.algorithm == "shm":
            late = self.shm.allreduce(send.host, recv.host, DTYPE_CODES[call.recv.dtype], OP_CODES[call.op.name])
            if late >= 0:
                self._shm_failed(late)
        else:
            AllreducePlan(self, route.algorithm, send.host, recv.host, call.in_place, call.recv.dtype,
                               call.op).launch()
        recv.commit()

    def _reduce_scatter_block(self, call, route: Route) -> None:
        """Rounds of an Alltoall of slice r of every block, each reduced in rank order into
        slice r of the result (in place: block 0 of the input, whose slice r is staged first)."""
        src = _Staged(call.recv if call.in_place else call.send)
        recv = src if call.in_place else _Staged(call.recv, fetch=False)
        x = src.host.reshape(self.size, -1)
        out = recv.host[:x.shape[1]]

        def reduce(lo, k, parts):
            out[lo:lo + k] = reduce_in_rank_order(call.op, parts)

        self._alltoall_rounds(x, call.name, reduce)
        recv.commit()

    def _allgather(self, call, route: Route) -> None:
        """Rounds of an Allgather of slice r of every rank's block, copied into the blocks."""
        P = self.size
        recv = _Staged(call.recv, fetch=call.in_place)
        y = recv.host.reshape(P, -1)
        n = y.shape[1]
        mine = y[self.rank] if call.in_place else _Staged(call.send).host
        s = _block_slice(P, y.itemsize, n)
        send, recv_flat = np.empty(s, y.dtype), np.empty(P * s, y.dtype)
        for lo, k in _spans(n, s):
            got = recv_flat[:P * k].reshape(P, k)
            np.copyto(send[:k], mine[lo:lo + k])
            self._complete(self.comm.Iallgather(_msg(_bytes(send[:k])), _msg(_bytes(got), P)), call.name,
                           send, recv_flat)
            y[:, lo:lo + k] = got
        recv.commit()

    def _bcast(self, call, route: Route) -> None:
        """Rounds of an Ibcast of STAGE_BYTES (at most MAX_COUNT) bytes each."""
        root = self.rank == call.root
        buf = _Staged(call.recv, fetch=root)
        u8 = _bytes(buf.host)
        stage = np.empty(min(STAGE_BYTES, rounds.MAX_COUNT, u8.size), np.uint8)
        for lo, k in _spans(u8.size, stage.size):
            if root:
                np.copyto(stage[:k], u8[lo:lo + k])
            self._complete(self.comm.Ibcast(stage[:k], root=call.root), call.name, stage)
            if not root:
                np.copyto(u8[lo:lo + k], stage[:k])
        buf.commit()

    def _alltoall(self, call, route: Route) -> None:
        """Rounds of an Alltoall of slice r of every block (in place: slice r of every block is
        staged before the round writes it)."""
        P = self.size
        src = _Staged(call.recv if call.in_place else call.send)
        recv = src if call.in_place else _Staged(call.recv, fetch=False)
        y = recv.host.reshape(P, -1)

        def store(lo, k, got):
            y[:, lo:lo + k] = got

        self._alltoall_rounds(src.host.reshape(P, -1), call.name, store)
        recv.commit()

    def _alltoall_rounds(self, x, name: str, take) -> None:
        """Rounds of an Alltoall of slice r of every row of x (P x n, row j for rank j), each
        round's slice staged before it is sent; take(lo, k, got): the P x k slice received, row
        i from rank i (staging, valid until the next round)."""
        P, n = x.shape
        s = _block_slice(P, x.itemsize, n)
        send_flat, recv_flat = np.empty(P * s, x.dtype), np.empty(P * s, x.dtype)
        for lo, k in _spans(n, s):
            sent, got = send_flat[:P * k].reshape(P, k), recv_flat[:P * k].reshape(P, k)
            np.copyto(sent, x[:, lo:lo + k])
            self._complete(self.comm.Ialltoall(_msg(_bytes(sent), P), _msg(_bytes(got), P)), name,
                           send_flat, recv_flat)
            take(lo, k, got)

    def _alltoallv(self, call, route: Route) -> None:
        """The blocks to other ranks through MPI point-to-point messages in rounds (device buffers
        staged through host memory); this rank's block to itself copied where the buffers are,
        after the exchange (on the device: no staging; one rank: no MPI call at all).

        Round r carries slice r (`_block_slice` elements) of every block still that long, one
        message per pair and direction: a pair's number of rounds is a function of its count,
        which both partners know, so no rank needs the others' counts.  A rank whose partner
        left a round behind (a timeout) waits for that partner's next round, which never comes,
        and raises CollectiveTimeout."""
        v, r = call.v, self.rank
        own = v.send_counts[r]  # (= v.recv_counts[r]: checked at validation)
        big = max(v.send_counts + v.send_displs + v.recv_counts + v.recv_displs)
        if big > rounds.MAX_COUNT:
            raise ValueError(f"Alltoallv: a count or displacement of {big} elements exceeds an MPI count "
                             f"({rounds.MAX_COUNT}): split the exchange into several calls")
        if self.size > 1:
            recv = _Staged(call.recv, fetch=True)  # elements outside the received blocks keep theirs
            x, y = _Staged(call.send).host, recv.host
            peers = [j for j in range(self.size) if j != r]
            s = _block_slice(self.size, x.itemsize)  # the same on every rank: a pair's slices agree
            longest = max([v.send_counts[j] for j in peers] + [v.recv_counts[j] for j in peers])
            send_flat, recv_flat = (np.empty(len(peers) * min(s, longest), x.dtype) for _ in range(2))
            comm, lo = self.comm, 0
            while True:
                reqs, copies, at = [], [], 0
                for j in peers:
                    k = min(s, v.recv_counts[j] - lo)
                    if k > 0:
                        reqs.append(comm.Irecv(_bytes(recv_flat[at:at + k]), source=j, tag=_ALLTOALLV_TAG))
                        copies.append((v.recv_displs[j] + lo, at, k))
                        at += k
                at = 0
                for j in peers:
                    k = min(s, v.send_counts[j] - lo)
                    if k > 0:
                        d = v.send_displs[j] + lo
                        np.copyto(send_flat[at:at + k], x[d:d + k])
                        reqs.append(comm.Isend(_bytes(send_flat[at:at + k]), dest=j, tag=_ALLTOALLV_TAG))
                        at += k
                if not reqs:
                    break
                self._complete(_Requests(reqs), call.name, send_flat, recv_flat)
                for d, at, k in copies:
                    y[d:d + k] = recv_flat[at:at + k]
                lo += s
            recv.commit()
        if own:
            dst = call.recv.flat[v.recv_displs[r]:v.recv_displs[r] + own]
            mine = call.send.flat[v.send_displs[r]:v.send_displs[r] + own]
            if call.recv.is_device:  # ordered after every stream's work, done before returning (as _Staged)
                import cupy

                with cupy.cuda.Device(call.recv.device):
                    cupy.cuda.runtime.deviceSynchronize()
                    dst[...] = mine
                    cupy.cuda.runtime.deviceSynchronize()
            else:
                dst[...] = mine

    def allgather_object(self, obj, name: str) -> list:
        """Every rank's picklable `obj`, in rank order, bounded by the timeout (check mode's
        exchange): the sizes, then the pickles."""
        import pickle

        data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
        mine, sizes = np.array([data.size], dtype=np.int64), np.empty(self.size, dtype=np.int64)
        self._complete(self.comm.Iallgather(mine, sizes), name, mine, sizes)
        displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        out = np.empty(int(sizes.sum()), dtype=np.uint8)
        self._complete(self.comm.Iallgatherv(data, [out, (sizes, displs), MPI.BYTE]), name, data, out, sizes, displs)
        return [pickle.loads(out[d:d + n].tobytes()) for d, n in zip(displs, sizes)]

    @staticmethod
    def _unknown(collective: str, algorithm: str):
        """Raise for an algorithm name the host backend does not run, naming the fix."""
        from .. import policy

        if algorithm in policy.ALGORITHMS:
            raise ValueError(f"{collective}: algorithm={algorithm!r} runs device buffers on the cuda backend; "
                             "this call runs on the host backend (host buffers, or a host communicator): "
                             "use 'auto' or 'mpi'")
        raise ValueError(f"{collective}: algorithm={algorithm!r} is unknown: use 'auto' or 'mpi' (host "
                         f"backend), or one of {', '.join(policy.ALGORITHMS)} for device buffers on the cuda backend")

    def plan(self, call, route: Route):
        """A prepared Allreduce of numpy buffers (the repeated call's fast path), by its route's
        path: on the shared-memory path a C object holding the buffers' addresses, codes and
        segment; else the plan's steps, with their scratch allocated once.  None for anything
        else (those repeats run `run` without re-validation)."""
        if call.name != "Allreduce" or call.recv.is_device or call.recv.count == 0:
            return None
        if route.algorithm == "shm":  # one C call a launch
            return _hostshm.Plan(self.shm, call.send.flat, call.recv.flat, DTYPE_CODES[call.recv.dtype],
                                 OP_CODES[call.op.name], self._shm_failed)
        return AllreducePlan(self, route.algorithm, call.send.flat, call.recv.flat, call.in_place,
                                  call.recv.dtype, call.op)

    def barrier(self) -> None:
        self._check("Barrier")
        self._complete(self.comm.Ibarrier(), "Barrier")

    def free(self) -> None:
        """Unmap the shared-memory segment (local: the peers' maps keep the memory alive while
        they finish the last call)."""
        if self.shm is not None:
            self.shm.close()


_RUN = {"Allreduce": HostBackend._allreduce, "Bcast": HostBackend._bcast,
        "Reduce_scatter_block": HostBackend._reduce_scatter_block, "Allgather": HostBackend._allgather,
        "Alltoall": HostBackend._alltoall, "Alltoallv": HostBackend._alltoallv}
