"""cuSOLVERMp sygvd as a reference (`hpccoll-eigensolver anchor cusolvermp`, under mpiexec, GPU only).

Imported lazily: nothing here is needed by the hpccoll solver. Written against nvmath-python
1.0.0's raw bindings `nvmath.bindings.cusolverMp` (create, create_device_grid,
create_matrix_desc, sygvd_buffer_size, sygvd) and the cuSOLVERMp C API; the NCCL communicator
comes from libnccl through ctypes. Untested on this (CPU-only) machine: points marked
UNCERTAIN are where the binding's exact behaviour was not checked.

Needs (reference notes section 5): nvmath-python 1.0.0, nvidia-cusolvermp-cu13 0.8.x, and the
site-packages `nvidia/cu13/lib` and `nvidia/nccl/lib` libraries loadable (LD_LIBRARY_PATH, or
preloaded here with ctypes RTLD_GLOBAL before importing nvmath)."""
from __future__ import annotations

import ctypes
import os
import sys
import time
import traceback

import numpy as np

# C enum values (cuSOLVER / cuBLAS / CUDA headers)
CUDA_R_64F = 1                 # cudaDataType_t
CUSOLVER_EIG_TYPE_1 = 1        # A x = lambda B x
CUSOLVER_EIG_MODE_VECTOR = 1
CUBLAS_FILL_MODE_LOWER = 0
GRID_MAPPING_COL_MAJOR = 0     # cusolverMpGridMapping_t (CUDALIBMG_GRID_MAPPING_COL_MAJOR)
NCCL_UNIQUE_ID_BYTES = 128


ANCHOR_SITE_ENV = "HPCCOLL_ANCHOR_SITE"


def use_anchor_site() -> None:
    """Put $HPCCOLL_ANCHOR_SITE (a pip --target folder holding nvmath-python and
    nvidia-cusolvermp-cu13) first on sys.path, for this process only: kept off PYTHONPATH, its
    nvidia/cu13/include folder cannot shadow the CUDA headers CuPy compiles with elsewhere."""
    site = os.environ.get(ANCHOR_SITE_ENV)
    if site and os.path.isdir(site) and site not in sys.path:
        sys.path.insert(0, site)
        nv = sys.modules.get("nvidia")
        extra = os.path.join(site, "nvidia")
        if nv is not None and os.path.isdir(extra) and extra not in list(getattr(nv, "__path__", [])):
            nv.__path__.append(extra)


def _site_dirs(sub: str) -> list[str]:
    """<site-packages>/nvidia/<sub> folders (namespace package nvidia)."""
    try:
        import nvidia
    except ImportError:
        return []
    return [os.path.join(p, sub) for p in getattr(nvidia, "__path__", []) if os.path.isdir(os.path.join(p, sub))]


#: what libcusolverMp.so.0 (0.8) needs, in dependency order (readelf -d); its RPATH only
#: looks beside itself and in ../../nccl/lib, which misses the venv when it is installed
#: with pip --target elsewhere.
PRELOAD = ("libnccl.so.2", "libcudart.so.13", "libnvJitLink.so.13", "libcublasLt.so.13",
           "libcublas.so.13", "libcusparse.so.12", "libcusolver.so.12", "libcusolverMp.so.0")


def preload_libraries() -> list[str]:
    """dlopen libcusolverMp.so.0 and its wheel-provided dependencies with RTLD_GLOBAL, so that
    nvmath's loader (which dlopens the soname) finds them already loaded.  Returns the paths
    loaded; a library found nowhere is left to the system loader."""
    dirs = _site_dirs("cu13/lib") + _site_dirs("nccl/lib") + _site_dirs("cusolvermp/lib")
    loaded = []
    for name in PRELOAD:
        for d in dirs:
            path = os.path.join(d, name)
            if os.path.exists(path):
                ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
                loaded.append(path)
                break
    return loaded


def _libnccl():
    for d in _site_dirs("nccl/lib"):
        p = os.path.join(d, "libnccl.so.2")
        if os.path.exists(p):
            return ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
    return ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)


class _NcclUniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * NCCL_UNIQUE_ID_BYTES)]


