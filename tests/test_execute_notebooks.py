"""scripts/execute_notebooks.py: its arguments, its table, and that --scratch leaves the notebook it runs untouched."""

import re
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from notebook_outputs import machine_text  # noqa: E402  (tests/ is on the path, as for claims_eval)

import execute_notebooks  # noqa: E402
from specdec_edu.models.devices import thread_share  # noqa: E402


def test_arguments():
    args = execute_notebooks.parse_args(["--scratch", "--quick"])
    assert args.scratch and args.quick and args.out is None
    assert [p.name for p in args.notebooks][:2] == ["00_start_here.ipynb", "01_why_decoding_is_slow.ipynb"]
    assert len(args.notebooks) == 12
    with pytest.raises(SystemExit):
        execute_notebooks.parse_args(["--out", "somewhere"])  # --out without --scratch would mean "in place"
    # the committed outputs: never bounded
    for in_place_only_one_by_one in (["--jobs", "2"], ["--deadline", "60"], ["--retries", "1"]):
        with pytest.raises(SystemExit):
            execute_notebooks.parse_args(in_place_only_one_by_one)
    for nonsense in (["--jobs", "0"], ["--deadline", "0"], ["--retries", "-1"]):
        with pytest.raises(SystemExit):
            execute_notebooks.parse_args(["--scratch", *nonsense])
    args = execute_notebooks.parse_args(["--scratch", "--jobs", "4", "--deadline", "540"])
    assert (args.jobs, args.deadline) == (4, 540)


def test_the_table_lists_every_notebook():
    table = execute_notebooks.format_table([("00_a.ipynb", 12.3, "pass", 0.52), ("01_b.ipynb", None, "FAIL: boom", None)])
    lines = table.splitlines()
    assert lines[0].split() == ["notebook", "seconds", "load", "result"]
    assert lines[1].split() == ["00_a.ipynb", "12", "0.5", "pass"] and lines[2].split() == ["01_b.ipynb", "FAIL:", "boom"]


def recorded_notebook(values: dict, *checks: str):
    """A notebook whose one code cell recorded ``values`` and whose markdown states ``checks``."""
    from specdec_edu.course.claims import MIME

    code = nbformat.v4.new_code_cell("", outputs=[nbformat.v4.new_output("display_data", data={MIME: values})])
    prose = nbformat.v4.new_markdown_cell(" ".join(f"Prose. <!-- check: {c} -->" for c in checks))
    return nbformat.v4.new_notebook(cells=[code, prose])


def test_a_run_passes_only_if_its_checks_hold(tmp_path, capsys):
    """The two-run check: a notebook that ran but whose prose its new numbers contradict is a failure."""
    holds = recorded_notebook({"speedup": 1.4}, "speedup > 1")
    flipped = recorded_notebook({"speedup": 0.9}, "speedup > 1", "speedup > 0.5")
    unknown = recorded_notebook({"speedup": 1.4}, "speedup_typo > 1")
    assert execute_notebooks.check_result(holds) == "pass (1 checks)"
    assert execute_notebooks.check_result(flipped) == "FAIL: 1 of 2 checks: cell 1: speedup > 1"
    assert execute_notebooks.check_result(unknown).startswith("FAIL: 1 of 1 checks: cell 1: speedup_typo > 1 (")
    paths = []
    for name, nb in [("00_holds.ipynb", holds), ("01_flipped.ipynb", flipped)]:
        paths.append(tmp_path / name)
        nbformat.write(nb, paths[-1])
    assert execute_notebooks.main([str(paths[0]), "--check-only"]) == 0
    assert execute_notebooks.main([str(p) for p in paths] + ["--check-only"]) == 1
    assert "01_flipped.ipynb" in capsys.readouterr().out
    # a check that is no expression fails its notebook; the table still lists every notebook
    broken = recorded_notebook({"speedup": 1.4}, "speedup >")
    nbformat.write(broken, tmp_path / "02_broken.ipynb")
    assert execute_notebooks.main([str(tmp_path / "02_broken.ipynb"), str(paths[0]), "--check-only"]) == 1
    table = capsys.readouterr().out
    assert re.search(r"02_broken\.ipynb .*FAIL: 1 of 1 checks: cell 1: speedup > \(claim", table), table
    assert re.search(r"00_holds\.ipynb .*pass \(1 checks\)", table), table
    with pytest.raises(SystemExit):
        execute_notebooks.parse_args(["--check-only", "--scratch"])  # it runs nothing


