"""Streams as the device backends see them: a raw handle from whatever the caller passed."""
from __future__ import annotations

_current_stream = None  # cupy.cuda.get_current_stream, looked up once


def stream_ptr(stream) -> int:
    """The raw cudaStream_t of `stream`: None (CuPy's current stream), an int handle, or an
    object with `ptr` (CuPy), `cuda_stream` (torch) or `handle`."""
    global _current_stream
    if stream is None:
        if _current_stream is None:
            import cupy

            _current_stream = cupy.cuda.get_current_stream
        return _current_stream().ptr
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream
    for attr in ("ptr", "cuda_stream", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise TypeError(f"stream must be a CuPy/torch stream or a raw handle (int), not {type(stream).__name__}")


def stream_idle(stream) -> bool:
    """Has every operation queued on `stream` finished?"""
    import cupy

    return cupy.cuda.runtime.streamQuery(stream_ptr(stream)) == 0  # the status, never raises


def synchronize_stream(stream) -> None:
    import cupy

    if stream is None:
        cupy.cuda.get_current_stream().synchronize()
    else:
        cupy.cuda.runtime.streamSynchronize(stream_ptr(stream))
