"""The CUDA backend: hpccoll's barrier-free kernels over CUDA IPC symmetric memory on one node
(backend.py holds the backend; the modules beside it, its parts).  Its names load on first use:
importing one part (the engine's argument checks, nvrtc) does not load the backend."""
from __future__ import annotations

import importlib

_NAMES = {"CudaBackend": ".backend", "CudaUnavailable": ".workspace", "kernel_names": ".kernels"}

__all__ = list(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(_NAMES[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
