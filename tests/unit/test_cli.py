"""The `hpccoll` command line (hpccoll/cli.py)."""
from __future__ import annotations

import os
import re
import shutil
import signal
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
    from hpccoll.backends.factory import device_unavailable_reason

    why = device_unavailable_reason()
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


# -- argument errors: caught before anything runs, printed once ----------------------------------
@pytest.fixture
def no_sweep(monkeypatch):
    """Any sweep fails the test: the command must stop before one (and restore the excepthook
    main() installs)."""
    import hpccoll.bench.sweep as sweep

    def sweep_ran(*a, **k):
        pytest.fail("a sweep ran before the command refused its arguments")

    monkeypatch.setattr(sweep, "run_sweep", sweep_ran)
    if "hpccoll.bench.tune" in sys.modules:
        monkeypatch.setattr(sys.modules["hpccoll.bench.tune"], "run_sweep", sweep_ran, raising=False)
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)


def _refused(argv, capsys) -> str:
    """main(argv) must exit non-zero; its stderr."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code not in (0, None)
    return capsys.readouterr().err


def test_unknown_algorithms_are_refused_with_the_valid_ones(no_sweep, capsys):
    err = _refused(["bench", "allreduce", "--sizes", "8", "--algorithms", "foo,oneshot_ll,bar"], capsys)
    assert "foo, bar" in err and "oneshot_sentinel" in err and "twoshot_ll128" in err and "auto" in err
    err = _refused(["bench", "bcast", "--sizes", "8", "--algorithms", "oneshot_ll"], capsys)
    assert "unknown oneshot_ll" in err and "bcast takes all (alone) or a comma list of auto, ll" in err


def test_tune_refuses_at_once_without_a_gpu(no_sweep, capsys):
    from hpccoll.backends.factory import device_unavailable_reason

    why = device_unavailable_reason()
    if why is None:
        pytest.skip("a GPU is usable here")
    err = _refused(["tune", "--sizes", "8", "--iters", "1"], capsys)
    assert "hpccoll tune" in err and "cuda backend" in err and why in err and "nothing written" in err


@pytest.mark.parametrize("argv", [["bench", "allreduce", "--json", "{bad}"],
                                  ["bench", "allreduce", "--plot", "{bad}"],
                                  ["tune", "--out", "{bad}"], ["tune", "--json", "{bad}"],
                                  ["bench", "allreduce", "--json", "{dir}"]])
def test_output_paths_are_checked_before_anything_runs(argv, no_sweep, capsys, tmp_path):
    bad = str(tmp_path / "no" / "such" / "x.json")
    argv = [a.format(bad=bad, dir=tmp_path) for a in argv] + ["--sizes", "8", "--iters", "1"]
    err = _refused(argv, capsys)
    assert len(err.strip().splitlines()) == 1, err
    assert (str(tmp_path / "no" / "such") in err and "does not exist" in err) or "is a folder" in err
    assert "Traceback" not in err


def test_bad_sizes_are_refused_in_one_line(no_sweep, capsys):
    err = _refused(["bench", "allreduce", "--sizes", "64M:8"], capsys)
    assert err.strip() == "hpccoll bench: sizes '64M:8': use LO:HI with 0 < LO <= HI (e.g. 8:64M)"
    assert "--iters must be >= 1" in _refused(["tune", "--iters", "0"], capsys)


def _mpiexec() -> list[str]:
    """The mpiexec beside this Python (else on PATH), with Open MPI's flags for root and 2 ranks."""
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1:
        pytest.skip("already inside an MPI job")
    exe = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        pytest.skip("no mpiexec")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout
    return [exe, "--allow-run-as-root", "--oversubscribe"] if "Open MPI" in version else [exe]


def test_an_exception_on_one_rank_aborts_the_job(tmp_path):
    """Rank 1 fails as the sweep starts while rank 0 enters a collective: the job must end
    (MPI_Abort), not hang, with the error printed once."""
    script = tmp_path / "fail_on_rank_1.py"
    script.write_text(
        "import sys\n"
        "from mpi4py import MPI\n"
        "import hpccoll.bench.sweep as sweep\n"
        "from hpccoll.cli import main\n"
        "def run_sweep(opts, log=None):\n"
        "    if MPI.COMM_WORLD.Get_rank() == 1:\n"
        "        raise RuntimeError('rank 1 failed on purpose')\n"
        "    MPI.COMM_WORLD.Barrier()\n"
        "sweep.run_sweep = run_sweep\n"
        "sys.exit(main(['bench', 'allreduce', '--sizes', '8', '--iters', '1']))\n")
    env = dict(os.environ, MPIEXEC_TIMEOUT="100", OMP_NUM_THREADS="1")
    job = subprocess.Popen([*_mpiexec(), "-n", "2", sys.executable, str(script)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        out, _ = job.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)  # the job's own process group (start_new_session)
        job.communicate()
        pytest.fail("the job hung after rank 1 raised")
    assert job.returncode != 0
    assert out.count("RuntimeError: rank 1 failed on purpose") == 1, out


def test_info_under_mpiexec_prints_one_report_with_every_rank(tmp_path):
    """Every rank runs `hpccoll info`; rank 0 prints the one report, with what each rank sees."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "HYDRA_"))}
    env.update(MPIEXEC_TIMEOUT="100", OMP_NUM_THREADS="1")
    proc = subprocess.run([*_mpiexec(), "-n", "3", sys.executable, "-m", "hpccoll", "info"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    # one report: its header line ("hpccoll <version> (Python ...)") and its backends once
    assert len(re.findall(r"^hpccoll \S+ \(Python ", out, re.M)) == 1 and out.count("backends:") == 1, out
    assert "ranks: 3 on 1 host" in out and all(f"  rank {r}: " in out for r in range(3)), out
    assert "MPS" in out.split("  rank 2: ")[1].splitlines()[0]
