"""Old import paths keep working: ``specdec_edu.widgets`` is ``specdec_edu.course.widgets``, and so on.

The package's top level holds the algorithm; the course's helpers moved to ``specdec_edu.course``,
model loading to ``specdec_edu.models`` and the commands to ``specdec_edu.commands``. Notebooks and
scripts written before the move import the old names; this finder hands them the moved module
(the same object, so patching one patches the other), imported only when first asked for.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

MOVED = {
    **{name: f"course.{name}" for name in
       ("widgets", "viz", "exercises", "experiments", "controls", "proof", "measure", "diagnostics", "claims")},
    **{name: f"models.{name}" for name in ("embedded", "weights", "devices", "feature_drafters", "feature_training")},
    **{name: f"commands.{name}" for name in ("demo", "bench")},
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        package, _, name = fullname.rpartition(".")
        if package == __package__ and name in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__package__}.{MOVED[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module):
        pass  # already executed under its new name


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())
