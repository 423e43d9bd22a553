"""A lost peer is an error, never a hang, on the host backend: MPI jobs (started here with the
venv's mpiexec) in which one rank exits or raises before a collective end within the timeout,
the survivors raising CollectiveTimeout that names the call; under `python -m mpi4py` an
uncaught exception aborts the whole job at once."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

MPIEXEC = Path(sys.executable).with_name("mpiexec")
pytestmark = pytest.mark.skipif(not MPIEXEC.exists(), reason="no mpiexec beside this Python (the MPICH wheel)")

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import hpccoll

    what, failure = sys.argv[1], sys.argv[2]
    c = hpccoll.Communicator(backend="host", check=what == "checked")
    if c.rank == 1:
        if failure == "exit":
            sys.exit(3)
        raise RuntimeError("rank 1 fails before the collective")
    if what == "barrier":
        c.Barrier()
    else:
        c.Allreduce(np.ones(4), np.empty(4))
    print("finished", flush=True)
""")


def _run(tmp_path, *args, module=False, timeout=2.0):
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_", "HYDRA_"))}
    env.update(HPCCOLL_TIMEOUT=str(timeout), OMP_NUM_THREADS="1")
    cmd = [str(MPIEXEC), "-n", "3", sys.executable] + (["-m", "mpi4py"] if module else []) + [str(script), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    return proc, time.monotonic() - t0


@pytest.mark.parametrize("failure", ["exit", "raise"])
@pytest.mark.parametrize("what,call", [("allreduce", "Allreduce"), ("barrier", "Barrier"),
                                       ("checked", "Allreduce")])
def test_survivors_raise_collective_timeout(tmp_path, what, call, failure):
    proc, took = _run(tmp_path, what, failure)
    out = proc.stdout + proc.stderr
    assert "finished" not in out
    assert "CollectiveTimeout" in out and f"{call}: rank 0 waited 2 s" in out and f"{call}: rank 2 waited 2 s" in out, out[-3000:]
    assert took < 60, f"the job took {took:.0f} s"


def test_python_m_mpi4py_aborts_the_job_at_once(tmp_path):
    proc, took = _run(tmp_path, "allreduce", "raise", module=True, timeout=60.0)
    assert proc.returncode != 0
    assert "rank 1 fails before the collective" in proc.stdout + proc.stderr
    assert took < 45, f"the job took {took:.0f} s: the abort did not end it"
