"""Builds a kernel file's CPU emulation (tests/unit/*_emulation.cpp: the kernel compiled as C++
with its HOST macro) into a shared library for ctypes."""
from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pytest

from hpccoll_eigensolver.linalg import _xp

HERE = Path(__file__).resolve().parent


def build_emulation(folder, source: str, flags=()) -> ctypes.CDLL:
    """tests/unit/`source` built in `folder` with the C++ compiler found, strict IEEE arithmetic
    (no contraction into fused multiply-adds) and warnings as errors; the calling test skipped
    where there is no compiler."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler for the kernel's CPU emulation")
    lib = Path(folder) / f"lib{Path(source).stem}.so"
    subprocess.run([cxx, "-O2", "-std=c++17", "-ffp-contract=off", "-Wall", "-Werror", *flags, "-shared", "-fPIC",
                    f"-I{_xp.HERE}", "-o", str(lib), str(HERE / source)], check=True)
    return ctypes.CDLL(str(lib))


def ptr(a, t=ctypes.c_double):
    """A NumPy array's data as a ctypes pointer to t."""
    return a.ctypes.data_as(ctypes.POINTER(t))
