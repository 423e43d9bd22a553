"""The CUDA backend: hpccoll's barrier-free kernels over CUDA IPC symmetric memory on one node
(backend.py holds the backend; the modules beside it, its parts)."""
from .backend import CudaBackend
from .kernels import kernel_names
from .workspace import CudaUnavailable

__all__ = ["CudaBackend", "CudaUnavailable", "kernel_names"]
