#!/usr/bin/env python
"""Re-execute course notebooks in place, the way they are committed (or, with --scratch, copies of them).

    python scripts/execute_notebooks.py                       # every notebook, in order, in place
    python scripts/execute_notebooks.py notebooks/05_*.ipynb  # some of them
    python scripts/execute_notebooks.py --scratch --quick     # check they run: copies, quick settings, a table
    SPECDEC_EDU_SEED=1 python scripts/execute_notebooks.py --scratch --out run2   # the second run of a truth pass
    python scripts/execute_notebooks.py --check-only run2/*.ipynb                  # its checks, without running
    python scripts/execute_notebooks.py --scratch --quick --jobs 4 --deadline 540 --timeout 300 --retries 1
                                                              # the GPU stage: side by side, bounded

``--scratch`` writes the executed copies to a temporary folder (``--out DIR`` to keep them) and leaves the
committed notebooks untouched; a failing notebook is reported and the next one runs. ``--quick`` runs the
notebooks' quick settings (``SPECDEC_EDU_QUICK=1``: fewer samples, repeats and tokens, as the tests do); without it
the full settings run (``SPECDEC_EDU_QUICK=0``, what the committed outputs record). Either way a table of
notebook, seconds and pass/fail ends the run, and the exit status is 1 if any notebook failed (3 if each one that
did not pass was only cut by ``--deadline``: stopped there, or never started).

A notebook passes only if it runs *and* every ``<!-- check: ... -->`` in its prose holds for the numbers this run
recorded (``tests/claims_eval.py``, the evaluator ``tests/test_notebook_claims.py`` applies to the committed
outputs). So a second run with another seed (``SPECDEC_EDU_SEED``, read by ``course_seed``) in a scratch folder
is the check that a claim survives a re-run, not only the run that was committed; ``--check-only`` evaluates
notebooks that ran already. The table's last column prints the machine's load average at each notebook's end,
since the timings that the checks read depend on it.

Each notebook runs top to bottom in a fresh ``python3`` kernel from the ``notebooks/`` folder, with the cells
tagged ``colab``, ``gpu`` or ``hub`` skipped (as in CI; their source stays, with no output). Then the progress
bars are removed, with their stored widget state: GitHub shows a bar's first frame, "0%", forever, and the work
it tracked is printed by the cell anyway. Sliders and other real widgets are kept.
Outputs that hold an install log or a path of this machine (``tests/notebook_outputs.py``; the embedded pair's
first use in a kernel logs both) are never written over a committed notebook: the run stops there and says so.
Run it on a quiet machine: several notebooks print timings, and their prose is checked against them
(``tests/test_notebook_claims.py``).

Three options are for a machine that is lent by the minute (the GPU stage, ``scripts/gpu_course_checks.sh``), and
work with ``--scratch`` only. ``--jobs N`` runs N notebooks side by side, each in its own kernel, with the CPU's
threads split between them (``OMP_NUM_THREADS``, unless set): most of a notebook's first minute on a GPU is
compiling, which is CPU work, and the compiled code lands in a cache on disk that the later notebooks reuse.
Their timings then disturb each other, so their prose checks are no evidence (the mode is for ``--quick``). The
table keeps the notebooks' order. ``--deadline S`` bounds the whole run to S seconds: a cell still running then
is stopped by the kernel client's own cell timeout (its copy is kept, up to that cell), a notebook not started by
then is not started, and both are FAIL rows of a table that is still printed (exit status 3 when they are the only
ones, so that a run cut short does not read as a broken notebook); a ``timeout`` around the script would
kill it before the table and leave no word on which notebooks ran. ``--retries N`` runs a notebook again when one of
its cells outlives ``--timeout`` before the deadline: a kernel client can stop hearing from its kernel (in a CPU
rehearsal of the GPU stage, notebook 04's last cell printed its output, its reply never came, and the notebook held
its worker to the deadline; nbclient and jupyter_client have such rare hangs), and a second run of a quick notebook
costs less than its lost row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, from a checkout
sys.path.insert(0, str(ROOT / "tests"))  # the list of skipped tags lives with the tests (CI reads it there)
from claims_eval import failed_checks  # noqa: E402  (the evaluator the claims test uses)
from notebook_outputs import machine_text  # noqa: E402  (install logs and machine paths: never committed)
from notebook_tags import skipped as skipped_tags  # noqa: E402  (one list of skipped tags, shared with CI)

from specdec_edu.models.devices import thread_share  # noqa: E402  (one rule with the test suite's workers)

PROGRESS = re.compile(r"^\s*[^|]*(\d+%\||\d+it \[)")  # tqdm's text: "desc:  40%|████  | 2/5 [..]", no total: "desc: 0it [..]"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the colours of a kernel's traceback


def is_progress_bar(output) -> bool:
    """A tqdm.auto bar: a widget view whose plain-text fallback is tqdm's bar."""
    data = output.get("data", {})
    return WIDGET_VIEW in data and bool(PROGRESS.match(str(data.get("text/plain", ""))))


