"""Reproducibility and performance report from a directory of run JSON files.

build_report(DIR) reads every run JSON (schemas hpccoll-eigensolver/run/1 and /2) and failure
JSON there and writes report.md, report.json and PNG plots (matplotlib, when installed).  Runs
are grouped by configuration: the problem (its digest), n, ranks, comm and the options that
change the bits (config_digest: a subset of the eigenpairs among them), so two problems of the
same n never mix.  The solves of an --scf loop are problems of their own (A_j's digest); its
solve 0, the problem itself, shares a plain solve's configuration (the same bits)."""
from __future__ import annotations

import glob
import json
import os
from collections import defaultdict

import numpy as np

from . import metrics
from .runinfo import DEVICE_PEAK_KEYS, GcPauses, MemoryMeter

#: the reproducibility guarantee, as solve writes it into every run
#: what every metric of a run record means (the records and report.json carry it)
METRIC_DEFINITIONS = {**metrics.DEFINITIONS, **MemoryMeter.DEFINITIONS, **GcPauses.DEFINITIONS}

GUARANTEE = ("With a --comm that reduces in a fixed order (mpi, sentinel, ll; not ll128, whose floating-point "
             "atomics sum in arrival order; nccl as far as NCCL picks the same algorithm every run), two runs give "
             "bitwise identical eigenvalues and eigenvectors, the same on every rank, when their fixed "
             "configuration is equal: the problem (problem_digest), n, nb, ranks, comm, stedc, sytrd_mode, at one "
             "rank the divide and conquer's early subtrees (dc_early_leaves), the device and its library versions "
             "(machine), the BLAS/LAPACK library and its thread counts (machine.blas: a BLAS may split a sum by "
             "thread count) and the hpccoll commit.")

CLUSTER_RTOL = 1e-7
ATOMICS_NOTE = (
    "Floating-point atomics (and any unordered reduction) are exact for two contributions: "
    "a + b == b + a bit for bit, so run-to-run differences from reduction order can only "
    "appear when three or more contributions meet in one sum. Runs with 2 ranks therefore "
    "cannot show non-determinism of a 2-rank reduction; use >= 3 ranks to expose it.")


def load_runs(directory: str):
    runs, failures = [], []
    for path in sorted(glob.glob(os.path.join(directory, "*.json"))):
        if os.path.basename(path) == "report.json":
            continue
        try:
            with open(path) as f:
                rec = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        rec["_path"] = path
        schema = rec.get("schema", "")
        if schema.startswith("hpccoll-eigensolver/run/"):
            runs.append(rec)
        elif schema.startswith("hpccoll-eigensolver/failure/"):
            failures.append(rec)
    return runs, failures


def _key(rec) -> tuple:
    # records without config_digest (schema run/1) fall back to the options they recorded
    cfg = rec.get("config_digest") or json.dumps([rec.get("nb"), rec.get("stedc"), rec.get("cond_b"),
                                                   rec.get("seed")])
    return (rec["problem"], rec["n"], rec["ranks"], rec["comm"], cfg)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return float(np.median(xs)) if xs else None


def _load_x(directory: str, rec):
    name = rec.get("eigenvectors_file")
    if not name:
        return None
    path = os.path.join(directory, name)
    # memory-mapped: X of a large run is read a column block at a time by the comparisons
    return np.load(path, mmap_mode="r") if os.path.exists(path) else None


