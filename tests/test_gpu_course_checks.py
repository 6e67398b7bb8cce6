"""scripts/gpu_course_checks.sh, the one prepared command a lent GPU runs: it must say how to use it before doing any
work, write its provenance first, and keep every step inside the time it was given (rehearsed here on the CPU)."""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
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
    files = sorted(f.name for f in out.iterdir())  # the device tool returns 8 files from $OUT: more are dropped, silently
    assert len(files) <= 8, files


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
    manifest = (repo / ".whl" / "MANIFEST").read_text().splitlines()  # every file that travels, by its hash
    assert f"{hashlib.sha256(b'a' * 1000).hexdigest()}  a.txt" in manifest and len(manifest) == 3, manifest
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


def fake_tools(tmp_path, cut="", cut_rc=124):
    """A PATH whose `timeout`, `pkill` and `nvidia-smi` are stand-ins: `timeout` writes its arguments to tools.log and
    runs the step with no limit, or, for a step whose command matches the glob ``cut``, exits ``cut_rc`` after it as a
    real `timeout` does when it cuts one (no test waits for a limit); `pkill` only writes its arguments (it must never
    reach the kernels of this machine); `nvidia-smi` names a GPU."""
    bin_, log = tmp_path / "bin", tmp_path / "tools.log"
    bin_.mkdir(exist_ok=True)
    tools = {
        "timeout": f'''#!/usr/bin/env bash
echo "timeout $*" >> "{log}"
while [[ $1 == -* ]]; do [[ $1 == -k ]] && shift; shift; done
shift
"$@"; rc=$?
cut='{cut}'
[[ -n $cut && "$*" == $cut ]] && exit {cut_rc}
exit $rc
''',
        "pkill": f'#!/usr/bin/env bash\necho "pkill $*" >> "{log}"\nexit 1\n',  # 1: no process matched
        "nvidia-smi": '#!/usr/bin/env bash\necho "NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB"\n',
    }
    for name, text in tools.items():
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    return f"{bin_}{os.pathsep}{os.environ['PATH']}"