def fake_execute(run: dict):
    """A stand-in for ``execute`` (no kernel): "runs" a notebook by writing ``run[path.name]`` (a notebook, or an
    exception to raise) to the destination, as a kernel's run would, and returns 1 s."""
    def execute(path, timeout, destination=None, deadline=None):
        result = run[path.name]
        if isinstance(result, Exception):
            raise result
        nbformat.write(result, destination or path)
        return 1.0
    return execute


def test_a_scratch_run_is_judged_by_the_numbers_it_recorded_not_the_committed_ones(tmp_path, capsys, monkeypatch):
    """The two-run check reads the executed copy: a committed notebook whose prose holds for its own outputs fails
    when this run's numbers contradict it, and the other way round. ``--quick`` records other numbers than the prose
    describes, so there the checks are not evaluated (and the row says so). No kernel: ``execute`` is replaced by one
    that writes the run's notebook. Before this test, a run judged by the committed outputs (or never judged)
    passed every test."""
    monkeypatch.setenv("SPECDEC_EDU_QUICK", "0")
    monkeypatch.setenv("PYTHONPATH", "")
    committed_holds, committed_flipped = tmp_path / "00_holds.ipynb", tmp_path / "01_flipped.ipynb"
    nbformat.write(recorded_notebook({"speedup": 1.4}, "speedup > 1", "speedup > 1.2"), committed_holds)
    nbformat.write(recorded_notebook({"speedup": 0.9}, "speedup > 1"), committed_flipped)
    before = committed_holds.read_text(), committed_flipped.read_text()
    run = {"00_holds.ipynb": recorded_notebook({"speedup": 0.9}, "speedup > 1", "speedup > 1.2"),  # this run flips both
           "01_flipped.ipynb": recorded_notebook({"speedup": 1.4}, "speedup > 1")}  # this run supports it
    monkeypatch.setattr(execute_notebooks, "execute", fake_execute(run))
    paths = [str(committed_holds), str(committed_flipped)]
    assert execute_notebooks.main([*paths, "--scratch", "--out", str(tmp_path / "full")]) == 1
    rows = capsys.readouterr().out.splitlines()
    assert [r for r in rows if r.startswith("00_holds")][0].endswith(
        "FAIL: 2 of 2 checks: cell 1: speedup > 1; cell 1: speedup > 1.2")
    assert [r for r in rows if r.startswith("01_flipped")][0].endswith("pass (1 checks)")
    assert execute_notebooks.main([paths[1], "--scratch", "--out", str(tmp_path / "one")]) == 0
    assert execute_notebooks.main([*paths, "--scratch", "--quick", "--out", str(tmp_path / "quick")]) == 0
    assert capsys.readouterr().out.count("pass (checks not evaluated: --quick)") == 2
    assert (committed_holds.read_text(), committed_flipped.read_text()) == before


def test_a_failing_notebook_stops_an_in_place_run_and_is_a_fail_row_in_scratch(tmp_path, capsys, monkeypatch):
    """In place, a notebook that fails ends the run with its error (the notebooks after it are not run over a
    broken state, and nothing reads as done); with ``--scratch`` it is a FAIL row, the next notebook runs, and the
    exit status is 1. No kernel (``execute`` replaced)."""
    monkeypatch.setenv("SPECDEC_EDU_QUICK", "0")
    monkeypatch.setenv("PYTHONPATH", "")
    paths = [tmp_path / "00_bad.ipynb", tmp_path / "01_good.ipynb"]
    for path in paths:
        nbformat.write(recorded_notebook({"speedup": 1.4}, "speedup > 1"), path)
    run = {"00_bad.ipynb": ZeroDivisionError("division by zero"),
           "01_good.ipynb": recorded_notebook({"speedup": 1.4}, "speedup > 1")}
    monkeypatch.setattr(execute_notebooks, "execute", fake_execute(run))
    with pytest.raises(ZeroDivisionError):
        execute_notebooks.main([str(p) for p in paths])
    assert "01_good" not in capsys.readouterr().out  # the run stopped at the broken notebook
    assert execute_notebooks.main([*map(str, paths), "--scratch", "--out", str(tmp_path / "out")]) == 1
    table = capsys.readouterr().out.splitlines()[-3:-1]
    assert table[0].startswith("00_bad.ipynb") and table[0].endswith("FAIL: division by zero")
    assert table[1].startswith("01_good.ipynb") and table[1].endswith("pass (1 checks)")


