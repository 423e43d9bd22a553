"""Which kernel runs, and when calls share one: every algorithm decision in one place.

- The algorithm of a call (`pick`: `choose` for `auto`, then `validate`): a tuning table maps (collective, rank count,
  policy) to size thresholds.  Defaults ship in hpccoll/tuning/*.json (by GPU family); `hpccoll
  tune` writes a measured table to $HPCCOLL_TUNING (default ~/.cache/hpccoll/tuning.json) that
  `auto` then prefers.  A table may also set "fuse_ll_max" (below).
- Capture fusion (`chain_algorithm`): which one-shot a captured call runs in a chain node.
- Groups (`group_algorithm`): which one-shot a run of grouped calls shares.
- The eager engine (`engine_takes`): which calls a running engine serves.
- Across nodes (`hier_variant`): which Allreduce composition a message size runs.

The backends ask these functions; none of them decides on its own."""
from __future__ import annotations

import functools
import json
from importlib import resources
from pathlib import Path

from .errors import HpccollError

# algorithm -> (collectives it implements, deterministic, float only, SUM only)
ALGORITHMS = {
    "oneshot_sentinel": ({"Allreduce"}, True, True, False),
    "oneshot_ll": ({"Allreduce"}, True, False, False),
    "twoshot_sentinel": ({"Allreduce"}, True, True, False),
    "twoshot_ll": ({"Allreduce"}, True, False, False),
    "twoshot_ll128": ({"Allreduce"}, False, True, True),
    "sentinel": ({"Reduce_scatter_block"}, True, True, False),
    "ll": ({"Reduce_scatter_block", "Bcast", "Allgather", "Alltoall"}, True, False, False),
    # NCCL's own allreduce: the tuning table's choice above the size where hpccoll's kernels
    # stop winning (non-deterministic policy only; needs NCCL, opened at construction)
    "nccl": ({"Allreduce"}, False, False, False),
}
FLOATS = {"float64", "float32", "float16", "bfloat16"}


def tuning_path() -> Path:
    """Where `hpccoll tune` writes and `auto` reads a measured table (HPCCOLL_TUNING)."""
    from .config import Config

    return Config.from_env().tuning_path()


def _shipped(family: str) -> dict:
    try:
        txt = (resources.files("hpccoll") / "tuning" / f"{family}.json").read_text()
        return json.loads(txt)
    except (FileNotFoundError, OSError):
        return {}


@functools.lru_cache(maxsize=1)
def _generic_rules() -> dict:
    """The shipped generic table, parsed once: `choose`'s fallback (read only; shipped_table
    gives callers a fresh copy to change)."""
    return _shipped("generic")


def shipped_table(family: str = "generic") -> dict:
    """The table shipped for a GPU family ("h200", "h100", "generic")."""
    return _shipped(family)


def load_table(gpu_name: str, path: Path | None = None) -> dict:
    """Measured table (at `path`, default tuning_path()) if its GPU is this one, else the
    shipped default for the GPU family, else generic."""
    p = tuning_path() if path is None else path
    if p.exists():
        try:
            t = json.loads(p.read_text())
            if t.get("gpu") == gpu_name:
                return t
        except (OSError, ValueError):
            pass
    fam = "h200" if "H200" in gpu_name else "h100" if "H100" in gpu_name else "generic"
    return _shipped(fam) or _shipped("generic")


def _rule(table: dict, key: str, nranks: int):
    rules = table.get(key, {})
    best = None
    for n_str, rule in rules.items():  # nearest rank count at or below, else smallest
        n = int(n_str)
        if n <= nranks and (best is None or n > best[0]):
            best = (n, rule)
    if best is None and rules:
        best = min(((int(k), v) for k, v in rules.items()), key=lambda kv: kv[0])
    return best[1] if best else None


def wants_nccl(table: dict, nranks: int) -> bool:
    """Whether the non-deterministic Allreduce rules for this rank count ever pick NCCL."""
    rows = _rule(table, "allreduce", nranks) or []
    return any(algo == "nccl" for _max, algo in rows)


