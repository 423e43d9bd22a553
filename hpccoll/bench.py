"""`hpccoll bench` / `hpccoll tune` (filled in by the benchmark work)."""
from __future__ import annotations


def add_parsers(sub) -> None:
    b = sub.add_parser("bench", help="latency sweep of a collective")
    b.add_argument("collective", choices=["allreduce", "bcast", "allgather", "reduce_scatter"])


def main(args) -> int:
    raise SystemExit("hpccoll bench: not built yet")
