"""How the notebooks open on Colab: the first cell, the pair it picks, the GPU request.

None of this runs on Colab here; we check the pieces that decide what happens there.
"""

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from specdec_edu.models.embedded import PAIRS, default_pair

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))


@pytest.fixture
def no_pair_variable(monkeypatch):
    monkeypatch.delenv("SPECDEC_EDU_PAIR", raising=False)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)


def test_default_pair_is_embedded_off_colab(no_pair_variable, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a GPU alone does not switch to the hub
    assert default_pair() == "embedded"


def test_default_pair_on_colab_depends_on_the_gpu(no_pair_variable, monkeypatch):
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_pair() == "embedded"  # a CPU runtime stays offline and small
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
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
    assert "PAIR = default_pair()" in setup, "the setup cell must let Colab pick the hub pair"
