"""Three questions the loops ask of a model, target or draft, from its shapes alone.

``head_rows``: how many token ids can its output head produce? A draft must produce no id the
target lacks (``ModelDrafter.check_target`` checks it), and every q is padded to the target's rows.
``max_positions``: how many positions can it read? Generation stops at the target's (``result.stop_reason``);
a draft's γ is cut so that it never reads past its own limit (``round.gamma_within``), and once the context
has outgrown the draft, the target finishes alone (``round.past_draft_limit`` says so, once).
``sliding_window``: does it attend within a window of the last W positions? The batched loop, which keeps
rejected drafts as masked cache slots, is exact only while the window holds every slot (``batched``).
"""

from __future__ import annotations

import torch


def head_rows(model: torch.nn.Module) -> int:
    """How many token ids the model's output head can produce (may exceed the tokenizer's
    vocabulary: Qwen2.5-0.5B has 151936 rows, Qwen2.5-7B 152064, for one tokenizer)."""
    return model.get_output_embeddings().weight.shape[0]


def max_positions(model: torch.nn.Module) -> int | None:
    """How many positions the model can read (``max_position_embeddings``, or GPT-2's ``n_positions``)."""
    config = model.config
    return getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)


def sliding_window(model: torch.nn.Module) -> int | None:
    """W if some attention layer of the model sees only the last W positions (Mistral; Qwen2 with
    ``use_sliding_window``; Gemma 2/3's local layers), else None."""
    config = model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:  # hybrid models name each layer's kind
        return window if "sliding_attention" in layer_types else None
    return window if getattr(config, "use_sliding_window", True) else None
