"""scripts/gpu_course_checks.sh, the one prepared command a lent GPU runs: it must say how to use it before doing any
work, write its provenance first, and keep every step inside the time it was given (rehearsed here on the CPU)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_course_checks.sh"
WHEELS = ROOT / "scripts" / "gpu_wheels.sh"


def run(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def fake_python(tmp_path, cases=""):
    """A PYTHON that runs no Python: ``cases`` (bash case arms) stand in for the steps, matched by their arguments;
    any other call (the versions, the dtype rule, ...) prints a line and succeeds, in no time."""
    path = tmp_path / "python"
    path.write_text(f'''#!/usr/bin/env bash
case "$*" in
{cases}
  *) echo "fake python: ${{1:-}}" ;;
esac
''')
    path.chmod(0o755)
    return str(path)


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


@pytest.mark.parametrize("stage, step, cases", [
    # a step that ignores SIGTERM: `timeout -k 10` kills it 10 s after its limit (exit 137), not the tool's limit
    ("cold", "smoke 4 (cold start)", "  *cold_start.py*) trap '' TERM; exec sleep 40 ;;"),
    ("7b", "7b (scripts/gpu_check.py)", "  *gpu_check.py*) exec sleep 40 ;;"),  # stopped by SIGTERM: timeout's 124
], ids=["ignores-SIGTERM", "stopped-by-SIGTERM"])
def test_a_step_cut_by_its_own_limit_exits_3_and_says_which(tmp_path, stage, step, cases):
    """The device tool reads a command's 124 (or 137) as its own timeout (timed_out: true), so an inner `timeout`'s
    124, passed out, sent the operator to rerun with a longer timeout_s. A cut step is now exit 3, with one line that
    names it and its limit (here BUDGET=5 leaves it the 5 s floor), and the stage's end is still recorded."""
    out = tmp_path / "out"
    done = run(stage, OUT=str(out), PYTHON=fake_python(tmp_path, cases), DEVICE="cpu", BUDGET="5", COLD_NEEDS="0")
    # exit 3 and the "cut:" line below are the proof that the step was stopped (a finished sleep exits 0, no line);
    # no wall-clock bound is asserted
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    provenance = (out / "provenance.txt").read_text()
    assert re.search(rf"cut: {re.escape(step)} (ran out|was killed .* after) its limit of [5-9] s", provenance), provenance
    assert f"stage {stage}: exit 3" in provenance


def test_the_fp16_report_starts_only_with_the_time_it_took_on_the_h200_left(tmp_path):
    """It took ≈ 100 s on the H200 on 2026-12-04 (inductor compiling); it started when 30 s were left (the old
    FP16_NEEDS), only to be cut. Now it needs 60 s (the default path records CUDA graphs without a compiler). The skip
    says how much was left and how much it needs; with enough left it runs."""
    cases = "  *gpu-report*) echo 'gpu-report ran' ;;"
    for budget, ran in (("50", False), ("200", True)):
        out = tmp_path / budget
        done = run("smoke", OUT=str(out), PYTHON=fake_python(tmp_path, cases), BUDGET=budget, COLD_NEEDS="1000")
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        report = (out / "gpu_report_fp16.txt").read_text()
        if ran:
            assert report.startswith("fp16 smoke: the path runs in fp16 on cuda; the fp32 reload on non-finite logits "
                                     "is not reached here") and report.endswith("\ngpu-report ran\n"), report
        else:
            assert re.fullmatch(r"smoke 3 \(fp16 gpu-report\) skipped: (4\d|50) s of BUDGET left, it needs 60 s "
                                r"\(FP16_NEEDS\)\n", report), report


