"""scripts/execute_notebooks.py: its arguments, its table, and that --scratch leaves the notebook it runs untouched."""

import os
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from notebook_outputs import machine_text  # noqa: E402  (tests/ is on the path, as for claims_eval)

import execute_notebooks  # noqa: E402


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
    with pytest.raises(SystemExit):
        execute_notebooks.parse_args(["--check-only", "--scratch"])  # it runs nothing


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
    assert ran.cells[0].outputs[0]["text"].split() == ["threads", str(max(1, os.cpu_count() // 2))]

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
