"""`hpccoll` command line: info, bench, tune.

Under mpiexec every rank runs the command.  Every rank parses the same arguments and fails
alike, so usage, help and argument errors print on rank 0 only; an uncaught exception on any
rank aborts the whole job, so that no rank is left waiting in a collective for one that died."""
from __future__ import annotations

import argparse
import sys


def _world_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that prints (usage, help, errors) on rank 0 only."""

    def _print_message(self, message, file=None):
        if _world_rank() == 0:
            super()._print_message(message, file)


def _abort_job(kind, value, tb) -> None:
    """sys.excepthook: the traceback as usual; then, when other ranks exist (they would wait for
    this one in their next collective forever), the process ends in MPI_Abort instead of
    MPI_Finalize (mpi4py.run.set_abort_status: at interpreter exit, once the traceback is out;
    an immediate Abort could kill the job before the launcher has forwarded it)."""
    sys.__excepthook__(kind, value, tb)
    from mpi4py import MPI
    from mpi4py.run import set_abort_status

    if MPI.Is_initialized() and not MPI.Is_finalized() and MPI.COMM_WORLD.Get_size() > 1:
        set_abort_status(1)


def _rank_facts(device_why: str | None) -> dict:
    """What this rank sees: its host, the GPU it would use (node-local rank modulo the GPUs, as
    the Communicator's default), whether MPS runs for it."""
    import socket

    from mpi4py import MPI

    from .mps import mps_status

    node = MPI.COMM_WORLD.Split_type(MPI.COMM_TYPE_SHARED, key=MPI.COMM_WORLD.Get_rank())
    local = node.Get_rank()
    node.Free()
    facts = {"host": socket.gethostname(), "gpu": None, "bus": None}
    facts["mps"], facts["mps_text"] = mps_status()
    if device_why is None:
        import cupy

        from .backends.topology import nccl_host

        facts["gpu"] = local % cupy.cuda.runtime.getDeviceCount()
        facts["bus"] = (nccl_host(), cupy.cuda.Device(facts["gpu"]).pci_bus_id)
    return facts


def _info(args) -> int:
    """One report, printed by rank 0 (under mpiexec every rank runs it: what each rank sees -
    host, GPU, MPS - is gathered to rank 0)."""
    import platform

    import hpccoll
    from mpi4py import MPI

    from .backends.factory import device_unavailable_reason

    why = device_unavailable_reason()
    facts = MPI.COMM_WORLD.gather(_rank_facts(why), root=0)
    if MPI.COMM_WORLD.Get_rank() != 0:
        return 0
    print(f"hpccoll {hpccoll.__version__} (Python {platform.python_version()})")
    print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}  "
          f"(world size {MPI.COMM_WORLD.Get_size()})")
    print("backends:")
    print("  host: available (numpy through MPI; device buffers staged through host)")
    from .backends.host import hostshm_unavailable_reason

    shm_why = hostshm_unavailable_reason()
    print(f"    shared-memory Allreduce (ranks of one node): "
          f"{'available' if shm_why is None else 'unavailable: ' + shm_why}")
    print(f"  cuda: {'available' if why is None else 'unavailable: ' + why}")
    nccl_why = why
    if why is None:
        from .backends.nccl import nccl_unavailable_reason

        nccl_why = nccl_unavailable_reason()
    print(f"  nccl: {'available' if nccl_why is None else 'unavailable: ' + nccl_why}")
    from .config import describe

    print(describe())
    _print_ranks(facts)
    if why is not None:
        print(f"GPUs: no GPU ({why})")
        return 0
    from .backends.topology import describe_gpus

    print(describe_gpus())
    return 0


def _print_ranks(facts: list[dict]) -> None:
    """Each rank's host, GPU and MPS status, and which ranks share a GPU without MPS."""
    from .mps import ADVICE, shared_without_mps

    hosts = {f["host"] for f in facts}
    print(f"ranks: {len(facts)} on {len(hosts)} host{'s' if len(hosts) > 1 else ''}")
    for r, f in enumerate(facts):
        gpu = "no GPU" if f["gpu"] is None else f"GPU {f['gpu']} ({f['bus'][1]})"
        print(f"  rank {r}: {f['host']}, {gpu}, {f['mps_text']}")
    shared = shared_without_mps([f["bus"] for f in facts], [f["mps"] for f in facts])
    if shared:
        print(f"GPU sharing: {shared} without MPS: every collective waits for a GPU time slice "
              f"(about 40x slower): {ADVICE}")
    elif any(f["bus"] is not None for f in facts):
        buses = [f["bus"] for f in facts]
        print("GPU sharing: " + ("ranks share GPUs, under MPS" if len(set(buses)) < len(buses)
                                 else "none (a GPU per rank)"))


def main(argv=None) -> int:
    """The `hpccoll` command; its exit status.  A command's message exit (SystemExit("...")),
    raised on every rank alike, prints on rank 0 only and exits with status 1."""
    sys.excepthook = _abort_job
    p = _Parser(prog="hpccoll", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="version, backends, MPI, configuration, each rank's host, GPU and MPS status, GPUs and their P2P / peer-atomic matrix (under mpiexec: one report, from rank 0)")
    from .bench import cli as bench_cli  # argument parsers only: the benchmark loads when it runs

    bench_cli.add_parsers(sub)
    args = p.parse_args(argv)
    try:
        if args.cmd == "info":
            return _info(args)
        return bench_cli.main(args)
    except SystemExit as exc:
        if not isinstance(exc.code, str):
            raise
        if _world_rank() == 0:
            print(exc.code, file=sys.stderr, flush=True)
        raise SystemExit(1) from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
