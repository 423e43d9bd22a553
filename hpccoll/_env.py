"""Process environment: launcher facts, node-local rank, settings from HPCCOLL_* variables."""
from __future__ import annotations

import os

from .errors import HpccollError

#: variables launchers set to the number of tasks they started
_LAUNCHER_SIZE_VARS = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


def timeout_s(explicit: float | None = None) -> float:
    """Spin-wait timeout in seconds: argument, else HPCCOLL_TIMEOUT, else 30."""
    if explicit is not None:
        val = explicit
    else:
        raw = os.environ.get("HPCCOLL_TIMEOUT", "30")
        try:
            val = float(raw)
        except ValueError:
            raise ValueError(f"HPCCOLL_TIMEOUT={raw!r} is not a number of seconds") from None
    if not val > 0:
        raise ValueError(f"timeout={val!r}: use a positive number of seconds")
    return float(val)


def _switch(name: str) -> bool:
    raw = os.environ.get(name, "1").strip().lower()
    if raw not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
        raise ValueError(f"{name}={raw!r}: use 1 (on, the default) or 0 (off)")
    return raw in ("1", "true", "yes", "on")


def pdl_mode() -> bool:
    """Programmatic dependent launch of the collective kernels (Hopper+): HPCCOLL_PDL, default on."""
    return _switch("HPCCOLL_PDL")


def fuse_mode() -> bool:
    """HPCCOLL_FUSE: one-shot Allreduce calls captured back to back into a CUDA graph run as one
    kernel node (hpccoll/_fuse.py); default on, 0 makes every captured call a node of its own."""
    return _switch("HPCCOLL_FUSE")


def rank_specialized() -> bool:
    """HPCCOLL_RANK_MODULES: kernels built for the communicator's rank count (default on); 0
    builds the generic modules, which serve any count (for comparing the two)."""
    return _switch("HPCCOLL_RANK_MODULES")


def small_block() -> int:
    """HPCCOLL_SMALL_BLOCK: threads per block of launches small enough to fit the block cap in
    blocks that size, so that they spread over more SMs (CudaBackend._grid).  Default 128; 512
    gives every size the same 512-thread blocks.  Must be the same on every rank (checked)."""
    raw = os.environ.get("HPCCOLL_SMALL_BLOCK", "128").strip()
    if raw not in ("32", "64", "128", "256", "512"):
        raise ValueError(f"HPCCOLL_SMALL_BLOCK={raw!r}: use 32, 64, 128 (the default), 256 or 512")
    return int(raw)


def check_mode(explicit: bool | None = None) -> bool:
    if explicit is not None:
        return bool(explicit)
    return os.environ.get("HPCCOLL_CHECK", "0") not in ("", "0", "false", "no")


def detect_singleton(world_size: int) -> None:
    """Slurm (or another launcher) started N>1 tasks, yet MPI says size 1: the wrong PMI plugin
    made N independent singletons.  Refuse loudly instead of computing N separate answers."""
    if world_size != 1:
        return
    if os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS"):
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
