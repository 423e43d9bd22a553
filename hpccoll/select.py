"""Which kernel runs: the one place that decides (tuning table + policy).

A tuning table maps (collective, rank count, policy) to size thresholds.  Defaults ship in
hpccoll/tuning/*.json (by GPU family); `hpccoll tune` writes a measured table to
$HPCCOLL_TUNING (default ~/.cache/hpccoll/tuning.json) that `auto` then prefers."""
from __future__ import annotations

import json
import os
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
    "ll": ({"Reduce_scatter_block", "Bcast", "Allgather"}, True, False, False),
    # NCCL's own allreduce: the tuning table's choice above the size where hpccoll's kernels
    # stop winning (non-deterministic policy only; needs NCCL, opened at construction)
    "nccl": ({"Allreduce"}, False, False, False),
}
FLOATS = {"float64", "float32", "float16", "bfloat16"}


def tuning_path() -> Path:
    return Path(os.environ.get("HPCCOLL_TUNING") or
                os.path.join(os.path.expanduser("~"), ".cache", "hpccoll", "tuning.json"))


def _shipped(family: str) -> dict:
    try:
        txt = (resources.files("hpccoll") / "tuning" / f"{family}.json").read_text()
        return json.loads(txt)
    except (FileNotFoundError, OSError):
        return {}


def load_table(gpu_name: str) -> dict:
    """Measured table if present, else the shipped default for the GPU family, else generic."""
    p = tuning_path()
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
    if collective in ("Bcast", "Allgather"):
        return "ll"
    if collective == "Reduce_scatter_block":
        return "sentinel" if is_float else "ll"
    # Allreduce: table rows are [[max_bytes, algorithm], ...] in ascending max_bytes
    key = "allreduce_deterministic" if deterministic else "allreduce"
    rows = _rule(table, key, nranks) or _rule(_shipped("generic"), key, nranks)
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


def validate(algorithm: str, collective: str, dtype: str, op: str | None, deterministic: bool,
             peer_atomics: bool) -> None:
    """Raise ValueError naming the problem and the fix when `algorithm` cannot run this call."""
    if algorithm not in ALGORITHMS:
        names = ", ".join(a for a, spec in ALGORITHMS.items() if collective in spec[0])
        raise ValueError(f"{collective}: algorithm={algorithm!r} is unknown: use 'auto' or one of {names}")
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
