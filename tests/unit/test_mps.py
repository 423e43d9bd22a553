"""Ranks sharing a GPU without MPS (hpccoll/mps.py): detection of the MPS control daemon, which
ranks share a GPU without it, the one PerformanceWarning, and starting / stopping MPS around a
job - with a fake nvidia-cuda-mps-control (a UNIX socket server) in place of NVIDIA's."""
from __future__ import annotations

import os
import socket
import sys
import textwrap
import time
import warnings

import pytest

import hpccoll
from hpccoll import mps

FAKE_CONTROL = textwrap.dedent("""\
    #!{python}
    # nvidia-cuda-mps-control as far as hpccoll uses it: -d starts a daemon listening on
    # $CUDA_MPS_PIPE_DIRECTORY/control; without arguments, stdin's command goes to it ("quit" ends it)
    import os, socket, sys
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
    path = os.path.join(pipe, "control")
    with open(os.path.join(pipe, "calls"), "a") as log:
        log.write(" ".join(sys.argv[1:]) or sys.stdin.read().strip())
        log.write("\\n")
    if sys.argv[1:] == ["-d"]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)
        s.listen(8)
        if os.fork():
            sys.exit(0)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        while True:
            c, _ = s.accept()
            data = c.recv(64)
            c.close()
            if data.startswith(b"quit"):
                os.unlink(path)
                os._exit(0)
    else:
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(path)
        c.sendall(b"quit")
    """)


def fake_mps_control(folder) -> dict:
    """An environment whose PATH has a fake nvidia-cuda-mps-control and whose
    CUDA_MPS_PIPE_DIRECTORY is `folder`/pipe (its calls logged in pipe/calls)."""
    bin_dir, pipe = folder / "bin", folder / "pipe"
    bin_dir.mkdir()
    pipe.mkdir()
    exe = bin_dir / "nvidia-cuda-mps-control"
    exe.write_text(FAKE_CONTROL.format(python=sys.executable))
    exe.chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                CUDA_MPS_PIPE_DIRECTORY=str(pipe))


def calls(env) -> list[str]:
    path = os.path.join(env["CUDA_MPS_PIPE_DIRECTORY"], "calls")
    return open(path).read().split("\n")[:-1] if os.path.exists(path) else []


def test_mps_is_detected_only_where_its_control_socket_accepts(tmp_path):
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    assert mps.pipe_directory({}) == "/tmp/nvidia-mps"
    running, text = mps.mps_status(env)
    assert not running and text == f"MPS not detected (no {tmp_path}/control)"
    (tmp_path / "control").write_text("")
    assert mps.mps_status(env) == (False, f"MPS not detected ({tmp_path}/control is not a socket)")
    (tmp_path / "control").unlink()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(tmp_path / "control"))
    s.listen(1)
    assert mps.mps_status(env) == (True, f"MPS control daemon running ({tmp_path}/control)")
    s.close()  # a daemon that died: its socket file stays, and refuses connections
    running, text = mps.mps_status(env)
    assert not running and "refuses connections" in text