def write_notebook(path: Path, source: str) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_scratch_runs_copies_and_reports_failures(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SPECDEC_EDU_QUICK", "0")
    monkeypatch.setenv("PYTHONPATH", "")  # main() sets both for its kernels; restored after the test
    good, bad = tmp_path / "00_good.ipynb", tmp_path / "01_bad.ipynb"
    report = "import os\nimport specdec_edu\nprint('quick', os.environ['SPECDEC_EDU_QUICK'], specdec_edu.__file__)"
    for path, source in [(good, report), (bad, "1 / 0")]:
        write_notebook(path, source)
    before, bad_before = good.read_text(), bad.read_text()
    out = tmp_path / "out"
    status = execute_notebooks.main([str(good), str(bad), "--scratch", "--quick", "--out", str(out)])
    assert status == 1 and good.read_text() == before and bad.read_text() == bad_before  # the committed ones: untouched
    failed = nbformat.read(out / bad.name, as_version=4)  # the failing copy is kept, with its traceback
    assert [o.get("ename") for o in failed.cells[0].outputs] == ["ZeroDivisionError"]
    ran = nbformat.read(out / good.name, as_version=4)
    quick, package = ran.cells[0].outputs[0]["text"].split()[1:]
    assert quick == "1" and package.startswith(str(Path(execute_notebooks.ROOT)))  # this checkout's package
    table = capsys.readouterr().out
    assert "00_good.ipynb" in table and "pass (checks not evaluated: --quick)" in table
    assert "01_bad.ipynb" in table and "ZeroDivisionError" in table


def test_jobs_run_notebooks_side_by_side_and_a_deadline_still_prints_the_table(tmp_path, capsys, monkeypatch):
    """Two notebooks that each wait for the other (a file each, up to 60 s) pass only side by side (--jobs 2).
    The negative control, one by one under a 15 s deadline (a kernel starts well inside it, on a loaded machine too):
    the first is stopped at the deadline, the second is never started, and the table still names both."""
    monkeypatch.setenv("SPECDEC_EDU_QUICK", "0")
    monkeypatch.setenv("PYTHONPATH", "")
    # main() sets OMP_NUM_THREADS for side-by-side kernels: unset here, and unset again after the test (setenv
    # records the value to restore, also "not set"; a bare delenv of an unset variable records nothing)
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    monkeypatch.delenv("OMP_NUM_THREADS")
    waits = textwrap.dedent("""\
        import os, pathlib, time
        here, other = pathlib.Path({!r}), pathlib.Path({!r})
        here.touch()
        end = time.monotonic() + 60
        while not other.exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert other.exists(), "the other notebook never ran beside this one"
        print("threads", os.environ["OMP_NUM_THREADS"])""")
    flags = tmp_path / "a.flag", tmp_path / "b.flag"
    paths = [write_notebook(tmp_path / "00_a.ipynb", waits.format(str(flags[0]), str(flags[1]))),
             write_notebook(tmp_path / "01_b.ipynb", waits.format(str(flags[1]), str(flags[0])))]
    out = tmp_path / "together"
    assert execute_notebooks.main([*map(str, paths), "--scratch", "--jobs", "2", "--deadline", "120", "--out", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()[:-1]  # the last line: "2 notebooks in N s, 2 at a time"
    assert [line.split()[0] for line in table[-2:]] == ["00_a.ipynb", "01_b.ipynb"]  # the notebooks' order
    ran = nbformat.read(out / "00_a.ipynb", as_version=4)
    assert ran.cells[0].outputs[0]["text"].split() == ["threads", str(thread_share(2))]  # the usable cores, halved

    for flag in flags:
        flag.unlink()
    out = tmp_path / "one_by_one"
    # 3, not 1: nothing failed but the deadline (gpu_course_checks.sh passes it on as "a step was cut")
    assert execute_notebooks.main([*map(str, paths), "--scratch", "--deadline", "15", "--out", str(out)]) == 3
    table = capsys.readouterr().out.splitlines()[:-1]
    assert "FAIL: stopped at the 15 s deadline in cell 0" in table[-2] and table[-2].startswith("00_a.ipynb")
    assert "FAIL: not started: the 15 s deadline had passed" in table[-1] and table[-1].startswith("01_b.ipynb")
    assert (out / "00_a.ipynb").exists() and not (out / "01_b.ipynb").exists()


def test_the_exit_status_tells_a_run_cut_by_its_deadline_from_a_failing_notebook():
    """The GPU stage reads 3 as "cut short: rerun the rest with more time", 1 as "a notebook is broken". Before: a
    deadline row exited 1, as a broken notebook does."""
    passed, broken = ("00.ipynb", 9.0, "pass"), ("01.ipynb", None, "FAIL: ZeroDivisionError: division by zero")
    stopped = ("02.ipynb", None, "FAIL: stopped at the 300 s deadline in cell 4 (its copy has the cells that ran)")
    not_started = ("03.ipynb", None, "FAIL: not started: the 300 s deadline had passed")
    assert execute_notebooks.exit_status([passed]) == 0
    assert execute_notebooks.exit_status([passed, stopped, not_started]) == 3
    assert execute_notebooks.exit_status([passed, broken, stopped]) == 1  # a real failure wins
    assert execute_notebooks.exit_status([broken]) == 1


def test_only_the_runners_own_deadline_rows_read_as_cut():
    """Exit status 3 ("cut short") needs every failing row to *be* a deadline row: a notebook whose own error
    message mentions a deadline, or whose checks failed, is broken (1). And ``--check-only`` runs nothing, so it
    takes no run settings."""
    own_error = ("00.ipynb", None, "FAIL: RuntimeError: stopped at the 30 s deadline of my own loop")
    checks = ("01.ipynb", 9.0, "FAIL: 1 of 2 checks: cell 4: speedup > 1")
    stopped = ("02.ipynb", None, "FAIL: stopped at the 300 s deadline in cell 4 (its copy has the cells that ran)")
    assert execute_notebooks.exit_status([own_error, stopped]) == 1
    assert execute_notebooks.exit_status([checks, stopped]) == 1
    for run_setting in (["--scratch"], ["--quick"]):
        with pytest.raises(SystemExit):
            execute_notebooks.parse_args(["--check-only", *run_setting])


def test_a_kernel_that_stops_answering_costs_a_rerun_not_the_deadline(tmp_path, capsys, monkeypatch):
    """The first run's kernel goes quiet in cell 1 (it sleeps past the 4 s cell timeout); --retries 1 runs the
    notebook again, and that run passes. The negative control, --retries 0: a FAIL row that names the cell."""
    monkeypatch.setenv("SPECDEC_EDU_QUICK", "0")
    monkeypatch.setenv("PYTHONPATH", "")
    flag = tmp_path / "ran_once.flag"
    quiet_once = textwrap.dedent(f"""\
        import pathlib, time
        flag = pathlib.Path({str(flag)!r})
        if not flag.exists():
            flag.touch()
            time.sleep(60)  # as a kernel that stopped answering
        print("answered")""")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(quiet_once)])
    path = tmp_path / "00_quiet.ipynb"
    nbformat.write(nb, path)
    common = [str(path), "--scratch", "--timeout", "4", "--deadline", "120"]
    assert execute_notebooks.main([*common, "--retries", "1", "--out", str(tmp_path / "retried")]) == 0
    printed = capsys.readouterr().out
    assert "00_quiet.ipynb: cell 1 ran past the 4 s cell timeout; running the notebook again (1 of 1)" in printed
    assert nbformat.read(tmp_path / "retried" / path.name, as_version=4).cells[1].outputs[0]["text"] == "answered\n"

    flag.unlink()
    assert execute_notebooks.main([*common, "--out", str(tmp_path / "once")]) == 1
    assert "FAIL: cell 1 ran past the 4 s cell timeout" in capsys.readouterr().out.splitlines()[-2]


def test_a_notebook_that_fails_in_place_keeps_its_committed_outputs(tmp_path):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="the committed output\n")])])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "00_bad.ipynb"
    nbformat.write(nb, path)
    before = path.read_text()
    with pytest.raises(Exception, match="ZeroDivisionError"):
        execute_notebooks.execute(path, timeout=60, destination=path)  # as main() calls it without --scratch
    assert path.read_text() == before


