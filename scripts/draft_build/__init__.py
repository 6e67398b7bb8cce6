"""The stages of ``python scripts/build_draft.py``, which distils the embedded draft model.

* :mod:`.prompts`   the training prompts (data only) and the held-out evaluation prompts;
* :mod:`.data`      stage 1: the target answers the prompts, its top-k logits are recorded;
* :mod:`.train`     stage 2: distillation; stage 3: save ``assets/draft/``;
* :mod:`.evaluate`  stage 4: α, timings and predicted / measured speed-ups, all through
  ``specdec_edu`` (``ModelDrafter``, ``speculative_generate``, ``theory.expected_speedup``);
* :mod:`.card`      ``DRAFT_CARD.md`` from the recorded numbers.

``scripts/build_draft.py`` puts ``scripts/`` on the import path (Python does that for the
script's own directory), so this package is imported as ``draft_build``.
"""
