"""The eager engine's control from a Communicator (Communicator.start_persistent,
stop_persistent, persistent): the communicator's checks and lock around its backend's
EngineSet (hpccoll/backends/cuda/engine.py, engines.py)."""
from __future__ import annotations

import contextlib

from .backends.cuda.engine import validate_engine_args
from .errors import CollectiveTimeout, HpccollError
from .ops import dtype_name


def start(comm, dtype, blocks: int, max_bytes: int, order: str) -> None:
    """Communicator.start_persistent (collective)."""
    comm._live("start_persistent")
    comm._outside_group("start_persistent", "before")
    name = dtype_name(dtype)
    validate_engine_args(blocks, max_bytes, order)
    if not comm._backend.caps.engine:
        raise HpccollError(f"start_persistent: needs the single-node cuda backend; this communicator's "
                           f"backend is {comm.backend!r} (open it with backend='cuda' on one node)")
    with comm._exclusive("start_persistent"):
        comm._invalidate_plans()  # prepared launches: the grid cap may change
        comm._backend.engines.start(name, blocks, max_bytes, order, comm.check)


def stop(comm, dtype=None) -> None:
    """Communicator.stop_persistent (collective; a no-op once freed or without an engine)."""
    if comm._freed or not comm._backend.caps.engine:
        return
    comm._outside_group("stop_persistent", "after")
    with comm._exclusive("stop_persistent"):
        comm._invalidate_plans()
        if dtype is None:
            comm._backend.engines.stop_all()
        else:
            comm._backend.engines.stop(dtype_name(dtype))


@contextlib.contextmanager
def persistent(comm, dtype="float32", **kw):
    """Communicator.persistent: start, then stop on exit (after a CollectiveTimeout, which
    stopped every engine already, the timeout propagates)."""
    comm.start_persistent(dtype, **kw)
    try:
        yield comm
    except CollectiveTimeout:
        raise
    except BaseException:
        comm.stop_persistent(dtype)
        raise
    comm.stop_persistent(dtype)