def drop_progress_bars(nb) -> int:
    """Remove progress-bar outputs (and their stored widget state); return how many were removed."""
    removed = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            if is_progress_bar(output):
                removed += 1
            else:
                kept.append(output)
        cell.outputs = kept
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state")
    if state is not None:  # the bar's models, and their children (number, text, layout, style), go with its view
        drop_unreachable_widgets(nb, state)
        if not state:  # no widget left to show: no widget block at all, as in a notebook that never had one
            nb.metadata.pop("widgets")
    return removed


WIDGET_REF = re.compile(r'IPY_MODEL_([\w-]+)|"model_id": "([\w-]+)"')  # a model's reference to another one


def reachable_widgets(nb, state: dict) -> set[str]:
    """The models of ``state`` (the stored widget state) that a view in ``nb``'s outputs reaches, directly or through
    its children (``IPY_MODEL_<id>`` references, or an Output widget's own views): the ones a reader can see."""
    todo = [output["data"][WIDGET_VIEW].get("model_id") for cell in nb["cells"] for output in cell.get("outputs", [])
            if WIDGET_VIEW in output.get("data", {})]
    reached = set()
    while todo:
        model_id = todo.pop()
        if model_id in reached or model_id not in state:
            continue
        reached.add(model_id)
        todo += [a or b for a, b in WIDGET_REF.findall(json.dumps(state[model_id]))]
    return reached


def drop_unreachable_widgets(nb, state: dict) -> None:
    """Remove from ``state`` each model that no view left in ``nb`` reaches: nothing renders it, and a progress
    bar's leftover children are ~800 bytes each."""
    for model_id in set(state) - reachable_widgets(nb, state):
        del state[model_id]


def execute(path: Path, timeout: int, destination: Path | None = None, deadline: float | None = None) -> float:
    """Run ``path`` top to bottom in a fresh kernel (from its own folder) and write the result to ``destination``
    (default: over ``path``); returns the seconds it took. Raises what the kernel raised; a copy that fails is
    written all the same, up to the failing cell and its traceback (never over ``path``: a committed notebook keeps
    its outputs). ``timeout``: seconds a cell may take; ``deadline`` (a ``time.monotonic()`` instant): no cell runs
    past it (each cell's timeout is cut to the time left)."""
    nb = nbformat.read(path, as_version=4)
    skipped = {}
    for i, cell in enumerate(nb.cells):  # skip tagged cells: keep their source, run nothing
        if cell.cell_type == "code" and skipped_tags(cell.metadata.get("tags", [])):
            skipped[i] = cell.source
            cell.source = ""
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            record_timing=False, store_widget_state=True)
    if deadline is not None:  # at least 1 s: the client reads a timeout of 0 as "none"
        client.timeout_func = lambda cell: max(1, min(timeout, int(deadline - time.monotonic())))
    start = time.perf_counter()
    try:
        client.execute()
    except Exception:
        if destination is not None and destination != path:
            _restore_skipped(nb, skipped)
            nbformat.write(nb, destination)
        raise
    seconds = time.perf_counter() - start
    _restore_skipped(nb, skipped)
    bars = drop_progress_bars(nb)
    found = machine_text(nb)
    if found and (destination or path) == path:  # a committed notebook keeps its outputs
        raise RuntimeError(f"{path.name}: the outputs hold an install log or a machine path, so they were not written "
                           f"({len(found)} lines, first: {found[0]}). If it was the embedded pair's first use, it "
                           "is built now: run again.")
    nbformat.write(nb, destination or path)
    print(f"{path.name}: {seconds:.0f} s, {bars} progress bars removed", flush=True)
    return seconds


