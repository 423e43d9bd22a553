"""Persistent collectives: MPI-4's MPI_Allreduce_init and friends (mpi4py's Prequest).

    req = comm.Allreduce_init(x, y)       # validated, routed, launch prepared: once
    for step in range(n):
        ...                               # write x
        req.Start()                       # issue on the request's stream
        req.Wait()                        # y holds the result

This module also plans a request for its Communicator (hpccoll/comm.py, which hands it its
lock, validation, routing and check mode): validated and routed at init (`_validate`), its
launch prepared (`_plan`), issued by `Start` through the prepared launch or, where none serves,
by its route (`_start_slow`).

A request binds its buffers, op, root, algorithm, policy and stream when it is made.  Every
Start issues that call again by the route decided at init, without validating it or matching
its arguments (the repeated call's fast path, minus the match), so a loop of Start/Wait is the cheapest blocking
collective there is from Python.  MPI's rules hold: between Start and Wait the input must not be
written nor the output read; Start on an active request raises; the request keeps its buffers
alive until Free.  Inside `with comm.group():` Start queues its call like any other, so several
requests started in a group share one launch.
"""
from __future__ import annotations

from ._fastpath import FastCall
from ._validate import switch
from .errors import HpccollError


class Request:
    """A persistent collective of one Communicator (see the module's doc)."""

    __slots__ = ("_comm", "_name", "_send", "_recv", "_op", "_root", "_algo", "_det", "_stream",
                 "_call", "_route", "_plan", "_gen", "_active", "_freed")

    def __init__(self, comm, name, sendbuf, recvbuf, op, root, algorithm, deterministic, stream):
        self._comm, self._name = comm, name
        self._send, self._recv, self._op, self._root = sendbuf, recvbuf, op, root
        self._algo = algorithm  # (None: the communicator's default; _validate decides)
        self._det = None  # (the policy: _validate decides)
        self._stream = stream
        self._call = self._plan = self._route = None  # the validated call, its route, its prepared launch
        self._gen = -1
        self._active = self._freed = False
        self._validate(deterministic)  # bad arguments raise here, at init, as MPI's do

    # -- MPI's request calls -----------------------------------------------------------
    def Start(self) -> None:
        """Issue the collective (on the device backends: asynchronously, on the request's stream).
        In check mode this request's state is checked with its arguments, on every rank together."""
        comm = self._comm
        if comm.check:
            self._start_slow()
        else:
            if self._freed or self._active:
                self._startable()  # raises
            if comm._group is None and self._gen == comm._plan_gen and self._plan is not None:
                _launch(comm, self._plan, self._stream, self._name)
            else:
                self._start_slow()
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
        if self._comm._group is None and self._stream_idle():
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

    # -- planning, for the Communicator -------------------------------------------------
    def _validate(self, deterministic) -> None:
        """The arguments, checked once, and the route, decided once (local: no communication; in
        check mode agreed with every rank's init, so its errors too are raised on every rank),
        and the launch prepared where one launch serves it (check mode: never, so every Start
        checks)."""
        comm, name = self._comm, f"{self._name}_init"

        def validate():
            det = comm.deterministic if deterministic is None else switch(self._name, "deterministic", deterministic)
            call, route = comm._validated(self._name, self._send, self._recv, self._op, self._root, self._algo,
                                          det, None)
            if self._stream is not None:
                from .backends.streams import stream_ptr

                stream_ptr(self._stream)  # a stream of the wrong type raises here
            return (call, route), comm._signature(call, route, name), call.v

        if comm.check:
            with comm._exclusive(name):
                call, route = comm._agreed(name, validate)
        else:
            comm._live(name)
            call, route = validate()[0]
        self._call, self._route, self._det = call, route, route.deterministic
        self._plan_launch()

    def _plan_launch(self) -> None:
        """The prepared launch (or None), for the communicator's current plans (`_plan_gen`)."""
        comm, route = self._comm, self._route
        eligible = (self._call is not None and not comm.check and route.backend.caps.plans
                    and FastCall.eligible(self._send, self._recv, self._call))
        self._plan = route.backend.plan(self._call, route) if eligible else None
        self._gen = comm._plan_gen

    def _start_slow(self) -> None:
        """Start's slow path: in a group, after the prepared launch went stale, or where none
        serves the call (staging, several launches, host backend, check mode).  Outside check
        mode the call runs by the route decided at init."""
        comm = self._comm
        if comm.check:  # the request's state is checked with its arguments, and agreed
            comm._run_checked(self._name, self._send, self._recv, self._op, self._root, self._algo, self._det,
                              self._stream, before=self._startable)
            return
        comm._live(f"{self._name}_init request: Start")
        if comm._group is not None:
            comm._group.append((self._route.backend, (self._call, self._route, self._stream)))
            return
        if self._gen != comm._plan_gen:
            self._plan_launch()
        if self._plan is not None:
            _launch(comm, self._plan, self._stream, self._name)
            return
        with comm._exclusive(self._name):
            self._route.backend.run(self._call, self._route, self._stream)

    def _stream_idle(self) -> bool:
        """Has every operation queued on the request's stream finished?  (Synchronous backends:
        always.)"""
        if not self._comm._backend.caps.asynchronous:
            return True
        from .backends.streams import stream_idle

        return stream_idle(self._stream)

    def __repr__(self) -> str:
        state = "freed" if self._freed else "active" if self._active else "inactive"
        return f"<hpccoll.Request {self._name} ({state}) on {self._comm!r}>"


def _launch(comm, plan, stream, name) -> None:
    """A prepared launch, one collective at a time on `comm` (the persistent requests' fast path)."""
    lock = comm._lock
    if not lock.acquire(False):
        raise comm._busy(name)
    try:
        plan.launch(stream)
    finally:
        lock.release()
