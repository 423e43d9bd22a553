"""Symmetric memory: one workspace per rank, mapped into every rank of the node over CUDA IPC,
and the layout of the collectives' regions inside it.

Allocated with plain cudaMalloc (outside CuPy's pool: IPC handles of pool sub-allocations or
VMM pointers fail), IPC handles exchanged over MPI, peers opened once.  Before the peer path
is trusted, every rank writes a token into every peer's workspace and reads back what the
peers wrote into its own (a real cross-process test, not only deviceCanAccessPeer).  The same
class backs the extension API's symmetric buffers (hpccoll.ext)."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ..._abi import CTRL_BYTES, SENTINEL_U32, Args, ErrRec, const
from ...errors import CollectiveTimeout, HpccollError
from .driver import host_device_pointer

OFF_ERR = const("HC_OFF_ERR")
OFF_PROBE = const("HC_OFF_PROBE")
KiB, MiB = 1024, 1024 * 1024


class CudaUnavailable(HpccollError):
    """The CUDA backend cannot run on this communicator (the reason says why)."""


class Workspace:
    def __init__(self, node_comm, nbytes: int):
        import cupy

        rt = cupy.cuda.runtime
        self.rt = rt
        self.nbytes = nbytes
        self.rank = node_comm.Get_rank()
        self.size = node_comm.Get_size()
        self.ptr = 0
        self._opened: list[int] = []
        self.peers = []
        # Each step's failure is agreed before anyone goes on: a rank out of memory, or one that
        # cannot map a peer, raises with all the others (and `auto` falls back on all of them)
        # instead of leaving them in the next exchange.
        handle, error = None, None
        try:
            self.ptr = rt.malloc(nbytes)
            rt.memset(self.ptr, 0, nbytes)
            rt.deviceSynchronize()
            handle = rt.ipcGetMemHandle(self.ptr)
        except Exception as exc:  # noqa: BLE001 - agreed below
            error = f"rank {self.rank}: {nbytes} bytes of workspace: {exc}"
        handles = self._agree(node_comm, handle, error, "CUDA IPC setup failed")
        error = None
        try:
            for r, h in enumerate(handles):
                if r == self.rank:
                    self.peers.append(self.ptr)
                else:
                    p = rt.ipcOpenMemHandle(h)
                    self._opened.append(p)
                    self.peers.append(p)
        except Exception as exc:  # noqa: BLE001 - agreed below
            error = f"rank {self.rank} mapping rank {len(self.peers)}'s workspace: {exc}"
        self._agree(node_comm, None, error, "CUDA IPC setup failed")
        # Host-mapped error word: kernels set it when a poll times out; the host reads it
        # without synchronizing.
        self.host_err = rt.hostAlloc(64, 2)  # cudaHostAllocMapped
        ctypes.memset(self.host_err, 0, 64)
        self.host_err_dev = host_device_pointer(self.host_err)
        self.err_word = ctypes.c_int.from_address(self.host_err)  # read on every call: made once

    def _agree(self, node_comm, value, error: str | None, what: str) -> list:
        """Every rank's value; CudaUnavailable on every rank (its memory released) if any rank
        had an error (collective)."""
        got = node_comm.allgather((value, error))
        errors = [e for _, e in got if e]
        if errors:
            self._release()
            raise CudaUnavailable(f"{what}: {'; '.join(errors)}")
        return [v for v, _ in got]

    def view(self, offset: int, nbytes: int, dtype=np.uint8):
        """A CuPy array over [offset, offset+nbytes) of my workspace."""
        import cupy

        mem = cupy.cuda.UnownedMemory(self.ptr + offset, nbytes, self)
        return cupy.ndarray(nbytes // np.dtype(dtype).itemsize, dtype, cupy.cuda.MemoryPointer(mem, 0))

    def probe_peers(self, node_comm) -> None:
        """Write a token into every peer, read back the peers' tokens: raise CudaUnavailable if wrong."""
        rt = self.rt
        token = int.from_bytes(os.urandom(7), "little") << 8 | self.rank
        tokens = node_comm.allgather(token)
        for r, base in enumerate(self.peers):
            val = np.array([token], dtype=np.uint64)
            rt.memcpy(base + OFF_PROBE + 8 * self.rank, val.ctypes.data, 8, 4)  # host -> peer (cudaMemcpyDefault)
        rt.deviceSynchronize()
        node_comm.Barrier()
        got = np.zeros(self.size, dtype=np.uint64)
        rt.memcpy(got.ctypes.data, self.ptr + OFF_PROBE, 8 * self.size, 4)
        bad = [r for r in range(self.size) if int(got[r]) != tokens[r]]
        bad_all = node_comm.allgather(bad)
        if any(bad_all):
            raise CudaUnavailable("cross-process peer write/read-back failed: " + "; ".join(
                f"rank {r} did not see rank(s) {b}" for r, b in enumerate(bad_all) if b))

    def kernel_args(self, timeout_ns: int) -> Args:
        """Kernel arguments over this workspace (cuda/hc_common.cuh's Args): every rank's base,
        the bound of every poll, the mapped error word, rank and size; the collective's fields
        (regions, buffers, root, iters) left for the caller."""
        a = Args()
        for r, p in enumerate(self.peers):
            a.peers[r] = p
        a.timeoutNs = timeout_ns
        a.hostErr = self.host_err_dev
        a.rank, a.nranks, a.root, a.iters = self.rank, self.size, 0, 1
        return a

    def host_error(self) -> int:
        return self.err_word.value

    def error_record(self) -> dict:
        """The ErrRec (cuda/hc_abi.h) the first poll that timed out wrote."""
        rec = ErrRec()
        self.rt.memcpy(ctypes.addressof(rec), self.ptr + OFF_ERR, ctypes.sizeof(rec), 4)  # cudaMemcpyDefault
        return {"code": rec.code, "collective": rec.collective, "peer": rec.peer, "slot": rec.slot,
                "waited_ns": rec.waitedNs}

    def timeout_error(self, rank: int, where: str, collective: str, unusable: str) -> CollectiveTimeout:
        """The CollectiveTimeout of the error record (the first poll that gave up): `where`
        names what waited, `unusable` says what the caller must do now."""
        rec = self.error_record()
        waited = rec["waited_ns"] / 1e9
        return CollectiveTimeout(f"{where}: rank {rank} waited {waited:.1f} s for rank {rec['peer']} (slot "
                                 f"{rec['slot']}); a peer never joined or died. {unusable}",
                                 collective=collective, peer=rec["peer"], slot=rec["slot"], waited_s=waited)

    def _release(self):
        for p in self._opened:
            try:
                self.rt.ipcCloseMemHandle(p)
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self._opened = []
        if self.ptr:
            try:
                self.rt.free(self.ptr)
            except Exception:  # noqa: BLE001
                pass
            self.ptr = 0

    def free(self):
        self.rt.deviceSynchronize()
        self._release()
        if getattr(self, "host_err", 0):
            self.err_word = ctypes.c_int(0)  # no longer over the freed page
            self.rt.freeHost(self.host_err)
            self.host_err = 0


