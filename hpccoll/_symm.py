"""Symmetric memory: one workspace per rank, mapped into every rank of the node over CUDA IPC.

Allocated with plain cudaMalloc (outside CuPy's pool: IPC handles of pool sub-allocations or
VMM pointers fail), IPC handles exchanged over MPI, peers opened once.  Before the peer path
is trusted, every rank writes a token into every peer's workspace and reads back what the
peers wrote into its own (a real cross-process test, not only deviceCanAccessPeer)."""
from __future__ import annotations

import ctypes
import os

import numpy as np

from ._driver import Args, host_device_pointer
from .errors import HpccollError

CTRL_BYTES = 65536     # HC_CTRL_BYTES
OFF_ERR = 2112         # HC_OFF_ERR
OFF_PROBE = 8192       # scratch for the cross-process probe


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
        self.ptr = rt.malloc(nbytes)
        self._opened: list[int] = []
        try:
            rt.memset(self.ptr, 0, nbytes)
            rt.deviceSynchronize()
            handle = rt.ipcGetMemHandle(self.ptr)
            handles = node_comm.allgather(handle)
            self.peers = []
            for r, h in enumerate(handles):
                if r == self.rank:
                    self.peers.append(self.ptr)
                else:
                    p = rt.ipcOpenMemHandle(h)
                    self._opened.append(p)
                    self.peers.append(p)
        except Exception as exc:
            self._release()
            raise CudaUnavailable(f"CUDA IPC setup failed: {exc}") from exc
        # Host-mapped error word: kernels set it when a poll times out; the host reads it
        # without synchronizing.
        self.host_err = rt.hostAlloc(64, 2)  # cudaHostAllocMapped
        ctypes.memset(self.host_err, 0, 64)
        self.host_err_dev = host_device_pointer(self.host_err)
        self.err_word = ctypes.c_int.from_address(self.host_err)  # read on every call: made once

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
            rt.memcpy(base + OFF_PROBE + 8 * self.rank, val.ctypes.data, 8, 4)  # host -> peer device (cudaMemcpyDefault)
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
        """The ErrRec of cuda/hc_common.cuh: int code, collective, peer, pad; u64 slot, waitedNs."""
        raw = np.zeros(32, dtype=np.uint8)
        self.rt.memcpy(raw.ctypes.data, self.ptr + OFF_ERR, 32, 4)  # cudaMemcpyDefault
        ints, u64s = raw[:16].view(np.int32), raw[16:].view(np.uint64)
        return {"code": int(ints[0]), "collective": int(ints[1]), "peer": int(ints[2]),
                "slot": int(u64s[0]), "waited_ns": int(u64s[1])}

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
