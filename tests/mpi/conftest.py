"""Fixtures of the MPI tests that run hpccoll-eigensolver's main in this process on every rank."""
from __future__ import annotations

import pytest


@pytest.fixture
def cli_main(monkeypatch, capsys):
    """main(argv) of hpccoll-eigensolver in this process on every rank; a hang ends the process
    (and so the job) after 120 s instead of blocking the suite.  Returns (status, stdout, stderr)."""
    import faulthandler
    import sys

    from hpccoll_eigensolver.cli import main

    monkeypatch.setattr(sys, "excepthook", sys.excepthook)   # main installs the job's abort hook

    def run(argv):
        capsys.readouterr()
        faulthandler.dump_traceback_later(120, exit=True, file=sys.__stderr__)
        try:
            code = main([str(a) for a in argv])
        finally:
            faulthandler.cancel_dump_traceback_later()
        out = capsys.readouterr()
        return code, out.out, out.err
    return run


@pytest.fixture
def agreed_error():
    """check(code, err, needles): status 2 on every rank; one error line, on rank 0, holding every
    needle."""
    from mpi4py import MPI

    world = MPI.COMM_WORLD

    def check(code, err, needles):
        codes = world.allgather(code)
        lines = world.gather([ln for ln in err.splitlines() if "error:" in ln], root=0)
        assert codes == [2] * world.Get_size(), codes
        if world.Get_rank() == 0:
            assert len(lines[0]) == 1 and not any(lines[1:]), lines
            for needle in needles:
                assert needle in lines[0][0], (needle, lines[0][0])
    return check
