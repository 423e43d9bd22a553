"""The slurm/*.sbatch scripts against a real Slurm, and srun's singleton trap.

Tests marked `slurm` need a reachable controller (`tests/slurm/run` starts a one-node cluster on
localhost and runs them); they submit the real scripts with small CPU problems, wait for the job
(bounded), and check its state, exit code and the files it wrote.  The unmarked tests check the
scripts' own guards and hygiene without Slurm."""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "slurm"
SCRIPTS = ("bench.sbatch", "eigensolver.sbatch", "reproducibility.sbatch")
#: seconds one job may take from submission to its end (small CPU problems, 2 CPUs)
JOB_TIMEOUT = float(os.environ.get("HPCCOLL_SLURM_JOB_TIMEOUT", "300"))
_DONE = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "BOOT_FAIL", "DEADLINE"}
#: pending reasons that never clear on a one-node test cluster
_NEVER = {"PartitionConfig", "PartitionNodeLimit", "BadConstraints", "ReqNodeNotAvail",
          "Resources_Unavailable", "InvalidQOS"}


def _slurm_unreachable() -> str | None:
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return "no Slurm client (sbatch, sinfo) on PATH; tests/slurm/run starts a cluster"
    try:
        r = subprocess.run(["sinfo", "-h"], capture_output=True, text=True, timeout=15)
    except subprocess.TimeoutExpired:
        return "sinfo did not answer within 15 s"
    if r.returncode != 0:
        return f"no Slurm controller reachable (sinfo: {r.stderr.strip()}); tests/slurm/run starts one"
    return None


@pytest.fixture(scope="module")
def slurm():
    why = _slurm_unreachable()
    if why:
        pytest.skip(why)


def _user_env() -> dict[str, str]:
    """The submitting user's environment: this Python's install is the one the jobs use."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
    if os.environ.get("SLURM_CONF"):
        env["SLURM_CONF"] = os.environ["SLURM_CONF"]
    if sys.prefix != sys.base_prefix and (Path(sys.prefix) / "bin" / "activate").is_file():
        env["HPCCOLL_VENV"] = sys.prefix  # exercise the scripts' venv activation
    else:
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _job_fields(job_id: str) -> dict[str, str] | None:
    r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0 or "JobState=" not in r.stdout:
        return None
    return dict(re.findall(r"(\w+)=(\S*)", r.stdout))


def submit(script: str, tmp_path: Path, ntasks: int = 2, sbatch_args=(), **variables
           ) -> tuple[dict, str, Path]:
    """sbatch the script with `variables` exported, wait for its end (bounded by JOB_TIMEOUT),
    return (scontrol fields, job log, OUT folder)."""
    out = tmp_path / "out"
    env = _user_env()
    env.update({k: str(v) for k, v in variables.items()})
    env["OUT"] = str(out)
    r = subprocess.run(["sbatch", "--parsable", "-n", str(ntasks), f"--chdir={tmp_path}",
                        f"--output={tmp_path}/slurm-%j.out", *sbatch_args, str(SLURM / script)],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"sbatch {script} failed: {r.stderr}"
    job_id = r.stdout.strip().split(";")[0]
    log = tmp_path / f"slurm-{job_id}.out"
    deadline = time.monotonic() + JOB_TIMEOUT
    fields = None
    while time.monotonic() < deadline:
        fields = _job_fields(job_id)
        if fields is None:
            # purged already (MinJobAge) or unknown: the job is over, squeue no longer lists it
            q = subprocess.run(["squeue", "-h", "-j", job_id], capture_output=True, text=True)
            if q.returncode == 0 and q.stdout.strip():
                time.sleep(0.5)
                continue
            pytest.fail(f"job {job_id} ({script}) vanished from scontrol; log:\n{_read(log)}")
        if fields.get("JobState") in _DONE:
            break
        if fields.get("JobState") == "PENDING" and fields.get("Reason") in _NEVER:
            subprocess.run(["scancel", job_id], timeout=30)
            pytest.fail(f"job {job_id} ({script}) can never start here: {fields.get('Reason')} "
                        f"(NumNodes={fields.get('NumNodes')} NumCPUs={fields.get('NumCPUs')}); "
                        "the node has fewer CPUs than the job's tasks?")
        time.sleep(0.5)
    else:
        subprocess.run(["scancel", job_id], timeout=30)
        pytest.fail(f"job {job_id} ({script}) still {fields and fields.get('JobState')} after "
                    f"{JOB_TIMEOUT:.0f} s; cancelled. Log:\n{_read(log)}")
    return fields, _read(log), out


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return f"<{path}: {exc}>"


def assert_completed(fields: dict, log: str) -> None:
    state, code = fields.get("JobState"), fields.get("ExitCode")
    assert (state, code) == ("COMPLETED", "0:0"), \
        f"job {fields.get('JobId')} ended {state} with exit {code}; log:\n{log}"


def job_txt(out: Path) -> dict[str, str]:
    lines = (out / "job.txt").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def _values(obj, key_part: str) -> list:
    """Every value, at any depth, under a dict key containing key_part (case-insensitive)."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if key_part in str(k).lower():
                found.append(v)
            found += _values(v, key_part)
    elif isinstance(obj, list):
        for v in obj:
            found += _values(v, key_part)
    return found


