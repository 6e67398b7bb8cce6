"""specdec_edu: exact speculative decoding, small enough to read.

Notation everywhere: p = target distribution, q = draft distribution, α = acceptance
rate, γ = draft length, c = draft/target cost ratio.

Reading order: ``round`` first, one round of the algorithm (draft, verify, accept, roll back) in one
short function; then what it calls: ``verify`` (the accept rule), ``sampling`` (p and q from logits),
``drafters`` (who proposes), ``generate`` (the single-prompt loop) and ``batched`` (B prompts), ``kv``
(the caches a round rolls back), ``result`` (what a round emits, counted), and ``theory`` (the formulas).
The course's helpers (widgets, plots, exercises, χ² harness, measurements) are in ``course/``, model
loading and shapes (the embedded pair, EAGLE and Medusa, ``models.shapes``) in ``models/``, the ``demo``
and ``bench`` commands in ``commands/``.
"""

from .drafters import Drafter, LookupThenDrafter, ModelDrafter, PromptLookupDrafter, draft_loop
from .generate import autoregressive_generate, compiles_by_default, speculative_generate
from .models.embedded import chat_prompt, default_pair, load_embedded_pair, load_pair
from .models.feature_drafters import EagleDrafter, MedusaDrafter, load_drafter
from .result import GenerationResult, GenerationStats
from .round import speculative_round
from .sampling import GenerationConfig, logits_to_probs, sample
from .theory import (
    alpha_for_speedup,
    alpha_from_tau,
    expected_speedup,
    expected_tokens_per_round,
    optimal_gamma,
    output_distribution,
    total_variation,
)
from .verify import accept_and_resample, acceptance_probability, residual_distribution

__version__ = "0.1.0"

__all__ = [
    "Drafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "LookupThenDrafter",
    "EagleDrafter",
    "MedusaDrafter",
    "load_drafter",
    "draft_loop",
    "speculative_round",
    "GenerationConfig",
    "GenerationResult",
    "GenerationStats",
    "autoregressive_generate",
    "speculative_generate",
    "compiles_by_default",
    "logits_to_probs",
    "sample",
    "alpha_for_speedup",
    "alpha_from_tau",
    "expected_speedup",
    "expected_tokens_per_round",
    "optimal_gamma",
    "output_distribution",
    "total_variation",
    "accept_and_resample",
    "acceptance_probability",
    "residual_distribution",
    "chat_prompt",
    "default_pair",
    "load_embedded_pair",
    "load_pair",
]
