"""`hpccoll bench` and `hpccoll tune`: their arguments, checked on every rank before anything
runs, and their entry points.  Light on purpose: the benchmark itself loads only when one runs."""
from __future__ import annotations

import os

from .collectives import COLLECTIVE_CALL, unknown_algorithms
from .sizes import parse_sizes

#: the options that name a file rank 0 writes, per command
OUTPUTS = {"bench": ("json", "plot"), "tune": ("out", "json")}


def _common_args(p, sizes_default: str) -> None:
    p.add_argument("--sizes", default=sizes_default,
                   help="LO:HI (powers of two) or a comma list, e.g. 8:64M or 4K,64K,1M; bytes per rank")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--iters", type=int, default=100, help="iterations per timed repetition (default 100)")


def add_parsers(sub) -> None:
    b = sub.add_parser("bench", help="latency sweep of a collective (eager, graph, in-kernel, blocking; "
                                     "SoL model; NCCL / torch symm_mem / MPI baselines)")
    b.add_argument("collective", choices=list(COLLECTIVE_CALL))
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


def check(args) -> None:
    """Raise SystemExit(message) on every rank alike for the first argument that cannot work,
    before anything runs (collective: the output folders are checked where rank 0, which
    writes the files, sees them; tune asks every rank for a GPU)."""
    from mpi4py import MPI

    from ..ops import np_dtype

    world, cmd = MPI.COMM_WORLD, args.cmd
    try:
        parse_sizes(args.sizes)
        np_dtype(args.dtype)
    except (ValueError, TypeError, KeyError) as exc:
        raise SystemExit(f"hpccoll {cmd}: {exc}") from None
    if args.iters < 1:
        raise SystemExit(f"hpccoll {cmd}: --iters must be >= 1, not {args.iters}")
    if cmd == "bench":
        why = unknown_algorithms(args.collective, args.algorithms)
        if why:
            raise SystemExit(f"hpccoll bench: {why}")
    why = None
    if world.Get_rank() == 0:
        for dest in OUTPUTS[cmd]:
            if getattr(args, dest) and not why:
                why = unwritable(f"--{dest}", getattr(args, dest))
    why = world.bcast(why, root=0)
    if why:
        raise SystemExit(f"hpccoll {cmd}: {why}")
    if cmd == "tune":
        from ..backends.factory import device_unavailable_reason

        ranks_of: dict[str, list[int]] = {}
        for r, w in enumerate(world.allgather(device_unavailable_reason())):
            if w:
                ranks_of.setdefault(w, []).append(r)
        if ranks_of:
            raise SystemExit("hpccoll tune: tunes hpccoll's GPU kernels and needs the cuda backend on every "
                             "rank: " + "; ".join(f"rank {', '.join(map(str, rs))}: {w}" for w, rs in ranks_of.items())
                             + "; nothing written")


def unwritable(option: str, path: str) -> str | None:
    """Why `path` cannot be written here (a folder; its folder missing or read-only), or None."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{option} {path} is a folder: name a file in it"
    if not os.path.isdir(folder):
        return f"{option} {path}: the folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{option} {path}: not writable"
    return None


def main(args) -> int:
    """Run `hpccoll bench` or `hpccoll tune` with parsed `args` (every rank); the exit status."""
    check(args)
    if args.cmd == "tune":
        from .tune import tune

        return tune(args)
    from mpi4py import MPI

    from .ranks import describe
    from .report import format_table, plot, write_json
    from .sweep import run_sweep

    result = run_sweep(args)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(format_table(result), flush=True)
        if args.json:
            write_json(result, args.json)
            print(f"# wrote {args.json}", flush=True)
        if args.plot:
            try:
                plot(result, args.plot)
                print(f"# wrote {args.plot}", flush=True)
            except Exception as exc:  # noqa: BLE001 - e.g. no matplotlib: the table and JSON stand
                print(f"# plot skipped: {describe(exc)}", flush=True)
    return 1 if any(r.get("ok") is False for r in result["rows"]) else 0
