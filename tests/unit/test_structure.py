"""The shape of the library, checked: no import cycles, one source for the ABI, focused modules,
a wheel that holds the library only, and product text free of process words."""
from __future__ import annotations

import ast
import ctypes
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from hpccoll import _abi

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"hpccoll": ROOT / "hpccoll", "hpccoll_eigensolver": ROOT / "apps" / "eigensolver"}


# -- the import graph ----------------------------------------------------------------------
def _modules() -> dict[str, Path]:
    mods = {}
    for pkg, base in PACKAGES.items():
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module of ours that `name` imports, at module level or inside functions."""
    is_pkg = path.name == "__init__.py"
    here = name if is_pkg else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here.split(".")
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            targets = [prefix] + [f"{prefix}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return comps


def test_no_import_cycles():
    mods = _modules()
    known = set(mods)
    graph = {m: _imports(m, p, known) for m, p in mods.items()}
    # a package's __init__ re-exporting its own submodules is not a cycle of design
    for m in graph:
        graph[m] = {t for t in graph[m] if not (m.startswith(t + ".") and mods[t].name == "__init__.py")}
    assert not _cycles(graph), f"import cycles: {_cycles(graph)}"


def test_the_app_uses_only_public_hpccoll_names():
    """apps/eigensolver imports hpccoll's public modules only (no hpccoll._* or backends)."""
    bad = []
    public = {"hpccoll", "hpccoll.ext", "hpccoll.errors", "hpccoll.ops", "hpccoll.config", "hpccoll.mps"}
    for path in PACKAGES["hpccoll_eigensolver"].rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            for n in names:
                if n.startswith("hpccoll") and not n.startswith("hpccoll_eigensolver") and n not in public:
                    bad.append(f"{path.name}: {n}")
            if isinstance(node, ast.Attribute) and node.attr in ("_backend", "_device", "_host", "__dict__"):
                bad.append(f"{path.name}:{node.lineno}: .{node.attr}")
    assert not bad, bad


def test_the_eigensolver_library_imports_nothing_of_its_app():
    """hpccoll_eigensolver.linalg (the solver) imports no module of the app around it (CLI, runs,
    problems, reports, counters): timers come in as arguments."""
    mods = _modules()
    known = set(mods)
    lib = "hpccoll_eigensolver.linalg"
    bad = {m: sorted(t for t in _imports(m, p, known)
                     if t.startswith("hpccoll_eigensolver") and t != lib and not t.startswith(lib + "."))
           for m, p in mods.items() if m == lib or m.startswith(lib + ".")}
    bad = {m: ts for m, ts in bad.items() if ts}
    assert len([m for m in mods if m.startswith(lib + ".")]) > 10
    assert not bad, f"linalg imports the app: {bad}"