def last_started_cell(copy: Path) -> str:
    """"cell N": the last code cell of an executed copy that the kernel started (it numbers a cell as it starts
    it), i.e. the one a cell timeout stopped; N counts every cell from 0, as nbclient's messages do."""
    nb = nbformat.read(copy, as_version=4)
    started = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and cell.get("execution_count")]
    return f"cell {started[-1]}" if started else "a cell before the first one started"


def _restore_skipped(nb, skipped: dict[int, str]) -> None:
    """Put back the source of the cells that ``execute`` skipped, with no output."""
    for i, source in skipped.items():
        nb.cells[i].source, nb.cells[i].outputs, nb.cells[i].execution_count = source, [], None


def check_result(nb) -> str:
    """The table's result for a notebook that ran: "pass (N checks)" or "FAIL: k of N checks: ..."."""
    n, wrong = failed_checks(nb)
    return f"pass ({n} checks)" if not wrong else f"FAIL: {len(wrong)} of {n} checks: " + "; ".join(wrong)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    ap.add_argument("--scratch", action="store_true", help="execute copies; leave the committed notebooks untouched")
    ap.add_argument("--out", type=Path, default=None, help="with --scratch: keep the executed copies here")
    ap.add_argument("--quick", action="store_true", help="SPECDEC_EDU_QUICK=1: the notebooks' quick settings")
    ap.add_argument("--check-only", action="store_true", help="run nothing: evaluate the prose checks of the notebooks given")
    ap.add_argument("--jobs", type=int, default=1, help="with --scratch: run this many notebooks side by side")
    ap.add_argument("--deadline", type=float, default=None,
                    help="with --scratch: seconds for the whole run; what is unfinished then is a FAIL row")
    ap.add_argument("--retries", type=int, default=0,
                    help="with --scratch: run a notebook again (up to N times) when a cell outlives --timeout before "
                         "the deadline: a kernel that stopped answering")
    args = ap.parse_args(argv)
    for given, name in [(args.out is not None, "--out"), (args.jobs != 1, "--jobs"), (args.deadline is not None, "--deadline"),
                        (args.retries != 0, "--retries")]:
        if given and not args.scratch:
            ap.error(f"{name} needs --scratch (without it the notebooks are executed in place, one by one, to the end)")
    if args.jobs < 1 or args.retries < 0 or (args.deadline is not None and args.deadline <= 0):
        ap.error("--jobs must be at least 1, --retries at least 0 and --deadline a positive number of seconds")
    if args.check_only and (args.scratch or args.quick):
        ap.error("--check-only runs nothing: drop --scratch and --quick")
    args.notebooks = [p.resolve() for p in args.notebooks] or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    return args


def format_table(rows: list[tuple]) -> str:
    """``rows`` of (notebook, seconds or None, "pass ..." or "FAIL: why"[, load average]) as an aligned text table."""
    width = max([len("notebook")] + [len(row[0]) for row in rows])
    lines = [f"{'notebook':{width}s}  seconds  load  result"]
    for name, seconds, result, *load in rows:
        load_text = f"{load[0]:4.1f}" if load and load[0] is not None else ""
        lines.append(f"{name:{width}s}  {'' if seconds is None else f'{seconds:7.0f}':>7s}  {load_text:>4s}  {result}")
    return "\n".join(lines)


