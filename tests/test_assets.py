"""The shipped assets (draft model, feature drafters, suffix corpus, evaluation prompts) are found by a
regular install too, wherever pip put them: on Colab's Debian-patched Python that is /usr/local/share
while ``sys.prefix`` is /usr, so a lookup under ``sys.prefix`` alone stopped every embedded-pair notebook."""

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_edu.models import assets

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("draft", "eagle", "medusa", "feature_data", "eval")  # pyproject's [tool.setuptools.data-files]


def test_every_asset_the_package_reads_is_shipped():
    text = (ROOT / "pyproject.toml").read_text()
    for name in SHIPPED:
        assert f'"share/specdec-edu/{name}" = ["assets/{name}/*"]' in text
        assert assets.asset_dir(name) == ROOT / "assets" / name  # a clone reads its own


class FakeDistribution:
    """What importlib.metadata returns for an install whose data files lie in ``root``/share."""

    def __init__(self, root: Path, files: list[str]):
        self.root, self.files = root, [importlib.metadata.PackagePath(f) for f in files]
        for f in self.files:
            f.dist = self

    def locate_file(self, path):
        return self.root / "lib" / "site-packages" / path


def test_the_installed_copy_is_found_where_pip_recorded_it(tmp_path, monkeypatch):
    (tmp_path / "share" / "specdec-edu" / "eval" / "sub").mkdir(parents=True)
    files = ["specdec_edu/__init__.py", "../../share/specdec-edu/eval/prompts.json",
             "../../share/specdec-edu/eval/sub/x.json"]
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDistribution(tmp_path, files))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere"))  # not where pip put them
    assert assets.installed_asset_dir("eval") == (tmp_path / "share" / "specdec-edu" / "eval").resolve()
    assert assets.installed_asset_dir("draft") is None  # recorded nowhere, and no scheme folder holds it


def test_the_recorded_copy_wins_over_one_under_sys_prefix(tmp_path, monkeypatch):
    """Two installed copies (an older install left one under ``sys.prefix``, pip recorded this install's elsewhere):
    the copy the installed distribution's RECORD lists is the one read."""
    recorded, stale = tmp_path / "share" / "specdec-edu" / "eval", tmp_path / "old" / "share" / "specdec-edu" / "eval"
    recorded.mkdir(parents=True)
    stale.mkdir(parents=True)
    files = ["../../share/specdec-edu/eval/prompts.json"]
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: FakeDistribution(tmp_path, files))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "old"))
    assert assets.installed_asset_dir("eval") == recorded.resolve()


def test_a_clone_reads_its_own_assets_though_an_install_has_a_copy(monkeypatch, tmp_path):
    """An editable install beside an older regular one: the repository's ``assets/<name>`` is read, not the copy."""
    monkeypatch.setattr(assets, "installed_asset_dir", lambda name: tmp_path)
    assert assets.asset_dir("eval") == assets.repo_asset_dir("eval") != tmp_path


@pytest.mark.slow
def test_a_regular_install_outside_sys_prefix_loads_the_draft(tmp_path):
    """``pip install --prefix`` (data files outside ``sys.prefix``, as on Colab), then load the draft model
    and read the evaluation prompts from the installed copy. Fails with the lookup under ``sys.prefix``."""
    # Without build isolation pip builds with the environment's setuptools, which must meet pyproject.toml's
    # build requirement: a venv of Python 3.11 starts with setuptools 65; torch 2.13 pulls a newer one, 2.7 and 2.8 do not.
    floor = re.search(r'"setuptools>=([\d.]+)"', (ROOT / "pyproject.toml").read_text())[1]
    pytest.importorskip("setuptools", minversion=floor, reason="builds the package without build isolation")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src)
    shutil.copytree(ROOT / "specdec_edu", src / "specdec_edu", ignore=shutil.ignore_patterns("__pycache__"))
    for name in SHIPPED:
        shutil.copytree(ROOT / "assets" / name, src / "assets" / name)
    prefix = tmp_path / "prefix"
    ours = importlib.metadata.distribution("specdec-edu").version  # the test environment's own install
    # --ignore-installed: without it pip first uninstalls the environment's install (the editable one the rest
    # of the suite and the notebooks import), even though it writes the new one under --prefix.
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--ignore-installed", "--prefix", str(prefix), str(src)],
                   check=True, capture_output=True, timeout=300, cwd=tmp_path)
    importlib.metadata.distribution("specdec-edu")  # still installed here: raises PackageNotFoundError if not
    assert importlib.metadata.version("specdec-edu") == ours
    site_packages = next(prefix.glob("lib/python*/site-packages"))
    script = (
        "import specdec_edu, sys\n"
        "from specdec_edu.models import assets, embedded\n"
        "from specdec_edu.commands.bench import eval_prompts\n"
        f"assert specdec_edu.__file__.startswith({str(site_packages)!r}), specdec_edu.__file__\n"
        f"for name in {SHIPPED!r}:\n"
        f"    assert assets.asset_dir(name).is_relative_to({str(prefix)!r}), (name, assets.asset_dir(name))\n"
        "draft = embedded.load_embedded_draft(device='cpu')\n"
        "assert len(eval_prompts('open-chat')) >= 20\n"
        "print('draft layers', draft.config.num_hidden_layers)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(site_packages))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "draft layers" in done.stdout