def analyse_group(directory: str, recs: list[dict]) -> dict:
    recs = sorted(recs, key=lambda r: r["repeat_index"])
    r0 = recs[0]
    w0 = np.asarray(r0["eigenvalues"])
    X0 = _load_x(directory, r0)
    groups = metrics.clusters(w0, CLUSTER_RTOL)
    per_run = []
    for rec in recs:
        w = np.asarray(rec["eigenvalues"])
        ulp = metrics.ulp_distance(w, w0) if w.shape == w0.shape else None
        entry = {
            "run": rec["repeat_index"],
            "eigenvalues_sha256": rec["eigenvalues_sha256"],
            "eigenvectors_sha256": rec["eigenvectors_sha256"],
            "per_rank": rec.get("per_rank", []),
            "ranks_agree_on_eigenvalues": rec.get("ranks_agree_on_eigenvalues"),
            "max_ulp_to_run0": float(ulp.max()) if ulp is not None and ulp.size else None,
            "median_ulp_to_run0": float(np.median(ulp)) if ulp is not None and ulp.size else None,
            "max_eigvec_diff_to_run0": None, "max_cluster_angle_to_run0": None,
        }
        X = _load_x(directory, rec) if X0 is not None else None
        if X is not None and rec["eigenvectors_sha256"] == r0["eigenvectors_sha256"]:
            entry["max_eigvec_diff_to_run0"] = 0.0  # bitwise identical
            entry["max_cluster_angle_to_run0"] = 0.0 if groups else None
        elif X is not None and X.shape == X0.shape:
            Xa = metrics.align_signs(X, X0)
            norms = np.linalg.norm(X0, axis=0)
            norms[norms == 0] = 1.0
            entry["max_eigvec_diff_to_run0"] = float(np.max(np.linalg.norm(Xa - X0, axis=0) / norms))
            entry["max_cluster_angle_to_run0"] = metrics.max_subspace_angle(X, X0, groups)
        per_run.append(entry)
    rank_digests = defaultdict(set)
    for rec in recs:
        for pr in rec.get("per_rank", []):
            rank_digests[pr["rank"]].add(pr["local_eigenvectors_sha256"])
    phases = defaultdict(list)
    for rec in recs:
        for k, v in rec["phases"].items():
            phases[k].append(v)
    coll = [rec.get("collectives") or {} for rec in recs]
    mem = _memory(recs)
    return {
        "problem": r0["problem"], "n": r0["n"], "ranks": r0["ranks"], "comm": r0["comm"],
        "subset": r0.get("subset"), "scf_index": (r0.get("scf") or {}).get("index") or None,
        "problem_digest": r0.get("problem_digest"), "config_digest": r0.get("config_digest"),
        "stedc": r0.get("stedc"), "sytrd_mode": r0.get("sytrd_mode"), "memory": mem,
        "blas": _blas_summary(r0),
        "backend": r0.get("backend"), "device": r0.get("device"), "nb": r0.get("nb"),
        "runs": len(recs),
        "distinct_eigenvalue_digests": len({r["eigenvalues_sha256"] for r in recs}),
        "distinct_eigenvector_digests": len({r["eigenvectors_sha256"] for r in recs}),
        "distinct_local_block_digests_per_rank": {str(k): len(v) for k, v in sorted(rank_digests.items())},
        "ranks_agree_on_eigenvalues_all_runs": all(bool(r.get("ranks_agree_on_eigenvalues")) for r in recs),
        "max_ulp_to_run0": max((e["max_ulp_to_run0"] or 0.0) for e in per_run),
        "median_ulp_to_run0": _median([e["median_ulp_to_run0"] for e in per_run[1:]]) if len(per_run) > 1 else 0.0,
        "max_eigvec_diff_to_run0": max((e["max_eigvec_diff_to_run0"] or 0.0) for e in per_run)
        if X0 is not None else None,
        "max_cluster_angle_to_run0": max((e["max_cluster_angle_to_run0"] or 0.0) for e in per_run)
        if X0 is not None and groups else None,
        "clusters": len(groups), "cluster_rtol": CLUSTER_RTOL,
        "per_run": per_run,
        "median_phase_seconds": {k: _median(v) for k, v in phases.items()},
        "median_solve_seconds": _median([r["solve_seconds"] for r in recs]),
        "collective_count": coll[0].get("count"), "collective_bytes": coll[0].get("bytes"),
        "median_collective_seconds": _median([c.get("seconds") for c in coll]),
        "median_collective_share": _median([c.get("share_of_solve") for c in coll]),
        "collectives_by_name": coll[0].get("by_name"), "collective_sizes": coll[0].get("sizes"),
        "collectives_by_phase": {ph: sum(v["count"] for v in d.values())
                                 for ph, d in (coll[0].get("by_phase") or {}).items()},
        "residual": [r["residual"] for r in recs], "b_orthogonality": [r["b_orthogonality"] for r in recs],
        "eigenvalue_error": [r.get("eigenvalue_error") for r in recs],
        "eigenvalue_error_vs_scipy": [r.get("eigenvalue_error_vs_scipy") for r in recs],
        "eigenvalue_error_definition": r0.get("eigenvalue_error_definition"),
        "machine": r0.get("machine"), "git_commit": r0.get("git_commit"),
        "gpus_used": (r0.get("machine") or {}).get("gpus_used"),
        "w0": w0,
    }


