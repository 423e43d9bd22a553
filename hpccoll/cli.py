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


def _info(args) -> int:
    import platform

    import hpccoll
    from mpi4py import MPI

    from .comm import _device_backend_reason

    print(f"hpccoll {hpccoll.__version__} (Python {platform.python_version()})")
    print(f"MPI: {MPI.Get_library_version().splitlines()[0].strip()}  "
          f"(world size {MPI.COMM_WORLD.Get_size()})")
    print("backends:")
    print("  host: available (numpy through MPI; device buffers staged through host)")
    from .backends.host import hostshm_unavailable_reason

    shm_why = hostshm_unavailable_reason()
    print(f"    shared-memory Allreduce (ranks of one node): "
          f"{'available' if shm_why is None else 'unavailable: ' + shm_why}")
    why = _device_backend_reason()
    print(f"  cuda: {'available' if why is None else 'unavailable: ' + why}")
    nccl_why = why
    if why is None:
        from .backends.nccl import nccl_unavailable_reason

        nccl_why = nccl_unavailable_reason()
    print(f"  nccl: {'available' if nccl_why is None else 'unavailable: ' + nccl_why}")
    from .config import describe

    print(describe())
    if why is not None:
        print(f"GPUs: no GPU ({why})")
        return 0
    from .backends.topology import describe_gpus

    print(describe_gpus())
    return 0


def main(argv=None) -> int:
    """The `hpccoll` command; its exit status.  A command's message exit (SystemExit("...")),
    raised on every rank alike, prints on rank 0 only and exits with status 1."""
    sys.excepthook = _abort_job
    p = _Parser(prog="hpccoll", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="version, backends, MPI, configuration, GPUs and their P2P / peer-atomic matrix")
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
