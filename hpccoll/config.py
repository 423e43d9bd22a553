"""Configuration: every HPCCOLL_* environment variable hpccoll reads, in one table.

Variables are read when a Communicator is made (`Config.from_env()`), never at import, so a
program may set them before opening each communicator.  Explicit constructor arguments win
over the environment.  `hpccoll info` prints the table with the values in effect;
docs/configuration.md is generated from the same table (`markdown_table()`).

Settings that change what the kernels of one collective do must be the same on every rank;
the communicator checks those (`agreed`) at construction and raises on every rank if they
differ."""
from __future__ import annotations

import contextlib
import math
import numbers
import os
import subprocess
from dataclasses import dataclass, fields
from pathlib import Path


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _switch(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: use 1 (on) or 0 (off)")


#: The longest wait a deadline in nanoseconds holds (int64: the host's clock arithmetic; the
#: device's u64 polls take it too), about 292 years: a longer timeout, math.inf among them, is
#: this one, which never passes.
FOREVER_NS = 2**63 - 1


def _seconds(name: str, raw: str) -> float:
    """HPCCOLL_TIMEOUT's text: a positive number of seconds, or inf (wait forever)."""
    try:
        val = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number of seconds: use a positive number, "
                         "or inf to wait forever") from None
    return _positive(name, val, raw)


def _positive(name: str, val: float, given) -> float:
    if not val > 0:  # (NaN too)
        raise ValueError(f"{name}={given!r}: use a positive number of seconds, or inf to wait forever")
    return val


