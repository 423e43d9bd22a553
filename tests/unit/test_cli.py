"""The `hpccoll` command line (hpccoll/cli.py)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

import hpccoll
from hpccoll.cli import main


def test_info_in_process(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"hpccoll {hpccoll.__version__} (Python ")
    assert "MPI: " in out and "(world size 1)" in out
    assert "  host: available" in out
    assert "  cuda: " in out and "  nccl: " in out
    assert "GPUs: " in out


def test_info_prints_the_configuration_in_effect(capsys, monkeypatch):
    for k in [k for k in os.environ if k.startswith("HPCCOLL_")]:
        monkeypatch.delenv(k)
    main(["info"])
    out = capsys.readouterr().out
    assert re.search(r"HPCCOLL_TIMEOUT +30.0 +\(default\)", out)
    monkeypatch.setenv("HPCCOLL_TIMEOUT", "7")
    monkeypatch.setenv("HPCCOLL_PDL", "0")
    monkeypatch.setenv("HPCCOLL_TYPO", "1")
    main(["info"])
    out = capsys.readouterr().out
    assert re.search(r"HPCCOLL_TIMEOUT +7.0 +\(set\)", out) and re.search(r"HPCCOLL_PDL +False +\(set\)", out)
    assert "ignored by the library): HPCCOLL_TYPO" in out


def test_info_reports_why_there_is_no_gpu(capsys):
    from hpccoll.comm import _device_backend_reason

    why = _device_backend_reason()
    if why is None:
        pytest.skip("a GPU is usable here")
    main(["info"])
    out = capsys.readouterr().out
    assert f"  cuda: unavailable: {why}" in out
    assert f"GPUs: no GPU ({why})" in out


def test_python_dash_m_info():
    res = subprocess.run([sys.executable, "-m", "hpccoll", "info"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"hpccoll {hpccoll.__version__}")


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    assert "usage: hpccoll" in capsys.readouterr().err


def test_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.gpu
def test_info_lists_the_gpus(capsys):
    """Marked `gpu`: skipped (by tests/conftest.py) where CuPy or a GPU is missing."""
    import cupy

    main(["info"])
    out = capsys.readouterr().out
    assert f"GPUs: {cupy.cuda.runtime.getDeviceCount()}" in out
    assert "  cuda: available" in out


def test_cupy_fixture_skips_without_a_gpu(cupy):
    assert cupy.cuda.runtime.getDeviceCount() > 0