def _memory(recs: list[dict]) -> dict:
    """Per configuration: the largest per-rank peak over runs (host RSS, NumPy data or tracemalloc,
    device pool, nvidia-smi), and rank 0's and the other ranks' separately (rank 0 holds the
    reference)."""
    out = {}
    for key in ("peak_rss_bytes", "numpy_peak_bytes", "tracemalloc_peak_bytes", "device_pool_solve_peak_bytes",
                "device_pool_peak_bytes", "nvidia_smi_used_bytes"):
        per_rank = defaultdict(list)
        for rec in recs:
            for m in (rec.get("memory") or {}).get("per_rank", []):
                if m.get(key) is not None:
                    per_rank[m["rank"]].append(m[key])
        if per_rank:
            out[key] = {"max": max(max(v) for v in per_rank.values()),
                        "rank0": max(per_rank.get(0, [0])),
                        "others": max((max(v) for r, v in per_rank.items() if r != 0), default=None)}
    return out


def _numpy_peak(m: dict, mib) -> str:
    """The NumPy data column: the handler's count, else tracemalloc's (marked tm), else '–'."""
    if m.get("numpy_peak_bytes"):
        return mib(m["numpy_peak_bytes"])
    return f"{mib(m['tracemalloc_peak_bytes'])} tm" if m.get("tracemalloc_peak_bytes") else "–"


def _blas_summary(rec: dict) -> str | None:
    blas = ((rec.get("machine") or {}).get("blas") or {})
    libs = blas.get("libraries") or []
    if not libs:
        return None
    return ", ".join(f"{lib.get('internal_api')} {lib.get('version')} x{lib.get('num_threads')}"
                     for lib in libs if lib.get("internal_api"))


def _fmt(x, spec=".3g"):
    if x is None:
        return "–"
    if isinstance(x, float):
        return format(x, spec)
    return str(x)


def _cross_config(groups: list[dict]) -> list[dict]:
    """Eigenvalue ULP distance of each configuration's run 0 to the first configuration's run 0."""
    out = []
    by_problem = defaultdict(list)
    for g in groups:
        by_problem[_problem_key(g)].append(g)
    for (problem, n, *_), gs in by_problem.items():
        problem = _problem_label(gs[0])
        base = gs[0]
        for g in gs:
            d = metrics.ulp_distance(g["w0"], base["w0"]) if g["w0"].shape == base["w0"].shape else None
            out.append({"problem": problem, "n": n, "config": f"{g['comm']} ({g['ranks']} ranks)",
                        "base": f"{base['comm']} ({base['ranks']} ranks)",
                        "max_ulp": float(d.max()) if d is not None and d.size else None,
                        "median_ulp": float(np.median(d)) if d is not None and d.size else None})
    return out


#: the configurations a solve is compared against, where present: the reference solvers and
#: the collective paths of NCCL and MPI
BASELINES = ("cusolvermp", "single-gpu", "nccl", "mpi")


def _label(g: dict) -> str:
    return f"{g['comm']} ({g['ranks']} rank{'s' if g['ranks'] != 1 else ''})"


def _problem_key(g: dict) -> tuple:
    """What configurations must share to be compared: the problem (its digest, so an --scf
    loop's solves apart), n and the subset of eigenpairs."""
    return (g["problem"], g["n"], str(g.get("problem_digest")), str(g.get("subset")))


def _problem_label(g: dict) -> str:
    """The problem as the tables name it: with its subset (LO:HI) and --scf solve, if any."""
    subset, j = g.get("subset"), g.get("scf_index")
    return g["problem"] + (f" subset {subset[0]}:{subset[1]}" if subset else "") + (f" scf solve {j}" if j else "")


