"""`hpccoll bench` and `hpccoll tune`: their arguments, checked before anything runs, and their
entry points (the benchmark itself loads only when one runs)."""
from __future__ import annotations

import os

COLLECTIVES = ("allreduce", "bcast", "allgather", "reduce_scatter")


def _common_args(p, sizes_default: str) -> None:
    p.add_argument("--sizes", default=sizes_default,
                   help="LO:HI (powers of two) or a comma list, e.g. 8:64M or 4K,64K,1M; bytes per rank")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--iters", type=int, default=100, help="iterations per timed repetition (default 100)")


def add_parsers(sub) -> None:
    b = sub.add_parser("bench", help="latency sweep of a collective (eager, graph, in-kernel, blocking; "
                                     "SoL model; NCCL / torch symm_mem / MPI baselines)")
    b.add_argument("collective", choices=list(COLLECTIVES))
    _common_args(b, "8:64M")
    b.add_argument("--algorithms", default="all",
                   help="all (every hpccoll algorithm valid here, plus auto), auto, or NAME,NAME,...")
    b.add_argument("--deterministic", action="store_true", help="deterministic policy (no ll128)")
    b.add_argument("--baselines", action="store_true",
                   help="also time NCCL, torch symmetric memory (one/two shot) and host-staged MPI")
    b.add_argument("--persistent", action="store_true",
                   help="also time eager calls with the eager engine running (Allreduce, 'auto' and "
                        "'oneshot_ll' rows up to 256 KiB): column eager*")
    b.add_argument("--engine-order", choices=("stream", "caller"), default="stream",
                   help="the engine's call order (Communicator.start_persistent's order): stream (each "
                        "call waits for its stream; the default) or caller (the bench synchronizes "
                        "before every call, as CUDA-aware MPI requires; no stream query)")
    b.add_argument("--json", default=None, help="write results here (rank 0)")
    b.add_argument("--plot", default=None, help="write a latency plot (PNG) here (rank 0)")
    t = sub.add_parser("tune", help="measure the allreduce algorithms (graph mode) at this rank count "
                                    "and write the tuning table that algorithm='auto' uses")
    _common_args(t, "8:64M")
    t.add_argument("--out", default=None, help="table path (default: hpccoll.policy.tuning_path())")
    t.add_argument("--json", default=None, help="also write the raw sweep here (rank 0)")


def main(args) -> int:
    from mpi4py import MPI

    from .sweep import _err, format_table, parse_sizes, plot, run_sweep, tune, write_json

    try:
        parse_sizes(args.sizes)
        from ..ops import np_dtype

        np_dtype(args.dtype)
    except (ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"hpccoll {getattr(args, 'cmd', 'bench')}: {exc}") from None
    if args.iters < 1:
        raise SystemExit(f"hpccoll {getattr(args, 'cmd', 'bench')}: --iters must be >= 1, not {args.iters}")
    if getattr(args, "cmd", "bench") == "tune":
        return tune(args)
    rank = MPI.COMM_WORLD.Get_rank()
    if args.baselines:  # before anything imports torch or creates an NCCL communicator
        os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
        os.environ["NCCL_NVLS_ENABLE"] = "0"
    result = run_sweep(args)
    if rank == 0:
        print(format_table(result), flush=True)
        if args.json:
            write_json(result, args.json)
            print(f"# wrote {args.json}", flush=True)
        if args.plot:
            try:
                plot(result, args.plot)
                print(f"# wrote {args.plot}", flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"# plot skipped: {_err(exc)}", flush=True)
    bad = [r for r in result["rows"] if r.get("ok") is False]
    return 1 if bad else 0