def test_every_step_runs_under_timeout_k_10_with_its_cap_cut_to_what_is_left_of_the_budget(tmp_path):
    """Each step runs under `timeout -k 10 LIMIT` (one that ignores SIGTERM is killed 10 s later, still inside the
    call); LIMIT is the step's cap (60, 90, 120, 150 and 400 s; 590 s for 7b, under the tool's 600 s) cut to what is left of
    BUDGET counted from the script's start, and never under 5 s. A fake `timeout` records the limits, so no step waits
    for one; bash takes SECONDS from the environment, so SECONDS=40 rehearses a stage 40 s into its call."""
    log = tmp_path / "tools.log"

    def limits(stage, **env):
        log.unlink(missing_ok=True)
        done = run(stage, OUT=str(tmp_path / "out"), PYTHON=fake_python(tmp_path), PATH=fake_tools(tmp_path),
                   FP16_NEEDS="-100", COLD_NEEDS="-100", **env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        setup, calls = [], []  # the provenance's nvidia-smi and versions lines have a limit of their own (30, 60 s)
        for call in log.read_text().splitlines():
            (setup if call.startswith("timeout -k 5 ") else calls).append(call)
        assert [call.split()[3] for call in setup] == ["30", "60"], setup
        found = [int(m.group(1)) for m in map(re.compile(r"timeout -k 10 (-?\d+) ").match, calls) if m]
        assert len(found) == len(calls), calls  # every step has its -k 10
        return found

    assert limits("smoke", BUDGET="1000") == [60, 90, 120, 150, 400]
    assert limits("7b", BUDGET="1000") == [590]
    dtype, *rest = limits("smoke", BUDGET="110", SECONDS="40")  # 70 s left (69 or 68 if a second ticks)
    assert dtype == 60 and len(rest) == 4 and all(67 <= t <= 70 for t in rest), rest
    assert limits("7b", BUDGET="0") == [5] and limits("smoke", BUDGET="3", SECONDS="40") == [5, 5, 5, 5, 5]


def test_the_notebooks_get_their_deadline_settings_and_names_and_a_backstop_20_s_after_it(tmp_path):
    """execute_notebooks.py gets --deadline (DEADLINE, or what is left of BUDGET less 40 s, and in `all` less
    FP16_NEEDS too), --jobs JOBS, --timeout CELL_TIMEOUT and the notebooks named after the stage; its outer `timeout`
    (a backstop) is 20 s after the deadline, with -k 10."""
    py = fake_python(tmp_path, '  *execute_notebooks.py*) echo "notebooks given: $*" ;;')
    for args, env, deadlines in (
            (("notebooks", "notebooks/00_a.ipynb", "notebooks/01_b.ipynb"),
             dict(DEADLINE="100", JOBS="2", CELL_TIMEOUT="30"), (100,)),
            (("all", "notebooks/00_a.ipynb", "notebooks/01_b.ipynb"),
             dict(BUDGET="300", FP16_NEEDS="100", COLD_NEEDS="7", JOBS="2", CELL_TIMEOUT="30"), (158, 159, 160))):
        out = tmp_path / args[0]
        (tmp_path / "tools.log").unlink(missing_ok=True)
        done = run(*args, OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path), **env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        given = (out / "notebooks.txt").read_text()
        deadline = int(re.search(r"--deadline (-?\d+) ", given).group(1))
        assert deadline in deadlines, (args[0], given)
        assert "--jobs 2 " in given and "--timeout 30 " in given and given.rstrip().endswith(
            "--out /tmp/executed notebooks/00_a.ipynb notebooks/01_b.ipynb"), given
        backstop = [line for line in (tmp_path / "tools.log").read_text().splitlines() if "execute_notebooks.py" in line]
        assert backstop and backstop[0].startswith(f"timeout -k 10 {deadline + 20} "), backstop


@pytest.mark.parametrize("stage, cut, step, rc", [
    ("smoke", "*default_dtype*", "smoke 1 (dtype rule)", 124),
    ("smoke", "*python - cuda", "smoke 2 (compile failure)", 137),
    ("smoke", "*gpu-report*", "smoke 3 (fp16 gpu-report)", 124),
    ("smoke", "*cold_start.py*", "smoke 4 (cold start)", 137),
    ("7b", "*gpu_check.py*", "7b (scripts/gpu_check.py)", 137),
])
def test_a_step_cut_by_its_timeout_is_exit_3_the_next_steps_run_and_the_provenance_keeps_its_head(tmp_path, stage,
                                                                                                    cut, step, rc):
    """Every step's cut (its `timeout`'s 124, or 137 after -k 10) is exit 3, never 124 or 137 passed out, with a
    "cut:" line appended to the provenance, whose head (date, commit) stays; smoke's later steps still run. A fake
    `timeout` exits as a real one would, at once (the slow test above waits for real limits on two steps)."""
    out = tmp_path / "out"
    done = run(stage, OUT=str(out), PYTHON=fake_python(tmp_path), PATH=fake_tools(tmp_path, cut, rc), BUDGET="1000",
               FP16_NEEDS="0", COLD_NEEDS="0", GIT_COMMIT="abc1234")
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    provenance = (out / "provenance.txt").read_text()
    assert provenance.startswith("date: 20") and "commit: abc1234" in provenance, provenance
    assert re.search(rf"^cut: {re.escape(step)} (ran out|was killed .* after) its limit of \d+ s", provenance, re.M)
    assert provenance.count("cut: ") == 1 and provenance.rstrip().splitlines()[-1].startswith(f"stage {stage}: exit 3")
    if stage == "smoke":
        assert "fake python: scripts/cold_start.py" in (out / "cold_start.txt").read_text()


@pytest.mark.parametrize("failing, code", [("*default_dtype*", 5), ('"- cuda"', 6), ("*gpu-report*", 7)])
def test_a_failed_step_is_the_stages_exit_status_and_the_steps_after_it_still_run(tmp_path, failing, code):
    """A step that fails gives the stage its own exit status (not 0, not 1, not an abort before the end line), and
    smoke's later steps still run: a failure must never read as a pass, nor cost the steps after it."""
    out = tmp_path / "out"
    py = fake_python(tmp_path, f"  {failing}) echo failing; exit {code} ;;")
    done = run("smoke", OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path), BUDGET="1000", FP16_NEEDS="0",
               COLD_NEEDS="0")
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
    assert "fake python: scripts/cold_start.py" in (out / "cold_start.txt").read_text()
    assert f"stage smoke: exit {code}" in (out / "provenance.txt").read_text()