def _comparisons(groups: list[dict]) -> dict:
    """Per problem and n, the numbers a reader compares (no verdicts): each configuration's
    median solve time and its ratio to the fastest baseline present (BASELINES; time over the
    baseline's, < 1 is faster), and each several-rank configuration's per-rank peak memory
    against the one-rank share (the same comm's one-rank peak / ranks)."""
    time_rows, memory_rows = [], []
    by_problem = defaultdict(list)
    for g in groups:
        by_problem[_problem_key(g)].append(g)
    for (problem, n, *_), gs in sorted(by_problem.items(), key=lambda kv: kv[0]):
        problem = _problem_label(gs[0])
        timed = [g for g in gs if g["median_solve_seconds"]]
        bases = [g for g in timed if g["comm"] in BASELINES]
        base = min(bases, key=lambda g: g["median_solve_seconds"]) if bases else None
        for g in sorted(timed, key=lambda g: (g["ranks"], g["comm"])):
            t = g["median_solve_seconds"]
            time_rows.append({"problem": problem, "n": n, "config": _label(g), "median_solve_seconds": t,
                              "baseline": _label(base) if base else None,
                              "baseline_median_solve_seconds": base["median_solve_seconds"] if base else None,
                              "time_over_baseline": t / base["median_solve_seconds"] if base else None})
        one_rank = {g["comm"]: g for g in gs if g["ranks"] == 1}
        for g in sorted(gs, key=lambda g: (g["ranks"], g["comm"])):
            single = one_rank.get(g["comm"])
            mine, kind = _peak(g)
            theirs, their_kind = _peak(single) if single else (None, None)
            if g["ranks"] > 1 and mine and theirs and kind == their_kind:
                share = theirs / g["ranks"]
                memory_rows.append({"problem": problem, "n": n, "config": _label(g), "memory": kind,
                                    "per_rank_peak_bytes": mine, "one_rank_peak_bytes": theirs,
                                    "one_rank_share_bytes": share, "per_rank_over_share": mine / share})
    return {"time": time_rows, "memory": memory_rows}


def _peak(g: dict) -> tuple[int | None, str | None]:
    """The configuration's largest per-rank peak of the solve and what it counts: the device pool
    (GPU), else the NumPy arrays (host), else tracemalloc's count."""
    dev = _device_peak(g)
    if dev:
        return dev, "device pool"
    m = g.get("memory") or {}
    for key, kind in (("numpy_peak_bytes", "NumPy data"), ("tracemalloc_peak_bytes", "tracemalloc")):
        if (m.get(key) or {}).get("max"):
            return m[key]["max"], kind
    return None, None


def _device_peak(g: dict) -> int | None:
    """The configuration's largest per-rank device pool peak of the solve (of the solve and its
    metrics in records that lack the former)."""
    m = g.get("memory") or {}
    for key in DEVICE_PEAK_KEYS:
        if (m.get(key) or {}).get("max"):
            return m[key]["max"]
    return None


def _plots(directory: str, groups: list[dict]) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    paths = []
    labels = [f"{g['comm']}\n{g['ranks']}r n={g['n']}" + (f"\n{_problem_label(g)}" if g.get("subset") or
                                                          g.get("scf_index") else "") for g in groups]
    phase_names = []
    for g in groups:
        for k in g["median_phase_seconds"]:
            if k not in phase_names:
                phase_names.append(k)
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(groups) + 2), 4.5))
    bottom = np.zeros(len(groups))
    for ph in phase_names:
        vals = np.array([g["median_phase_seconds"].get(ph) or 0.0 for g in groups])
        ax.bar(labels, vals, bottom=bottom, label=ph)
        bottom += vals
    coll = np.array([g["median_collective_seconds"] or 0.0 for g in groups])
    ax.scatter(labels, coll, color="black", marker="_", s=400, zorder=3, label="in collectives")
    ax.set_ylabel("seconds (median over runs)")
    ax.set_title("Phase times per configuration")
    ax.legend(fontsize=8)
    fig.tight_layout()
    p = os.path.join(directory, "phases.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)

    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(groups) + 2), 4.5))
    for i, g in enumerate(groups):
        ys = [e["max_ulp_to_run0"] or 0.0 for e in g["per_run"]]
        ax.scatter([i] * len(ys), np.array(ys) + 1.0, alpha=0.7)
    ax.set_xticks(range(len(groups)), labels)
    ax.set_yscale("log")
    ax.set_ylabel("1 + max eigenvalue ULP distance to run 0")
    ax.set_title("Run-to-run eigenvalue differences (1 = bitwise identical)")
    fig.tight_layout()
    p = os.path.join(directory, "ulp.png")
    fig.savefig(p, dpi=110)
    plt.close(fig)
    paths.append(p)
    return paths


