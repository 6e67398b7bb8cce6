"""environment.yml and pyproject.toml must describe the same environment.

A learner who runs ``conda env create -f environment.yml`` should get the packages and the
version bounds that ``pip install -e ".[test]"`` gives (the README's test command), no more,
no fewer. This test fails when one file is edited without the other.
"""

import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

yaml = pytest.importorskip("yaml", reason="PyYAML comes with jupyterlab (via jupyter-events)")
if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

REPO = Path(__file__).resolve().parent.parent


def _by_name(lines):
    """{normalised name: SpecifierSet} for requirement strings like ``"torch>=2.4"``."""
    reqs = [Requirement(line) for line in lines]
    return {r.name.lower().replace("_", "-"): r.specifier for r in reqs}


def _environment():
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    deps = env["dependencies"]
    conda = [d for d in deps if isinstance(d, str)]
    pip = next(d["pip"] for d in deps if isinstance(d, dict) and "pip" in d)
    return conda, pip


def _pyproject():
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _requirements(project, extras=()):
    """The requirement strings of the package plus ``extras``, with self-references such as
    ``specdec-edu[notebooks]`` (one extra pulling in another) replaced by what they name."""
    lines = list(project["dependencies"])
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in project["optional-dependencies"][extra]:
            req = Requirement(line)
            if req.name.lower().replace("_", "-") == project["name"]:
                todo += sorted(req.extras)
            else:
                lines.append(line)
    return lines


def test_pip_section_matches_pyproject():
    _, pip = _environment()
    project = _pyproject()
    assert "-e ." in pip, "environment.yml must install this package (pip: '-e .')"
    in_env = _by_name([line for line in pip if line != "-e ."])
    in_pyproject = _by_name(_requirements(project, ["test"]))
    assert sorted(in_env) == sorted(in_pyproject), (
        f"only in environment.yml: {sorted(set(in_env) - set(in_pyproject))}; "
        f"only in pyproject.toml (dependencies + [test] and the extras it names): {sorted(set(in_pyproject) - set(in_env))}"
    )
    for name, spec in in_env.items():
        assert spec == in_pyproject[name], f"{name}: environment.yml says {spec}, pyproject.toml says {in_pyproject[name]}"


def test_the_torch_floor_is_the_oldest_that_compiles():
    """pyproject.toml's torch floor is ``generate.OLDEST_TORCH``, the release the fallback's warning names."""
    from specdec_edu.generate import OLDEST_TORCH

    assert _by_name(_pyproject()["dependencies"])["torch"] == SpecifierSet(f">={OLDEST_TORCH}")


def test_conda_python_satisfies_requires_python():
    conda, _ = _environment()
    python = next(d for d in conda if d.startswith("python"))
    version = Version(python.split("=", 1)[1])
    assert version in SpecifierSet(_pyproject()["requires-python"]), f"{python} vs requires-python"


def test_extras_that_name_other_extras_are_expanded():
    project = {"name": "specdec-edu", "dependencies": ["torch>=2.4"],
               "optional-dependencies": {"a": ["specdec-edu[b]", "pytest>=8"], "b": ["scipy>=1.11", "specdec_edu[a]"]}}
    assert sorted(_requirements(project, ["a"])) == ["pytest>=8", "scipy>=1.11", "torch>=2.4"]
    assert _requirements(project) == ["torch>=2.4"]


def test_comparison_can_fail():
    """Negative control: a changed bound or a missing package is seen as a difference."""
    base = _by_name(["torch>=2.4", "numpy>=1.26"])
    assert base != _by_name(["torch>=2.5", "numpy>=1.26"])
    assert sorted(base) != sorted(_by_name(["torch>=2.4"]))
