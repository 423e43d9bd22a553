"""A sweep's result as people and programs read it: the table, the JSON, the plot, and the
provenance every record carries (machine, commit, date)."""
from __future__ import annotations

import datetime
import json
import socket
import subprocess

from .sizes import fmt_bytes
from .timing import GRAPH_OPS

COLUMNS = [("size", 8), ("count", 10), ("dtype", 8), ("algorithm", 17), ("eager", 8), ("eager*", 7), ("req*", 6),
           ("graph", 8), ("unfused", 8), ("group", 7),
           ("in-kern", 8), ("blocking", 8), ("busbw", 7), ("xSoL", 6), ("vsNCCL", 6), ("vsTorch", 7),
           ("ok", 3)]
_ROW_CELLS = ("eager_us", "eager_persistent_us", "eager_request_us", "graph_us", "graph_unfused_us",
              "graph_group_us", "in_kernel_us", "blocking_us", "busbw_GBps", "ratio_to_sol",
              "speedup_vs_nccl", "speedup_vs_torch")  # the numbers between algorithm and ok


def _cell(v, w: int) -> str:
    if v is None:
        return "-".rjust(w)
    if isinstance(v, float):
        return f"{v:{w}.2f}"
    return str(v).rjust(w)


def format_table(result: dict) -> str:
    """nccl-tests-like table: latencies in µs, busbw in GB/s."""
    lines = [f"# hpccoll bench {result.get('collective')}  ranks {result.get('ranks')}  "
             f"backend {result.get('backend')}  dtype {result.get('dtype')}  "
             f"{result.get('machine', {}).get('gpu') or ''}"]
    sol = result.get("sol") or {}
    if result.get("sol_us"):
        lines.append(f"# SoL {result['sol_us']:.3f} us = 2*{sol.get('fence_ns', 0):.0f} ns fence + "
                     f"({sol.get('pingpong_roundtrip_ns', 0):.0f} ns ping-pong - 2*fence)/2; "
                     f"peer copy {sol.get('bw_GBps', 0):.1f} GB/s")
    floors = [(k[6:-3].replace("_", "+"), v) for k, v in sol.items() if k.startswith("floor_") and v]
    if floors:
        lines.append("# graph floor (us per launch of a kernel that does nothing: empty, or one "
                     "peer store; +pdl: programmatic launch): "
                     + ", ".join(f"{k} {v:.2f}" for k, v in floors))
    lines.append("# times: us per op (eager: blocking Python call; eager*: the same with the eager "
                 "engine running; req*: Start + Wait of a persistent request, engine running; "
                 f"engine order: {result.get('engine_order', 'stream')}; "
                 f"graph: per op in a CUDA graph of {GRAPH_OPS} calls (hpccoll's one-shot calls "
                 "captured back to back run as one node); unfused: the same, a node per call; group: per op in a CUDA graph of one "
                 f"group of {GRAPH_OPS} calls (comm.group(); NCCL: an NCCL group); in-kern: per op "
                 "inside one launch, the slope between loops of K and 4K ops; blocking: graph op + "
                 "device barrier - barrier)")
    lines.append("".join(h.rjust(w + 1) for h, w in COLUMNS))
    for r in result.get("rows", []):
        algo = r["algorithm"] + (f"({r['resolved']})" if r.get("resolved") else "")
        ok = {True: "yes", False: "NO", None: "-"}[r.get("ok")]
        cells = [fmt_bytes(r["bytes"]), r["count"], r["dtype"], algo[:17], *(r.get(k) for k in _ROW_CELLS), ok]
        lines.append("".join(c.rjust(w + 1) if isinstance(c, str) else " " + _cell(c, w)
                             for c, (_, w) in zip(cells, COLUMNS)))
    for k, v in (result.get("skipped") or {}).items():
        lines.append(f"# skipped {k}: {v}")
    return "\n".join(lines)


def write_json(result: dict, path: str) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")


def plot(result: dict, path: str) -> None:
    """Latency vs size (log-log): graph mode per algorithm / baseline, dashed in-kernel, SoL line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 6))
    by: dict[str, list] = {}
    for r in result.get("rows", []):
        by.setdefault(r["algorithm"], []).append(r)
    for i, (algo, rows) in enumerate(by.items()):
        rows = sorted(rows, key=lambda r: r["bytes"])
        color = f"C{i % 10}"
        pts = [(r["bytes"], r.get("graph_us") or r.get("eager_us")) for r in rows]
        pts = [p for p in pts if p[1]]
        if pts:
            mode = "graph" if any(r.get("graph_us") for r in rows) else "eager"
            ax.plot(*zip(*pts), "-o", ms=3, color=color, label=f"{algo} ({mode})")
        ik = [(r["bytes"], r["in_kernel_us"]) for r in rows if r.get("in_kernel_us")]
        if ik:
            ax.plot(*zip(*ik), "--", color=color, label=f"{algo} (in-kernel)")
    if result.get("sol_us"):
        ax.axhline(result["sol_us"], color="k", ls=":", label=f"SoL {result['sol_us']:.2f} us")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("latency per op (us)")
    m = result.get("machine", {})
    ax.set_title(f"hpccoll {result.get('collective')}: {m.get('gpu') or m.get('hostname')}, "
                 f"{result.get('ranks')} ranks, {result.get('dtype')}, {result.get('date', '')[:10]}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- provenance ----------------------------------------------------------------------------
def now() -> str:
    """UTC time of day, ISO 8601 to the second."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def machine_info(comm) -> dict:
    """Host, GPU, driver and CUDA versions of this rank (what is not known stays None)."""
    info = {"hostname": socket.gethostname(), "gpu": None, "driver": None, "cuda_runtime": None,
            "cuda_driver": None, "backend": comm.backend}
    if comm.device is not None:
        try:
            import cupy

            rt = cupy.cuda.runtime
            props = rt.getDeviceProperties(comm.device)
            name = props["name"]
            info["gpu"] = name.decode() if isinstance(name, bytes) else name
            info["cuda_runtime"] = rt.runtimeGetVersion()
            info["cuda_driver"] = rt.driverGetVersion()
            info["cupy"] = cupy.__version__
        except Exception:  # noqa: BLE001 - a record without these is still a record
            pass
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20)
            if out.returncode == 0:
                info["driver"] = out.stdout.strip().splitlines()[0]
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    return info
