"""The collectives the benchmark runs, and which of hpccoll's algorithms a sweep times for each
(the names come from hpccoll.policy: the bench keeps no list of its own)."""
from __future__ import annotations

from .. import policy

#: the command line's name of a collective -> the Communicator method it times
COLLECTIVE_CALL = {"allreduce": "Allreduce", "bcast": "Bcast", "allgather": "Allgather",
                   "reduce_scatter": "Reduce_scatter_block"}


def algorithms_of(collective: str) -> tuple[str, ...]:
    """hpccoll's own kernels for `collective`, in the policy's order (NCCL's allreduce is a
    baseline here, timed by --baselines, not an algorithm of the sweep)."""
    call = COLLECTIVE_CALL[collective]
    return tuple(a for a, (colls, *_) in policy.ALGORITHMS.items() if call in colls and a != "nccl")


ALLREDUCE_ALGORITHMS = algorithms_of("allreduce")


def unknown_algorithms(collective: str, spec: str) -> str | None:
    """Why `--algorithms spec` names no algorithm of `collective`, or None when it is valid:
    'all', or a comma list of 'auto' and the collective's algorithms."""
    valid = ("auto",) + algorithms_of(collective)
    if spec.strip() == "all":
        return None
    names = [a.strip() for a in spec.split(",") if a.strip()]
    bad = [a for a in names if a not in valid]
    if names and not bad:
        return None
    what = f"unknown {', '.join(bad)}" if bad else "no algorithm named"
    return f"--algorithms {spec!r}: {what}; {collective} takes all (alone) or a comma list of {', '.join(valid)}"


def algorithm_list(collective: str, spec: str, dtype: str, deterministic: bool, peer_atomics: bool,
                   on_gpu: bool) -> list[str]:
    """The hpccoll algorithms a sweep runs: 'all' = every one valid for this dtype, policy and
    machine, then 'auto'; else those named.  The host backend has one path: 'mpi'."""
    if not on_gpu:
        return ["mpi"]
    if spec.strip() != "all":
        return [a.strip() for a in spec.split(",") if a.strip()]
    call = COLLECTIVE_CALL[collective]
    op = "SUM" if collective in ("allreduce", "reduce_scatter") else None
    out = []
    for a in algorithms_of(collective):
        try:
            policy.validate(a, call, dtype, op, deterministic, peer_atomics)
        except Exception:  # noqa: BLE001 - not valid for this dtype / policy / machine
            continue
        out.append(a)
    return out + ["auto"]
