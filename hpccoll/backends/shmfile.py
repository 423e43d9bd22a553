"""The memory behind the host backend's shared-memory segment, and why none outlives its job.

The segment is made by rank 0 and opened by every rank of the node (HostBackend._map_segment).

- First choice, an anonymous memory file (memfd_create): it has no name in any file system;
  the other ranks open it through /proc/<rank 0's pid>/fd/<fd>, which the kernel allows to a
  process of the same user (ptrace read access, which Yama's ptrace_scope does not restrict;
  a non-dumpable process or /proc mounted with hidepid for another user would refuse, and the
  caller falls back).  Each rank checks that the file it opened is rank 0's (device and inode):
  ranks in another pid namespace would open another process's descriptor.  The memory is freed
  when the last rank unmaps it, killed or not: a job leaves nothing behind.
- Fallback, a file in /dev/shm, unlinked once every rank mapped it.  A job killed in between
  (SIGKILL: no handler runs) leaves the file; its name records the creating process
  (shm_file_name), and reclaim_stale_files, run by every construction's rank 0, deletes the
  files whose creator provably no longer exists.

Proof that a file is stale, every part required:
- its name has our exact pattern and it is a regular file owned by this user (never someone
  else's file, never a symbolic link);
- it was made in this boot and this pid namespace (the boot id and the namespace's inode in the
  name equal ours; from another namespace a live creator's pid would look absent, so such a
  file is kept, and so is one naming another boot, which a /dev/shm in memory cannot hold);
- no process has the creator's pid (or only a zombie: it has exited), or the process that has
  it started at another time (the start time in clock ticks since boot, /proc/<pid>/stat field
  22: a reused pid has a later start).
A live job's file fails the last test and is kept; a file this module cannot read the facts of
is kept."""
from __future__ import annotations

import contextlib
import os
import re
import secrets

_PREFIX = "hpccoll-"
# hpccoll-<boot id, 32 hex>-<pid namespace inode>-<pid>-<start ticks>-<16 hex random>
_NAME = re.compile(r"^hpccoll-([0-9a-f]{32})-(\d+)-(\d+)-(\d+)-[0-9a-f]{16}$")


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip().replace("-", "")
    except OSError:
        return None


def _pid_namespace() -> int | None:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return None


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot), or None when no such process runs:
    none is visible, or it has exited and only its exit status remains (a zombie, whose parent
    has not reaped it; it holds no file).  (/proc/<pid>/stat: field 3 the state, field 22 the
    start; the command name, field 2, may hold spaces and parentheses, so fields are counted
    after its last ')'.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat[stat.rindex(b")") + 2:].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def shm_file_name() -> str | None:
    """A fresh file name naming this process (see the module's docstring), or None when this
    process cannot name itself (no /proc): then its files could never be proved stale."""
    boot, ns = _boot_id(), _pid_namespace()
    try:
        start = start_ticks(os.getpid())
    except (OSError, ValueError, IndexError):
        start = None
    if boot is None or ns is None or start is None or len(boot) != 32:
        return None
    return f"{_PREFIX}{boot}-{ns}-{os.getpid()}-{start}-{secrets.token_hex(8)}"


def is_stale(folder: str, name: str) -> bool:
    """Whether file `name` of `folder` is a segment file whose creator provably is gone."""
    m = _NAME.match(name)
    boot, ns = _boot_id(), _pid_namespace()
    if m is None or boot is None or ns is None:
        return False
    try:
        st = os.lstat(os.path.join(folder, name))
    except OSError:
        return False
    import stat

    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
        return False
    file_boot, file_ns, pid, start = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
    if file_boot != boot or file_ns != ns:
        return False  # another boot or pid namespace: its creator's pid means nothing here
    try:
        now = start_ticks(pid)
    except (OSError, ValueError, IndexError):
        return False  # unreadable: not provably gone
    return now is None or now != start


def reclaim_stale_files(folder: str) -> list[str]:
    """Delete the segment files of `folder` whose creator provably is gone (is_stale); their
    names.  Errors are not raised: reclaiming is housekeeping, and a file another process
    reclaimed first is gone all the same."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(_PREFIX)]
    except OSError:
        return []
    gone = []
    for name in names:
        if is_stale(folder, name):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))
                gone.append(name)
    return gone


def create_segment(nbytes: int, anonymous: bool, folder: str):
    """(fd, (path the other ranks open, (st_dev, st_ino)), None), or (None, None, why not):
    `nbytes` of reserved shared memory, an anonymous memory file or a fresh file in `folder`.
    Reserved, not sparse: a full file system fails here, not as SIGBUS at a first store."""
    if anonymous:
        if not hasattr(os, "memfd_create"):
            return None, None, "no memfd_create on this system"
        try:
            fd = os.memfd_create("hpccoll-shm", os.MFD_CLOEXEC)
        except OSError as exc:
            return None, None, f"rank 0 could not create an anonymous memory file ({exc})"
        path, where = f"/proc/{os.getpid()}/fd/{fd}", "an anonymous memory file"
    else:
        name = shm_file_name()
        if name is None:
            return None, None, (f"rank 0 cannot name a file in {folder} that a later job could prove stale "
                                "(/proc unreadable)")
        path, where = os.path.join(folder, name), folder
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            return None, None, f"rank 0 could not create a file in {folder} ({exc})"
    try:
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, nbytes)
        else:
            os.ftruncate(fd, nbytes)
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        if not anonymous:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return None, None, f"rank 0 could not reserve {nbytes} bytes in {where} ({exc})"
    return fd, (path, (st.st_dev, st.st_ino)), None
