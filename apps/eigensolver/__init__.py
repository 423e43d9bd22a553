"""Distributed generalized symmetric-definite eigensolver (sygvd) on hpccoll collectives.

    from hpccoll_eigensolver import BlockCyclic, distribute, gather, sygvd
    desc = BlockCyclic(n, n, nb, comm.Get_size())
    w, X_local = sygvd(distribute(A, desc, rank), distribute(B, desc, rank), desc, comm)

Works on NumPy arrays (host) and CuPy arrays (GPU); see linalg/driver.py for the algorithm and
docs/eigensolver.md for the memory model."""
from .linalg.layout import BlockCyclic, distribute, gather, numroc
from .linalg.driver import PHASES, GeneralizedSolver, InputError, NonFiniteResult, NotPositiveDefinite, sygvd
from .warmup import warm_up

__all__ = ["BlockCyclic", "distribute", "gather", "numroc", "sygvd", "GeneralizedSolver", "warm_up", "PHASES", "NotPositiveDefinite",
           "NonFiniteResult", "InputError"]
