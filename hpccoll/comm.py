"""The Communicator: mpi4py-style collectives on host or device buffers.

Construction is collective over the MPI communicator it wraps (which it duplicates, so
hpccoll's traffic never meets the caller's).  One collective is in flight per communicator
at a time: calls from two threads, or on two streams without ordering between them, are not
supported; use one communicator per stream (`Dup`).

This module is the API only: the backends come from hpccoll.backends.factory; a call is
validated (hpccoll._validate), routed once (hpccoll._routes: the device backend for the calls
it runs, its `caps`, the host backend for everything else, and the algorithm that backend's
policy gives), agreed across ranks in check mode, and run by its backend
(hpccoll/backends/base.py) as its route says.  Repeats of a call keep its route
(hpccoll._fastpath), as persistent requests do (hpccoll/request.py plans them); the eager
engine's control is hpccoll._eager's."""
from __future__ import annotations

import contextlib
import itertools
import logging
import threading

from mpi4py import MPI

from . import config as _config
from ._buffers import result_like
from ._launcher import detect_singleton
from . import _eager, _routes
from ._fastpath import FastCall
from ._validate import agree, integer, plain_signature, prepare, signature, switch
from .backends.base import Backend
from .backends.cuda.engine import DEFAULT_BLOCKS
from .backends.factory import REQUESTS, open_backends
from .backends.hier import node_layout
from .errors import HpccollError
from .ops import SUM, dtype_name
from .request import Request

log = logging.getLogger("hpccoll")

BACKENDS = REQUESTS
# Free waits for a call in flight at most this many timeouts: every wait of a call is bounded by
# the timeout, and a call makes a few (check mode's exchange, staging, the collective)
_FREE_WAIT = 4