def nccl_comm_from_mpi(mpi_comm):
    """(ncclComm_t as int, owner object) over mpi_comm's ranks.  CuPy's NCCL binding first (the
    same one hpccoll's NCCL backend uses on this machine); else libnccl through ctypes:
    ncclGetUniqueId on rank 0, MPI bcast, ncclCommInitRank.  The CUDA device must be current."""
    try:
        from cupy.cuda import nccl as cnccl

        uid = cnccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        c = cnccl.NcclCommunicator(mpi_comm.Get_size(), uid, mpi_comm.Get_rank())
        handle = getattr(c, "comm", None)
        if handle:
            return int(handle), c
    except Exception as exc:  # noqa: BLE001 - fall back to ctypes below
        print(f"cusolvermp anchor: CuPy NCCL communicator unavailable ({exc}); using libnccl directly",
              file=sys.stderr, flush=True)
    return _nccl_comm_ctypes(mpi_comm), None


def _nccl_comm_ctypes(mpi_comm) -> int:
    nccl = _libnccl()
    uid = _NcclUniqueId()
    if mpi_comm.Get_rank() == 0:
        rc = nccl.ncclGetUniqueId(ctypes.byref(uid))
        if rc != 0:
            raise RuntimeError(f"ncclGetUniqueId failed: {rc}")
    raw = mpi_comm.bcast(bytes(uid.internal) if mpi_comm.Get_rank() == 0 else None, root=0)
    ctypes.memmove(ctypes.addressof(uid), raw, NCCL_UNIQUE_ID_BYTES)
    comm = ctypes.c_void_p()
    nccl.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, _NcclUniqueId, ctypes.c_int]
    rc = nccl.ncclCommInitRank(ctypes.byref(comm), mpi_comm.Get_size(), uid, mpi_comm.Get_rank())
    if rc != 0:
        raise RuntimeError(f"ncclCommInitRank failed: {rc}")
    return int(comm.value)


