"""tests/run's stage bookkeeping (tests/stages.sh): a stage that exits 77 is reported SKIPPED
with its reason, in its own line and in the summary, never as passed; failures still fail."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

STAGES = Path(__file__).resolve().parents[1] / "stages.sh"
pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")


def _run(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {STAGES}\n{script}\nsummary"], capture_output=True,
                          text=True, timeout=60)


def test_all_ran_and_passed():
    r = _run("stage one true\nstage two true")
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "=== tests/run: all stages passed", r.stdout
    assert "=== tests/run: one: ok in " in r.stdout


def test_a_skipped_stage_is_named_with_its_reason_not_counted_as_passed():
    r = _run("stage serial true\n"
             "stage slurm bash -c 'echo \"tests/slurm/run: skipped: needs root\"; exit 77'\n"
             "skip gpu 'no GPU on this machine'")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "=== tests/run: slurm: SKIPPED (needs root)" in r.stdout
    assert "slurm: ok" not in r.stdout
    assert r.stdout.splitlines()[-1] == \
        "=== tests/run: all stages passed (skipped: slurm — needs root; gpu — no GPU on this machine)"


def test_a_failed_stage_fails_the_run_and_skips_are_still_named():
    r = _run("stage serial false\nstage slurm bash -c 'exit 77'")
    assert r.returncode == 1
    assert "=== tests/run: serial: FAILED (exit 1)" in r.stdout
    assert r.stdout.splitlines()[-1] == "=== tests/run: FAILED: serial (skipped: slurm — no reason given)"


def test_tests_run_uses_the_bookkeeping_and_the_slurm_stage_can_skip():
    run = (STAGES.parent / "run").read_text()
    assert "source tests/stages.sh" in run and run.rstrip().endswith("summary")
    assert "exit 0" not in (STAGES.parent / "slurm" / "run").read_text().split("have_slurm()")[0]