def choose(table: dict, collective: str, dtype: str, op: str | None, nbytes: int, nranks: int,
           deterministic: bool, peer_atomics: bool, nccl: bool = False) -> str:
    """`auto`: pick an algorithm for this call.  A table row naming "nccl" is taken only when
    NCCL is open (`nccl`), the policy is not deterministic and the dtype is not bfloat16
    (CuPy's NCCL binding may lack it); otherwise the previous row's
    hpccoll algorithm serves (two-shot sentinel if there is none)."""
    is_float = dtype in FLOATS
    if collective in ("Bcast", "Allgather", "Alltoall"):
        return "ll"
    if collective == "Reduce_scatter_block":
        return "sentinel" if is_float else "ll"
    # Allreduce: table rows are [[max_bytes, algorithm], ...] in ascending max_bytes
    key = "allreduce_deterministic" if deterministic else "allreduce"
    rows = _rule(table, key, nranks) or _rule(_generic_rules(), key, nranks)
    prev = "twoshot_sentinel"
    for max_bytes, algo in rows:
        if algo == "nccl" and (deterministic or not nccl or dtype == "bfloat16"):
            algo = prev
        if max_bytes is None or nbytes <= max_bytes:
            break
        prev = algo
    if algo == "nccl":
        return algo
    if algo == "twoshot_ll128" and not (is_float and op == "SUM" and peer_atomics):
        algo = "twoshot_sentinel"
    if not is_float:
        algo = algo.replace("sentinel", "ll").replace("twoshot_ll128", "twoshot_ll")
    return algo


def pick(table: dict, collective: str, dtype: str, op: str | None, nbytes: int, nranks: int,
         deterministic: bool, peer_atomics: bool, algorithm: str, nccl: bool = False) -> str:
    """The algorithm a device call runs: `auto`, or a default that does not implement this
    collective, goes through the table (`choose`); the result is validated once (`validate`).
    nccl: whether NCCL is open for the table's "nccl" rows."""
    if algorithm != "auto":
        _known(algorithm, collective)
    if algorithm == "auto" or collective not in ALGORITHMS[algorithm][0]:
        algorithm = choose(table, collective, dtype, op, nbytes, nranks, deterministic, peer_atomics, nccl=nccl)
    if algorithm == "nccl" and not nccl:
        raise ValueError(f"{collective}: algorithm='nccl' needs NCCL opened by this communicator "
                         "(HPCCOLL_NCCL_FALLBACK=1 and a table that prefers it): use 'auto' or backend='nccl'")
    validate(algorithm, collective, dtype, op, deterministic, peer_atomics)
    return algorithm


def _known(algorithm: str, collective: str) -> None:
    if algorithm not in ALGORITHMS:
        names = ", ".join(a for a, spec in ALGORITHMS.items() if collective in spec[0])
        raise ValueError(f"{collective}: algorithm={algorithm!r} is unknown: use 'auto' or one of {names}")


def validate(algorithm: str, collective: str, dtype: str, op: str | None, deterministic: bool,
             peer_atomics: bool) -> None:
    """Raise ValueError naming the problem and the fix when `algorithm` cannot run this call."""
    _known(algorithm, collective)
    colls, det, float_only, sum_only = ALGORITHMS[algorithm]
    if collective not in colls:
        names = ", ".join(a for a, spec in ALGORITHMS.items() if collective in spec[0])
        raise ValueError(f"{collective}: algorithm={algorithm!r} implements {', '.join(sorted(colls))} "
                         f"only: use 'auto' or one of {names}")
    if float_only and dtype not in FLOATS:
        alt = algorithm.replace("sentinel", "ll").replace("_ll128", "_ll")
        raise ValueError(f"{collective}: {algorithm} needs a floating-point dtype (the sentinel is a NaN "
                         f"pattern, LL128 adds floats); {dtype} has none: use algorithm={alt!r}")
    if sum_only and op != "SUM":
        raise ValueError(f"{collective}: {algorithm} reduces with hardware adds (SUM only), op={op}: "
                         "use algorithm='twoshot_sentinel'")
    if deterministic and not det:
        raise ValueError(f"{collective}: {algorithm} is not deterministic (atomics land in any order): "
                         "pass deterministic=False or use 'oneshot_sentinel'/'twoshot_sentinel'")
    if algorithm == "twoshot_ll128" and not peer_atomics:
        raise HpccollError(f"{collective}: twoshot_ll128 needs native peer atomics, which the driver "
                           "reports missing between some GPUs of this node: use algorithm='twoshot_sentinel'")


