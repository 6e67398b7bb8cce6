"""Which notebook cells run where: one definition for CI and for the committed outputs.

``tests/conftest.py`` (nbval in CI) and ``scripts/execute_notebooks.py`` (the run whose outputs are
committed) both import this, so a tag cannot be skipped by one and executed by the other unnoticed.
"""

NOT_RUN_ON_CPU = frozenset({"colab", "gpu", "hub"})
"""Cells that need Colab (install cells), CUDA or the Hugging Face hub. Neither CI nor the committed run
executes them; their source stays, with no output."""

RUN_EVERYWHERE = frozenset({"solution", "raises-exception"})
"""Tags that change how a cell is shown (a hidden solution) or checked (nbval expects an error), not where it runs.
A tag in neither set fails ``tests/test_notebook_claims.py``: decide where it runs by adding it to one of them."""


def skipped(tags) -> set[str]:
    """The tags among ``tags`` (a cell's ``metadata.tags``) that keep the cell from running here."""
    return set(tags) & NOT_RUN_ON_CPU