def run_cusolvermp(args) -> int:
    """Solve with cuSOLVERMp sygvd on a 1 x P grid (--repeat times); any failure is printed and the
    job aborted with a non-zero code, which `compare` records in the report."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    try:
        return _run(args, world)
    except Exception as exc:  # noqa: BLE001 - report, do not crash the comparison
        msg = f"cusolvermp anchor failed on rank {world.Get_rank()}: {type(exc).__name__}: {exc}"
        print(msg, file=sys.stderr, flush=True)
        traceback.print_exc()
        if world.Get_size() > 1:
            world.Abort(3)
        return 3


def _run(args, world) -> int:
    from hpccoll import Communicator

    from . import metrics
    from .anchors import anchor_record
    from .runs import (build_local_problem, check_out_dir, config_digest, config_identity, in_column_order,
                      print_run, rank_records, reference_on_root, refuse_overwrite, run_stem, save_vectors,
                      write_eigenvalues, write_json, write_vectors)
    from .linalg.layout import BlockCyclic
    from .problems import spectrum
    from .runinfo import MemoryMeter, select_device

    rank, size = world.Get_rank(), world.Get_size()
    xp, dev = select_device(world)
    if dev is None:
        raise RuntimeError("needs CuPy and a GPU")
    if rank == 0 and args.out:
        check_out_dir(args.out)
    use_anchor_site()
    loaded = [os.path.basename(p) for p in preload_libraries()]
    from nvmath.bindings import cusolverMp as mp  # checked: nvmath-python 1.0.0 wheel, cusolverMp.pxd

    cp = xp
    n, nb = args.n, args.nb
    digest = config_digest(config_identity(args, args.spec.digest("gpu"), size, "cusolvermp", "gpu"))
    stems = [run_stem(args, n, size, "cusolvermp", r, digest) for r in range(args.repeat)]
    if rank == 0:
        refuse_overwrite(args.out, stems, args.overwrite)
    desc = BlockCyclic(n, n, nb, size)
    A_loc, B_loc, _ = build_local_problem(args.spec, desc, world, cp)   # this rank's columns only
    nloc = desc.local_n(rank)
    lld = n  # one process row: every rank holds all n rows (F order)
    ref, ref_s, ref_err = reference_on_root(args, A_loc, B_loc, desc, world)
    known = spectrum(args.spec) if rank == 0 else None
    host = Communicator(world, backend="host")   # the metrics' Bcast/Allreduce (device buffers staged)

    nccl_comm, _nccl_owner = nccl_comm_from_mpi(world)  # the owner keeps the communicator alive
    stream = cp.cuda.Stream(non_blocking=True)
    handle = mp.create(dev, stream.ptr)
    grid = mp.create_device_grid(handle, nccl_comm, 1, size, GRID_MAPPING_COL_MAJOR)
    # UNCERTAIN: whether sygvd wants mb == nb; with one process row mb only has to be valid.
    mdesc = mp.create_matrix_desc(grid, CUDA_R_64F, n, n, nb, nb, 0, 0, lld)
    dev_bytes, host_bytes = mp.sygvd_buffer_size(
        handle, CUSOLVER_EIG_TYPE_1, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n,
        1, 1, mdesc, 1, 1, mdesc, 1, 1, mdesc, CUDA_R_64F)
    d_work = cp.empty(max(int(dev_bytes), 1), dtype=cp.uint8)
    h_work = np.empty(max(int(host_bytes), 1), dtype=np.uint8)
    info = cp.zeros(1, dtype=cp.int32)
    meter = MemoryMeter(cp, trace=False)
    try:
        for r in range(args.repeat):
            with stream:
                a = cp.asfortranarray(A_loc.copy())   # sygvd overwrites its inputs
                b = cp.asfortranarray(B_loc.copy())
                w = cp.empty(n, dtype=cp.float64)
                z = cp.empty((n, max(nloc, 1)), dtype=cp.float64, order="F")
            stream.synchronize()
            meter.start()
            world.Barrier()
            t0 = time.perf_counter()
            mp.sygvd(handle, CUSOLVER_EIG_TYPE_1, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, n,
                     a.data.ptr, 1, 1, mdesc, b.data.ptr, 1, 1, mdesc, w.data.ptr, z.data.ptr, 1, 1, mdesc,
                     CUDA_R_64F, d_work.data.ptr, int(dev_bytes), h_work.ctypes.data, int(host_bytes),
                     info.data.ptr)
            stream.synchronize()
            solve_s = time.perf_counter() - t0
            if int(info.get()[0]) != 0:
                raise RuntimeError(f"cusolverMpSygvd info = {int(info.get()[0])}")
            del a, b
            X = cp.asfortranarray(z[:, :nloc])
            acc = metrics.distributed_accuracy(A_loc, B_loc, X, w, desc, host)
            col = metrics.column_digests(X)
            memory = meter.stop()
            gathered = world.gather((metrics.sha256(w), metrics.combine_digests(col), col, memory), root=0)
            if save_vectors(args):
                write_vectors(os.path.join(args.out, stems[r] + "_X.npy"), X, desc, world, args.gather_vectors)
            del X, z
            if rank == 0:
                all_cols = in_column_order(desc, [g[2] for g in gathered])
                per_rank, memory_per_rank = rank_records(gathered)
                rec = anchor_record(args, comm="cusolvermp", backend="cusolverMp+nccl", ranks=size, n=n, r=r,
                                    w=cp.asnumpy(w), per_rank=per_rank, accuracy=acc,
                                    eigenvectors_sha256=metrics.combine_digests(all_cols),
                                    phases={"sygvd": solve_s}, solve_s=solve_s, known=known, ref=ref,
                                    ref_s=ref_s, ref_err=ref_err, xp=cp,
                                    memory=memory_per_rank,
                                    extra={"grid": [1, size], "nvmath_loaded": loaded})
                if save_vectors(args):
                    rec["eigenvectors_file"] = stems[r] + "_X.npy"
                print_run(rec)
                if args.out:
                    rec["eigenvalues_file"] = os.path.basename(write_eigenvalues(args.out, stems[r], w))
                    write_json(args.out, stems[r], rec)
    finally:
        mp.destroy_matrix_desc(mdesc)
        mp.destroy_grid(grid)
        mp.destroy(handle)
        host.Free()
    return 0
