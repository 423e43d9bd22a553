"""Launcher facts: what mpiexec / srun started, checked against what MPI reports."""
from __future__ import annotations

import os

from .errors import HpccollError


def detect_singleton(world_size: int) -> None:
    """Slurm (or another launcher) started N>1 tasks, yet MPI says size 1: the wrong PMI plugin
    made N independent singletons.  Refuse loudly instead of computing N separate answers."""
    if world_size != 1:
        return
    n = os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS")
    if n and n.isdigit() and int(n) > 1 and os.environ.get("SLURM_STEP_ID") is not None:
        raise HpccollError(
            f"Slurm started {n} tasks but MPI reports a world of size 1: each task is a "
            "singleton because srun's PMI plugin does not match the MPI library. Use "
            "`srun --mpi=pmi2` with the MPICH wheel or `srun --mpi=pmix` with Open MPI "
            "(`srun --mpi=list` shows what this Slurm has).")
    for var in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        n = os.environ.get(var)
        if n and n.isdigit() and int(n) > 1:
            raise HpccollError(
                f"{var}={n} but MPI reports a world of size 1: mpi4py is linked against a different "
                "MPI than the launcher's. Launch with the mpiexec of the MPI that mpi4py uses "
                "(`python -c 'import mpi4py; print(mpi4py.get_config())'`).")
