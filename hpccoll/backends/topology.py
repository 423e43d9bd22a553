"""GPU facts read from the driver: count, names, P2P access and native peer atomics."""
from __future__ import annotations


def p2p_matrix():
    """(names, access[i][j], atomics[i][j]) from cudaDeviceGetP2PAttribute."""
    import cupy

    rt = cupy.cuda.runtime
    n = rt.getDeviceCount()
    names = []
    for i in range(n):
        props = rt.getDeviceProperties(i)
        name = props["name"]
        names.append(name.decode() if isinstance(name, bytes) else name)
    access = [[i == j or bool(rt.deviceCanAccessPeer(i, j)) for j in range(n)] for i in range(n)]
    from .cuda.driver import p2p_native_atomics

    atomics = [[i == j or p2p_native_atomics(i, j) for j in range(n)] for i in range(n)]
    return names, access, atomics


def describe_gpus() -> str:
    names, access, atomics = p2p_matrix()
    n = len(names)
    lines = [f"GPUs: {n}"]
    lines += [f"  GPU {i}: {name}" for i, name in enumerate(names)]
    head = "      " + " ".join(f"{j:>4}" for j in range(n))
    lines.append("P2P access (A) and native peer atomics (+):")
    lines.append(head)
    for i in range(n):
        cells = ["self" if i == j else ("A+" if atomics[i][j] else "A") if access[i][j] else "-"
                 for j in range(n)]
        lines.append(f"  {i:>3} " + " ".join(f"{c:>4}" for c in cells))
    return "\n".join(lines)
