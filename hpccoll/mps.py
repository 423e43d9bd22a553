"""Ranks sharing a GPU, and NVIDIA's Multi-Process Service (MPS) that they need.

Without MPS the processes on one GPU are time-sliced: a kernel that spins waiting for a peer
running on the same GPU waits until the GPU switches to that peer, a time slice (about 2 ms),
in every collective.  With MPS their kernels run concurrently.  docs/performance.md has the
measurement (the eigensolver at 2 ranks on one GPU: about 40x slower without MPS).

Detection (mps_status) rests on what NVIDIA documents for the MPS control daemon: it and its
clients talk through named pipes and UNIX sockets in CUDA_MPS_PIPE_DIRECTORY (default
/tmp/nvidia-mps), and a CUDA program runs as an MPS client when, at CUDA's initialization, it
can connect to the daemon there.  The assumption written here: the daemon listens on the socket
`control` of that directory (nvidia-cuda-mps-control -d creates it, `quit` removes it).  MPS
counts as running only when a live process holds that socket: a connection is accepted, or refused
for its socket type (EPROTOTYPE: the daemon's socket is of another type than asked, which only a
bound socket answers); a leftover socket of a daemon that died refuses every connection
(ECONNREFUSED), and anything unreadable counts as "MPS not detected"."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import stat
import subprocess
import time
import warnings

from .errors import HpccollError, PerformanceWarning

DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
START = "nvidia-cuda-mps-control -d"
STOP = "echo quit | nvidia-cuda-mps-control"
ADVICE = (f"start MPS on the node before the job ({START}) and stop it after ({STOP}), "
          "or run one rank per GPU")
COST = ("each collective waits for a GPU time slice while its peer runs on the same GPU: measured 40x slower "
        "(the eigensolver at 2 ranks on one GPU, n = 3000: 14.7 s per solve without MPS, 0.36 s with MPS)")


def pipe_directory(env=None) -> str:
    """The MPS pipe directory a CUDA program of environment `env` (default: this process's) uses."""
    env = os.environ if env is None else env
    return env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIRECTORY


def mps_status(env=None) -> tuple[bool, str]:
    """(running, what was found): whether an MPS control daemon serves CUDA programs of
    environment `env` (see the module's docstring for the assumption)."""
    path = os.path.join(pipe_directory(env), "control")
    try:
        if not stat.S_ISSOCK(os.stat(path).st_mode):
            return False, f"MPS not detected ({path} is not a socket)"
    except OSError:
        return False, f"MPS not detected (no {path})"
    for kind in (socket.SOCK_STREAM, socket.SOCK_SEQPACKET):
        with socket.socket(socket.AF_UNIX, kind) as s:
            s.settimeout(1.0)
            try:
                s.connect(path)
            except OSError as exc:
                if exc.errno == errno.EPROTOTYPE:  # bound by a live process, as a socket of another type
                    continue
                return False, f"MPS not detected ({path} refuses connections: {exc.strerror or exc})"
        return True, f"MPS control daemon running ({path})"
    # (a socket whose process died refuses every type with ECONNREFUSED; EPROTOTYPE needs a binder)
    return True, f"MPS control daemon running ({path})"


def shared_without_mps(gpus, mps) -> str | None:
    """Which ranks share a GPU without MPS, from every rank's GPU (a hashable identity such as
    (host, PCI bus id), None: unknown) and whether it detected MPS; None when none do."""
    ranks: dict = {}
    for r, key in enumerate(gpus):
        if key is not None:
            ranks.setdefault(key, []).append(r)
    shared = []
    for key, rs in ranks.items():
        if len(rs) > 1 and not all(mps[r] for r in rs):
            where = f"GPU {key[1]} on {key[0]}" if isinstance(key, tuple) and len(key) == 2 else f"GPU {key}"
            shared.append(f"ranks {', '.join(map(str, rs))} share {where}")
    return "; ".join(shared) or None


def sharing_message(who: str) -> str:
    return f"{who} without MPS: {COST}. Fix: {ADVICE}."


_warned: set = set()


def warn_sharing(who: str | None, rank: int) -> bool:
    """Warn (PerformanceWarning) that ranks share a GPU without MPS: on rank 0 only (one warning
    per job), once per process; whether this call warned."""
    if who is None or rank != 0 or who in _warned:
        return False
    _warned.add(who)
    warnings.warn(sharing_message(who), PerformanceWarning, stacklevel=5)
    return True


def visible_gpus(env=None) -> int:
    """GPUs a CUDA program of environment `env` sees, without initializing CUDA here (a process
    that started CUDA before the MPS daemon would not be its client): CUDA_VISIBLE_DEVICES where
    set, else nvidia-smi's list; 0 without a driver."""
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


@contextlib.contextmanager
def mps_where_needed(ranks: int, gpus: int, env=None):
    """Around a job of `ranks` ranks per node on `gpus` GPUs: where ranks outnumber GPUs and no
    MPS runs, start the MPS control daemon (nvidia-cuda-mps-control -d) and stop it afterwards;
    a daemon found running is left alone.  HpccollError (nothing started) where MPS is needed
    but nvidia-cuda-mps-control is not on PATH or does not come up.  Yields what it did."""
    env = os.environ if env is None else env
    if gpus <= 0 or ranks <= gpus:
        yield "MPS not needed (a GPU per rank)" if gpus > 0 else "MPS not needed (no GPU)"
        return
    running, found = mps_status(env)
    if running:
        yield found
        return
    control = shutil.which("nvidia-cuda-mps-control", path=env.get("PATH"))
    who = f"{ranks} ranks on {gpus} GPU{'s' if gpus > 1 else ''}"
    if control is None:
        raise HpccollError(f"{who} share GPUs and no MPS runs ({found}); nvidia-cuda-mps-control is not on "
                           f"PATH to start it: {sharing_message('such ranks')}")
    pipe = pipe_directory(env)
    os.makedirs(pipe, exist_ok=True)
    proc = subprocess.run([control, "-d"], capture_output=True, text=True, env=dict(env), timeout=60)
    deadline = time.monotonic() + 10
    while not (up := mps_status(env))[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    if not up[0]:
        raise HpccollError(f"{who} need MPS, and `{control} -d` did not start it (exit {proc.returncode}: "
                           f"{(proc.stderr or proc.stdout).strip() or up[1]}): start it by hand ({START})")
    try:
        yield f"MPS started for {who} ({pipe}); stopped at the end"
    finally:
        subprocess.run([control], input="quit\n", capture_output=True, text=True, env=dict(env), timeout=60)
