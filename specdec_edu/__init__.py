"""specdec_edu: exact speculative decoding, small enough to read.

Notation everywhere: p = target distribution, q = draft distribution, α = acceptance
rate, γ = draft length, c = draft/target cost ratio.
"""

from .drafters import Drafter, ModelDrafter, PromptLookupDrafter
from .generate import GenerationResult, GenerationStats, autoregressive_generate, speculative_generate
from .sampling import logits_to_probs, sample
from .theory import alpha_from_tau, expected_speedup, expected_tokens_per_round, optimal_gamma
from .verify import accept_and_resample, acceptance_probability, residual_distribution

__version__ = "0.1.0"

__all__ = [
    "Drafter",
    "ModelDrafter",
    "PromptLookupDrafter",
    "GenerationResult",
    "GenerationStats",
    "autoregressive_generate",
    "speculative_generate",
    "logits_to_probs",
    "sample",
    "alpha_from_tau",
    "expected_speedup",
    "expected_tokens_per_round",
    "optimal_gamma",
    "accept_and_resample",
    "acceptance_probability",
    "residual_distribution",
]

try:  # the embedded pair and hub loaders (need gguf/accelerate only on first conversion)
    from .embedded import chat_prompt, default_pair, load_embedded_pair, load_pair  # noqa: F401

    __all__ += ["chat_prompt", "default_pair", "load_embedded_pair", "load_pair"]
except ImportError:  # pragma: no cover - embedded.py is being written
    pass
