"""Message sizes as the command line writes them: '64K' -> 65536, '8:64M' -> every power of
two from 8 B to 64 MiB, and back (`fmt_bytes`)."""
from __future__ import annotations

import re

KiB, MiB, GiB = 1024, 1024 * 1024, 1024 * 1024 * 1024
_UNITS = {"": 1, "B": 1, "K": KiB, "KB": KiB, "KIB": KiB, "M": MiB, "MB": MiB, "MIB": MiB,
          "G": GiB, "GB": GiB, "GIB": GiB}


def parse_size(text: str) -> int:
    """'8' -> 8, '4K' -> 4096, '64M' -> 67108864 (binary units; KiB/MB spellings accepted)."""
    m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"size {text!r}: use a number of bytes with an optional K, M or G suffix (e.g. 64K)")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


def parse_sizes(spec: str) -> list[int]:
    """'8:64M' = powers of two from 8 B to 64 MiB; '4K,64K,1M' = exactly those."""
    if ":" in spec:
        lo_s, hi_s = spec.split(":", 1)
        lo, hi = parse_size(lo_s), parse_size(hi_s)
        if lo <= 0 or hi < lo:
            raise ValueError(f"sizes {spec!r}: use LO:HI with 0 < LO <= HI (e.g. 8:64M)")
        out, s = [], lo
        while s <= hi:
            out.append(s)
            s *= 2
        return out
    sizes = [parse_size(p) for p in spec.split(",") if p.strip()]
    if not sizes or min(sizes) <= 0:
        raise ValueError(f"sizes {spec!r}: give positive sizes, e.g. 4K,64K,1M or 8:64M")
    return sizes


def fmt_bytes(n: int) -> str:
    """4096 -> '4K', 3 MiB -> '3M'; sizes that are not a whole number of a unit stay in bytes."""
    for unit, div in (("G", GiB), ("M", MiB), ("K", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)