def load_average() -> float | None:
    """The 1-minute load average, where the OS has one."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


DEADLINE_ROW = re.compile(r"FAIL: (not started: the [\d.]+ s deadline had passed|stopped at the [\d.]+ s deadline)")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.check_only:
        rows = [(path.name, None, check_result(nbformat.read(path, as_version=4))) for path in args.notebooks]
        print(format_table(rows), flush=True)
        return 0 if all(result.startswith("pass") for _, _, result in rows) else 1
    os.environ["SPECDEC_EDU_QUICK"] = "1" if args.quick else "0"  # the kernels inherit it
    # the kernels import this checkout's package, not whichever copy the environment has installed
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if args.jobs > 1:  # N kernels share the CPU: each gets its share of threads, not all of them
        os.environ.setdefault("OMP_NUM_THREADS", str(thread_share(args.jobs)))
    out_dir = None
    if args.scratch:
        out_dir = args.out or Path(tempfile.mkdtemp(prefix="notebooks_scratch_"))
        out_dir.mkdir(parents=True, exist_ok=True)
        print(f"scratch mode: executed copies go to {out_dir}; the committed notebooks stay as they are", flush=True)
    started = time.monotonic()
    deadline = None if args.deadline is None else started + args.deadline

    def run_one(path: Path, attempt: int = 0) -> tuple:
        """One notebook's row of the table; in place, a failure is raised (the run stops there)."""
        if deadline is not None and time.monotonic() >= deadline - 1:
            return (path.name, None, f"FAIL: not started: the {args.deadline:.0f} s deadline had passed", load_average())
        destination = out_dir / path.name if out_dir else path
        try:
            seconds = execute(path, args.timeout, destination, deadline)
            # quick settings record other values than the prose describes: its checks are for the full settings
            executed = nbformat.read(destination, as_version=4)
            result = "pass (checks not evaluated: --quick)" if args.quick else check_result(executed)
            return (path.name, seconds, result, load_average())
        except Exception as exc:  # noqa: BLE001 (a failing notebook is a row of the table, not the end of the run)
            if not args.scratch:
                raise
            last_line = ANSI.sub("", (str(exc).strip().splitlines() or [type(exc).__name__])[-1])[:120]
            if isinstance(exc, CellTimeoutError):
                cell = last_started_cell(destination)
                if deadline is not None and time.monotonic() >= deadline - 1:
                    last_line = f"stopped at the {args.deadline:.0f} s deadline in {cell} (its copy has the cells that ran)"
                elif attempt < args.retries:
                    print(f"{path.name}: {cell} ran past the {args.timeout} s cell timeout; running the notebook "
                          f"again ({attempt + 1} of {args.retries})", flush=True)
                    return run_one(path, attempt + 1)
                else:
                    last_line = f"{cell} ran past the {args.timeout} s cell timeout"
            print(f"{path.name}: FAIL: {last_line}", flush=True)
            return (path.name, None, f"FAIL: {last_line}", load_average())

    if args.jobs == 1:
        rows = [run_one(path) for path in args.notebooks]
    else:  # threads are enough: each notebook's work happens in its own kernel process
        with ThreadPoolExecutor(args.jobs) as pool:
            rows = list(pool.map(run_one, args.notebooks))  # in the notebooks' order, whichever ends first
    print(format_table(rows), flush=True)
    print(f"{len(rows)} notebooks in {time.monotonic() - started:.0f} s, {args.jobs} at a time", flush=True)
    return exit_status(rows)


def exit_status(rows) -> int:
    """0: every notebook passed; 3: each one that did not was stopped or never started by the deadline (a run cut
    short: rerun the rest with more time, as gpu_course_checks.sh reads a cut step); 1: a notebook failed."""
    failures = [row[2] for row in rows if not row[2].startswith("pass")]
    if not failures:
        return 0
    return 3 if all(DEADLINE_ROW.match(result) for result in failures) else 1


if __name__ == "__main__":
    sys.exit(main())
