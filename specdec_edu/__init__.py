"""specdec_edu: exact speculative decoding, small enough to read.

Notation everywhere: p = target distribution, q = draft distribution, α = acceptance
rate, γ = draft length, c = draft/target cost ratio.
"""

from .drafters import Drafter, LookupThenDrafter, ModelDrafter, PromptLookupDrafter
from .embedded import chat_prompt, default_pair, load_embedded_pair, load_pair
from .feature_drafters import EagleDrafter, MedusaDrafter, load_drafter
from .generate import autoregressive_generate, speculative_generate
from .result import GenerationResult, GenerationStats
from .sampling import logits_to_probs, sample
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
    "GenerationResult",
    "GenerationStats",
    "autoregressive_generate",
    "speculative_generate",
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