def test_only_the_factory_constructs_backends():
    """hpccoll.backends.factory is the one place a backend is constructed: no other module of the
    library calls a backend class (tests build theirs from fakes)."""
    made = re.compile(r"\b(HostBackend|CudaBackend|NcclBackend|Hierarchical)\(")
    factory = PACKAGES["hpccoll"] / "backends" / "factory.py"
    bad = []
    for base in PACKAGES.values():
        for path in base.rglob("*.py"):
            if path == factory:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call):
                    f = node.func
                    name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
                    if made.match(name + "("):
                        bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}(")
    assert not bad, bad
    assert made.search(factory.read_text())


def test_the_bench_reads_no_private_attribute_of_a_communicator():
    """hpccoll.bench reaches the backends through Communicator.backends (docs/api.md), never
    through a communicator's private attributes."""
    bad = []
    for path in (PACKAGES["hpccoll"] / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("_backend", "_backends", "_host", "_comm"):
                bad.append(f"{path.name}:{node.lineno}: .{node.attr}")
            elif isinstance(node, ast.ImportFrom) and node.module == "comm" and node.level == 2 and any(
                    a.name.startswith("_") for a in node.names):
                bad.append(f"{path.name}:{node.lineno}: a private name of hpccoll.comm")
    assert not bad, bad


# -- one source for the ABI ------------------------------------------------------------------
def test_the_header_is_parsed_completely():
    text = (_abi.cuda_dir() / "hc_abi.h").read_text()
    defined = set(re.findall(r"^\s*#define\s+(HC_\w+)\s", text, re.M))
    assert defined == set(_abi.CONSTANTS), f"not read: {sorted(defined - set(_abi.CONSTANTS))}"
    assert set(re.findall(r"^struct (\w+)", text, re.M)) == set(_abi.STRUCTS)
    a = _abi.Args
    assert ctypes.sizeof(a) == 8 * _abi.MAX_RANKS + 8 * 9 + 4 * 4
    assert a.in_.offset == 8 * _abi.MAX_RANKS and a.rank.offset == ctypes.sizeof(a) - 16
    g = _abi.Group
    assert g.in_.offset == 8 * (_abi.GROUP_MAX + 1) and ctypes.sizeof(g) % 8 == 0


def test_the_parser_follows_a_changed_header():
    consts, structs = _abi.parse("#define HC_A 4\n#define HC_B (HC_A * 2 + 1) // nine\n"
                                 "struct S {\n  u64 x[HC_B];  // c\n  const void* in;\n  int n;\n};\n")
    assert consts == {"HC_A": 4, "HC_B": 9}
    assert ctypes.sizeof(structs["S"]) == 9 * 8 + 8 + 8 and structs["S"].in_.offset == 72


def _int_literal(node) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return True
    if isinstance(node, ast.BinOp):
        return _int_literal(node.left) and _int_literal(node.right)
    if isinstance(node, ast.UnaryOp):
        return _int_literal(node.operand)
    return False


def test_no_python_literal_duplicates_a_header_value():
    """Python takes every shared number from cuda/hc_abi.h: no UPPER_CASE constant named like a
    header constant is assigned a literal, no literal assignment cites an HC_ name, and no dict of
    dtype or op names to literal codes exists."""
    stems = {n[3:] for n in _abi.CONSTANTS}
    codes = set(_abi.DTYPE_CODES) | set(_abi.OP_CODES)
    bad = []
    for path in (ROOT / "hpccoll").rglob("*.py"):
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, ast.Assign) and _int_literal(node.value):
                for t in node.targets:
                    if isinstance(t, ast.Name) and t.id.isupper() and t.id in stems:
                        bad.append(f"{path.name}:{node.lineno}: {t.id} = literal (cuda/hc_abi.h has HC_{t.id})")
                if re.search(r"#.*\bHC_[A-Z]", lines[node.lineno - 1]):
                    bad.append(f"{path.name}:{node.lineno}: a literal citing a header name")
            if isinstance(node, ast.Dict) and node.keys and all(
                    isinstance(k, ast.Constant) and k.value in codes for k in node.keys) and all(
                    _int_literal(v) for v in node.values):
                bad.append(f"{path.name}:{node.lineno}: a dict of literal codes (use hpccoll._abi)")
    assert not bad, "\n".join(bad)


# -- focused modules ---------------------------------------------------------------------------
def test_the_cuda_backend_modules_stay_focused():
    sizes = {p.name: len(p.read_text().splitlines()) for p in (ROOT / "hpccoll" / "backends" / "cuda").glob("*.py")}
    assert max(sizes.values()) <= 320, sizes


# -- the wheel --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def wheel_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (whl,) = out.glob("hpccoll-*.whl")
    with zipfile.ZipFile(whl) as z:
        return [n for n in z.namelist() if ".dist-info/" not in n]


def test_the_wheel_holds_the_library_only(wheel_files):
    kernels = sorted(n for n in wheel_files if n.startswith("hpccoll/cuda/"))
    assert kernels == sorted(f"hpccoll/cuda/{f.name}" for f in (ROOT / "cuda").iterdir()
                             if f.suffix in (".cu", ".cuh", ".h"))
    assert not [n for n in wheel_files if "lab" in Path(n).name], "lab files in the wheel"
    assert not [n for n in wheel_files if n.startswith(("bench/", "tests/", "docs/"))]
    assert "hpccoll/ext.py" in wheel_files and "hpccoll_eigensolver/linalg/driver.py" in wheel_files
    for src in ("linalg/sytrd_step.cu", "linalg/sytrd_abi.h", "linalg/stedc/dc_kernels.cu"):
        assert f"hpccoll_eigensolver/{src}" in wheel_files, f"{src} is not in the wheel"


# -- product text ------------------------------------------------------------------------------
PROCESS = re.compile(r"\bsession \d|\bsessions? \d|\bissue #|\bissue \d|\bstop \d", re.I)
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,12}\b")
# a record's name in bench/results carries the commit it ran on (date-machine-commit-what): citing
# the record is allowed, a commit id anywhere else is not
RECORD = re.compile(r"\b20\d\d-\d\d-\d\d-[\w.{},/-]+")


def _product_files():
    for base in ("hpccoll", "cuda", "apps", "docs", "slurm"):
        for p in (ROOT / base).rglob("*"):
            if p.is_file() and p.suffix in (".py", ".cu", ".cuh", ".h", ".md", ".sh", ".sbatch", ".json"):
                yield p
    yield ROOT / "README.md"
    yield ROOT / "bench" / "README.md"
    yield ROOT / "bench" / "results" / "README.md"