def test_an_install_log_is_never_written_over_a_committed_notebook(tmp_path):
    # What the embedded pair's first use printed inside a kernel, executing notebook 07 in place on a fresh machine.
    log = "[specdec_edu] first use: building the embedded target in /root/.cache/specdec_edu/x"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"import sys; print({log!r}, file=sys.stderr)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "00_log.ipynb"
    nbformat.write(nb, path)
    before = path.read_text()
    with pytest.raises(RuntimeError, match="install log or a machine path.*cell 0: .*first use"):
        execute_notebooks.execute(path, timeout=60, destination=path)  # in place
    assert path.read_text() == before
    copy = tmp_path / "copy.ipynb"  # a scratch copy is nobody's committed output: it is written
    execute_notebooks.execute(path, timeout=60, destination=copy)
    assert machine_text(nbformat.read(copy, as_version=4)) == [f"cell 0: {log}"]


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.name[:2])
def test_committed_outputs_hold_no_install_log_or_machine_path(path):
    assert machine_text(nbformat.read(path, as_version=4)) == []


def test_every_kind_of_machine_text_is_found_wherever_an_output_holds_it():
    """Each alternative of ``MACHINE_TEXT``, in each place a reader sees it (a stream as a list of lines, a plain-text
    result, a traceback, not only on an output's first line), is found; the committed notebooks hold none, so only
    this negative control shows the check can fail. Clean text is left alone."""
    leaks = ["/root/specdec", "/home/me/x", "/work/main/x", "/tmp/x", "/Users/me/x", "C:\\Users\\me", "site-packages/torch",
             "~/.cache/huggingface", "Looking in indexes: https://pypi.org", "Collecting torch", "Downloading torch-2.whl",
             "Successfully installed torch-2", "Requirement already satisfied: torch", "[specdec_edu] first use: built",
             "[specdec_edu] downloading the pair"]
    for leak in leaks:
        outputs = [nbformat.v4.new_output("stream", name="stderr", text=["clean\n", f"  {leak}\n"]),
                   nbformat.v4.new_output("execute_result", data={"text/plain": f"clean\n{leak}"}),
                   nbformat.v4.new_output("error", ename="E", evalue="", traceback=["clean", f"at {leak}"])]
        nb = {"cells": [{"cell_type": "markdown", "source": leak}, {"cell_type": "code", "outputs": outputs}]}
        assert machine_text(nb) == [f"cell 1: {leak}", f"cell 1: {leak}", f"cell 1: at {leak}"], leak
    clean = nbformat.v4.new_output("stream", name="stdout", text="speedup 1.4x in 56 ms; α = 0.62 (see notebooks/07)\n")
    assert machine_text({"cells": [{"cell_type": "code", "outputs": [clean]}]}) == []


