"""Machine, git and communicator facts recorded with every run."""
from __future__ import annotations

import os
import platform
import socket

#: --comm choice -> Communicator keyword arguments
COMM_CHOICES = {
    "mpi": dict(backend="host"),
    "nccl": dict(backend="nccl"),
    "sentinel": dict(backend="cuda", algorithm="oneshot_sentinel", deterministic=True),
    "ll": dict(backend="cuda", algorithm="oneshot_ll", deterministic=True),
    "ll128": dict(backend="cuda", algorithm="twoshot_ll128", deterministic=False),
    "auto": dict(backend="auto"),
}


def make_communicator(choice: str, mpi_comm=None, device: int | None = None):
    """The hpccoll Communicator for a --comm choice (raises HpccollError where it cannot run).

    The host path is made deterministic (rank-order reductions) so that two solves agree
    bit for bit; 'auto' keeps the library's defaults."""
    from hpccoll import Communicator

    if choice not in COMM_CHOICES:
        raise ValueError(f"--comm {choice!r}: use one of {', '.join(COMM_CHOICES)}")
    kw = dict(COMM_CHOICES[choice])
    if choice == "mpi":
        kw["deterministic"] = True
    elif device is not None:
        kw["device"] = device
    return Communicator(mpi_comm, **kw)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name(xp) -> str | None:
    if xp.__name__ != "cupy":
        return None
    dev = xp.cuda.Device().id
    name = xp.cuda.runtime.getDeviceProperties(dev)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def machine_info(xp) -> dict:
    import numpy
    import scipy

    info = {"hostname": socket.gethostname(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "gpu": gpu_name(xp), "python": platform.python_version(),
            "numpy": numpy.__version__, "scipy": scipy.__version__}
    if xp.__name__ == "cupy":
        info["cupy"] = xp.__version__
    # the solver's switches in force (HPCCOLL_EIG_SYMV, _POTRF, _GEMV, _SYTRD, ...): a run says
    # which variant produced it
    info["eig_env"] = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("HPCCOLL_EIG_", "HPCCOLL_DC_"))}
    return info


def select_device(mpi_comm):
    """Pick this rank's GPU by node-local rank and make it current: (cupy, ordinal), or
    (numpy, None) without a GPU."""
    import numpy

    from ._xp import gpu_available

    if not gpu_available():
        return numpy, None
    import cupy
    from mpi4py import MPI

    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    dev = local.Get_rank() % cupy.cuda.runtime.getDeviceCount()
    local.Free()
    cupy.cuda.Device(dev).use()
    return cupy, dev