def timeout_argument(value) -> float:
    """The `timeout=` argument: a positive int or float (numpy's too), math.inf to wait forever."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # (a numpy bool is no Real)
        raise TypeError(f"Communicator: timeout={value!r} must be a number of seconds (math.inf: wait "
                        "forever; None: HPCCOLL_TIMEOUT)")
    return _positive("Communicator: timeout", float(value), value)


def timeout_ns(seconds: float) -> int:
    """A timeout in whole nanoseconds, FOREVER_NS for any longer one (math.inf included)."""
    ns = seconds * 1e9
    return FOREVER_NS if ns >= FOREVER_NS else int(math.ceil(ns))


def _block(name: str, raw: str) -> int:
    if raw.strip() not in ("32", "64", "128", "256", "512"):
        raise ValueError(f"{name}={raw!r}: use 32, 64, 128, 256 or 512")
    return int(raw)


def _nonneg_int(name: str, raw: str) -> int:
    if not raw.strip().isdigit():
        raise ValueError(f"{name}={raw!r}: use a non-negative integer")
    return int(raw)


def _node_size(name: str, raw: str) -> int | None:
    if not raw.strip():
        return None
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ValueError(f"{name}={raw!r}: use a positive number of ranks per simulated node")
    return int(raw)


def _path(name: str, raw: str) -> str | None:
    return raw or None


@dataclass(frozen=True)
class Setting:
    """One environment variable: its default (as the variable's text), parser and meaning."""

    var: str
    field: str
    default: str
    parse: object
    doc: str
    agreed: bool = False  # must be the same on every rank (checked at construction)


SETTINGS = (
    Setting("HPCCOLL_TIMEOUT", "timeout", "30", _seconds,
            "Seconds a collective waits for a peer before it raises CollectiveTimeout (device "
            "kernels' polls, host-backend MPI calls and shared-memory waits, the NCCL watchdog "
            "alike); `inf`: wait forever. The `timeout=` argument wins."),
    Setting("HPCCOLL_CHECK", "check", "0", _switch,
            "1: compare every call's arguments and validation outcome across ranks first, so a "
            "mismatch raises the same error on every rank instead of hanging. The `check=` argument wins.",
            agreed=True),
    Setting("HPCCOLL_PDL", "pdl", "1", _switch,
            "Programmatic dependent launch (Hopper and newer): a collective kernel is scheduled "
            "while the stream's previous kernel runs, and waits for it on the device.", agreed=False),
    Setting("HPCCOLL_FUSE", "fuse", "1", _switch,
            "Capture fusion: one-shot Allreduce calls captured back to back into a CUDA graph run "
            "as one kernel node. 0: every captured call is a node of its own.", agreed=True),
    Setting("HPCCOLL_SMALL_BLOCK", "small_block", "128", _block,
            "Threads per block of launches small enough to fit the grid cap in blocks of that "
            "size (spread over more SMs).", agreed=True),
    Setting("HPCCOLL_NCCL_FALLBACK", "nccl_fallback", "0", _switch,
            "1: open NCCL for the Allreduce sizes where the tuning table prefers it (non-"
            "deterministic calls only). 0: hpccoll's kernels serve every size.", agreed=True),
    Setting("HPCCOLL_NODE_SIZE", "node_size", "", _node_size,
            "Treat consecutive groups of this many ranks as nodes (tests the hierarchical "
            "collectives on one machine). Unset: nodes are the shared-memory domains.", agreed=True),
    Setting("HPCCOLL_HIER_RSAG_BYTES", "hier_rsag_bytes", "262144", _nonneg_int,
            "Across nodes, Allreduce messages of at least this many bytes run reduce-scatter / "
            "allreduce / allgather, smaller ones allreduce / allreduce (0: always the former).",
            agreed=True),
    Setting("HPCCOLL_HOST_SHM", "host_shm", "1", _switch,
            "The host backend's Allreduce of float32/float64/int32/int64 messages up to 32 KiB, "
            "ranks on one node: through shared memory, in rank order (the deterministic result, by "
            "default too). 0: through MPI, as larger messages.", agreed=True),
    Setting("HPCCOLL_TUNING", "tuning", "", _path,
            "Tuning table written by `hpccoll tune` (default ~/.cache/hpccoll/tuning.json); "
            "used when its GPU name matches this GPU's. Rank 0's table serves every rank (a "
            "warning names the ranks that read another)."),
    Setting("HPCCOLL_CACHE_DIR", "cache_dir", "", _path,
            "Folder of compiled kernels (default ~/.cache/hpccoll/kernels)."),
    Setting("HPCCOLL_NVRTC", "nvrtc", "", _path,
            "Path of the libnvrtc to compile kernels with (default: CuPy's, else the pip "
            "wheel's, else the system's)."),
    Setting("HPCCOLL_COMMIT", "commit", "", _path,
            "The commit id `hpccoll bench` and the eigensolver record in their results where git "
            "cannot tell it (a copy of the tree without its history)."),
)


@dataclass(frozen=True)
class Config:
    """The settings one Communicator runs with (see SETTINGS for each field's variable)."""

    timeout: float = 30.0
    check: bool = False
    pdl: bool = True
    fuse: bool = True
    small_block: int = 128
    nccl_fallback: bool = False
    node_size: int | None = None
    hier_rsag_bytes: int = 262144
    host_shm: bool = True
    tuning: str | None = None
    cache_dir: str | None = None
    nvrtc: str | None = None
    commit: str | None = None

    @classmethod
    def from_env(cls, environ=None, **explicit) -> "Config":
        """The environment's settings; keyword arguments that are not None win."""
        env = os.environ if environ is None else environ
        values = {}
        for s in SETTINGS:
            if explicit.get(s.field) is not None:
                values[s.field] = explicit[s.field]
                continue
            values[s.field] = s.parse(s.var, env.get(s.var, s.default))
        if explicit.get("timeout") is not None:
            values["timeout"] = timeout_argument(explicit["timeout"])
        return cls(**values)

    def agreed_values(self) -> tuple:
        """The settings every rank must share, in SETTINGS order."""
        return tuple((s.var, getattr(self, s.field)) for s in SETTINGS if s.agreed)

    def tuning_path(self) -> Path:
        return Path(self.tuning or os.path.join(os.path.expanduser("~"), ".cache", "hpccoll", "tuning.json"))

    def kernel_cache_dir(self) -> Path:
        return Path(self.cache_dir or os.path.join(os.path.expanduser("~"), ".cache", "hpccoll", "kernels"))


assert {s.field for s in SETTINGS} == {f.name for f in fields(Config)}, "every Config field has its variable"


@contextlib.contextmanager
def setting(var: str, value: str):
    """The block runs with the setting `var` (one of SETTINGS) set to `value` in the environment: a
    Communicator made inside, or its Dup, reads it (for a setting that must agree, every rank
    sets it alike).  The environment is restored on exit."""
    if var not in {s.var for s in SETTINGS}:
        raise ValueError(f"setting: {var} is not an hpccoll setting")
    before = os.environ.get(var)
    os.environ[var] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = before


def check_agreement(mpi_comm, config: Config | None, error: Exception | None = None,
                    explicit: tuple = ()) -> None:
    """Raise on every rank when a rank's settings are invalid (`error`, from Config.from_env;
    that rank re-raises its own) or the settings that must agree differ between ranks
    (collective).  explicit: the fields this rank took from arguments (e.g. ("check",)); an
    error names each value's source, the argument (`check=`) or the variable (HPCCOLL_CHECK)."""
    theirs = mpi_comm.allgather((None if error is None else str(error),
                                 None if config is None else config.agreed_values(),
                                 tuple(explicit)))
    if error is not None:
        raise error
    bad = [(r, e) for r, (e, _, _) in enumerate(theirs) if e is not None]
    if bad:
        said = "; ".join(f"rank {r}: {e}" for r, e in bad)
        raise ValueError(f"invalid HPCCOLL_* settings on other ranks ({said}): set valid values on every rank")
    mine = config.agreed_values()
    fields = {s.var: s.field for s in SETTINGS}
    for i, (var, _val) in enumerate(mine):
        vals = [t[1][i][1] for t in theirs]
        if any(v != vals[0] for v in vals):
            field = fields[var]
            source = [f"{field}=" if field in t[2] else var for t in theirs]
            names = " / ".join(dict.fromkeys(source))
            seen = ", ".join(f"rank {r}: {v!r} ({src})" for r, (v, src) in enumerate(zip(vals, source)))
            raise ValueError(f"{names} differs between ranks ({seen}): set the same value on every rank")


def git_commit() -> str | None:
    """The commit a result records: HPCCOLL_COMMIT when set (a copy of the tree whose git HEAD is
    stale or absent), else git's HEAD of the tree hpccoll lives in, else None."""
    commit = Config.from_env().commit
    if commit:
        return commit
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return None


def describe(config: Config | None = None, environ=None) -> str:
    """The table `hpccoll info` prints: each variable, its value in effect, and whether set."""
    env = os.environ if environ is None else environ
    if config is None:
        try:
            config = Config.from_env(env)
        except ValueError as exc:
            return f"configuration: invalid ({exc})"
    rows = []
    for s in SETTINGS:
        val = getattr(config, s.field)
        src = "set" if s.var in env else "default"
        rows.append(f"  {s.var:<24} {str(val):<12} ({src})")
    known = {s.var for s in SETTINGS}
    unknown = sorted(k for k in env if k.startswith("HPCCOLL_") and k not in known)
    lines = ["configuration (HPCCOLL_* variables; docs/configuration.md):", *rows]
    if unknown:
        lines.append("  not hpccoll settings (ignored by the library): " + ", ".join(unknown))
    return "\n".join(lines)


def markdown_table() -> str:
    """The variables as a Markdown table (docs/configuration.md holds this text)."""
    out = ["| variable | default | same on every rank | meaning |", "|---|---|---|---|"]
    for s in SETTINGS:
        out.append(f"| `{s.var}` | {s.default or '(unset)'} | {'yes' if s.agreed else 'no'} | {s.doc} |")
    return "\n".join(out)