def test_failed_or_backstopped_notebooks_are_not_a_pass_and_come_back_as_one_archive_of_this_call(tmp_path):
    """The executed notebooks come back as one notebooks.tgz (the tool returns 8 files) holding this call's copies
    only, whether they passed or not. A failed notebook is the stage's failure (its exit status), not a pass; a backstop
    cut (124, or 137 after -k 10) is exit 3, and its kernels are stopped (`pkill`, faked here) even when none is left."""
    cases = '''  *execute_notebooks.py*) while (( $# )); do [[ $1 == --out ]] && o=$2; shift; done
    echo '{}' > "$o/00_a.ipynb"; echo "one failed"; exit 1 ;;'''
    py = fake_python(tmp_path, cases)
    for cut_rc, code in ((None, 1), (124, 3), (137, 3)):
        out, log = tmp_path / f"out{cut_rc}", tmp_path / "tools.log"
        log.unlink(missing_ok=True)
        Path("/tmp/executed").mkdir(exist_ok=True)
        Path("/tmp/executed/stale_from_an_earlier_call.ipynb").write_text("{}")
        path = fake_tools(tmp_path, "*execute_notebooks.py*" if cut_rc else "", cut_rc or 0)
        done = run("notebooks", OUT=str(out), PYTHON=py, PATH=path, DEADLINE="100")
        assert done.returncode == code, done.stdout[-2000:] + done.stderr[-2000:]
        listing = subprocess.run(["tar", "-tzf", str(out / "notebooks.tgz")], capture_output=True, text=True, check=True)
        assert sorted(listing.stdout.split()) == ["executed/", "executed/00_a.ipynb"], listing.stdout
        provenance = (out / "provenance.txt").read_text()
        assert f"stage notebooks: exit {code}" in provenance
        assert ("pkill -f ipykernel_launcher" in log.read_text()) == bool(cut_rc)
        if cut_rc:
            assert "cut: notebooks (the backstop)" in provenance and "its limit of 120 s" in provenance, provenance
        else:  # a notebook failed: the backstop did not fire, and the line must not blame it
            assert "failed: notebooks exited 1" in provenance and "(the backstop)" not in provenance, provenance


def test_no_jupyter_stack_is_exit_2_and_runs_no_notebook(tmp_path):
    """Without nbclient, ipykernel or ipywidgets (the GPU image has none; .whl was not carried) the notebooks stage
    says what to do and exits 2, instead of running notebooks that cannot start or passing with none run."""
    out = tmp_path / "out"
    py = fake_python(tmp_path, """  *ipywidgets*) exit 1 ;;
  *execute_notebooks.py*) echo 'notebooks ran' ;;""")
    done = run("notebooks", OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path))
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    said = (out / "notebooks.txt").read_text()
    assert said.startswith("no Jupyter stack here: run 'bash scripts/gpu_wheels.sh'") and "notebooks ran" not in said
    assert "stage notebooks: exit 2" in (out / "provenance.txt").read_text()


