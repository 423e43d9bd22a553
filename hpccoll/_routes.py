"""A call's route: which backend runs it, with which algorithm and policy, decided once.

`route` is the only place that decides: the Communicator's full path, check mode, groups and
persistent requests call it once per call, and the hierarchical backend once per phase; the
repeated call's fast path and a persistent request keep the Route it returns; a backend runs
the call by it (`Backend.run(call, route, stream)`, hpccoll/backends/base.py) and never
decides again.  The backend's own choice (a kernel, a host path, a composition across nodes)
comes from its `route`, which asks hpccoll.policy."""
from __future__ import annotations

from .backends.base import Backend, Route


def route(host: Backend, main: Backend, default: str, call, algorithm: str | None, deterministic: bool) -> Route:
    """The Route of a validated call (local: no communication; unknown or unfit algorithm names
    raise here).  main: the communicator's backend (device or hierarchical, else `host`); it runs
    the calls its capabilities take, `host` the others.  algorithm: the call's own, else
    `default` (the communicator's), except that a device communicator's calls that run on the
    host backend take "auto" there (a device algorithm means nothing on the host)."""
    backend = main if main.takes(call) else host
    if algorithm is None:
        algorithm = "auto" if backend is host and main is not host else default
    return backend.route(call, algorithm, deterministic)
