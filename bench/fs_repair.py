"""Find (and where possible work around) corrupted files on the GPU machine's image.

On 2026-11-30 three machines of the same image failed with "source code string cannot contain
null bytes" on imports (numpy.testing, torch) and NVRTC read garbage in CuPy's reduction
headers.  This lists every .py / header under the stdlib, site-packages and the CUDA include
folders that contains NUL or other binary control bytes, and overlays corrupted stdlib modules
with clean CPython 3.12 copies from .whl/stdlib312.tgz (extracted into the folder given as
argv[1], meant to go first on PYTHONPATH).  Prints one summary line per finding."""
from __future__ import annotations

import os
import site
import sys
import sysconfig
import tarfile

BAD = set(range(0, 9)) | {11, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 28, 29, 30, 31}


def corrupted(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return True
    return b"\0" in data or any(b in BAD for b in data[:4096])


def scan(roots):
    hits = []
    for root in roots:
        if not os.path.isdir(root):
            continue
        for dirpath, _dirs, files in os.walk(root):
            for name in files:
                if name.endswith((".py", ".h", ".cuh", ".hpp", ".inl")):
                    p = os.path.join(dirpath, name)
                    if corrupted(p):
                        hits.append(p)
    return hits


def main() -> int:
    overlay = sys.argv[1] if len(sys.argv) > 1 else "/tmp/stdfix"
    std = sysconfig.get_paths()["stdlib"]
    cuda = [d for d in ("/usr/local/cuda/include", "/usr/local/cuda/targets/x86_64-linux/include") if os.path.isdir(d)]
    roots = [std] + site.getsitepackages() + cuda
    hits = scan(roots)
    print(f"fs_repair: scanned {', '.join(roots)}: {len(hits)} corrupted file(s)")
    for h in hits[:40]:
        print("  corrupted:", h)
    std_hits = [h for h in hits if h.startswith(std + os.sep) and "site-packages" not in h]
    tgz = os.path.join(".whl", "stdlib312.tgz")
    if std_hits and os.path.exists(tgz):
        tops = sorted({os.path.relpath(h, std).split(os.sep)[0] for h in std_hits})
        os.makedirs(overlay, exist_ok=True)
        with tarfile.open(tgz) as t:
            members = [m for m in t.getmembers()
                       if m.name.lstrip("./").split("/")[0] in tops]
            t.extractall(overlay, members=members)
        print(f"fs_repair: overlaid stdlib {tops} from {tgz} into {overlay}")
        return 10  # tells the caller to put the overlay on PYTHONPATH
    return 0


if __name__ == "__main__":
    sys.exit(main())