def test_the_carried_wheels_go_on_pythonpath_and_a_failed_install_costs_no_stage(tmp_path):
    """What .whl/ holds is installed with pip --no-index --no-deps into /tmp/site, which goes first on PYTHONPATH for
    every step; a failed install (wheels for another Python) warns and the stage runs on (it may need none of them).
    Either way the provenance says so (a warning on stderr alone reached only the device tool's tail of its output).
    The script runs from a copy of the tree that holds a .whl/, with pip faked."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".whl").mkdir()
    shutil.copy(SCRIPT, repo / "scripts" / "gpu_course_checks.sh")
    (repo / ".whl" / "nbclient-0.11.0-py3-none-any.whl").write_text("")
    for installs in (True, False):
        out = tmp_path / f"out{installs}"
        py = fake_python(tmp_path, f'''  *"pip install"*) echo "$*" > "{tmp_path}/pip.txt"; exit {0 if installs else 1} ;;
  *"import torch, transformers"*) echo "versions PYTHONPATH=${{PYTHONPATH:-}}" ;;''')
        done = subprocess.run(["bash", "scripts/gpu_course_checks.sh", "cold"], cwd=repo, capture_output=True,
                              text=True, timeout=60, env={**os.environ, "PYTHON": py, "OUT": str(out),
                                                          "PATH": fake_tools(tmp_path), "PYTHONPATH": "/x",
                                                          "COLD_NEEDS": "1000"})
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        pip = (tmp_path / "pip.txt").read_text()
        assert "--no-index --no-deps " in pip and "--target /tmp/site .whl/nbclient-0.11.0-py3-none-any.whl" in pip
        seen = "/tmp/site:/x" if installs else "/x"
        assert (out / "versions.txt").read_text() == f"versions PYTHONPATH={seen}\n"
        assert ("did not install" in done.stderr) != installs
        assert "skipped" in (out / "cold_start.txt").read_text()
        provenance = (out / "provenance.txt").read_text()
        said = "wheels: 1 from .whl/ installed into /tmp/site" if installs else "warning: the wheels in .whl/ did not install"
        assert "stage cold: exit 0" in provenance and said in provenance, provenance


def test_the_provenance_names_the_run_and_every_step_runs_offline_on_the_random_target_to_its_files(tmp_path,
                                                                                                        monkeypatch):
    """The provenance holds the date, the command, the commit, the settings (BUDGET 580 by default), the
    SPECDEC_EDU_ variables, the GPU and the versions (also versions.txt); each step sees no internet (HF_HUB_OFFLINE,
    TRANSFORMERS_OFFLINE), the random target and, for the fp16 report, SPECDEC_EDU_DTYPE=fp16, and writes its JSON
    under $OUT with the name the results are committed by. FP16_NEEDS and COLD_NEEDS each gate their own step."""
    for name in ("BUDGET", "DEADLINE", "JOBS", "CELL_TIMEOUT", "DEVICE", "SIZE", "FP16_NEEDS", "COLD_NEEDS"):
        monkeypatch.delenv(name, raising=False)
    cases = '''  *"import torch, transformers"*) echo "2.13.0 5.17.0 NVIDIA H100 80GB HBM3" ;;
  *gpu-report*) echo "dtype=${SPECDEC_EDU_DTYPE:-}" ;;
  *gpu_check.py*|*cold_start.py*) echo "$* offline=$HF_HUB_OFFLINE,$TRANSFORMERS_OFFLINE random=$SPECDEC_EDU_RANDOM_TARGET" ;;'''
    py, path = fake_python(tmp_path, cases), fake_tools(tmp_path)
    out = tmp_path / "7b"
    tree = tmp_path / "TREE"  # what scripts/gpu_wheels.sh writes beside the wheels
    tree.write_text("commit 0123abc\nNOT CLEAN: 1 path(s) differ from it; git diff HEAD sha256 feedbeef\n M a.py\n")
    done = run("7b", OUT=str(out), PYTHON=py, PATH=path, GIT_COMMIT="abc1234", SIZE="tiny", TREE=str(tree))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    provenance = (out / "provenance.txt").read_text().splitlines()
    assert ["tree: commit 0123abc", "tree: NOT CLEAN: 1 path(s) differ from it; git diff HEAD sha256 feedbeef",
            "tree:  M a.py"] == [line for line in provenance if line.startswith("tree:")], provenance
    assert re.fullmatch(r"date: 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\dZ", provenance[0]), provenance
    assert provenance[1].startswith("command: ") and provenance[1].endswith("scripts/gpu_course_checks.sh 7b")
    assert provenance[2:4] == ["commit: abc1234", "settings: BUDGET=580 DEADLINE=auto JOBS=4 CELL_TIMEOUT=240 "
                                                  "DEVICE=cuda SIZE=tiny"], provenance
    for line in ("SPECDEC_EDU_RANDOM_TARGET=1", "NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB",
                 "2.13.0 5.17.0 NVIDIA H100 80GB HBM3"):
        assert line in provenance, line
    assert (out / "versions.txt").read_text() == "2.13.0 5.17.0 NVIDIA H100 80GB HBM3\n"
    check = (out / "gpu_check_7b.txt").read_text()
    assert f"--json {out}/gpu_check_7b.json " in check and "offline=1,1 random=1" in check, check
    for fp16_needs, cold_needs in (("0", "1000"), ("1000", "0")):
        out = tmp_path / f"smoke{fp16_needs}"
        done = run("smoke", OUT=str(out), PYTHON=py, PATH=path, FP16_NEEDS=fp16_needs, COLD_NEEDS=cold_needs)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        fp16, cold = (out / "gpu_report_fp16.txt").read_text(), (out / "cold_start.txt").read_text()
        if fp16_needs == "0":
            assert fp16.endswith("\ndtype=fp16\n") and "it needs 1000 s (COLD_NEEDS)" in cold, (fp16, cold)
        else:
            assert "it needs 1000 s (FP16_NEEDS)" in fp16 and f"--json {out}/cold_start.json " in cold, (fp16, cold)
            assert "offline=1,1 random=1" in cold


def test_a_versions_line_cut_by_its_limit_stops_the_stage_with_3_not_124(tmp_path):
    """Nothing runs without torch: a versions line that does not return stops the stage. Under `set -e` its 124 was
    the script's exit status, which the device tool reads as its own timeout; it is exit 3 with a `failed:` line."""
    out = tmp_path / "out"
    done = run("cold", OUT=str(out), PYTHON=fake_python(tmp_path),
               PATH=fake_tools(tmp_path, "*import torch, transformers*", 124))
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    assert "failed: the versions line (import torch, transformers) exited 124" in (out / "provenance.txt").read_text()


