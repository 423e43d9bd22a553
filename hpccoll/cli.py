"""`hpccoll` command line: info, bench, tune."""
from __future__ import annotations

import argparse
import sys


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
    p = argparse.ArgumentParser(prog="hpccoll", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="version, backends, MPI, configuration, GPUs and their P2P / peer-atomic matrix")
    from .bench import cli as bench_cli  # argument parsers only: the benchmark loads when it runs

    bench_cli.add_parsers(sub)
    args = p.parse_args(argv)
    if args.cmd == "info":
        return _info(args)
    return bench_cli.main(args)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
