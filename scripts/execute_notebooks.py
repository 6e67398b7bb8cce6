#!/usr/bin/env python
"""Re-execute course notebooks in place, the way they are committed.

    python scripts/execute_notebooks.py                       # every notebook, in order
    python scripts/execute_notebooks.py notebooks/05_*.ipynb  # some of them

Each notebook runs top to bottom in a fresh ``python3`` kernel from the ``notebooks/`` folder, with the cells
tagged ``colab``, ``gpu`` or ``hub`` skipped (as in CI; their source stays, with no output). Then the progress
bars are removed, with their stored widget state: GitHub shows a bar's first frame, "0%", forever, and the work
it tracked is printed by the cell anyway. Sliders and other real widgets are kept.
Run it on a quiet machine: several notebooks print timings, and their prose is checked against them
(``tests/test_notebook_claims.py``).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the package, from a checkout
sys.path.insert(0, str(ROOT / "tests"))  # the list of skipped tags lives with the tests (CI reads it there)
from notebook_tags import skipped as skipped_tags  # noqa: E402  (one list of skipped tags, shared with CI)

PROGRESS = re.compile(r"^\s*[^|]*(\d+%\||\d+it \[)")  # tqdm's text: "desc:  40%|████  | 2/5 [..]", no total: "desc: 0it [..]"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def is_progress_bar(output) -> bool:
    """A tqdm.auto bar: a widget view whose plain-text fallback is tqdm's bar."""
    data = output.get("data", {})
    return WIDGET_VIEW in data and bool(PROGRESS.match(str(data.get("text/plain", ""))))


def drop_progress_bars(nb) -> int:
    """Remove progress-bar outputs (and their stored widget state); return how many were removed."""
    removed, dropped_ids = 0, set()
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kept = []
        for output in cell.get("outputs", []):
            if is_progress_bar(output):
                dropped_ids.add(output["data"][WIDGET_VIEW].get("model_id"))
                removed += 1
            else:
                kept.append(output)
        cell.outputs = kept
    state = nb.metadata.get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {}).get("state")
    if state is not None:  # the bar's models (and their layout/style children) are not needed without the views
        for model_id in dropped_ids:
            state.pop(model_id, None)
    return removed


def execute(path: Path, timeout: int) -> None:
    nb = nbformat.read(path, as_version=4)
    skipped = {}
    for i, cell in enumerate(nb.cells):  # skip tagged cells: keep their source, run nothing
        if cell.cell_type == "code" and skipped_tags(cell.metadata.get("tags", [])):
            skipped[i] = cell.source
            cell.source = ""
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                            record_timing=False, store_widget_state=True)
    start = time.perf_counter()
    client.execute()
    for i, source in skipped.items():
        nb.cells[i].source, nb.cells[i].outputs, nb.cells[i].execution_count = source, [], None
    bars = drop_progress_bars(nb)
    nbformat.write(nb, path)
    print(f"{path.name}: {time.perf_counter() - start:.0f} s, {bars} progress bars removed", flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("notebooks", nargs="*", type=Path)
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = ap.parse_args(argv)
    for path in args.notebooks or sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        execute(path.resolve(), args.timeout)


if __name__ == "__main__":
    sys.exit(main())