def _numbers(values) -> list[float]:
    nums = []
    for v in values:
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            nums.append(float(v))
        elif isinstance(v, (list, dict)):
            nums += _numbers(v if isinstance(v, list) else list(v.values()))
    return nums


def _expected_plugin() -> str:
    from mpi4py import MPI  # noqa: PLC0415 - only the slurm tests need it

    return "pmix" if "Open MPI" in MPI.Get_library_version() else "pmi2"


# ---------------------------------------------------------------- against a real Slurm


@pytest.mark.slurm
def test_bench_job(slurm, tmp_path):
    fields, log, out = submit("bench.sbatch", tmp_path, COLLECTIVE="allreduce", SIZES="8:4K",
                              ITERS=5)
    assert_completed(fields, log)
    meta = job_txt(out)
    assert meta["ranks"] == "2"  # the test node advertises fake GPUs, so "gpus" may be non-zero
    assert meta["mpi_plugin"] == _expected_plugin()
    data = json.loads((out / "bench.json").read_text())
    assert data, "bench.json is empty"
    assert "allreduce" in json.dumps(data)
    sizes = set(_numbers(_values(data, "size")) + _numbers(_values(data, "bytes")))
    assert {8.0, 4096.0} <= sizes, f"bench.json lacks the sizes 8 and 4096: {sorted(sizes)[:20]}"


@pytest.mark.slurm
def test_eigensolver_job(slurm, tmp_path):
    n, repeat = 96, 2
    fields, log, out = submit("eigensolver.sbatch", tmp_path, N=n, COMM="mpi", REPEAT=repeat)
    assert_completed(fields, log)
    meta = job_txt(out)
    assert meta["ranks"] == "2" and "--comm mpi" in meta["command"]
    runs = sorted(out.glob("*_run[0-9][0-9][0-9].json"))
    assert len(runs) == repeat, f"want {repeat} run JSONs in {out}: {sorted(p.name for p in out.iterdir())}"
    for path in runs:
        rec = json.loads(path.read_text())
        assert (rec["n"], rec["ranks"], rec["comm"], rec["problem"]) == (n, 2, "mpi", "known"), path
        assert rec["cond_b"] == 1e3
        # LAPACK-style scaled residual and B-orthogonality: O(1) for a correct solve
        for key in ("residual", "b_orthogonality"):
            assert math.isfinite(rec[key]) and 0 <= rec[key] < 100, (path.name, key, rec[key])
        assert rec["eigenvalue_error"] < 1e-10, (path.name, rec["eigenvalue_error"])
        assert len(rec["eigenvalues"]) == n
    # the mpi path reduces in rank order: both solves agree bit for bit
    digests = {json.loads(p.read_text())["eigenvalues_sha256"] for p in runs}
    assert len(digests) == 1, digests


@pytest.mark.slurm
def test_reproducibility_job(slurm, tmp_path):
    # COMM unset: on this CPU node the script must default to the only path there, mpi.
    n, repeat = 64, 2
    fields, log, out = submit("reproducibility.sbatch", tmp_path, N=n, REPEAT=repeat)
    assert_completed(fields, log)
    meta = job_txt(out)
    assert "--comm mpi" in meta["command"] and "--ranks 2" in meta["command"]
    assert not list(out.glob("failed_*.json"))
    assert len(list(out.glob(f"known_n{n}_p2_mpi_*_run[0-9][0-9][0-9].json"))) == repeat
    assert "| mpi |" in (out / "report.md").read_text()
    report = json.loads((out / "report.json").read_text())
    (config,) = report["configurations"]
    assert (config["comm"], config["n"], config["ranks"], config["runs"]) == ("mpi", n, 2, repeat)
    assert config["distinct_eigenvalue_digests"] == 1, config
    assert config["ranks_agree_on_eigenvalues_all_runs"] is True


@pytest.fixture
def fake_gpus(slurm):
    """tests/slurm/run gives its node 2 fake GPUs (device files like /dev/null) where it can."""
    if os.environ.get("HPCCOLL_SLURM_FAKE_GPUS", "0") != "2":
        pytest.skip("this Slurm node has no (fake) GPUs; tests/slurm/run configures 2")


