"""hpccoll: barrier-free small-message GPU collectives with an mpi4py-style Communicator."""
from __future__ import annotations

__version__ = "0.1.0"

from ._buffers import IN_PLACE
from .comm import Communicator
from .errors import CollectiveTimeout, HpccollError, MismatchError, PerformanceWarning
from .ops import MAX, MIN, PROD, SUM, Op
from .request import Request

__all__ = ["Communicator", "Request", "IN_PLACE", "SUM", "PROD", "MAX", "MIN", "Op",
           "CollectiveTimeout", "HpccollError", "MismatchError", "PerformanceWarning", "__version__"]
