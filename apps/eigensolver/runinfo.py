"""Machine, git, BLAS, memory and communicator facts recorded with every run."""
from __future__ import annotations

import gc
import os
import platform
import socket
import subprocess
import time

#: --comm choice -> Communicator keyword arguments
COMM_CHOICES = {
    "mpi": dict(backend="host"),
    "nccl": dict(backend="nccl"),
    "sentinel": dict(backend="cuda", algorithm="oneshot_sentinel", deterministic=True),
    "ll": dict(backend="cuda", algorithm="oneshot_ll", deterministic=True),
    "ll128": dict(backend="cuda", algorithm="twoshot_ll128", deterministic=False),
    "auto": dict(backend="auto"),
}


def make_communicator(choice: str, mpi_comm=None, device: int | None = None):
    """The hpccoll Communicator for a --comm choice (raises HpccollError where it cannot run).

    The host path is made deterministic (rank-order reductions) so that two solves agree
    bit for bit; 'auto' keeps the library's defaults."""
    from hpccoll import Communicator

    if choice not in COMM_CHOICES:
        raise ValueError(f"--comm {choice!r}: use one of {', '.join(COMM_CHOICES)}")
    kw = dict(COMM_CHOICES[choice])
    if choice == "mpi":
        kw["deterministic"] = True
    elif device is not None:
        kw["device"] = device
    return Communicator(mpi_comm, **kw)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def gpu_name(xp) -> str | None:
    if xp.__name__ != "cupy":
        return None
    dev = xp.cuda.Device().id
    name = xp.cuda.runtime.getDeviceProperties(dev)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


#: environment variables that set BLAS/OpenMP thread counts (recorded with every run)
THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS",
              "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


def blas_info() -> dict:
    """The BLAS/LAPACK/OpenMP libraries loaded in this process with their versions and thread
    counts (threadpoolctl), and the thread-count environment variables.  Part of what fixes a
    run's bits: a reduction inside BLAS may split its sums by thread count."""
    import numpy  # noqa: F401 - load the BLAS the solver uses before looking
    import scipy.linalg  # noqa: F401

    libs = []
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            libs.append({k: lib.get(k) for k in ("user_api", "internal_api", "version", "num_threads",
                                                 "threading_layer", "architecture", "filepath")})
    except ImportError:  # a dependency; say so rather than fail a run
        libs.append({"error": "threadpoolctl is not installed: pip install threadpoolctl"})
    return {"libraries": libs, "env": {k: os.environ.get(k) for k in THREAD_ENV}}


#: --host-threads: auto (share this rank's CPUs among the node's ranks that share them, unless a
#: THREAD_ENV variable is set), all (the BLAS's own default), or a positive count
HOST_THREADS_HELP = ("host BLAS/OpenMP threads per rank: auto (default): when ranks of one node may run on "
                     "the same CPUs (mpiexec --bind-to none, MPS runs) and no OMP_NUM_THREADS-like variable "
                     "is set, each gets its share of those CPUs; all: the BLAS's default (a thread per CPU "
                     "the rank may use); N: N threads")


def parse_host_threads(text: str) -> str | int:
    """'auto' | 'all' | a positive int; ValueError naming the option otherwise."""
    if text in ("auto", "all"):
        return text
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise ValueError(f"--host-threads {text!r}: use auto, all or a positive thread count")