@pytest.mark.parametrize("kind", ["SOCK_SEQPACKET", "SOCK_DGRAM"])
def test_mps_is_detected_whatever_its_control_sockets_type(tmp_path, kind):
    """NVIDIA's daemon does not hold a stream socket (a stream connect to it fails with EPROTOTYPE,
    seen on an H100 machine): a socket of another type bound by a live process counts, and the
    same file left by a process that died does not."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    s = socket.socket(socket.AF_UNIX, getattr(socket, kind))
    s.bind(str(tmp_path / "control"))
    if kind != "SOCK_DGRAM":
        s.listen(1)
    assert mps.mps_status(env) == (True, f"MPS control daemon running ({tmp_path}/control)")
    s.close()
    running, text = mps.mps_status(env)
    assert not running and "refuses connections" in text


def test_sharing_without_mps_is_found_per_gpu():
    a, b = ("n1", "0000:01:00.0"), ("n1", "0000:02:00.0")
    assert mps.shared_without_mps([a, b], [False, False]) is None           # a GPU per rank
    assert mps.shared_without_mps([a, a], [True, True]) is None             # shared, under MPS
    assert mps.shared_without_mps([a, a], [False, False]) == "ranks 0, 1 share GPU 0000:01:00.0 on n1"
    assert mps.shared_without_mps([a, a], [True, False]) == "ranks 0, 1 share GPU 0000:01:00.0 on n1"
    assert mps.shared_without_mps([a, b, a, b], [False, True, False, True]) == "ranks 0, 2 share GPU 0000:01:00.0 on n1"
    assert mps.shared_without_mps([None, None], [False, False]) is None     # unknown GPUs: never shared


def test_one_warning_on_rank_0_with_the_cost_and_the_fix(monkeypatch):
    monkeypatch.setattr(mps, "_warned", set())
    who = "ranks 0, 1 share GPU 0000:01:00.0 on n1"
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert not mps.warn_sharing(who, rank=1)
        assert not mps.warn_sharing(None, rank=0)
        assert mps.warn_sharing(who, rank=0)
        assert not mps.warn_sharing(who, rank=0)   # a Dup of the same communicator: said already
    assert len(got) == 1 and got[0].category is hpccoll.PerformanceWarning
    text = str(got[0].message)
    assert text.startswith(who + " without MPS: ")
    assert "40x slower" in text and "14.7 s per solve without MPS, 0.36 s with MPS" in text
    assert "nvidia-cuda-mps-control -d" in text and "echo quit | nvidia-cuda-mps-control" in text
    assert issubclass(hpccoll.PerformanceWarning, UserWarning) and "PerformanceWarning" in hpccoll.__all__


def test_visible_gpus_without_initializing_cuda():
    assert mps.visible_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert mps.visible_gpus({"CUDA_VISIBLE_DEVICES": ""}) == 0
    assert mps.visible_gpus({"CUDA_VISIBLE_DEVICES": "-1"}) == 0
    assert mps.visible_gpus({"PATH": "/nonexistent"}) == 0


def test_mps_is_started_only_where_ranks_outnumber_gpus_and_stopped_after(tmp_path):
    env = fake_mps_control(tmp_path)
    with mps.mps_where_needed(2, 2, env) as what:
        assert what == "MPS not needed (a GPU per rank)"
    with mps.mps_where_needed(4, 0, env) as what:
        assert what == "MPS not needed (no GPU)"
    assert calls(env) == []
    with mps.mps_where_needed(3, 1, env) as what:
        assert what.startswith("MPS started for 3 ranks on 1 GPU")
        assert mps.mps_status(env)[0]
    assert calls(env) == ["-d", "quit"]
    deadline = time.monotonic() + 10
    while mps.mps_status(env)[0] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not mps.mps_status(env)[0]


def test_a_running_mps_is_left_alone(tmp_path):
    env = fake_mps_control(tmp_path)
    with mps.mps_where_needed(2, 1, env):
        with mps.mps_where_needed(2, 1, env) as inner:
            assert inner.startswith("MPS control daemon running")
        assert mps.mps_status(env)[0]   # the inner one did not stop what it did not start
    assert calls(env) == ["-d", "quit"]


def test_no_mps_control_on_path_is_refused_with_the_fix(tmp_path):
    env = {"PATH": str(tmp_path), "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}
    with pytest.raises(hpccoll.HpccollError) as exc:
        with mps.mps_where_needed(2, 1, env):
            pytest.fail("ran without MPS")
    text = str(exc.value)
    assert text.startswith("2 ranks on 1 GPU share GPUs and no MPS runs (MPS not detected")
    assert "nvidia-cuda-mps-control -d" in text and "40x slower" in text


class _FakeComm:
    """Two ranks on one GPU, seen from `rank`: what allgather would return."""

    def __init__(self, rank, mps_flags):
        self.rank, self.mps_flags = rank, mps_flags

    def Get_rank(self):
        return self.rank

    def allgather(self, mine):
        return [(mine[0], m) for m in self.mps_flags]


@pytest.mark.parametrize("rank,flags,warned", [(0, [False, False], True), (1, [False, False], False),
                                               (0, [True, True], False)])
def test_the_communicator_check_warns_on_rank_0_without_mps(monkeypatch, rank, flags, warned):
    """What Communicator runs once its CUDA backend is open (backends/topology.py)."""
    from hpccoll.backends import topology

    monkeypatch.setattr(mps, "_warned", set())
    monkeypatch.setattr(topology, "nccl_identity", lambda device: ("n1", "0000:01:00.0"))
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        assert topology.warn_if_shared_without_mps(_FakeComm(rank, flags), 0) == warned
    assert [w.category for w in got] == ([hpccoll.PerformanceWarning] if warned else [])
