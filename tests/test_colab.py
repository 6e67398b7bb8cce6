"""How the notebooks open on Colab: the first cell, the pair it picks, the GPU request.

None of this runs on Colab here; we check the pieces that decide what happens there.
"""

import ast
import json
import os
import sys
import types
from pathlib import Path

import pytest
import torch

from specdec_edu import compiles_by_default
from specdec_edu.models.embedded import PAIRS, default_pair

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
#: The concept notebooks: their lessons (the verify pass, the rule, the residual, the proof) need exactness, not a large
#: model, so they run the embedded pair, eager, on every device; the others (speed) load the device's pair.
CONCEPT = ("02_", "03_", "04_", "05_")


def is_concept(path: Path) -> bool:
    return path.name.startswith(CONCEPT)


#: Notebook 11 runs eager on every device too: its Medusa and EAGLE read the target's features, which the compiled
#: path does not hand out, so its runs and the baselines beside them are eager; its pair is the embedded one.
EAGER = (*CONCEPT, "11_")


@pytest.fixture
def no_pair_variable(monkeypatch):
    monkeypatch.delenv("SPECDEC_EDU_PAIR", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    monkeypatch.delenv("COLAB_RELEASE_TAG", raising=False)


def test_default_pair_is_embedded_off_colab(no_pair_variable, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU alone does not switch to the hub
    assert default_pair() == "embedded"


def test_default_pair_on_colab_depends_on_the_gpu(no_pair_variable, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_pair() == "embedded"  # a CPU runtime stays offline and small
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_pair() == "smollm2"


def test_a_command_started_from_a_colab_cell_knows_it_is_on_colab(no_pair_variable, monkeypatch):
    """``!python -m specdec_edu gpu-report`` runs in a fresh interpreter, which has not imported ``google.colab``; it
    inherits the runtime's environment. Before: it reported on the embedded pair, not the learner's Colab pair."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_pair() == "embedded"
    monkeypatch.setenv("COLAB_RELEASE_TAG", "release-colab-external_20261201-060000_RC00")
    assert default_pair() == "smollm2"


def test_pair_variable_wins_and_is_checked(no_pair_variable, monkeypatch):
    monkeypatch.setenv("SPECDEC_EDU_PAIR", "qwen2.5")
    assert default_pair() == "qwen2.5"
    monkeypatch.setenv("SPECDEC_EDU_PAIR", "llama")
    with pytest.raises(ValueError, match="choose one of"):
        default_pair()
    assert set(PAIRS) >= {"embedded", "smollm2", "qwen2.5"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_opens_well_on_colab(path):
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    assert nb["metadata"].get("accelerator") == "GPU", "ask Colab for a GPU runtime"
    first_md = "".join(next(c for c in nb["cells"] if c["cell_type"] == "markdown")["source"])
    assert "colab.research.google.com/github/" in first_md and path.name in first_md, "Open-in-Colab badge"
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    install = "".join(code[0]["source"])
    assert "colab" in code[0]["metadata"].get("tags", []), "the install cell must be tagged (the tests skip it)"
    assert 'if "google.colab" in sys.modules' in install and "pip install" in install and "-e " not in install
    assert not any(pin in install for pin in ("torch==", "transformers==", "ipywidgets==")), "keep Colab's versions"
    setup = "".join(code[1]["source"])
    if is_concept(path):
        assert 'PAIR = "embedded"' in setup, "a concept notebook runs the embedded pair on every device"
    else:
        assert "PAIR = default_pair()" in setup, "the setup cell must let Colab pick the hub pair"
    assert "dtype_reason(" in setup and "print(" in setup, "the setup cell prints the pair's dtype and why"
    markdown = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]
    setup_note = next((m for m in markdown if m.lstrip().startswith("## Setup")), markdown[1])  # 00: its setup section
    assert "pair" in setup_note and (not is_concept(path) or "embedded pair" in setup_note and "every device" in setup_note)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_code_cell_imports_a_name_twice(path):
    """The setup cell is the first code a learner reads on Colab: each name it imports, it imports once (four setup
    cells once carried a second ``import time`` under the line that starts the notebook's clock)."""
    for cell in (c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"):
        lines = [line for line in "".join(cell["source"]).splitlines() if not line.lstrip().startswith(("!", "%"))]
        names = [alias.asname or alias.name for node in ast.walk(ast.parse("\n".join(lines)))
                 if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names]
        assert len(names) == len(set(names)), f"imported twice: {sorted({n for n in names if names.count(n) > 1})}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_colab_cell_says_which_path_and_can_turn_compiling_off(path, monkeypatch):
    """Issue 18: on a Colab GPU the notebooks run the compiled path by default, with a switch to turn it off, and
    the first cell's output says which path is on. The cell's Colab branch runs here with a fake Colab, its pip
    line dropped: with a GPU it prints "path: compiled", with COMPILE set to False it prints "path: eager"."""
    code = "".join(next(c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")["source"])
    body = "\n".join(line for line in code.splitlines() if not line.strip().startswith("!pip"))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setenv("SPECDEC_EDU_COMPILE", "")  # empty is unset; setenv makes monkeypatch restore what was there
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Tesla T4")
    printed = []
    monkeypatch.setattr("builtins.print", lambda *args, **kwargs: printed.append(" ".join(map(str, args))))
    exec(compile(body, path.name, "exec"), {})
    if path.name.startswith(EAGER):  # the embedded pair, eager: nothing to download or compile (see CONCEPT, EAGER)
        pair = "this lesson's pair on every device" if is_concept(path) else "the trained drafters' target, on every device"
        assert printed[-1] == f"GPU: Tesla T4 · pair: embedded ({pair}) · path: eager", printed
        assert os.environ["SPECDEC_EDU_COMPILE"] == "0"
        body = body.replace("    COMPILE = False\n", "    COMPILE = torch.cuda.is_available()\n")  # the switch still works
        exec(compile(body, path.name, "exec"), {})
    assert printed[-1].endswith("path: compiled (CUDA graphs; COMPILE = False for eager)"), printed
    assert path.name.startswith(EAGER) or printed[-1].startswith("GPU: Tesla T4 · pair: smollm2 · path: compiled"), printed
    assert os.environ["SPECDEC_EDU_COMPILE"] == "1"
    exec(compile(body.replace("COMPILE = torch.cuda.is_available()", "COMPILE = False"), path.name, "exec"), {})
    assert printed[-1].endswith("path: eager") and os.environ["SPECDEC_EDU_COMPILE"] == "0"
    assert not compiles_by_default("cuda")


# A device split of a round's time: stats.draft_seconds (and the verify seconds beside it) are exact only where a run's
# clock sees all the work, a CPU. On a GPU the loop reads the device once per round, at the verify, so a run without
# profile=True times only the queuing of the drafting (c near 0). Drafters that run on the host (prompt lookup, the
# suffix drafter) queue nothing, so only a cell that splits a GPU-side drafter's time must offer the profiled run.
HOST_DRAFTERS = ("sfx_stats",)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_a_cell_that_splits_draft_and_verify_time_has_a_profiled_run_on_a_gpu(path):
    nb = json.loads(path.read_text())
    for index, cell in enumerate(nb["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] != "code" or not any(k in source for k in ("draft_seconds", "draft_seconds_per_token")):
            continue
        if any(name in source for name in HOST_DRAFTERS) or "draft_seconds + " in source:  # host drafter, or a sum
            continue
        profiled = "profile=True" in "".join("".join(c["source"]) for c in nb["cells"][: index + 1])
        assert ('device.type != "cpu"' in source or "ASYNC" in source) and profiled, \
            f"{path.name} cell {index} reads draft seconds without a profiled run for a GPU"


def test_notebook_00s_gpu_cell_skips_the_hub_pair_where_the_hub_cannot_be_reached(monkeypatch, capsys):
    """On a GPU off Colab (``PAIR`` embedded), notebook 00's "On a GPU" cell loads the hub pair. Offline (a GPU server
    without internet, in JupyterLab, where the cell's ``gpu``/``hub`` tags skip nothing) that raised
    HubUnavailableError and stopped a "Run all". The cell's code runs here with a fake GPU and an unreachable hub;
    control: on a CPU it skips without asking the hub."""
    from specdec_edu.models.embedded import HubUnavailableError

    nb = json.loads(next(p for p in NOTEBOOKS if p.name.startswith("00_")).read_text())
    cell = next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"
                and 'load_pair("smollm2")' in "".join(c["source"]))

    def offline(name):
        raise HubUnavailableError(f"cannot download {name}: no internet\n(more lines)")

    for gpu in (True, False):
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        exec(cell, {"torch": torch, "PAIR": "embedded", "load_pair": offline})
        assert capsys.readouterr().out == ("skipped: the hub pair cannot be loaded here (cannot download smollm2: no "
                                           "internet)\n" if gpu else "skipped: no GPU\n")