def test_no_process_words_or_commit_ids_in_the_product():
    bad = []
    for p in _product_files():
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if PROCESS.search(line):
                bad.append(f"{p.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
            elif p.suffix != ".json" and COMMIT.search(RECORD.sub("", line)) and "0x" not in line:
                bad.append(f"{p.relative_to(ROOT)}:{n}: commit-like id: {line.strip()[:100]}")
    assert not bad, "\n".join(bad[:40]) + (f"\n... {len(bad)} in all" if len(bad) > 40 else "")


# -- cited paths and records ---------------------------------------------------------------------
RESULTS = ROOT / "bench" / "results"
CITING = ("README.md", "bench/README.md", *(f"docs/{p.name}" for p in sorted((ROOT / "docs").glob("*.md"))))
# a path of the tree written in prose or code spans (not part of a longer path such as hpccoll/bench/)
TREE_PATH = re.compile(r"(?<![\w./-])(?:apps|bench|cuda|docs|hpccoll|slurm|tests)/[\w.{},*/-]*[\w}*/]")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
# the index names its records relative to bench/results
INDEX_NAME = re.compile(r"`((?:eigensolver/)?20\d\d-\d\d-\d\d-[\w.{},*/-]+)`")


def _expand(pattern: str) -> list[str]:
    """`a.{txt,json}` -> a.txt, a.json (one brace group)."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if not m:
        return [pattern]
    return [x for alt in m.group(1).split(",") for x in _expand(pattern[:m.start()] + alt + pattern[m.end():])]


def _resolve(base: Path, cited: str) -> list[Path]:
    """The files and folders a citation names; empty when none exists."""
    out = []
    for name in _expand(cited.rstrip(".,;:")):
        out += list(base.glob(name)) if "*" in name else [base / name] if (base / name).exists() else []
    return out


def _citations() -> dict[str, list[tuple[str, str]]]:
    """doc -> [(cited path, how it was found)], tree paths and relative links."""
    cites = {}
    for doc in CITING:
        text = (ROOT / doc).read_text()
        found = [(ROOT, m) for m in TREE_PATH.findall(text)]
        found += [((ROOT / doc).parent, m) for m in LINK.findall(text) if "://" not in m]
        if doc == "bench/README.md":
            found += [(ROOT / "bench", m) for m in re.findall(r"`((?:kernels|results)/[\w.*/-]+)`", text)]
        cites[doc] = found
    index = RESULTS / "README.md"
    cites["bench/results/README.md"] = [(RESULTS, m) for m in INDEX_NAME.findall(index.read_text())]
    for report in sorted(RESULTS.rglob("*.md")):  # a record's own report: its links
        if report != index:
            cites[str(report.relative_to(ROOT))] = [(report.parent, m) for m in LINK.findall(report.read_text())
                                                    if "://" not in m]
    return cites


def test_every_cited_path_exists():
    """Every path the README, docs/*.md, bench/README.md and the results index name exists, and
    every link of a report in bench/results."""
    bad = [f"{doc}: {cited}" for doc, found in _citations().items()
           for base, cited in found if not _resolve(base, cited)]
    assert not bad, "cited but missing:\n" + "\n".join(bad)


def test_every_record_is_cited_by_the_docs_and_indexed():
    """bench/results holds the records the documentation cites and nothing else: each file is named
    (or its job folder is) by README.md, docs/*.md or bench/README.md, and listed in the index."""
    cites = _citations()

    def covered(docs) -> set[Path]:
        files = set()
        for doc in docs:
            for base, cited in cites[doc]:
                for p in _resolve(base, cited):
                    if p.is_file():
                        files.add(p)
                    elif p.is_dir() and RESULTS in p.parents:  # a job folder; bench/results itself covers nothing
                        files |= {q for q in p.rglob("*") if q.is_file()}
        return files

    records = {p for p in RESULTS.rglob("*") if p.is_file() and p.name != "README.md"}
    by_docs = covered([d for d in cites if not d.startswith("bench/results/")])
    by_index = covered(["bench/results/README.md"])
    rel = lambda ps: sorted(str(p.relative_to(RESULTS)) for p in ps)  # noqa: E731
    assert not records - by_docs, "in bench/results, cited by no doc:\n" + "\n".join(rel(records - by_docs))
    assert not records - by_index, "in bench/results, not in its index:\n" + "\n".join(rel(records - by_index))
