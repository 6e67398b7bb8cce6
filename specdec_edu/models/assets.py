"""Where the files the package ships live: the draft model, the feature drafters, the suffix corpus, the
evaluation prompts (``assets/<name>`` in the repository).

A clone or an editable install reads them from the repository. A regular install (``pip install
git+…``, as on Colab) gets them as pyproject's ``data-files`` under ``<scheme data>/share/specdec-edu/<name>``.
That folder is *not* always under ``sys.prefix``: a Debian-patched Python (Colab's, Ubuntu's) has
``sys.prefix = /usr`` but installs into ``/usr/local``, and ``pip install --prefix`` or ``--user``
put it elsewhere again. So the installed copy is found where pip recorded it, in the distribution's
RECORD (``importlib.metadata``), and only then in the usual scheme folders.
"""

from __future__ import annotations

import importlib.metadata
import site
import sys
import sysconfig
from pathlib import Path

__all__ = ["asset_dir", "installed_asset_dir", "repo_asset_dir"]

DISTRIBUTION = "specdec-edu"  # pyproject's [project] name
SHARE = ("share", "specdec-edu")  # pyproject's [tool.setuptools.data-files] folders: share/specdec-edu/<name>


def repo_asset_dir(name: str) -> Path:
    """``assets/<name>`` next to this package's source (it exists in a clone and in an editable install)."""
    return Path(__file__).resolve().parents[2] / "assets" / name


def _recorded_dirs(name: str) -> list[Path]:
    """The ``share/specdec-edu/<name>`` folders that the installed distribution's RECORD lists files in."""
    try:
        files = importlib.metadata.distribution(DISTRIBUTION).files or []
    except importlib.metadata.PackageNotFoundError:  # running from a source tree that was never installed
        return []
    found = []
    for file in files:
        parts = file.parts
        for i in range(len(parts) - 2):
            if parts[i:i + 3] == (*SHARE, name):
                folder = Path(file.locate()).parent
                for _ in range(len(parts) - i - 4):  # a file nested below <name>/: walk up to <name>
                    folder = folder.parent
                found.append(folder.resolve())
                break
    return list(dict.fromkeys(found))


def installed_asset_dir(name: str) -> Path | None:
    """The installed copy of ``assets/<name>``, or None. Where pip recorded it first, then the data folders
    of the interpreter's install schemes (default, prefix, user)."""
    candidates = _recorded_dirs(name)
    for base in (sysconfig.get_path("data"), sys.prefix, site.getuserbase()):
        candidates.append(Path(base).joinpath(*SHARE, name))
    return next((c for c in candidates if c.is_dir()), None)


def asset_dir(name: str) -> Path:
    """``assets/<name>``: the repository's when it exists, else the installed copy; if neither exists, the
    repository path (so that the error a caller raises names the folder it looked for)."""
    in_repo = repo_asset_dir(name)
    if in_repo.exists():
        return in_repo
    return installed_asset_dir(name) or in_repo