@pytest.mark.slurm
def test_every_task_gets_all_node_gpus(fake_gpus, tmp_path):
    """--gpus-per-node=2: both tasks see GPUs 0,1 (no per-task binding); no real GPU, so the
    benchmark itself runs on the host backend."""
    fields, log, out = submit("bench.sbatch", tmp_path, sbatch_args=["--gpus-per-node=2"],
                              SIZES="8:64", ITERS=3)
    meta = job_txt(out)
    assert meta["gpus"] == "2", meta
    assert meta["task_gpus"] == "0,1", f"tasks saw {meta['task_gpus']!r}, want all of 0,1 each"
    assert_completed(fields, log)


@pytest.mark.slurm
@pytest.mark.parametrize("binding", [["--gpus-per-task=1"], ["--gpus-per-node=2", "--gpu-bind=closest"]],
                         ids=["gpus-per-task", "gpu-bind"])
def test_per_task_gpu_binding_is_refused(fake_gpus, tmp_path, binding):
    fields, log, out = submit("eigensolver.sbatch", tmp_path, sbatch_args=binding, N=64, COMM="mpi")
    assert fields["JobState"] == "FAILED" and fields["ExitCode"] == "2:0", (fields, log)
    assert "breaks CUDA IPC" in log and "--gpus-per-node" in log, log
    assert not out.exists(), "refused, yet it wrote output"