# -- capture fusion, groups, the engine, nodes ------------------------------------------------
KiB = 1024
#: one-shot algorithms that carry several calls in one launch (groups) or one node (chains)
ONE_SHOTS = ("oneshot_sentinel", "oneshot_ll")
#: the most bytes for which a captured chain of 'auto' calls runs the one-shot LL: there its
#: flags beat the sentinel's re-arms, which need a fence between the chain's calls (a table's
#: "fuse_ll_max" overrides it).  Both reduce in rank order: the choice changes speed, not bits.
FUSE_LL_MAX = 128 * KiB
#: the algorithm arguments a running eager engine serves (its kernel is a one-shot)
ENGINE_ALGORITHMS = ("auto", "oneshot_ll")


def chain_algorithm(table: dict, requested: str, resolved: str, nbytes: int, cap: int) -> str | None:
    """The one-shot a captured Allreduce of `nbytes` runs in a chain node, or None where it cannot
    join one.  `resolved` is the call's algorithm; `cap` the chain's one-shot's bytes per launch."""
    if resolved not in ONE_SHOTS or nbytes <= 0:
        return None
    algo = resolved
    if requested == "auto" and nbytes <= table.get("fuse_ll_max", FUSE_LL_MAX):
        algo = "oneshot_ll"
    return algo if nbytes <= cap(algo) else None


def group_algorithm(resolved: str, total_bytes: int, cap) -> str | None:
    """The one-shot a run of grouped Allreduce calls of `total_bytes` in all shares (resolved:
    the algorithm chosen for that total), or None when the run cannot share one launch."""
    if resolved in ONE_SHOTS and total_bytes <= cap(resolved):
        return resolved
    return None


def group_bytes(cap) -> int:
    """The most bytes a run of grouped calls can carry in one launch: the largest one-shot's."""
    return max(cap(a) for a in ONE_SHOTS)


def group_share(sizes: list, pick_for, cap) -> tuple[int, str | None]:
    """(k, algorithm): the first k of consecutive grouped calls of `sizes` bytes (k >= 2) share
    one launch of that one-shot, chosen for their total (`pick_for(total)`), or (1, None)."""
    k, total = len(sizes), sum(sizes)
    while k >= 2:
        algo = group_algorithm(pick_for(total), total, cap)
        if algo is not None:
            return k, algo
        k -= 1
        total -= sizes[k]
    return 1, None


def groupable(collective: str, algorithm: str) -> bool:
    """Whether a call may join a group launch at all (its buffers aside)."""
    return collective == "Allreduce" and algorithm in ("auto",) + ONE_SHOTS


def engine_takes(collective: str, algorithm: str, nbytes: int, max_bytes: int) -> bool:
    """Whether a running eager engine serves this call (its buffers' alignment aside)."""
    return collective == "Allreduce" and algorithm in ENGINE_ALGORITHMS and 0 < nbytes <= max_bytes


def hier_variant(nbytes: int, per_node: int, algorithm: str, rsag_bytes: int) -> str:
    """"rsag" (node Reduce_scatter / inter-node Allreduce of a shard / node Allgather) or "ar"
    (node Allreduce / inter-node Allreduce) for an Allreduce across nodes: the same on every rank
    of a valid call.  A node-phase kernel named by the caller always runs "ar"."""
    if nbytes >= rsag_bytes and per_node > 1 and algorithm in ("auto", "mpi", "host"):
        return "rsag"
    return "ar"