def test_the_provenance_names_the_files_changed_since_the_wheels_were_made(tmp_path):
    """The tree travels at the call, not when scripts/gpu_wheels.sh wrote .whl/TREE: its MANIFEST (every file's
    sha256) is checked, and a file edited since is named in the provenance; an unchanged tree says so."""
    tree, manifest = tmp_path / "TREE", tmp_path / "MANIFEST"
    tree.write_text("commit 0123abc\nclean: the tree is that commit\n")
    readme = hashlib.sha256((ROOT / "README.md").read_bytes()).hexdigest()
    manifest.write_text(f"{readme}  README.md\n")
    py, path = fake_python(tmp_path), fake_tools(tmp_path)
    done = run("cold", OUT=str(tmp_path / "same"), PYTHON=py, PATH=path, TREE=str(tree))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tree check: every file as when scripts/gpu_wheels.sh ran" in (tmp_path / "same" / "provenance.txt").read_text()
    manifest.write_text(f"{readme}  README.md\n{'0' * 64}  pyproject.toml\n")  # pyproject.toml "edited" since
    done = run("cold", OUT=str(tmp_path / "edited"), PYTHON=py, PATH=path, TREE=str(tree))
    lines = [line for line in (tmp_path / "edited" / "provenance.txt").read_text().splitlines() if "tree check" in line]
    assert lines == ["tree check: changed since scripts/gpu_wheels.sh ran: pyproject.toml: FAILED"], lines


def test_every_test_the_script_names_exists():
    """Smoke step 2b runs the suite's CUDA-only tests by node id: a renamed test would be "not found" on the GPU only."""
    named = re.findall(r'"(tests/[\w/]+\.py)::(\w+)"', SCRIPT.read_text())
    assert len(named) >= 3, named
    for file, test in named:
        assert re.search(rf"^def {test}\(", (ROOT / file).read_text(), re.M), f"{file}::{test}"


def wheels_repo(tmp_path):
    """A copy of gpu_wheels.sh in a fresh one-commit repo with its constraints, and a `python3` whose pip download
    writes its arguments to pip.txt and, instead of fetching, leaves wheels of the packages it names and of some it
    must not carry (no network)."""
    repo, bin_ = tmp_path / "repo", tmp_path / "bin"
    (repo / "scripts").mkdir(parents=True)
    (repo / "constraints").mkdir()
    bin_.mkdir()
    shutil.copy(WHEELS, repo / "scripts" / "gpu_wheels.sh")
    shutil.copy(ROOT / "constraints" / "gpu_wheels.txt", repo / "constraints" / "gpu_wheels.txt")
    (repo / ".gitignore").write_text("/.whl/\n")
    (bin_ / "python3").write_text(f'''#!/usr/bin/env bash
echo "$*" > "{tmp_path}/pip.txt"
while (( $# )); do [[ $1 == -d ]] && d=$2; shift; done
for w in nbclient-0.11.0 traitlets-5.16.1 debugpy-1.8.0 jedi-0.19.0 tzdata-2025.1 widgetsnbextension-4.0.0; do
  echo > "$d/$w-py3-none-any.whl"
done
''')
    (bin_ / "python3").chmod(0o755)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run(git + args, cwd=repo, check=True, capture_output=True)
    return repo, {**os.environ, "PATH": f"{bin_}{os.pathsep}{os.environ['PATH']}"}


