"""The one compiled piece of hpccoll: the host backend's shared-memory Allreduce
(hpccoll/_hostshm.c).  Everything else is in pyproject.toml.  The extension is optional: where it
cannot be built, hpccoll installs without it and the host backend runs every call through MPI."""
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "hpccoll._hostshm", ["hpccoll/_hostshm.c"],
    include_dirs=["cuda"],  # hc_abi.h: the dtype and op codes, the canonical NaNs
    # IEEE rounding at every step, as the reference reduction: no fast-math, no contraction;
    # the float results are canonicalized through an integer view of the same memory
    extra_compile_args=["-std=gnu11", "-O3", "-fno-fast-math", "-ffp-contract=off", "-fno-strict-aliasing"],
    optional=True)])
