"""Two ranks on one GPU: the Communicator warns (hpccoll.PerformanceWarning, rank 0, once) when
MPS does not serve them, and stays quiet when it does.  Each case is its own 2-rank job on GPU 0
started here by this process, which is no MPI job itself (tests/gpu/run.sh runs a file that sets
STARTS_ITS_OWN_JOBS with plain pytest, once: under Open MPI a rank's child cannot start MPI; under
a launcher only rank 0 starts them): without MPS its pipe directory points at an empty folder, so its CUDA programs do not
connect to a daemon; with MPS it uses the daemon tests/gpu/run.sh started, else one started here
(hpccoll.mps.mps_where_needed, stopped afterwards)."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hpccoll import mps

pytestmark = pytest.mark.gpu
STARTS_ITS_OWN_JOBS = True  # tests/gpu/run.sh: run this file outside mpiexec

JOB = """
import warnings
import cupy
import hpccoll
with warnings.catch_warnings(record=True) as got:
    warnings.simplefilter("always")
    c = hpccoll.Communicator(backend="cuda")
    d = c.Dup()  # a second construction: still one warning
x = cupy.ones(8, dtype=cupy.float32)
c.Allreduce(hpccoll.IN_PLACE, x)
cupy.cuda.runtime.deviceSynchronize()
assert float(x[0]) == c.size
perf = [str(w.message) for w in got if w.category is hpccoll.PerformanceWarning]
print(f"rank {c.rank} device {c.device} warnings {len(perf)}", flush=True)
for m in perf:
    print("WARNING " + m, flush=True)
d.Free()
c.Free()
"""


def _launcher() -> list[str]:
    if os.environ.get("MPIEXEC"):
        return shlex.split(os.environ["MPIEXEC"])
    here = Path(sys.executable).with_name("mpiexec")
    return [str(here) if here.exists() else "mpiexec"]


def _job_variable(name: str) -> bool:
    """A variable a launcher sets for the ranks of its job (not the site's MCA settings, such as
    OMPI_MCA_plm_rsh_agent, which a new mpiexec needs)."""
    if name.startswith(("PMI_", "PMIX_", "HYDRA_")):
        return True
    if name.startswith("OMPI_MCA_"):
        return name.startswith(("OMPI_MCA_orte_", "OMPI_MCA_ess", "OMPI_MCA_pmix"))
    return name.startswith("OMPI_")


def _two_ranks_on_gpu_0(env: dict) -> str:
    env = {k: v for k, v in env.items() if not _job_variable(k)}
    env.update(CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0], PYTHONUNBUFFERED="1")
    proc = subprocess.run([*_launcher(), "-n", "2", sys.executable, "-c", JOB], capture_output=True, text=True,
                          timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.fixture
def rank0_only():
    """Skip on every rank but 0 when a launcher started this file (read from the launcher's
    variables: MPI is not initialized here, so the 2-rank jobs start from a plain process)."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if os.environ.get(var, "0") != "0":
            pytest.skip("rank 0 of this job starts the 2-rank jobs")


def test_two_ranks_on_one_gpu_without_mps_warn_once(rank0_only, tmp_path):
    (tmp_path / "no-mps").mkdir()
    out = _two_ranks_on_gpu_0(dict(os.environ, CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "no-mps")))
    assert "rank 0 device 0 warnings 1" in out and "rank 1 device 0 warnings 0" in out, out[-4000:]
    assert out.count("WARNING ranks 0, 1 share GPU ") == 1 and "without MPS" in out, out[-4000:]
    assert "40x slower" in out and "nvidia-cuda-mps-control -d" in out


def test_two_ranks_on_one_gpu_under_mps_do_not_warn(rank0_only, tmp_path):
    env = dict(os.environ)
    if mps.mps_status(env)[0]:
        out = _two_ranks_on_gpu_0(env)
    else:
        env.update(CUDA_MPS_PIPE_DIRECTORY=str(tmp_path / "pipe"), CUDA_MPS_LOG_DIRECTORY=str(tmp_path / "log"))
        os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"])
        try:
            with mps.mps_where_needed(2, 1, env):
                out = _two_ranks_on_gpu_0(env)
        except Exception as exc:  # noqa: BLE001 - no MPS on this machine
            if "not on PATH" in str(exc) or "did not start" in str(exc):
                pytest.skip(f"MPS cannot be started here: {exc}")
            raise
    assert "rank 0 device 0 warnings 0" in out and "rank 1 device 0 warnings 0" in out, out[-4000:]
    assert "WARNING" not in out