def test_tagged_cells_are_skipped_and_keep_their_source(tmp_path):
    """A cell tagged ``gpu`` (``colab``, ``hub``: tests/notebook_tags.py) does not run on the machine that writes the
    committed outputs, and its source comes back with no output: a notebook whose GPU cell would fail here passes,
    and its copy still shows the learner that cell. One kernel, one short run."""
    gpu = nbformat.v4.new_code_cell("raise RuntimeError('needs CUDA')", outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="an old output\n")], execution_count=3)
    gpu.metadata["tags"] = ["solution", "gpu"]
    shown = nbformat.v4.new_code_cell("print('ran')")
    shown.metadata["tags"] = ["solution"]
    nb = nbformat.v4.new_notebook(cells=[gpu, shown])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path, copy = tmp_path / "00_tags.ipynb", tmp_path / "copy.ipynb"
    nbformat.write(nb, path)
    execute_notebooks.execute(path, timeout=60, destination=copy)
    ran = nbformat.read(copy, as_version=4)
    assert ran.cells[0].source == "raise RuntimeError('needs CUDA')" and ran.cells[0].outputs == []
    assert ran.cells[0].execution_count is None and ran.cells[0].metadata["tags"] == ["solution", "gpu"]
    assert ran.cells[1].outputs[0]["text"] == "ran\n"