def host_thread_choice(setting: str | int, cpus: int, sharing: int, env: dict) -> tuple[int | None, str]:
    """(threads to limit the host BLAS/OpenMP pools to, or None to leave them, and why).

    cpus: CPUs in this rank's affinity mask; sharing: node-local ranks (this one included) whose
    masks overlap it; env: the set THREAD_ENV variables."""
    if setting == "all":
        return None, "--host-threads all: the BLAS's default"
    if isinstance(setting, int):
        return setting, f"--host-threads {setting}"
    if env:
        return None, "set by " + ", ".join(f"{k}={v}" for k, v in sorted(env.items()))
    if sharing <= 1:
        return None, f"no other rank of this node runs on this rank's {cpus} CPUs"
    threads = max(1, cpus // sharing)
    return threads, f"{cpus} CPUs shared by {sharing} ranks of this node"


def limit_host_threads(mpi_comm, setting: str | int = "auto") -> dict:
    """Limit this rank's host BLAS/OpenMP threads (threadpoolctl) by --host-threads; collective
    over mpi_comm.  Ranks that each start a thread per CPU of the node oversubscribe it, and an
    oversubscribed BLAS runs many times slower than its share of the CPUs would.  Returns the
    decision, recorded with the run
    (the thread count can change a host-path run's bits)."""
    from mpi4py import MPI

    mine = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    masks = local.allgather(mine)
    local.Free()
    sharing = sum(1 for m in masks if not set(mine).isdisjoint(m))
    env = {k: os.environ[k] for k in THREAD_ENV if os.environ.get(k)}
    threads, why = host_thread_choice(setting, len(mine), sharing, env)
    if threads is not None:
        import numpy  # noqa: F401 - load both BLAS copies (NumPy's, SciPy's) before limiting them
        import scipy.linalg  # noqa: F401
        from threadpoolctl import threadpool_limits

        threadpool_limits(limits=threads)  # for the rest of the process
    return {"setting": setting, "threads": threads, "cpus": len(mine), "ranks_sharing_them": sharing,
            "reason": why}


def machine_info(xp) -> dict:
    import numpy
    import scipy

    info = {"hostname": socket.gethostname(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "gpu": gpu_name(xp), "python": platform.python_version(),
            "numpy": numpy.__version__, "scipy": scipy.__version__, "blas": blas_info()}
    if xp.__name__ == "cupy":
        info["cupy"] = xp.__version__
        try:
            info["cuda_runtime"] = xp.cuda.runtime.runtimeGetVersion()
            info["cuda_driver"] = xp.cuda.runtime.driverGetVersion()
        except Exception:  # noqa: BLE001 - informational only
            pass
    return info


# -- memory ---------------------------------------------------------------------------------
def _status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def _reset_peak_rss() -> bool:
    """Set this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0); False if it cannot."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def nvidia_smi_used_bytes(pid: int | None = None) -> int | None:
    """GPU memory nvidia-smi attributes to this process (None where nvidia-smi or the per-process
    figure is missing, e.g. under MPS)."""
    pid = os.getpid() if pid is None else pid
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    total = None
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[0] == str(pid) and parts[1].isdigit():
            total = (total or 0) + int(parts[1]) * 2**20
    return total


# a record's device peak: the solve's own pool mark, else (older records) the mark with the metrics
DEVICE_PEAK_KEYS = ("device_pool_solve_peak_bytes", "device_pool_peak_bytes")


try:
    from . import _npmem  # the NumPy memory handler (apps/eigensolver/_npmem.c), built where a C compiler was
except ImportError:
    _npmem = None


class MemoryMeter:
    """Peak memory of one stretch of work (a solve and its metrics) in this process.

    host: peak RSS over the stretch (VmHWM reset at start where Linux allows, else the process's
    lifetime peak, ru_maxrss) and the peak of NumPy's array data, counted by a NumPy memory
    handler (the extension _npmem: a few atomic operations per allocation) or, where that
    extension was not built, tracemalloc's peak of traced allocations (Python objects and NumPy
    arrays; it slows Python-heavy phases severalfold).  device: CuPy's default memory
    pool's reserved bytes at the end - a high-water mark, since the pool keeps what it has
    reserved until free_all_blocks(), which is called at start - and nvidia-smi's per-process
    figure, which also counts memory outside the pool (hpccoll's IPC buffers, CUDA context)."""

    DEFINITIONS = {
        "peak_rss_bytes": "peak resident set size of the rank's process during the solve and its metrics "
                          "(Linux VmHWM reset at the start; 'rss_scope' says when it could not be reset)",
        "process_peak_rss_bytes": "peak resident set size over the process's life so far (getrusage ru_maxrss)",
        "numpy_peak_bytes": "peak bytes of NumPy array data allocated during the solve and its metrics and "
                            "alive at once (a NumPy memory handler; arrays made before the solve, such as its "
                            "inputs, not counted)",
        "tracemalloc_peak_bytes": "tracemalloc's peak of traced allocations (Python objects and NumPy arrays) "
                                  "during the solve and its metrics; only where the NumPy handler's extension "
                                  "is not built",
        "device_pool_peak_bytes": "bytes reserved by CuPy's default memory pool at the end of the solve and its "
                                  "metrics: a high-water mark, the pool returns nothing until free_all_blocks()",
        "device_pool_used_bytes": "bytes in use from CuPy's pool at the end",
        "device_pool_solve_peak_bytes": "bytes reserved by CuPy's default memory pool when the solve returned, "
                                        "before the metrics: the solve's own high-water mark",
        "nvidia_smi_used_bytes": "GPU memory nvidia-smi attributes to the process at the end (includes memory "
                                 "outside CuPy's pool; unavailable under MPS)",
    }

    def __init__(self, xp, trace: bool = True):
        self.xp = xp
        self.trace = trace
        self.numpy_handler = trace and _npmem is not None  # else tracemalloc, where trace
        self.scope = None

    def start(self) -> None:
        import gc
        import tracemalloc

        gc.collect()
        if self.numpy_handler:
            _npmem.stop()  # (a no-op unless a stretch before this one ended in an exception)
            _npmem.start()
        elif self.trace:
            if not tracemalloc.is_tracing():
                tracemalloc.start()
            tracemalloc.reset_peak()
        if self.xp.__name__ == "cupy":
            self.xp.get_default_memory_pool().free_all_blocks()
        self.scope = "solve" if _reset_peak_rss() else "process"
        self.solve_pool = None

    def solve_done(self) -> None:
        """Mark the end of the solve (before its metrics): the device pool's high-water mark of
        the solve alone."""
        if self.xp.__name__ == "cupy":
            self.xp.cuda.get_current_stream().synchronize()
            self.solve_pool = int(self.xp.get_default_memory_pool().total_bytes())

    def stop(self) -> dict:
        import resource
        import tracemalloc

        rec = {"peak_rss_bytes": None, "rss_scope": self.scope,
               "process_peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
               "numpy_peak_bytes": None,
               "tracemalloc_peak_bytes": tracemalloc.get_traced_memory()[1] if tracemalloc.is_tracing() else None,
               "device_pool_peak_bytes": None, "device_pool_used_bytes": None, "nvidia_smi_used_bytes": None}
        if self.numpy_handler:
            rec["numpy_peak_bytes"] = _npmem.peak()
            _npmem.stop()
        hwm = _status_kib("VmHWM")
        rec["peak_rss_bytes"] = hwm * 1024 if hwm is not None else rec["process_peak_rss_bytes"]
        if self.xp.__name__ == "cupy":
            self.xp.cuda.get_current_stream().synchronize()
            pool = self.xp.get_default_memory_pool()
            rec["device_pool_peak_bytes"] = int(pool.total_bytes())
            rec["device_pool_used_bytes"] = int(pool.used_bytes())
            rec["device_pool_solve_peak_bytes"] = self.solve_pool
            rec["nvidia_smi_used_bytes"] = nvidia_smi_used_bytes()
        return rec


# -- launch facts and failing together ---------------------------------------------------------
#: variables in which launchers (MPICH hydra, Open MPI, Slurm, PMIx) give a process its rank
RANK_ENV = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")


class GcPauses:
    """The collections of Python's cyclic garbage collector while entered, per generation, and
    the seconds they took (gc.callbacks).  A collection of the oldest generation walks every
    object the collector tracks (milliseconds in a host solve's process) and stalls whatever
    phase it lands in; recorded with every solve, so that a slow run can be told from a
    collector's pause."""

    DEFINITIONS = {
        "host_gc": "per rank, the collections of Python's garbage collector during the solve by generation "
                   "(0, 1, 2) and the seconds they took",
    }

    def __init__(self):
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = None

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        elif self._t0 is not None:
            g = min(int(info.get("generation", 2)), 2)
            self.collections[g] += 1
            self.seconds[g] += time.perf_counter() - self._t0
            self._t0 = None

    def __enter__(self) -> "GcPauses":
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._callback)

    def record(self) -> dict:
        return {"collections": list(self.collections), "seconds": list(self.seconds)}


def launcher_rank() -> int:
    """This process's rank from the launcher's environment, without initializing MPI (0 when
    not launched by mpiexec/srun): who prints an error found before MPI starts."""
    for key in RANK_ENV:
        value = os.environ.get(key, "")
        if value.isdigit():
            return int(value)
    return 0


def install_abort_hook(prog: str) -> None:
    """On an uncaught exception in a process of a multi-rank MPI job: print it (with this rank's
    number) and MPI_Abort the job, so that no other rank waits forever in a collective.
    Leaves single-process runs to Python's default hook."""
    import sys
    import traceback

    previous = sys.excepthook

    def hook(kind, value, tb):
        try:
            from mpi4py import MPI

            live = MPI.Is_initialized() and not MPI.Is_finalized()
            world = MPI.COMM_WORLD if live else None
            size = world.Get_size() if world is not None else 1
        except Exception:  # noqa: BLE001 - fall back to the default hook
            world, size = None, 1
        if world is None or size == 1 or kind is KeyboardInterrupt:
            previous(kind, value, tb)
            return
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"{prog}: rank {world.Get_rank()} of {size} failed; aborting the job so the "
                         f"other ranks do not wait:\n{text}")
        sys.stderr.flush()
        sys.stdout.flush()
        world.Abort(1)

    sys.excepthook = hook


class MixedDevices(RuntimeError):
    """Some ranks of a job found a usable GPU and others none (raised on every rank)."""


def select_device(mpi_comm):
    """Pick this rank's GPU by node-local rank and make it current: (cupy, ordinal), or
    (numpy, None) without a GPU.  Collective: every rank must find a GPU, or none (else
    MixedDevices on every rank, naming the ranks without one)."""
    import numpy
    from mpi4py import MPI

    from .linalg._xp import gpu_available

    have = gpu_available()
    haves = mpi_comm.allgather(have)
    if any(haves) and not all(haves):
        none = [r for r, h in enumerate(haves) if not h]
        raise MixedDevices(f"rank{'s' if len(none) > 1 else ''} {', '.join(map(str, none))} found no usable GPU "
                           "(CuPy and a CUDA device) while the others did: give every rank a GPU, or hide them "
                           "from every rank (CUDA_VISIBLE_DEVICES=) for the CPU path")
    if not have:
        return numpy, None
    import cupy

    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    dev = local.Get_rank() % cupy.cuda.runtime.getDeviceCount()
    local.Free()
    cupy.cuda.Device(dev).use()
    return cupy, dev
