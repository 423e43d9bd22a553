"""The host backend's shared-memory segment leaves nothing behind (hpccoll/backends/shmfile.py).

MPI jobs started here with the venv's mpiexec construct communicators in a loop and are killed
with SIGKILL (as a scheduler kills a job) at random moments, construction included: no file
of theirs may stay in the segment folder.  Through the anonymous memory file no file is ever
made; through the fallback file the next construction on the node reclaims what a killed job
left.  The staleness proof itself is checked on files named for live, dead and reused pids."""
from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from hpccoll.backends import shmfile

MPIEXEC = Path(sys.executable).with_name("mpiexec")

JOB = textwrap.dedent("""
    import os, sys
    folder, memory, loops = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if memory == "file":  # as on a system without memfd_create: the fallback file in `folder`
        del os.memfd_create
    from mpi4py import MPI
    from hpccoll.backends import host
    host.SHM_DIR = folder
    import hpccoll
    c = hpccoll.Communicator(backend="host", check=False)
    assert c._host.shm is not None, c._host.shm_off
    print("constructing", flush=True)
    n = 0
    while loops == 0 or n < loops:  # the host backend's construction, segment and all
        b = host.HostBackend(MPI.COMM_WORLD)
        assert b.shm is not None, b.shm_off
        b.free()
        n += 1
    c.Free()
""")


def _name(pid: int, start: int | None = None, boot: str | None = None, ns: int | None = None) -> str:
    """A segment file name as shm_file_name writes it, for process `pid`."""
    boot = shmfile._boot_id() if boot is None else boot
    ns = shmfile._pid_namespace() if ns is None else ns
    start = shmfile.start_ticks(pid) if start is None else start
    return f"hpccoll-{boot}-{ns}-{pid}-{start}-{'0' * 16}"


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_a_fresh_name_names_this_process_and_is_not_stale(tmp_path):
    name = shmfile.shm_file_name()
    assert name is not None and f"-{os.getpid()}-{shmfile.start_ticks(os.getpid())}-" in name
    (tmp_path / name).write_bytes(b"x")
    assert not shmfile.is_stale(str(tmp_path), name)
    assert shmfile.reclaim_stale_files(str(tmp_path)) == []
    assert (tmp_path / name).exists()


def test_only_provably_stale_files_are_reclaimed(tmp_path, monkeypatch):
    me = os.getpid()
    dead = _dead_pid()
    stale = [_name(dead, start=12345),                       # no such process
             _name(me, start=shmfile.start_ticks(me) - 1)]   # the pid now belongs to a later process
    kept = [_name(me),                                       # its creator is alive
            _name(dead, start=1, boot="f" * 32),             # another boot: not provable here
            _name(dead, start=1, ns=1),                      # another pid namespace: its pid means nothing here
            f"hpccoll-{dead}-{'0' * 16}",                    # not our pattern
            "unrelated-file"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"x")
    link = _name(dead, start=7)
    (tmp_path / link).symlink_to(tmp_path / "unrelated-file")  # never a symbolic link
    assert sorted(shmfile.reclaim_stale_files(str(tmp_path))) == sorted(stale)
    assert sorted(os.listdir(tmp_path)) == sorted(kept + [link])
    # another user's file is never touched, stale or not
    (tmp_path / stale[0]).write_bytes(b"x")
    monkeypatch.setattr(os, "getuid", lambda: os.stat(tmp_path / stale[0]).st_uid + 1)
    assert shmfile.reclaim_stale_files(str(tmp_path)) == []


def test_the_fallback_file_is_named_so_that_it_can_be_proved_stale(tmp_path):
    fd, (path, ident), error = shmfile.create_segment(4096, anonymous=False, folder=str(tmp_path))
    try:
        assert error is None and os.path.dirname(path) == str(tmp_path)
        assert os.fstat(fd).st_size == 4096 and (os.fstat(fd).st_dev, os.fstat(fd).st_ino) == ident
        name = os.path.basename(path)
        assert shmfile._NAME.match(name) and not shmfile.is_stale(str(tmp_path), name)
    finally:
        os.close(fd)


def _job(folder, memory: str, loops: int) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_", "HYDRA_"))}
    env.update(OMP_NUM_THREADS="1", MPIEXEC_TIMEOUT="120")
    cmd = [str(MPIEXEC), "-n", "2", sys.executable, "-c", JOB, str(folder), memory, str(loops)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def _tree(root: int) -> list[int]:
    """`root` and its descendants, deepest first (hydra's proxy and the ranks each run in a
    session of their own: the job's process group is mpiexec alone)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    order, todo = [], [root]
    while todo:
        pid = todo.pop()
        order.append(pid)
        todo += children.get(pid, [])
    return order[::-1]


def _kill_while_constructing(folder, memory: str, jobs: int) -> None:
    """`jobs` jobs, each SIGKILLed at a random moment of its loop of constructions: every process
    of the job (mpiexec, its proxy, the ranks), as a scheduler ends a job, so no cleanup runs."""
    rng = random.Random(1234)
    for _ in range(jobs):
        job = _job(folder, memory, 0)
        try:
            line = job.stdout.readline()
            assert line.startswith("constructing"), line + job.stdout.read()
            time.sleep(rng.uniform(0.0, 0.3))
        finally:
            procs = _tree(job.pid)
            for pid in procs:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            job.communicate()
            deadline = time.monotonic() + 30
            while any(shmfile.start_ticks(pid) is not None for pid in procs) and time.monotonic() < deadline:
                time.sleep(0.05)


@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside this Python (the MPICH wheel)")
def test_jobs_killed_during_construction_leave_nothing(tmp_path):
    """Through the anonymous memory file: no file in the folder, ever, however the job ends."""
    from hpccoll.backends.host import hostshm_unavailable_reason

    if hostshm_unavailable_reason() or not hasattr(os, "memfd_create"):
        pytest.skip(hostshm_unavailable_reason() or "no memfd_create")
    _kill_while_constructing(tmp_path, "memfd", jobs=10)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside this Python (the MPICH wheel)")
def test_files_of_killed_jobs_are_reclaimed_by_the_next_construction(tmp_path):
    """Through the fallback file: whatever the killed jobs left, the next job's construction
    deletes (their creators are gone), and its own file is gone when it ends."""
    from hpccoll.backends.host import hostshm_unavailable_reason

    if hostshm_unavailable_reason():
        pytest.skip(hostshm_unavailable_reason())
    planted = _name(_dead_pid(), start=12345)  # as a job killed before these left it
    (tmp_path / planted).write_bytes(b"x")
    _kill_while_constructing(tmp_path, "file", jobs=10)
    left = os.listdir(tmp_path)
    assert all(shmfile.is_stale(str(tmp_path), n) for n in left), left
    out, _ = _job(tmp_path, "file", 1).communicate(timeout=120)
    assert os.listdir(tmp_path) == [], (left, out)


def test_an_exited_creator_not_yet_reaped_is_gone():
    """A zombie (exited, its parent has not waited for it) holds no file: its files are stale."""
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        for _ in range(200):
            with open(f"/proc/{p.pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    break
            time.sleep(0.05)
        assert shmfile.start_ticks(p.pid) is None
    finally:
        p.wait()