def build_report(directory: str) -> list[str]:
    """Write report.md, report.json and plots into directory; returns their paths."""
    runs, failures = load_runs(directory)
    by_key = defaultdict(list)
    for rec in runs:
        by_key[_key(rec)].append(rec)
    groups = [analyse_group(directory, recs) for _, recs in sorted(by_key.items(), key=lambda kv: kv[0])]
    cross = _cross_config(groups)
    pngs = _plots(directory, groups) if groups else []
    rank_counts = sorted({g["ranks"] for g in groups})

    md = ["# hpccoll eigensolver: reproducibility report", ""]
    if groups:
        m = groups[0]["machine"] or {}
        md += [f"Machine: {m.get('hostname')} — {m.get('gpu') or m.get('cpu')}; git {groups[0]['git_commit']}.",
               f"Rank counts used: {', '.join(map(str, rank_counts))}.", ""]
    md += ["> " + ATOMICS_NOTE, "", "> " + GUARANTEE, ""]
    blas = sorted({g["blas"] for g in groups if g.get("blas")})
    if blas:
        md += [f"BLAS/LAPACK (library, version x threads): {'; '.join(blas)}.", ""]
    if rank_counts and max(rank_counts) < 3:
        md += ["**Only runs with fewer than 3 ranks are present: reduction-order non-determinism "
               "cannot show up here.**", ""]
    md += ["## Reproducibility", "",
           "| problem | n | ranks | comm | backend | config | runs | distinct w digests | distinct X digests | "
           "ranks agree on w | max ULP to run 0 | median ULP to run 0 | max eigvec diff | max cluster angle (rad) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for g in groups:
        md.append(f"| {_problem_label(g)} | {g['n']} | {g['ranks']} | {g['comm']} | {g['backend']} | "
                  f"{(g.get('config_digest') or '–')[:10]} | {g['runs']} | "
                  f"{g['distinct_eigenvalue_digests']} | {g['distinct_eigenvector_digests']} | "
                  f"{'yes' if g['ranks_agree_on_eigenvalues_all_runs'] else 'NO'} | {_fmt(g['max_ulp_to_run0'], 'g')} | "
                  f"{_fmt(g['median_ulp_to_run0'], 'g')} | {_fmt(g['max_eigvec_diff_to_run0'])} | "
                  f"{_fmt(g['max_cluster_angle_to_run0'])} |")
    md += ["", f"Eigenvector differences: max over columns of ||s·x − x₀||/||x₀|| after sign alignment; "
           f"cluster angles: largest principal angle between the subspaces of eigenvalue clusters "
           f"(neighbours closer than {CLUSTER_RTOL:g}·max|λ|). '–': eigenvectors not saved or no clusters.", ""]
    md += ["### Digests per run and rank", ""]
    for g in groups:
        md += [f"**{g['comm']}, {g['ranks']} ranks, {_problem_label(g)} n={g['n']}** "
               f"(distinct local-block digests per rank: {g['distinct_local_block_digests_per_rank']})", "",
               "| run | SHA-256 w | SHA-256 X | per-rank SHA-256 w | per-rank SHA-256 local X |", "|---|---|---|---|---|"]
        for e in g["per_run"]:
            pw = " ".join(p["eigenvalues_sha256"][:12] for p in e["per_rank"])
            px = " ".join((p["local_eigenvectors_sha256"] or "–")[:12] for p in e["per_rank"])
            md.append(f"| {e['run']} | {e['eigenvalues_sha256'][:16]} | {(e['eigenvectors_sha256'] or '–')[:16]} | "
                      f"{pw} | {px} |")
        md.append("")
    if cross:
        md += ["### Across configurations (run 0 of each against the first configuration)", "",
               "| problem | n | config | vs | max ULP | median ULP |", "|---|---|---|---|---|---|"]
        for c in cross:
            md.append(f"| {c['problem']} | {c['n']} | {c['config']} | {c['base']} | "
                      f"{_fmt(c['max_ulp'], 'g')} | {_fmt(c['median_ulp'], 'g')} |")
        md.append("")
    phase_names = []
    for g in groups:
        for k in g["median_phase_seconds"]:
            if k not in phase_names:
                phase_names.append(k)
    time_cols = ["problem", "comm", "ranks", "n", *phase_names, "solve", "in collectives", "share", "collectives",
                 "bytes"]
    md += ["## Time (median over runs, seconds)", "",
           "| " + " | ".join(time_cols) + " |", "|---" * len(time_cols) + "|"]
    for g in groups:
        ph = " | ".join(_fmt(g["median_phase_seconds"].get(k), ".4f") for k in phase_names)
        share = g["median_collective_share"]
        md.append(f"| {_problem_label(g)} | {g['comm']} | {g['ranks']} | {g['n']} | {ph} | "
                  f"{_fmt(g['median_solve_seconds'], '.4f')} | "
                  f"{_fmt(g['median_collective_seconds'], '.4f')} | "
                  f"{'–' if share is None else f'{100 * share:.1f}%'} | {_fmt(g['collective_count'])} | "
                  f"{_fmt(g['collective_bytes'])} |")
    md += ["", "Collectives per configuration (count per phase; sizes as power-of-two buckets):", ""]
    for g in groups:
        names = ", ".join(f"{k} {v['count']}× ({v['min_bytes']}–{v['max_bytes']} B)"
                          for k, v in (g["collectives_by_name"] or {}).items())
        md.append(f"- {g['comm']} {g['ranks']}r, {_problem_label(g)}: {names}; "
                  f"per phase {g['collectives_by_phase']}; "
                  f"sizes {g['collective_sizes']}")
    md += ["", "## Memory (per rank, max over runs, MiB)", "",
           "Host: peak RSS of the process during the solve and its metrics; NumPy data: peak of the NumPy "
           "arrays made during the solve and alive at once (where the counting extension was not built: "
           "tracemalloc's peak of traced Python/NumPy allocations, marked tm); device: CuPy pool high-water "
           "mark when the solve returned and at the end of its metrics, and nvidia-smi's per-process figure. "
           "rank 0 / other ranks shown apart: rank 0 also held the gathered A and B for the scipy reference "
           "(small n only).", "",
           "| problem | comm | ranks | n | peak RSS rank 0 | peak RSS others | NumPy data max | "
           "device pool max, solve | device pool max, with metrics | nvidia-smi max |",
           "|---|---|---|---|---|---|---|---|---|---|"]

    def mib(d, part="max"):
        v = (d or {}).get(part)
        return "–" if v is None else f"{v / 2**20:.0f}"

    for g in groups:
        m = g["memory"]
        md.append(f"| {_problem_label(g)} | {g['comm']} | {g['ranks']} | {g['n']} | "
                  f"{mib(m.get('peak_rss_bytes'), 'rank0')} | "
                  f"{mib(m.get('peak_rss_bytes'), 'others')} | {_numpy_peak(m, mib)} | "
                  f"{mib(m.get('device_pool_solve_peak_bytes'))} | {mib(m.get('device_pool_peak_bytes'))} | "
                  f"{mib(m.get('nvidia_smi_used_bytes'))} |")
    md += ["", "## Accuracy", "",
           f"residual = ‖AX − BXΛ‖_F/(n‖A‖_F‖X‖_F ε) and B-orth = ‖XᵀBX − I‖_F/(nε), both in units of nε "
           f"(ε = 2⁻⁵²; O(1) is a correct solve), computed from the ranks' column blocks; eigenvalue error = "
           f"{metrics.EIGENVALUE_ERROR_DEFINITION} against the constructed spectrum (known/clustered/wilkinson; "
           "its rounding when forming A and B contributes O(ε·cond(B))) and against scipy.linalg.eigh(A, B) "
           "(on rank 0, A and B gathered there, small n only). Max over runs."
           + (f" With a subset LO:HI of the eigenpairs X is n x k, B-orth in units of k ε, and the eigenvalue "
              f"error {metrics.SUBSET_EIGENVALUE_ERROR_DEFINITION}." if any(g.get("subset") for g in groups) else ""),
           "",
           "| problem | n | comm | ranks | residual | B-orth | eig. error (known) | eig. error (scipy) |",
           "|---|---|---|---|---|---|---|---|"]

    def mx(xs):
        xs = [x for x in xs if x is not None]
        return max(xs) if xs else None

    for g in groups:
        md.append(f"| {_problem_label(g)} | {g['n']} | {g['comm']} | {g['ranks']} | {_fmt(mx(g['residual']))} | "
                  f"{_fmt(mx(g['b_orthogonality']))} | {_fmt(mx(g['eigenvalue_error']))} | "
                  f"{_fmt(mx(g['eigenvalue_error_vs_scipy']))} |")
    comparisons = _comparisons(groups)
    if comparisons["time"]:
        md += ["", "## Comparisons", "",
               "Median solve time of each configuration and its ratio to the fastest of the baselines present "
               f"({', '.join(BASELINES)}) for the same problem and n: time / the baseline's time (below 1: "
               "faster than the baseline). From this directory only.", "",
               "| problem | n | config | median solve (s) | fastest baseline | its median (s) | time / baseline |",
               "|---|---|---|---|---|---|---|"]
        md += [f"| {c['problem']} | {c['n']} | {c['config']} | {c['median_solve_seconds']:.4f} | "
               f"{c['baseline'] or '–'} | {_fmt(c['baseline_median_solve_seconds'], '.4f')} | "
               f"{_fmt(c['time_over_baseline'], '.2f')} |" for c in comparisons["time"]]
    if comparisons["memory"]:
        md += ["", "Per-rank peak memory of the solve against the one-rank share (the same comm's one-rank "
               "peak / ranks), MiB:", "",
               "| problem | n | config | memory | per rank | one rank | one-rank share | per rank / share |",
               "|---|---|---|---|---|---|---|---|"]
        md += [f"| {c['problem']} | {c['n']} | {c['config']} | {c['memory']} | "
               f"{c['per_rank_peak_bytes'] / 2**20:.0f} | {c['one_rank_peak_bytes'] / 2**20:.0f} | "
               f"{c['one_rank_share_bytes'] / 2**20:.0f} | {c['per_rank_over_share']:.2f} |"
               for c in comparisons["memory"]]
    notes = os.path.join(directory, "analysis.md")
    if os.path.exists(notes):  # a person's analysis of what the numbers show (kept with the runs)
        with open(notes) as f:
            md += ["", "## Analysis", "", f.read().strip()]
    if failures:
        md += ["", "## Configurations that did not run", ""]
        for f in failures:
            tail = (f.get("error") or "").strip().splitlines()[-3:]
            why = f.get("reason") or f"exit {f.get('returncode')}"
            md.append(f"- **{f['comm']}** ({f.get('ranks')} ranks, {why}): "
                      + " / ".join(t.strip() for t in tail))
    if pngs:
        md += ["", "## Plots", ""] + [f"![{os.path.basename(p)}]({os.path.basename(p)})" for p in pngs]
    md.append("")

    md_path = os.path.join(directory, "report.md")
    with open(md_path, "w") as f:
        f.write("\n".join(md))
    js_path = os.path.join(directory, "report.json")
    with open(js_path, "w") as f:
        json.dump({"schema": "hpccoll-eigensolver/report/2", "note": ATOMICS_NOTE, "reproducibility": GUARANTEE,
                   "metric_definitions": METRIC_DEFINITIONS,
                   "rank_counts": rank_counts,
                   "configurations": [{k: v for k, v in g.items() if k != "w0"} for g in groups],
                   "across_configurations": cross, "comparisons": comparisons,
                   "failures": [{k: v for k, v in f.items() if k != "_path"} for f in failures]},
                  f, indent=1, default=str)
    return [md_path, js_path] + pngs
