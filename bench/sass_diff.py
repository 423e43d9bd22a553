"""Which library kernels changed in machine code between two trees (CPU only: NVRTC + cuobjdump
from the [test] extra)?  A change to cuda/ that leaves every kernel's SASS identical to a
GPU-tested commit needs no new GPU run; one that does not, does.

    python bench/sass_diff.py REV [--dtypes float32,bfloat16,float64,int32] [--ranks 2,3] [--arch sm_90]
                                  [--sources collectives.cu,persistent.cu]

Compares this checkout's cuda/ with REV's (read with `git show`), per module (one per source,
dtype and rank count, plus collectives.cu's float32 in-kernel-loop modules; persistent.cu is the
eager engine) and per function; prints the functions that differ.  Both trees are compiled
with the same NVRTC options, each with its own cuda/ on the include path.  Exit status 1 when
any function differs.  (A REV whose kernels ignore HC_NRANKS builds its generic module for every
rank count: against it every kernel of a rank-count module shows as changed.)"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent.parent


def _tree_at(rev: str, dest: pathlib.Path) -> pathlib.Path:
    """cuda/ of `rev` written under dest (git show of every file git lists there)."""
    names = subprocess.run(["git", "ls-tree", "--name-only", rev, "cuda/"], cwd=HERE, check=True,
                           capture_output=True, text=True).stdout.split()
    if not names:
        raise SystemExit(f"sass_diff: {rev} has no cuda/ folder")
    out = dest / "cuda"
    out.mkdir(parents=True)
    for name in names:
        data = subprocess.run(["git", "show", f"{rev}:{name}"], cwd=HERE, check=True, capture_output=True).stdout
        (out / pathlib.Path(name).name).write_bytes(data)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("rev")
    ap.add_argument("--dtypes", default="float32,bfloat16,float64,int32")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--ranks", default="2,3", help="rank counts the modules are built for (HC_NRANKS)")
    ap.add_argument("--sources", default="collectives.cu,persistent.cu")
    opts = ap.parse_args()
    sys.path.insert(0, str(HERE / "tests" / "unit"))
    from test_device_code import _sass_by_function  # noqa: E402  (the SASS parser the tests use)

    from hpccoll.backends.cuda import nvrtc
    from hpccoll.backends.cuda.kernels import LOOP_FENCE

    # the library builds every module for its rank count (HC_NRANKS, backends/cuda/kernels.py)
    ranks = [f"-DHC_NRANKS={n}" for n in opts.ranks.split(",") if n]
    sources = [s for s in opts.sources.split(",") if s]
    modules = [(src, dt, (r,)) for src in sources for dt in opts.dtypes.split(",") if dt for r in ranks]
    if "collectives.cu" in sources:
        modules += [("collectives.cu", "float32", (r, LOOP_FENCE)) for r in ranks]

    def compile_in(cuda: pathlib.Path, src: str, dtype: str, defs) -> bytes:
        """The module as the library builds it, but with `cuda` as its source and include folder."""
        opts_ = [o for o in nvrtc.options(dtype, opts.arch, defs) if not o.startswith("-I")] + [f"-I{cuda}"]
        return nvrtc.compile_source((cuda / src).read_bytes(), src, opts_)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        trees = {"here": HERE / "cuda", opts.rev: _tree_at(opts.rev, tmp / "rev")}
        sass = {label: {(src, dt, defs): _sass_by_function(compile_in(cuda, src, dt, defs), tmp)
                        for src, dt, defs in modules}
                for label, cuda in trees.items()}
    changed = 0
    for key in sass["here"]:
        a, b = sass["here"][key], sass[opts.rev][key]
        diff = sorted(set(a) ^ set(b)) + sorted(n for n in set(a) & set(b) if a[n] != b[n])
        name = f"{key[0]} {key[1]} {key[2][0][2:]}" + (" (in-kernel loop module)" if len(key[2]) > 1 else "")
        print(f"{name}: {'identical' if not diff else f'{len(diff)} of {len(a)} functions differ: ' + ', '.join(diff)}")
        changed += bool(diff)
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
