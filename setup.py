"""The compiled pieces of hpccoll, both optional (where one cannot be built, hpccoll installs
without it): the host backend's shared-memory Allreduce (hpccoll/_hostshm.c; without it the
host backend runs every call through MPI) and the eigensolver's count of NumPy's array memory
(apps/eigensolver/_npmem.c; without it the CPU path measures with tracemalloc).  Everything else
is in pyproject.toml."""
from setuptools import Extension, setup

extensions = [Extension(
    "hpccoll._hostshm", ["hpccoll/_hostshm.c"],
    include_dirs=["cuda"],  # hc_abi.h: the dtype and op codes, the canonical NaNs
    # IEEE rounding at every step, as the reference reduction: no fast-math, no contraction;
    # the float results are canonicalized through an integer view of the same memory
    extra_compile_args=["-std=gnu11", "-O3", "-fno-fast-math", "-ffp-contract=off", "-fno-strict-aliasing"],
    optional=True)]
try:
    import numpy
except ImportError:  # a build without NumPy: the eigensolver falls back to tracemalloc
    pass
else:
    extensions.append(Extension(
        "hpccoll_eigensolver._npmem", ["apps/eigensolver/_npmem.c"], include_dirs=[numpy.get_include()],
        extra_compile_args=["-std=gnu11", "-O2"], optional=True))

setup(ext_modules=extensions)
