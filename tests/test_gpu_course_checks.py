"""scripts/gpu_course_checks.sh, the one prepared command a lent GPU runs: it must say how to use it before doing any
work, write its provenance first, and keep every step inside the time it was given (rehearsed here on the CPU)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_course_checks.sh"


def run(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_no_stage_or_a_wrong_one_prints_the_usage_and_does_no_work(tmp_path):
    """A mistyped stage on the GPU costs a machine start: it ran smoke with no argument, and printed its usage only
    after installing the wheels and importing torch."""
    for args in ((), ("smok",)):
        done = run(*args, OUT=str(tmp_path / "out"))
        assert done.returncode == 2 and "bash scripts/gpu_course_checks.sh all" in done.stderr
        assert "give all, smoke, cold, notebooks or 7b" in done.stderr and not (tmp_path / "out").exists()
    done = run("--help", OUT=str(tmp_path / "out"))
    assert done.returncode == 0 and "BUDGET" in done.stdout and not (tmp_path / "out").exists()


def test_a_stage_writes_its_provenance_and_skips_what_its_budget_cannot_hold(tmp_path):
    """On a CPU: the dtype rule and the forced compile failure run (seconds); the fp16 report and the cold start,
    which would need 1000 s of BUDGET left to start, do not fit, and say so in their files; the provenance names the
    date, the command and the settings. (BUDGET=25 with the steps' real needs, 30 and 60 s, was cut off under a loaded
    2-core machine before the first two steps had finished.)"""
    out = tmp_path / "out"
    done = run("smoke", OUT=str(out), DEVICE="cpu", BUDGET="200", FP16_NEEDS="1000", COLD_NEEDS="1000",
               GIT_COMMIT="abc1234")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    provenance = (out / "provenance.txt").read_text()
    for line in ("date: 20", "command: ", "commit: abc1234", "BUDGET=200", "SPECDEC_EDU_RANDOM_TARGET=1",
                 "stage smoke: exit 0"):
        assert line in provenance, line
    assert "same tokens as eager: True" in (out / "compile_failure.txt").read_text()
    assert "skipped" in (out / "gpu_report_fp16.txt").read_text() and "skipped" in (out / "cold_start.txt").read_text()


def test_the_cold_stage_runs_the_cold_start_alone(tmp_path):
    """A lease's second call, while the machine is warm: only the cold start (smoke's last step), within its budget."""
    out = tmp_path / "out"
    done = run("cold", OUT=str(out), DEVICE="cpu", BUDGET="25")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "skipped" in (out / "cold_start.txt").read_text() and not (out / "compile_failure.txt").exists()
    assert "stage cold: exit 0" in (out / "provenance.txt").read_text()