def test_gpu_wheels_fetches_binaries_for_the_gpu_python_and_leaves_out_what_the_image_has(tmp_path):
    """pip download asks for binary wheels (any platform the image takes, pure ones too) for PY (3.12 by default), under
    the pins; the wheels the image has or that are not needed are removed, the ones needed stay, and a wheel left from
    an earlier run is gone. Run from another folder, it still works in the repository. PY other than 3.12 without
    WHEELS stops with exit 2 before fetching anything: .whl/ travels to the 3.12 machine."""
    repo, env = wheels_repo(tmp_path)
    (repo / ".whl").mkdir()
    (repo / ".whl" / "ipykernel-6.0.0-cp311-none-any.whl").write_text("")  # from an earlier run, for another Python
    done = subprocess.run(["bash", str(repo / "scripts" / "gpu_wheels.sh")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    pip = (tmp_path / "pip.txt").read_text().split()
    assert pip[:4] == ["-m", "pip", "download", "-q"] and "--only-binary=:all:" in pip, pip
    for option, value in (("--python-version", "3.12"), ("--implementation", "cp"), ("-c", "constraints/gpu_wheels.txt"),
                          ("-d", ".whl")):
        assert pip[pip.index(option) + 1] == value, (option, pip)
    platforms = {pip[i + 1] for i, arg in enumerate(pip) if arg == "--platform"}
    assert {"any", "manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_28_x86_64"} <= platforms, platforms
    assert sorted(p.name for p in (repo / ".whl").iterdir()) == ["MANIFEST", "TREE", "nbclient-0.11.0-py3-none-any.whl",
                                                                  "traitlets-5.16.1-py3-none-any.whl"]
    # TREE names the commit and whether the tree that travels is it (the stages copy it into their provenance)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    tree = (repo / ".whl" / "TREE").read_text().splitlines()
    assert tree[0] == f"commit {sha}" and len(sha) == 40, tree
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True).stdout
    assert tree[1] == "clean: the tree is that commit" if not status else tree[1].startswith("NOT CLEAN: "), (tree, status)
    (tmp_path / "pip.txt").unlink()
    done = subprocess.run(["bash", "scripts/gpu_wheels.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**env, "PY": "3.11"})
    assert done.returncode == 2 and "for a rehearsal give WHEELS=/tmp/whl" in done.stderr
    assert not (tmp_path / "pip.txt").exists()
    done = subprocess.run(["bash", "scripts/gpu_wheels.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**env, "PY": "3.11", "WHEELS": str(tmp_path / "whl")})
    assert done.returncode == 0, done.stdout + done.stderr
    pip = (tmp_path / "pip.txt").read_text().split()
    assert pip[pip.index("--python-version") + 1] == "3.11" and (tmp_path / "whl" / "nbclient-0.11.0-py3-none-any.whl").exists()


def test_gpu_wheels_fetches_every_module_the_notebooks_stage_checks_for():
    """The notebooks stage stops (exit 2) unless it can import nbclient, ipykernel and ipywidgets: each of them must be
    among the packages gpu_wheels.sh fetches, or a lease finds its stack incomplete."""
    checked = re.search(r'"\$PY" -c "import ([\w, ]+)" 2>/dev/null', SCRIPT.read_text()).group(1).split(", ")
    asked = re.search(r"^PACKAGES=\(([^)]*)\)", WHEELS.read_text(), re.M).group(1).split()
    assert checked and set(checked) <= set(asked), (checked, asked)


def test_the_pins_hold_every_dependency_of_the_pinned_packages():
    """-c pins only what it names: a dependency of a pinned package that is not pinned (nor on the image, nor left out
    on purpose) is fetched at whatever version is newest. Checked against this environment's metadata, for each pinned
    package installed here at its pinned version, with the GPU image's markers (CPython 3.12 on Linux)."""
    metadata = pytest.importorskip("importlib.metadata")
    requirements = pytest.importorskip("packaging.requirements")

    def norm(name):
        return re.sub(r"[-_.]+", "-", name).lower()

    script = WHEELS.read_text()
    left_out = {norm(name) for array in ("ON_THE_IMAGE", "NOT_NEEDED")
                for name in re.search(rf"^{array}=\(([^)]*)\)", script, re.M).group(1).split()}
    pins = dict(line.strip().split("==") for line in (ROOT / "constraints" / "gpu_wheels.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    pins = {norm(name): version for name, version in pins.items()}
    marker_env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "implementation_name": "cpython", "os_name": "posix",
                  "platform_python_implementation": "CPython", "platform_machine": "x86_64", "extra": ""}
    checked, missing = 0, []
    for name, version in pins.items():
        try:
            if metadata.version(name) != version:
                continue
        except metadata.PackageNotFoundError:
            continue
        checked += 1
        for text in metadata.requires(name) or []:
            requirement = requirements.Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(marker_env):
                continue
            if norm(requirement.name) not in pins and norm(requirement.name) not in left_out:
                missing.append(f"{name}: {requirement}")
    if not checked:
        pytest.skip("none of the pinned packages is installed here at its pinned version")
    assert not missing, missing


def test_device_size_paths_and_backend_reach_the_steps_and_their_stderr_goes_to_their_files(tmp_path):
    """DEVICE, SIZE, COLD_PATHS and COMPILE_BACKEND reach the steps that take them (a CPU rehearsal that ran with the
    GPU's settings would rehearse nothing), and each step's stderr (a traceback) lands in its file under $OUT beside
    its stdout: the files are what comes back from the machine."""
    py = fake_python(tmp_path, '  *) echo "args: $*"; echo "stderr of ${1:-}" >&2 ;;')
    env = dict(PYTHON=py, PATH=fake_tools(tmp_path), BUDGET="1000", FP16_NEEDS="0", COLD_NEEDS="0", DEVICE="cpu",
               SIZE="tiny", COLD_PATHS="default", COMPILE_BACKEND="aot_eager", DEADLINE="100")
    out = tmp_path / "out"
    for stage in ("smoke", "7b", "notebooks"):
        done = run(stage, OUT=str(out), **env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    expected = {"dtype.txt": ("default_dtype(d))) cpu\n", "stderr of -c"),
                "compile_failure.txt": ("args: - cpu\n", "stderr of -\n"),
                "gpu_report_fp16.txt": ("args: -m specdec_edu gpu-report", "stderr of -m"),
                "cold_start.txt": ("--device cpu --paths default --cpus 0,1 ", "stderr of scripts/cold_start.py"),
                "gpu_check_7b.txt": ("--size tiny --device cpu --compile --goals", "--compile-backend aot_eager ",
                                     "stderr of scripts/gpu_check.py"),
                "notebooks.txt": ("args: scripts/execute_notebooks.py", "stderr of scripts/execute_notebooks.py")}
    for name, parts in expected.items():
        text = (out / name).read_text()
        assert all(part in text for part in parts), (name, text)


@pytest.mark.parametrize("cut, failing", [("*cold_start.py*", '"- cuda"'), ("*default_dtype*", "*gpu-report*")])
def test_a_failure_outranks_a_cut_and_every_failed_step_has_its_line(tmp_path, cut, failing):
    """A step that failed and another that was cut, in either order: the stage exits with the failure's own status,
    not 3, which reads as "rerun with more time" and would not mend the failure; the provenance names the failed step
    as well as the cut one (the failure was found nowhere but in its own file)."""
    out = tmp_path / "out"
    py = fake_python(tmp_path, f"  {failing}) echo failing; exit 6 ;;")
    done = run("smoke", OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path, cut), BUDGET="1000", FP16_NEEDS="0",
               COLD_NEEDS="0")
    assert done.returncode == 6, done.stdout[-2000:] + done.stderr[-2000:]
    provenance = (out / "provenance.txt").read_text()
    assert re.search(r"^failed: smoke [23] \((compile failure|fp16 gpu-report)\) exited 6;", provenance, re.M), provenance
    assert provenance.count("cut: ") == 1 and provenance.splitlines()[-1].startswith("stage smoke: exit 6 "), provenance


def test_the_notebooks_deadline_is_cut_to_the_budget_and_too_little_of_it_is_a_cut(tmp_path):
    """DEADLINE is cut to what is left of BUDGET (less 40 s), so the backstop 20 s after it still ends inside the call
    (DEADLINE=1000 gave a 1020 s backstop, past the tool's 600 s limit). With too little left for any notebook, the
    stage runs none and exits 3 with a "cut:" line: it ran `timeout -1`, which GNU timeout refuses, and a limit of 0
    would have meant none at all."""
    py = fake_python(tmp_path, '  *execute_notebooks.py*) echo "notebooks given: $*" ;;')
    log = tmp_path / "tools.log"
    out = tmp_path / "capped"
    done = run("notebooks", OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path), BUDGET="300", DEADLINE="1000")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    deadline = int(re.search(r"--deadline (-?\d+) ", (out / "notebooks.txt").read_text()).group(1))
    backstop = int(re.search(r"timeout -k 10 (-?\d+) ", log.read_text()).group(1))
    assert 255 <= deadline <= 260 and backstop == deadline + 20, (deadline, backstop)
    log.unlink()
    out = tmp_path / "short"
    done = run("notebooks", OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path), BUDGET="20")
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    provenance = (out / "provenance.txt").read_text()
    assert "cut: notebooks not started: " in provenance and "stage notebooks: exit 3" in provenance, provenance
    assert "timeout -k 10" not in log.read_text() and "notebooks given" not in (out / "notebooks.txt").read_text()


def test_a_kernel_that_outlives_the_notebooks_run_does_not_hold_the_stage(tmp_path):
    """The kernels run in sessions of their own and inherit the run's output. Through `tee`, one that outlived
    execute_notebooks.py kept the pipe open: the stage waited for it (here a `sleep 20` in a new session stands in),
    and after a backstop cut the pkill that stops such kernels would never have come. The output now goes to its
    file directly, and the stage goes on at once."""
    marker = f"specdec-edu-test-kernel-{os.getpid()}"
    cases = f"""  *execute_notebooks.py*) setsid bash -c 'exec -a {marker} sleep 20' & echo "notebooks ran" ;;"""
    out = tmp_path / "out"
    try:
        started = time.monotonic()
        done = run("notebooks", OUT=str(out), PYTHON=fake_python(tmp_path, cases), PATH=fake_tools(tmp_path), DEADLINE="100")
        took = time.monotonic() - started
    finally:
        subprocess.run(["pkill", "-f", marker], capture_output=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert took < 15 and "notebooks ran" in (out / "notebooks.txt").read_text() and "notebooks ran" in done.stdout, took


def test_the_backstop_stops_this_runs_kernels_and_no_others(tmp_path, monkeypatch):
    """After a backstop cut the kernels (sessions of their own) outlive execute_notebooks.py, so the script stops
    them; a bare `pkill -f ipykernel_launcher` also stopped every other Jupyter kernel of the machine (a CPU rehearsal
    shares it). The notebooks run with TMPDIR set to a folder of the run's own, and pkill matches kernels whose
    connection file is there. That holds because jupyter_client puts a kernel's connection file under TMPDIR and the
    kernel's command line names it after -f (checked here on this environment's jupyter_client)."""
    py = fake_python(tmp_path, '  *execute_notebooks.py*) echo "TMPDIR=$TMPDIR" ;;')
    log = tmp_path / "tools.log"
    done = run("notebooks", OUT=str(tmp_path / "out"), PYTHON=py, DEADLINE="100",
               PATH=fake_tools(tmp_path, "*execute_notebooks.py*", 124))
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr[-2000:]
    kernels = re.search(r"^TMPDIR=(\S+)$", (tmp_path / "out" / "notebooks.txt").read_text(), re.M).group(1)
    assert kernels.startswith("/tmp/") and kernels != "/tmp", kernels
    assert [line for line in log.read_text().splitlines() if line.startswith("pkill")] == [
        f"pkill -f ipykernel_launcher -f {kernels}/"]
    connect = pytest.importorskip("jupyter_client.connect")
    kernelspec = pytest.importorskip("jupyter_client.kernelspec")
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # what TMPDIR sets in a fresh process
    fname, _ = connect.write_connection_file()
    assert Path(fname).parent == tmp_path, fname
    argv = " ".join(kernelspec.get_kernel_spec("python3").argv)
    assert "-m ipykernel_launcher -f {connection_file}" in argv, argv


def test_the_provenance_names_every_setting_a_step_reads(tmp_path):
    """COLD_PATHS, COMPILE_BACKEND, FP16_NEEDS, COLD_NEEDS and PYTHON change what a stage measures, so the provenance
    names them beside BUDGET and the rest (whether the carried wheels installed: the test of the wheels above)."""
    out = tmp_path / "out"
    py = fake_python(tmp_path)
    done = run("cold", OUT=str(out), PYTHON=py, PATH=fake_tools(tmp_path), COLD_NEEDS="1000", COLD_PATHS="default",
               COMPILE_BACKEND="capture", FP16_NEEDS="7")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert (f"settings: COLD_PATHS=default COMPILE_BACKEND=capture FP16_NEEDS=7 COLD_NEEDS=1000 PYTHON={py}"
            in (out / "provenance.txt").read_text().splitlines())


def test_gpu_wheels_refuses_another_python_for_the_folder_that_travels_however_it_is_named(tmp_path):
    """PY other than 3.12 into .whl/ (the folder that travels) stops with exit 2 before fetching anything, whether
    WHEELS is unset, `./.whl` or its absolute path: the guard compared the name with ".whl" and let the other two
    build cp311 wheels where the 3.12 machine would install them."""
    repo, env = wheels_repo(tmp_path)
    for wheels in (None, "./.whl", str(repo / ".whl"), str(repo / ".whl") + "/"):
        done = subprocess.run(["bash", "scripts/gpu_wheels.sh"], cwd=repo, capture_output=True, text=True, timeout=60,
                              env={**env, "PY": "3.11", **({"WHEELS": wheels} if wheels else {})})
        assert done.returncode == 2 and "for a rehearsal give WHEELS=/tmp/whl" in done.stderr, (wheels, done.stderr)
        assert not (tmp_path / "pip.txt").exists(), wheels