class Communicator:
    """Collectives over an MPI communicator, mirroring mpi4py.MPI.Comm.

    backend: "auto" (CUDA kernels where a GPU and CuPy are usable, else host),
    "host" (MPI; device buffers are staged through host memory), "cuda", "nccl".
    algorithm / deterministic: defaults for every call (each call may override).
    check: compare every call's arguments across ranks first (default: HPCCOLL_CHECK).
    timeout: seconds a collective waits for a peer before CollectiveTimeout (HPCCOLL_TIMEOUT).
    """

    def __init__(self, comm=None, *, backend: str = "auto", device: int | None = None,
                 algorithm: str = "auto", deterministic: bool = False, check: bool | None = None,
                 timeout: float | None = None, _owned_comm=None):
        if backend not in BACKENDS:
            raise ValueError(f"Communicator: backend={backend!r}: use one of {', '.join(BACKENDS)}")
        if not isinstance(algorithm, str):
            raise TypeError(f"Communicator: algorithm={algorithm!r}: pass a name such as 'auto'")
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Comm):
            raise TypeError(f"Communicator: comm must be an mpi4py communicator, not {type(base).__name__}")
        if base == MPI.COMM_NULL:
            raise ValueError("Communicator: comm is MPI.COMM_NULL: pass a communicator this rank belongs to")
        detect_singleton(MPI.COMM_WORLD.Get_size())
        self._freed = True  # until construction has finished (repr and Free stay safe)
        # a setting that is invalid on some ranks only must not leave the others waiting in Dup:
        # every rank comes to the agreement, which raises on all of them
        det = False
        try:
            det = switch("Communicator", "deterministic", deterministic)
            check = None if check is None else switch("Communicator", "check", check)
            self.config, config_error = _config.Config.from_env(check=check, timeout=timeout), None
        except (ValueError, TypeError) as exc:
            self.config, config_error = None, exc
        self._comm = _owned_comm if _owned_comm is not None else base.Dup()
        self._rank, self._size = self._comm.Get_rank(), self._comm.Get_size()
        try:
            _config.check_agreement(self._comm, self.config, config_error, ("check",) if check is not None else ())
        except Exception:
            if _owned_comm is None:
                self._comm.Free()
            raise
        self.algorithm = algorithm
        self.deterministic = det
        self.check = self.config.check
        self.timeout = self.config.timeout
        layout = node_layout(self._comm, self.config.node_size)  # (several nodes: backends/hier.py)
        self._backends = open_backends(self._comm, backend, device, self.config, layout,
                                       algorithm=algorithm, deterministic=det)
        self._host = self._backends.host
        self._backend: Backend = self._backends.main  # the device backend, the hierarchical one, or _host
        self.backend = self._backends.name
        self._lock = threading.Lock()  # held by the call in flight; by Free from teardown on, for good
        self._freeing = threading.Lock()  # one Free at a time, from any thread
        self._fast: dict = {}  # collective name -> FastCall of its last call (hpccoll._fastpath)
        self._plan_gen = 0  # bumped whenever prepared launches go stale (requests re-plan)
        self._group: list | None = None  # the calls queued inside `with comm.group():`
        self._requested = backend
        self._freed = False

    # -- mpi4py-style basics -------------------------------------------------
    def _live(self, name: str) -> None:
        if self._freed:
            raise _freed_error(name)

    def _busy(self, name: str) -> HpccollError:
        """Why `name` found the lock taken: Free holds it for good, or another call is in flight."""
        return _freed_error(name) if self._freed else _in_flight(name)

    @property
    def rank(self) -> int:
        self._live("rank")
        return self._rank

    @property
    def size(self) -> int:
        self._live("size")
        return self._size

    @property
    def mpi_comm(self):
        """The (duplicated) MPI communicator underneath."""
        self._live("mpi_comm")
        return self._comm

    @property
    def device(self):
        """The CUDA device ordinal this rank uses, or None on the host backend."""
        return self._backend.device_id

    @property
    def capabilities(self):
        """What this communicator's backend runs itself (hpccoll.backends.base.Capabilities)."""
        return self._backend.caps

    @property
    def backends(self):
        """This communicator's backends (hpccoll.backends.factory.Backends: `host`, `main`,
        `name`), for benchmarks and tools that time a backend itself (hpccoll.bench): their
        interface is hpccoll.backends.base.Backend, not part of the stable API."""
        self._live("backends")
        return self._backends

    def Get_rank(self) -> int:
        self._live("Get_rank")
        return self._rank

    def Get_size(self) -> int:
        self._live("Get_size")
        return self._size

    def _like_me(self, owned_comm) -> "Communicator":
        return Communicator(owned_comm, backend=self._requested, device=self.device,
                            algorithm=self.algorithm, deterministic=self.deterministic,
                            check=self.check, timeout=self.timeout, _owned_comm=owned_comm)

    def Dup(self) -> "Communicator":
        """A new communicator over the same ranks, with its own device workspace (collective).
        In check mode every rank's call is compared first, within the timeout: MPI's Dup waits
        without bound, so a rank enters it only once every rank has agreed to."""
        with self._exclusive("Dup"):
            if self.check:
                self._agreed("Dup", lambda: (None, plain_signature("Dup"), None))
            sub = self._comm.Dup()
        return self._like_me(sub)

    def Split(self, color: int = 0, key: int = 0) -> "Communicator | None":
        """Like MPI_Comm_split; ranks passing color=MPI.UNDEFINED get None (collective).  Colors and
        keys differ between ranks; in check mode the call itself is compared, as Dup's."""
        def validate():  # (before MPI's Split, in which the other ranks would wait)
            return (integer("Split", "color", color), integer("Split", "key", key)), plain_signature("Split"), None

        with self._exclusive("Split"):
            color, key = self._agreed("Split", validate) if self.check else validate()[0]
            sub = self._comm.Split(color, key)
        if sub == MPI.COMM_NULL:
            return None
        return self._like_me(sub)

    def Free(self) -> None:
        """Release device workspace and the MPI communicator (collective).  A second Free is a no-op.

        Safe from any thread: every call that starts after Free raises HpccollError; a call in
        flight finishes first (Free waits for it, at most _FREE_WAIT timeouts; past that the
        resources are left to the end of the process).  In check mode Free is compared with every
        rank's call like a collective: a MismatchError leaves the communicator as it was.
        After a CollectiveTimeout it waits for its peers at most the timeout (a peer that never
        came may never come): past it, or after a host-backend timeout, the workspace and the MPI
        communicator are left to the end of the process (a pending MPI operation cannot be
        cancelled, and freeing would wait for it)."""
        if self._freed:
            return
        with self._freeing:
            if self._freed:
                return
            if not self.check:
                self._retire()  # calls from now on raise; the one in flight (if any) finishes
            wait = min(_FREE_WAIT * self.timeout, threading.TIMEOUT_MAX)
            if not self._lock.acquire(timeout=wait):
                self._retire()
                log.warning("hpccoll: Free: a call on this communicator did not return within %g s; its "
                            "workspace and MPI communicator are left to the end of the process", wait)
                return
            # From here Free holds the lock for good: a call that gets past `_freed` finds it taken.
            try:
                if self.check and not self._host.broken:
                    self._agreed("Free", lambda: (None, plain_signature("Free"), None))
            except BaseException:
                self._lock.release()  # disagreed: the communicator stays as it was
                raise
            self._retire()
            self._backends.free()

    def _retire(self) -> None:
        """Mark this communicator freed: later calls raise, repeats lose their fast path."""
        self._freed = True
        self._invalidate_plans()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.Free()
        return False

    def __repr__(self) -> str:
        rank, size = getattr(self, "_rank", "?"), getattr(self, "_size", "?")
        state = " (freed)" if getattr(self, "_freed", True) else ""
        return f"<hpccoll.Communicator rank {rank}/{size} backend={getattr(self, 'backend', '?')}{state}>"

    # -- collectives -----------------------------------------------------------
    def _run(self, name, sendbuf, recvbuf, op=None, root=None, algorithm=None,
             deterministic=None, stream=None):
        if self.check:
            self._run_checked(name, sendbuf, recvbuf, op, root, algorithm, deterministic, stream)
            return
        key = self.algorithm if algorithm is None else algorithm  # what a repeat must match
        det = self.deterministic if deterministic is None else switch(name, "deterministic", deterministic)
        if self._group is not None:
            self._enqueue(name, sendbuf, recvbuf, op, root, algorithm, det, stream)
            return
        fast = self._fast.get(name)  # (Free() empties it: a freed communicator never matches)
        if fast is not None and fast.matches(sendbuf, recvbuf, op, root, key, det):
            # a repeat of the last call: the same arrays, arguments and policy
            lock = self._lock
            if not lock.acquire(False):
                raise self._busy(name)
            try:
                plan = fast.plan
                if plan is not None:
                    plan.launch(stream)
                else:
                    fast.run(stream)
            finally:
                lock.release()
            return
        call, route = self._prepare(name, sendbuf, recvbuf, op, root, algorithm, det, stream)
        with self._exclusive(name):
            route.backend.run(call, route, stream)
            # (under the lock: a Free waiting for this call finds it noted, and clears it)
            self._remember(name, call, route, sendbuf, recvbuf, op, root, key, det)

    def _run_checked(self, name, sendbuf, recvbuf, op, root, algorithm, deterministic, stream,
                     before=None) -> None:
        """_run in check mode: every call agreed with every rank's (`_agreed`), never a fast path.
        before: a further local check (a persistent request's state), agreed with the rest."""
        def validate():
            if before is not None:
                before()
            det = self.deterministic if deterministic is None else switch(name, "deterministic", deterministic)
            call, route = self._validated(name, sendbuf, recvbuf, op, root, algorithm, det, stream)
            return (call, route), self._signature(call, route), call.v

        with self._exclusive(name):
            call, route = self._agreed(name, validate)
            if self._group is not None:
                self._group.append((route.backend, (call, route, stream)))
            else:
                route.backend.run(call, route, stream)

    def _agreed(self, name, validate):
        """Check mode: `validate()` (this rank's part: (result, signature, Alltoallv's VSpec or
        None)), then exactly one exchange with every rank whatever it raised, so the ranks'
        exchanges stay paired: a local error is raised here and, as MismatchError naming this
        rank, on every other rank (hpccoll._validate.agree).  The caller holds the lock.
        KeyboardInterrupt and the other BaseExceptions are not exchanged: they stop this rank,
        and its peers' exchange ends in CollectiveTimeout (bounded), as for a rank that died."""
        self._host._check(name)  # a communicator that timed out has no exchange left to pair
        gather = self._host.allgather_object
        try:
            result, sig, vspec = validate()
        except Exception as exc:  # noqa: BLE001 - any local failure (a user type's method may raise anything)
            agree(gather, self._rank, name, exc)  # raises exc here, MismatchError on the other ranks
            raise  # pragma: no cover - agree always raises for an exception
        agree(gather, self._rank, name, sig, vspec)
        return result

    def _signature(self, call, route, name=None) -> tuple:
        """Check mode's signature of a call, from its route (what it asked for, its backend)."""
        sig = signature(call, self._size, route.requested, route.deterministic, route.backend.name,
                        self._group is not None)
        return sig if name is None else (name,) + sig[1:]

    def _prepare(self, name, sendbuf, recvbuf, op, root, algorithm, det, stream=None):
        """(call, route) of a call on a live communicator outside check mode (`_validated`)."""
        self._live(name)
        return self._validated(name, sendbuf, recvbuf, op, root, algorithm, det, stream)

    def _validated(self, name, sendbuf, recvbuf, op, root, algorithm, det, stream):
        """(call, route): a call validated, and its route (hpccoll._routes: the backend that runs
        it, the algorithm it runs with).  Local: no communication."""
        if stream is not None and not (isinstance(stream, int) or hasattr(stream, "ptr") or hasattr(
                stream, "cuda_stream") or hasattr(stream, "handle")):
            raise TypeError(f"{name}: stream={stream!r}: pass a CuPy or torch stream, a raw handle (int), or None")
        call = prepare(name, self._size, sendbuf, recvbuf, op=op, root=root, rank=self._rank)
        return call, _routes.route(self._host, self._backend, self.algorithm, call, algorithm, det)

    def _remember(self, name, call, route, sendbuf, recvbuf, op, root, key, det) -> None:
        """Note this call for the repeated call's fast path (not in check mode: every call of
        check mode is agreed; nor once Free has begun).  key: the algorithm a repeat must ask for."""
        if self.check or self._freed or not FastCall.eligible(sendbuf, recvbuf, call):
            self._fast[name] = None
            return
        self._fast[name] = FastCall(call, route, sendbuf, recvbuf, op, root, key, det)

    def Allreduce(self, sendbuf, recvbuf, op=SUM, *, algorithm=None, deterministic=None, stream=None):
        """recvbuf = op over ranks of sendbuf (sendbuf may be IN_PLACE)."""
        self._run("Allreduce", sendbuf, recvbuf, op, None, algorithm, deterministic, stream)

    def Bcast(self, buf, root: int = 0, *, algorithm=None, deterministic=None, stream=None):
        """Copy buf from root to every rank."""
        self._run("Bcast", None, buf, root=root, algorithm=algorithm,
                  deterministic=deterministic, stream=stream)

    def Reduce_scatter_block(self, sendbuf, recvbuf, op=SUM, *, algorithm=None,
                             deterministic=None, stream=None):
        """recvbuf = block `rank` of op over ranks of sendbuf (size*len(recvbuf) elements)."""
        self._run("Reduce_scatter_block", sendbuf, recvbuf, op=op, algorithm=algorithm,
                  deterministic=deterministic, stream=stream)

    def Allgather(self, sendbuf, recvbuf, *, algorithm=None, deterministic=None, stream=None):
        """recvbuf = concatenation over ranks of sendbuf."""
        self._run("Allgather", sendbuf, recvbuf, algorithm=algorithm,
                  deterministic=deterministic, stream=stream)

    def Alltoall(self, sendbuf, recvbuf, *, algorithm=None, deterministic=None, stream=None):
        """Block j of sendbuf (size equal blocks) goes to rank j, which stores it as block `rank`
        of recvbuf (sendbuf may be IN_PLACE)."""
        self._run("Alltoall", sendbuf, recvbuf, algorithm=algorithm,
                  deterministic=deterministic, stream=stream)

    def Alltoallv(self, sendbuf, recvbuf, *, algorithm=None, deterministic=None, stream=None):
        """As mpi4py's: sendbuf = (array, counts[, displs]) sends counts[j] elements from displs[j]
        to rank j; recvbuf = (array, counts[, displs]) receives counts[i] elements from rank i at
        displs[i].  displs default to the running sum of counts."""
        self._run("Alltoallv", sendbuf, recvbuf, algorithm=algorithm,
                  deterministic=deterministic, stream=stream)

    # -- groups ------------------------------------------------------------------
    @contextlib.contextmanager
    def group(self):
        """`with comm.group():` the collectives called inside are validated at once, queued, and
        issued in order when the block exits, as NCCL's ncclGroupStart/ncclGroupEnd do (their
        results exist only after the block, on the stream of each call).  On the cuda backend,
        consecutive Allreduce calls of one dtype, op, policy and stream whose buffers do not
        overlap each other's outputs share ONE one-shot launch, their buffers laid end to end
        (up to 32 calls and the one-shot's bytes per launch): one epoch and one round trip for
        all of them, bitwise what each call alone gives.  Other calls run as usual, in order.
        On the nccl backend the block is an NCCL group; on the host backend the calls run in
        order at exit.  Collective: every rank, the same calls.  If the block raises, nothing
        queued is issued.  Groups do not nest; Barrier and the engine's start/stop are not
        allowed inside one."""
        self._live("group")
        if self._group is not None:
            raise HpccollError("group: groups do not nest (this communicator is already in one)")
        self._group = []
        try:
            yield self
        except BaseException:
            self._group = None
            raise
        items, self._group = self._group, None
        if items:
            with self._exclusive("group"):
                self._issue(items)

    def _outside_group(self, name: str, where: str) -> None:
        if self._group is not None:
            raise HpccollError(f"{name}: not allowed inside a group (its calls are issued when the "
                               f"block exits): call it {where} the block")

    def _enqueue(self, name, sendbuf, recvbuf, op, root, algorithm, det, stream) -> None:
        call, route = self._prepare(name, sendbuf, recvbuf, op, root, algorithm, det, stream)
        self._group.append((route.backend, (call, route, stream)))

    def _issue(self, items) -> None:
        """A group's calls in order: runs of calls for one backend through its run_group."""
        for backend, run in itertools.groupby(items, key=lambda item: item[0]):
            batch = [call for _b, call in run]
            if backend.caps.groups:
                backend.run_group(batch, self.check)
            else:
                for call in batch:
                    backend.run(*call)

    # -- persistent collectives (MPI-4; hpccoll/request.py) ---------------------------
    def Allreduce_init(self, sendbuf, recvbuf, op=SUM, *, algorithm=None, deterministic=None,
                       stream=None) -> Request:
        """A persistent Allreduce: validated now, issued by every `Start()`, finished by `Wait()`."""
        return Request(self, "Allreduce", sendbuf, recvbuf, op, None, algorithm, deterministic, stream)

    def Bcast_init(self, buf, root: int = 0, *, algorithm=None, deterministic=None, stream=None) -> Request:
        """A persistent Bcast (see Allreduce_init)."""
        return Request(self, "Bcast", None, buf, None, root, algorithm, deterministic, stream)

    def Reduce_scatter_block_init(self, sendbuf, recvbuf, op=SUM, *, algorithm=None, deterministic=None,
                                  stream=None) -> Request:
        """A persistent Reduce_scatter_block (see Allreduce_init)."""
        return Request(self, "Reduce_scatter_block", sendbuf, recvbuf, op, None, algorithm, deterministic, stream)

    def Allgather_init(self, sendbuf, recvbuf, *, algorithm=None, deterministic=None, stream=None) -> Request:
        """A persistent Allgather (see Allreduce_init)."""
        return Request(self, "Allgather", sendbuf, recvbuf, None, None, algorithm, deterministic, stream)

    def _invalidate_plans(self) -> None:
        self._fast.clear()
        self._plan_gen += 1

    def Barrier(self) -> None:
        """Wait until every rank has called Barrier (device work ordered on the stream too).
        In check mode every rank's call is compared first (a Barrier never pairs with a collective)."""
        def validate():
            self._outside_group("Barrier", "after")
            return None, plain_signature("Barrier"), None

        with self._exclusive("Barrier"):
            self._agreed("Barrier", validate) if self.check else validate()
            self._backend.barrier()

    def synchronize(self, stream=None) -> None:
        """Wait for this communicator's device work on `stream`; raise CollectiveTimeout if a
        kernel gave up waiting for a peer.  (Device collectives are asynchronous: like CUDA
        errors, a timeout surfaces here or at the next call on this communicator.)"""
        self._live("synchronize")
        self._backend.synchronize(stream)

    def prepare(self, dtypes=("float32", "float64")) -> None:
        """Compile, or load from the kernel cache, the device kernels this communicator runs for
        `dtypes` (launched and captured), now instead of at each dtype's first collective: a
        cold compile takes seconds per dtype and rank count, which would otherwise land inside
        the first timed call.  Local (no rank waits for another); a no-op on the host and NCCL
        backends."""
        self._live("prepare")
        if isinstance(dtypes, (str, bytes)) or not hasattr(dtypes, "__iter__"):
            raise TypeError(f"prepare: dtypes={dtypes!r}: pass a sequence of dtypes, e.g. ('float64',)")
        self._backend.prepare([dtype_name(d) for d in dtypes])

    # -- the eager engine (backends/cuda/engine.py) -------------------------------------
    def start_persistent(self, dtype="float32", *, blocks: int = DEFAULT_BLOCKS, max_bytes: int = 64 * 1024,
                         order: str = "stream") -> None:
        """Start the eager engine for `dtype` (collective: every rank, the same arguments).

        A resident kernel on `blocks` SMs then runs every Allreduce of that dtype of at most
        `max_bytes` (device buffers, through an aligned copy where not 16-byte aligned; algorithm
        'auto' or 'oneshot_ll'; the stream not being captured) without a kernel launch: the call
        waits for the stream's earlier work, runs, and returns finished (blocking).  Results: the one-shot's, in rank order, bitwise
        identical on every rank.  While an engine runs, device-wide synchronization
        (cudaDeviceSynchronize, cudaFree) waits for it: synchronize streams instead, and stop it
        first.  At most two engines (dtypes) at once; `with comm.persistent(...)` stops it for you.
        max_bytes: at most 256 KiB, and 32 KiB per block.
        order: how an engine call is ordered after the work that writes its input or still reads
        its output.  "stream" (the default): the call asks whether its stream has finished, and
        synchronizes it if not.  "caller": the caller has finished that work before the call, as
        CUDA-aware MPI requires of device buffers (e.g. `stream.synchronize()`, or the previous
        blocking call); the call skips the query.  With the check mode every call queries anyway
        and raises HpccollError when the stream had work left.  Launched calls are stream-ordered
        either way."""
        _eager.start(self, dtype, blocks, max_bytes, order)

    def stop_persistent(self, dtype=None) -> None:
        """Stop the eager engine of `dtype`, or every engine when None (collective)."""
        _eager.stop(self, dtype)

    def persistent(self, dtype="float32", **kw):
        """`with comm.persistent("float32"):` start_persistent, then stop_persistent on exit
        (after a CollectiveTimeout, which stopped every engine already, the timeout propagates)."""
        return _eager.persistent(self, dtype, **kw)

    @contextlib.contextmanager
    def _exclusive(self, name):
        """The call `name` alone on this communicator, which is live (Free waits for it)."""
        if not self._lock.acquire(False):
            raise self._busy(name)
        try:
            self._live(name)  # (Free may have begun since the caller's check)
            yield
        finally:
            self._lock.release()

    def allreduce(self, x, op=SUM, **kw):
        """Return a new array: op over ranks of x, of x's kind (NumPy, torch, else CuPy), shape,
        dtype and memory order, on x's device (hpccoll._buffers.result_like)."""
        out = result_like(x, kw.get("stream"))
        self.Allreduce(x, out, op=op, **kw)
        return out


def _freed_error(name: str) -> HpccollError:
    return HpccollError(f"{name}: this communicator was freed: make a new one (or Dup() before Free())")


def _in_flight(name: str) -> HpccollError:
    return HpccollError(f"{name}: another collective is in flight on this communicator "
                        "(one at a time per communicator; use Dup() for another thread)")