def test_all_keeps_the_fp16_reports_time_back_from_the_notebooks_and_a_deadline_cut_is_exit_3(tmp_path):
    """In `all` the notebooks run to a deadline, then the fp16 report. The deadline kept back 40 s only, and the
    report needs 60 s (FP16_NEEDS) to start: a run to the deadline always skipped it. Now the deadline keeps
    FP16_NEEDS back too. Notebooks that were only cut by their deadline (execute_notebooks.py's exit 3) are a cut
    step, exit 3 with a line that says so, not a failed one."""
    cases = """  *execute_notebooks.py*) echo "notebooks given: $*"; exit 3 ;;
  *gpu-report*) echo 'gpu-report ran' ;;"""
    out = tmp_path / "out"
    done = run("all", OUT=str(out), PYTHON=fake_python(tmp_path, cases), BUDGET="200")
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    deadline = int(re.search(r"--deadline (\d+)", (out / "notebooks.txt").read_text()).group(1))
    assert 90 <= deadline <= 100  # 200 s, less 40 s for the archive and 60 s for the fp16 report (was 160)
    assert (out / "gpu_report_fp16.txt").read_text().endswith("gpu-report ran\n")
    provenance = (out / "provenance.txt").read_text()
    assert f"cut: notebooks: the DEADLINE of {deadline} s stopped or never started some" in provenance
    assert "stage all: exit 3" in provenance


def test_gpu_wheels_names_the_commit_and_warns_when_the_tree_that_travels_is_not_it(tmp_path):
    """.git does not travel, so GIT_COMMIT names the code that ran only if the tree is that commit: the script prints
    the sha, and a warning when tracked edits or untracked files that git does not ignore (they travel too) differ.
    Its size counts those untracked files (it counted tracked ones only). pip is faked: a wheel appears, no network."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    bin_.mkdir()
    shutil.copy(WHEELS, repo / "scripts" / "gpu_wheels.sh")
    (repo / ".gitignore").write_text("/.whl/\n")
    (repo / "a.txt").write_text("a" * 1000)
    (bin_ / "python3").write_text('''#!/usr/bin/env bash
while (( $# )); do [[ $1 == -d ]] && d=$2; shift; done
printf '%0100d' 0 > "$d/nbclient-1.0-py3-none-any.whl"
''')
    (bin_ / "python3").chmod(0o755)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()
    env = {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}

    def wheels():
        done = subprocess.run(["bash", "scripts/gpu_wheels.sh"], cwd=repo, capture_output=True, text=True, timeout=60, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        travels = int(re.search(r"not ignored\): (\d+) bytes", done.stdout).group(1))
        return done, travels

    tracked = sum(p.stat().st_size for p in (repo / "scripts" / "gpu_wheels.sh", repo / ".gitignore", repo / "a.txt"))
    done, travels = wheels()
    assert done.stdout.rstrip().endswith(f"GIT_COMMIT={sha}") and "WARNING" not in done.stderr
    assert "1 wheels in .whl: 100 bytes" in done.stdout and travels == tracked
    (repo / "b.txt").write_text("b" * 5000)  # untracked, not ignored: it travels
    done, travels = wheels()
    assert f"GIT_COMMIT={sha}" in done.stdout and travels == tracked + 5000
    assert "WARNING: the working tree is not commit" in done.stderr and "?? b.txt" in done.stderr


def test_the_wheels_for_the_gpu_machine_are_pinned():
    """gpu_wheels.sh fetches with -c constraints/gpu_wheels.txt, which pins each package it asks for (and their
    dependencies) to one version: a new release cannot change what runs in a lease unannounced. Before: unpinned."""
    script = WHEELS.read_text()
    assert "-c constraints/gpu_wheels.txt" in script
    pins = {}
    for line in (ROOT / "constraints" / "gpu_wheels.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = re.fullmatch(r"([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.]*)", line.strip()).groups()
            pins[name.lower().replace("_", "-")] = version
    asked = re.search(r"^PACKAGES=\(([^)]*)\)", script, re.M).group(1).split()
    assert asked and all(name in pins for name in asked), (asked, sorted(pins))
    assert {"ipython", "jupyter-client", "pyzmq", "tornado", "traitlets"} <= set(pins)  # the kernel's own stack
