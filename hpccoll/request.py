"""Persistent collectives: MPI-4's MPI_Allreduce_init and friends (mpi4py's Prequest).

    req = comm.Allreduce_init(x, y)       # validated, routed, launch prepared: once
    for step in range(n):
        ...                               # write x
        req.Start()                       # issue on the request's stream
        req.Wait()                        # y holds the result

A request binds its buffers, op, root, algorithm, policy and stream when it is made.  Every
Start issues that call again by the route decided at init, without validating it or matching
its arguments (the repeated call's fast path, minus the match), so a loop of Start/Wait is the cheapest blocking
collective there is from Python.  MPI's rules hold: between Start and Wait the input must not be
written nor the output read; Start on an active request raises; the request keeps its buffers
alive until Free.  Inside `with comm.group():` Start queues its call like any other, so several
requests started in a group share one launch.
"""
from __future__ import annotations

from .errors import HpccollError


class Request:
    """A persistent collective of one Communicator (see the module's doc)."""

    __slots__ = ("_comm", "_name", "_send", "_recv", "_op", "_root", "_algo", "_det", "_stream",
                 "_call", "_route", "_plan", "_gen", "_active", "_freed")

    def __init__(self, comm, name, sendbuf, recvbuf, op, root, algorithm, deterministic, stream):
        self._comm, self._name = comm, name
        self._send, self._recv, self._op, self._root = sendbuf, recvbuf, op, root
        self._algo = algorithm  # (None: the communicator's default; _validate_persistent decides)
        self._det = None  # (the policy: _validate_persistent decides)
        self._stream = stream
        self._call = self._plan = self._route = None  # the validated call, its route, its prepared launch
        self._gen = -1
        self._active = self._freed = False
        comm._validate_persistent(self, deterministic)  # bad arguments raise here, at init, as MPI's do

    # -- MPI's request calls -----------------------------------------------------------
    def Start(self) -> None:
        """Issue the collective (on the device backends: asynchronously, on the request's stream).
        In check mode this request's state is checked with its arguments, on every rank together."""
        comm = self._comm
        if comm.check:
            comm._start_persistent_request(self)
        else:
            if self._freed or self._active:
                self._startable()  # raises
            if comm._group is None and self._gen == comm._plan_gen and self._plan is not None:
                comm._launch_plan(self._plan, self._stream, self._name)
            else:
                comm._start_persistent_request(self)
        self._active = True

    def _startable(self) -> None:
        """Raise unless this request may Start."""
        if self._freed:
            raise HpccollError(f"{self._name}_init request: Start after Free: make a new request")
        if self._active:
            raise HpccollError(f"{self._name}_init request: Start on an active request: call Wait() first")

    def Wait(self) -> None:
        """Wait until the collective Start issued has finished (a no-op when none is active).
        Inside a group, the call has not been issued yet: Wait after the group's end."""
        if not self._active:
            return
        if self._comm._group is not None:
            raise HpccollError(f"{self._name}_init request: Wait inside comm.group(): the call is issued "
                               "when the group ends; Wait after the `with` block")
        self._active = False
        self._comm.synchronize(self._stream)

    def Test(self) -> bool:
        """True when the collective has finished (then as Wait); False while it runs."""
        if not self._active:
            return True
        if self._comm._group is None and self._comm._stream_idle(self._stream):
            self.Wait()
            return True
        return False

    def Free(self) -> None:
        """Release the request (after Wait): its buffers are no longer held."""
        if self._active:
            raise HpccollError(f"{self._name}_init request: Free on an active request: call Wait() first")
        self._freed = True
        self._plan = self._call = self._route = self._send = self._recv = None

    @property
    def active(self) -> bool:
        """Started and not yet waited for."""
        return self._active

    @staticmethod
    def Startall(requests) -> None:
        """Start every request, in order."""
        for r in requests:
            r.Start()

    @staticmethod
    def Waitall(requests) -> None:
        """Wait for every request."""
        for r in requests:
            r.Wait()

    def __repr__(self) -> str:
        state = "freed" if self._freed else "active" if self._active else "inactive"
        return f"<hpccoll.Request {self._name} ({state}) on {self._comm!r}>"