# -- the regions of the library's collectives ------------------------------------------------
S_ONESHOT = 4 * MiB      # payload per source of one one-shot sentinel launch (2 parities x n of them)
S_LL = 256 * KiB         # payload per source of one LL launch
S_LLB = 2 * MiB          # Bcast's chunk (payload per LL sub-buffer of its own region)
S_TWOSHOT = 8 * MiB      # message bytes of one two-shot launch
S_ENGINE = 256 * KiB     # most payload of one eager-engine call
ENGINES = 2              # engines (dtypes) one communicator can run at once: a region each


def _align(n: int, a: int = 256) -> int:
    return (n + a - 1) // a * a


class Layout:
    """Byte offsets of the regions in every rank's workspace (identical on all ranks)."""

    def __init__(self, nranks: int):
        n = nranks
        self.sub_oneshot = S_ONESHOT
        self.sub_ll = 2 * S_LL                                   # LL: 16 B of slot per 8 B of data
        self.sub_twoshot = _align((S_TWOSHOT // 120 // n + 2) * 128)  # >= LL128 lines per owner
        off = CTRL_BYTES
        self.oneshot = off; off += 2 * n * self.sub_oneshot      # sentinel
        self.ll = off; off += 2 * n * self.sub_ll                # LL
        self.ll2 = off; off += 2 * n * self.sub_ll               # LL (two-shot phase 2, Alltoall)
        self.sub_llb = 2 * S_LLB
        self.llb = off; off += 2 * n * self.sub_llb              # LL (Bcast)
        self.ts1 = off; off += 2 * n * self.sub_twoshot          # sentinel (reduce-scatter)
        self.ts2 = off; off += 2 * n * self.sub_twoshot          # sentinel (all-gather)
        self.ll128 = off; off += 2 * self.sub_twoshot            # zeroed lines
        self.sub_engine = 2 * S_ENGINE                           # the eager engines
        self.engine_bytes = 2 * n * self.sub_engine              # one engine's region
        self.engine = []
        for _ in range(ENGINES):
            self.engine.append(off); off += self.engine_bytes
        self.total = _align(off, 2 * MiB)
        # LL slots lie in groups of 32 packs, 1 KiB each (cuda/proto_ll.cuh, LL::at)
        assert self.sub_ll % KiB == self.sub_llb % KiB == self.sub_engine % KiB == 0
        # allreduce algorithm -> (bytes per launch, (region, sub), (region2, sub2))
        self.allreduce = {
            "oneshot_sentinel": (S_ONESHOT, (self.oneshot, self.sub_oneshot), (0, 0)),
            "oneshot_ll": (S_LL, (self.ll, self.sub_ll), (0, 0)),
            "twoshot_ll": (S_LL * n, (self.ll, self.sub_ll), (self.ll2, self.sub_ll)),
            "twoshot_sentinel": (S_TWOSHOT, (self.ts1, self.sub_twoshot), (self.ts2, self.sub_twoshot)),
            "twoshot_ll128": (S_TWOSHOT, (self.ll128, self.sub_twoshot), (self.ts2, self.sub_twoshot)),
        }
        # regions armed with the sentinel (the rest starts zeroed: LL flags, LL128 lines)
        self.sentinel_regions = [(self.oneshot, self.ll), (self.ts1, self.ll128)]

    def arm(self, ws: "Workspace") -> None:
        """Fill the sentinel regions of `ws` with the sentinel (once, before any collective)."""
        for lo, hi in self.sentinel_regions:
            ws.view(lo, hi - lo, np.uint32).fill(SENTINEL_U32)


__all__ = ["Workspace", "Layout", "CudaUnavailable"]