@pytest.mark.slurm
def test_srun_wrong_plugin_is_refused(slurm):
    """srun --mpi=none with the MPICH wheel starts 2 singletons: hpccoll must refuse loudly."""
    r = subprocess.run(["srun", "-n", "2", "--mpi=none", sys.executable, "-c",
                        "import hpccoll; hpccoll.Communicator()"],
                       env=_user_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode != 0
    assert "--mpi=pmi2" in r.stderr and "size 1" in r.stderr, r.stderr


@pytest.mark.slurm
def test_srun_right_plugin_makes_one_world(slurm):
    r = subprocess.run(["srun", "-n", "2", f"--mpi={_expected_plugin()}", sys.executable, "-c",
                        "import hpccoll; c = hpccoll.Communicator(backend='host'); "
                        "print('world', c.Get_size())"],
                       env=_user_env(), capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split().count("2") == 2, r.stdout


# ---------------------------------------------------------------- the scripts, without Slurm


def _run_script(script: str, **variables) -> subprocess.CompletedProcess:
    env = _user_env()
    env.pop("HPCCOLL_VENV", None)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({k: str(v) for k, v in variables.items()})
    return subprocess.run(["bash", str(SLURM / script)], env=env, capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_refuses_outside_slurm(script):
    r = _run_script(script)
    assert r.returncode == 2 and "submit with sbatch" in r.stderr, r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_accepts_multinode(script, tmp_path):
    """Several nodes run hierarchically (hpccoll.hier): the scripts say so instead of refusing."""
    r = _run_script(script, SLURM_JOB_ID=1, SLURM_JOB_NUM_NODES=2, OUT=tmp_path)
    assert "2 nodes: collectives run hierarchically" in r.stderr, r.stderr
    assert "HPCCOLL_ALLOW_MULTINODE" not in r.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_refuses_per_task_gpus(script):
    r = _run_script(script, SLURM_JOB_ID=1, SLURM_GPUS_PER_TASK=1)
    assert r.returncode == 2 and "CUDA IPC" in r.stderr and "--gpus-per-node" in r.stderr, r.stderr


def test_script_refuses_a_missing_venv(tmp_path):
    r = _run_script("bench.sbatch", SLURM_JOB_ID=1, HPCCOLL_VENV=tmp_path / "nope")
    assert r.returncode == 2 and "HPCCOLL_VENV" in r.stderr, r.stderr


def test_jobs_share_one_common_file():
    """Every job sources slurm/common.sh and repeats none of it."""
    common = (SLURM / "common.sh").read_text()
    shared = [name for name in ("die()", "write_job_txt()", "MPI_PLUGIN=", "TASK_GPUS=") if name in common]
    assert len(shared) == 4, "common.sh lost a part the jobs use"
    for s in SCRIPTS:
        text = (SLURM / s).read_text()
        assert 'source "$common"' in text, f"slurm/{s} does not source common.sh"
        for name in ("die()", "write_job_txt()", "MPI_PLUGINS="):
            assert name not in text, f"slurm/{s} repeats {name} of common.sh"


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_header(script):
    text = (SLURM / script).read_text()
    assert os.access(SLURM / script, os.X_OK)
    assert "#SBATCH --nodes=1" in text
    assert "--gpus-per-task" in text.split("#SBATCH")[0], "the header must warn about per-task GPUs"
    for var in ("OUT", "HPCCOLL_VENV", "HPCCOLL_MPI_PLUGIN", "hierarchically", "Writes:"):
        assert var in text.split("#SBATCH")[0], f"{script}: header does not document {var}"


def test_shellcheck_clean():
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed (apt-get install shellcheck)")
    files = [str(SLURM / s) for s in SCRIPTS] + [str(SLURM / "common.sh"), str(Path(__file__).with_name("run"))]
    r = subprocess.run(["shellcheck", *files], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


# ------------------------------------------------- MPS where tasks outnumber GPUs (no Slurm needed)
FAKE_MPS_CONTROL = """#!/bin/bash
# nvidia-cuda-mps-control as far as slurm/common.sh uses it: -d leaves a control socket, quit is logged
if [[ ${1:-} == -d ]]; then
    echo start >> "$MPS_CALLS"
    "$PYTHON" -c 'import os, socket; socket.socket(socket.AF_UNIX).bind(os.environ["CUDA_MPS_PIPE_DIRECTORY"] + "/control")'
else
    echo "$(cat)" >> "$MPS_CALLS"
fi
"""


def _mps_function(tmp_path, fake: bool, **variables) -> tuple[subprocess.CompletedProcess, list[str]]:
    """slurm/common.sh's mps_where_ranks_share_gpus alone, in a shell with `variables` (and, with
    `fake`, a fake nvidia-cuda-mps-control on PATH); its result and the control program's calls."""
    text = (SLURM / "common.sh").read_text()
    body = text[text.index("die() {"):text.index("\n", text.index("die() {"))] + "\n" + \
        text[text.index("mps_where_ranks_share_gpus() {"):]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if fake:
        (bin_dir / "nvidia-cuda-mps-control").write_text(FAKE_MPS_CONTROL)
        (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    calls = tmp_path / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "MPS_CALLS": str(calls), "PYTHON": sys.executable,
           "SLURM_JOB_ID": str(os.getpid()), "CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")}
    env.update({k: str(v) for k, v in variables.items()})
    r = subprocess.run(["bash", "-c", body + "\nset -euo pipefail\nmps_where_ranks_share_gpus\n"
                        'echo "pipe=${CUDA_MPS_PIPE_DIRECTORY}"'],
                       env=env, capture_output=True, text=True, timeout=60)
    return r, calls.read_text().split() if calls.exists() else []


def test_mps_is_not_started_where_every_task_has_a_gpu(tmp_path):
    for gpus, tasks in ((0, "4"), (2, "2(x2)"), (4, "3,4")):
        r, calls = _mps_function(tmp_path, True, NGPUS=gpus, SLURM_TASKS_PER_NODE=tasks)
        assert r.returncode == 0 and calls == [] and "MPS" not in r.stdout, r.stdout + r.stderr


def test_mps_is_started_for_the_job_and_stopped_at_its_end(tmp_path):
    r, calls = _mps_function(tmp_path, True, NGPUS=1, SLURM_TASKS_PER_NODE="2")
    assert r.returncode == 0, r.stderr
    assert calls == ["start", "quit"], calls
    assert "MPS started for 2 tasks on 1 GPU(s)" in r.stdout and "pipe=/tmp/hpccoll-mps-" in r.stdout
    assert not os.path.exists(r.stdout.split("pipe=")[1].strip())  # its pipe folder removed at the end


def test_a_running_mps_is_used_as_it_is(tmp_path):
    import socket

    (tmp_path / "pipe").mkdir()
    socket.socket(socket.AF_UNIX).bind(str(tmp_path / "pipe" / "control"))
    r, calls = _mps_function(tmp_path, True, NGPUS=1, SLURM_NTASKS_PER_NODE=3,
                             CUDA_MPS_PIPE_DIRECTORY=tmp_path / "pipe")
    assert r.returncode == 0 and calls == [] and "MPS running" in r.stdout, r.stdout + r.stderr


def test_ranks_sharing_a_gpu_without_a_way_to_start_mps_are_refused(tmp_path):
    r, calls = _mps_function(tmp_path, False, NGPUS=1, SLURM_TASKS_PER_NODE="2")
    assert r.returncode == 2 and calls == [], r.stdout + r.stderr
    assert "2 tasks per node share 1 GPU(s) and no MPS runs" in r.stderr
    assert "nvidia-cuda-mps-control -d" in r.stderr and "40x slower" in r.stderr
    r, calls = _mps_function(tmp_path, True, NGPUS=2, SLURM_TASKS_PER_NODE="4(x2)", SLURM_JOB_NUM_NODES=2)
    assert r.returncode == 2 and calls == [] and "start MPS on every node" in r.stderr, r.stderr
