"""NCCL baseline backend (through CuPy's NCCL bindings)."""
from __future__ import annotations


def nccl_unavailable_reason() -> str | None:
    try:
        from cupy.cuda import nccl
    except Exception as exc:  # noqa: BLE001
        return f"cupy.cuda.nccl not importable ({exc})"
    if not getattr(nccl, "available", True):
        return "CuPy was built without NCCL (pip install nvidia-nccl-cu13)"
    return None
