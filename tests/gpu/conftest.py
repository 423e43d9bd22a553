"""GPU tests: import, before any GPU work, every module the tests or CuPy import lazily later.

On the nvidia-h200-x2 machines of 2026-11-30, a process that had done GPU work sometimes read
source files back with NUL bytes (numpy.testing pulled in by CuPy's first cupyx use, CuPy's
CUB headers); modules imported before the first GPU call were never hit (bench/NOTES.md,
"The machine").  Importing them here is harmless everywhere else."""
from __future__ import annotations

import contextlib

for _name in ("numpy.testing", "scipy.sparse", "scipy.linalg", "cupyx", "cupyx.scipy.linalg",
              "cupyx.scipy.sparse", "torch"):
    with contextlib.suppress(Exception):  # absent modules: the tests that need them skip
        __import__(_name)
