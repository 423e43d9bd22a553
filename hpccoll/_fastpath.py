"""The repeated call's fast path: a Communicator keeps the last call of each collective with its
Route (`FastCall`), and a repeat of exactly that call runs without validation or a decision:
its prepared launch (`Backend.plan`) once it has been repeated, else the backend's `run` with
the kept Route."""
from __future__ import annotations

import weakref

import numpy as np

from ._buffers import _cupy as _cupy_module
from ._buffers import is_in_place as _is_in_place

HOST_BYTES = 64 * 1024  # host calls up to this size may skip re-validation when repeated
DEVICE_BYTES = 4 << 20  # device calls: the cache holds their arrays until a prepared launch


class FastCall:
    """The last call of one collective, for its repeats: the validated `call` and its `route`,
    and once the call has been repeated on a backend that prepares launches, the prepared launch
    (`plan`).

    A repeat must pass the very same arrays (held by weak reference, so a freed array can never
    be mistaken for a new one at the same address), with the dtype and shape they had, and the
    same op, root, algorithm and determinism policy.  A CuPy ndarray's `data`, `size` and `dtype`
    are read-only; a numpy array's dtype, shape, strides and writeable flag can be reassigned, so
    they are compared.
    A view, a slice or a reshape is a new object.  Anything else takes the full path: validation,
    routing, staging."""

    __slots__ = ("call", "route", "plan", "repeats", "send", "recv", "send_ref", "args", "recv_meta",
                 "send_meta", "numpy")

    @staticmethod
    def eligible(sendbuf, recvbuf, call) -> bool:
        if call.v is not None:
            return False
        cp = _cupy_module()
        if cp is not None and type(recvbuf) is cp.ndarray:
            return call.recv.nbytes <= DEVICE_BYTES and (
                sendbuf is None or _is_in_place(sendbuf) or type(sendbuf) is cp.ndarray)
        return (type(recvbuf) is np.ndarray and call.recv.nbytes <= HOST_BYTES
                and (sendbuf is None or _is_in_place(sendbuf) or type(sendbuf) is np.ndarray))

    def __init__(self, call, route, sendbuf, recvbuf, op, root, key, det):
        """key: the algorithm a repeat must ask for (the route's `requested` may be the default's)."""
        self.call, self.route, self.plan, self.repeats = call, route, None, 0
        self.recv = weakref.ref(recvbuf)
        self.send_ref = not (sendbuf is None or _is_in_place(sendbuf))
        self.send = weakref.ref(sendbuf) if self.send_ref else sendbuf  # (None, IN_PLACE: held as itself)
        self.args = (op, root, key, det)
        self.recv_meta = (recvbuf.dtype, recvbuf.shape, recvbuf.strides)
        self.send_meta = (sendbuf.dtype, sendbuf.shape, sendbuf.strides) if self.send_ref else None
        self.numpy = type(recvbuf) is np.ndarray

    def matches(self, sendbuf, recvbuf, op, root, algo, det) -> bool:
        if self.recv() is not recvbuf or (self.send() if self.send_ref else self.send) is not sendbuf:
            return False
        if (recvbuf.dtype, recvbuf.shape, recvbuf.strides) != self.recv_meta or (
                self.send_ref and (sendbuf.dtype, sendbuf.shape, sendbuf.strides) != self.send_meta):
            return False
        if self.numpy and not recvbuf.flags.writeable:  # made read-only since: validation says so
            return False
        a = self.args
        return (a[0] is op or a[0] == op) and a[1] == root and a[2] == algo and a[3] == det

    def run(self, stream) -> None:
        """Issue a repeat that has no prepared launch yet (the caller holds the communicator's
        lock) by the kept route; on the first repeat, prepare its launch where the backend can: a
        one-off call pays only for the note.  A prepared launch holds raw pointers, so the call
        (and its arrays) need not be kept."""
        route = self.route
        route.backend.run(self.call, route, stream)
        self.repeats += 1
        if self.repeats == 1 and route.backend.caps.plans:
            self.plan = route.backend.plan(self.call, route)
            if self.plan is not None:
                self.call = None
