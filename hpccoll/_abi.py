"""The kernels' ABI, read from its one source, cuda/hc_abi.h.

Every constant the host shares with the device code (limits, control-region offsets, codes,
bit patterns, the engine's host-memory layout) and every by-value parameter struct is defined
in that header only.  This module parses it once at import: `const("HC_MAX_RANKS")` (or the
module attributes below) for the integers, `Args`, `Group`, `Chain`, `ErrRec`, `EngineArgs` as
ctypes structures built from the header's own field lists, so a field or a size changed there
changes here with it."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

from .errors import HpccollError


def cuda_dir() -> Path:
    """Folder of the device sources: hpccoll/cuda in an installed wheel, cuda/ in a checkout.

    (cuda/ has no __init__.py on purpose: a regular package named `cuda` at the top of a
    checkout would shadow NVIDIA's `cuda` namespace package that CuPy imports.)"""
    here = Path(__file__).resolve().parent
    for d in (here / "cuda", here.parent / "cuda"):
        if (d / "hc_abi.h").exists():
            return d
    raise HpccollError(f"device sources not found beside {here}: reinstall hpccoll")


HEADER = "hc_abi.h"
_DEFINE = re.compile(r"^\s*#define\s+(HC_\w+)\s+(.+?)\s*(?://.*)?$")
_STRUCT = re.compile(r"struct\s+(\w+)\s*\{(.*?)\};", re.S)
_FIELD = re.compile(r"^(?P<type>[\w\s\*]+?)\s*(?P<name>\w+)\s*(?:\[(?P<dim>[^\]]+)\])?$")
_EXPR_OK = re.compile(r"^[\w\s\(\)\+\-\*/<>]+$")
_PY_NAME = {"in": "in_"}  # C field names that are Python keywords


def _eval(expr: str, names: dict[str, int]) -> int | None:
    """The integer value of a #define's expression, or None when it is not one."""
    text = re.sub(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]*\b", r"\1", expr.strip())
    if not _EXPR_OK.match(text):
        return None
    for word in set(re.findall(r"\b[A-Za-z_]\w*\b", text)):
        if word not in names:
            return None
    try:
        value = eval(text.replace("/", "//"), {"__builtins__": {}}, dict(names))  # noqa: S307 - checked above
    except Exception:  # noqa: BLE001 - not an integer expression
        return None
    return value if isinstance(value, int) else None


def _ctype(ctext: str):
    t = " ".join(ctext.replace("const", " ").replace("volatile", " ").split())
    if "*" in t:
        return ctypes.c_void_p
    return {"u64": ctypes.c_uint64, "u32": ctypes.c_uint32, "u16": ctypes.c_uint16, "int": ctypes.c_int,
            "unsigned": ctypes.c_uint32, "char": ctypes.c_char}[t]


def parse(text: str) -> tuple[dict[str, int], dict[str, type]]:
    """(constants, ctypes structures) of a header in hc_abi.h's restricted C."""
    consts: dict[str, int] = {}
    for line in text.splitlines():
        m = _DEFINE.match(line)
        if m:
            value = _eval(m.group(2), consts)
            if value is not None:
                consts[m.group(1)] = value
    structs: dict[str, type] = {}
    code = re.sub(r"//[^\n]*", "", text)
    for name, body in _STRUCT.findall(code):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            m = _FIELD.match(" ".join(decl.split()))
            if m is None:
                raise HpccollError(f"{HEADER}: struct {name}: cannot read the field {decl!r}")
            ctype = _ctype(m.group("type") + ("*" if "*" in decl.split(m.group("name"))[0] else ""))
            if m.group("dim"):
                dim = _eval(m.group("dim"), consts)
                if dim is None:
                    raise HpccollError(f"{HEADER}: struct {name}: array size {m.group('dim')!r} is not a constant")
                ctype = ctype * dim
            fields.append((_PY_NAME.get(m.group("name"), m.group("name")), ctype))
        structs[name] = type(name, (ctypes.Structure,), {"_fields_": fields, "__doc__":
                             f"`struct {name}` of cuda/{HEADER} (natural alignment, as the device sees it)."})
    return consts, structs


CONSTANTS, STRUCTS = parse((cuda_dir() / HEADER).read_text())


def const(name: str) -> int:
    """The integer value of `#define name` in cuda/hc_abi.h."""
    try:
        return CONSTANTS[name]
    except KeyError:
        raise HpccollError(f"{name} is not defined in cuda/{HEADER}") from None


Args = STRUCTS["Args"]
Group = STRUCTS["Group"]
Chain = STRUCTS["Chain"]
ErrRec = STRUCTS["ErrRec"]
EngineArgs = STRUCTS["EngineArgs"]

MAX_RANKS = const("HC_MAX_RANKS")
PACK = const("HC_PACK")
GROUP_MAX = const("HC_GROUP_MAX")
CHAIN_MAX = const("HC_CHAIN_MAX")
CTRL_BYTES = const("HC_CTRL_BYTES")

#: dtype name -> the HC_DTYPE code its module is compiled with
DTYPE_CODES = {"float64": const("HC_F64"), "float32": const("HC_F32"), "float16": const("HC_F16"),
               "bfloat16": const("HC_BF16"), "int32": const("HC_I32"), "int64": const("HC_I64")}
#: op name -> HC_SUM...
OP_CODES = {"SUM": const("HC_SUM"), "PROD": const("HC_PROD"), "MAX": const("HC_MAX"), "MIN": const("HC_MIN")}
#: HC_COLL_* code -> the collective's name (the error record names one)
COLLECTIVE_NAMES = {const("HC_COLL_ALLREDUCE"): "Allreduce", const("HC_COLL_BCAST"): "Bcast",
                    const("HC_COLL_ALLGATHER"): "Allgather", const("HC_COLL_REDUCE_SCATTER"): "Reduce_scatter_block",
                    const("HC_COLL_BARRIER"): "Barrier", const("HC_COLL_ALLTOALL"): "Alltoall",
                    const("HC_COLL_USER"): "a user kernel"}
#: float dtype name -> the bits of the NaN every result NaN becomes
CANONICAL_NAN = {"float64": const("HC_CANON_NAN_F64"), "float32": const("HC_CANON_NAN_F32"),
                 "float16": const("HC_CANON_NAN_F16"), "bfloat16": const("HC_CANON_NAN_BF16")}
SENTINEL_U32 = const("HC_SENTINEL_U32")
