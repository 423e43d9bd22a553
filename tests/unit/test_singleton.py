"""hpccoll._launcher.detect_singleton: a launcher started N>1 tasks but MPI says the world has size 1
(wrong srun PMI plugin, or mpiexec of another MPI): refuse with a message naming the fix."""
from __future__ import annotations

import pytest

from hpccoll import _launcher as _env
from hpccoll.errors import HpccollError

#: every variable detect_singleton reads; each test starts from an environment without them
_VARS = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_STEP_ID", "SLURM_JOB_ID",
         "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE", "MPI_LOCALNRANKS")


@pytest.fixture
def env(monkeypatch):
    """Clear the launcher variables, then return a setter."""
    for var in _VARS:
        monkeypatch.delenv(var, raising=False)

    def set_(**kw):
        for k, v in kw.items():
            monkeypatch.setenv(k, str(v))
    return set_


def test_srun_wrong_plugin_fires_and_names_the_fix(env):
    """srun -n 4 --mpi=none with MPICH: every task is a singleton."""
    env(SLURM_STEP_NUM_TASKS=4, SLURM_NTASKS=4, SLURM_STEP_ID=0)
    with pytest.raises(HpccollError) as exc:
        _env.detect_singleton(1)
    msg = str(exc.value)
    assert "4 tasks" in msg and "size 1" in msg
    assert "--mpi=pmi2" in msg and "--mpi=pmix" in msg


def test_step_task_count_wins_over_job_task_count(env):
    """Inside `sbatch -n 4`, `srun -n 1 python ...` is a legitimate singleton: the step has 1 task."""
    env(SLURM_NTASKS=4, SLURM_STEP_NUM_TASKS=1, SLURM_STEP_ID=0)
    _env.detect_singleton(1)


def test_step_num_tasks_alone_fires(env):
    env(SLURM_STEP_NUM_TASKS=2, SLURM_STEP_ID=3)
    with pytest.raises(HpccollError, match="--mpi=pmi2"):
        _env.detect_singleton(1)


def test_silent_when_the_world_matches(env):
    env(SLURM_STEP_NUM_TASKS=4, SLURM_NTASKS=4, SLURM_STEP_ID=0, PMI_SIZE=4)
    _env.detect_singleton(4)


def test_silent_in_the_batch_step(env):
    """The batch script of `sbatch -n 4` has SLURM_NTASKS=4 but no step: a plain `python` there
    (a driver such as `hpccoll-eigensolver compare`) is a real singleton."""
    env(SLURM_NTASKS=4, SLURM_JOB_ID=17)
    _env.detect_singleton(1)


def test_silent_for_a_one_task_step(env):
    env(SLURM_STEP_NUM_TASKS=1, SLURM_NTASKS=1, SLURM_STEP_ID=0)
    _env.detect_singleton(1)


def test_silent_without_any_launcher(env):
    _env.detect_singleton(1)


def test_open_mpi_launcher_with_another_mpi_fires(env):
    """Open MPI's mpirun -n 2 starting a program linked against MPICH."""
    env(OMPI_COMM_WORLD_SIZE=2)
    with pytest.raises(HpccollError) as exc:
        _env.detect_singleton(1)
    assert "OMPI_COMM_WORLD_SIZE=2" in str(exc.value)
    assert "mpiexec" in str(exc.value)


def test_pmi_launcher_with_another_mpi_fires(env):
    """MPICH's (hydra) mpiexec -n 3 starting a program linked against Open MPI."""
    env(PMI_SIZE=3)
    with pytest.raises(HpccollError, match="PMI_SIZE=3"):
        _env.detect_singleton(1)


@pytest.mark.parametrize("var", ["OMPI_COMM_WORLD_SIZE", "PMI_SIZE"])
def test_launcher_size_one_is_silent(env, var):
    env(**{var: 1})
    _env.detect_singleton(1)


@pytest.mark.parametrize("value", ["", "x", "-2"])
def test_garbage_values_are_ignored(env, value):
    env(SLURM_STEP_NUM_TASKS=value, SLURM_STEP_ID=0, OMPI_COMM_WORLD_SIZE=value, PMI_SIZE=value)
    _env.detect_singleton(1)
