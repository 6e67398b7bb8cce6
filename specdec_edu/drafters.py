"""Drafters: anything that can guess the next γ tokens.

The whole protocol is one method::

    propose(context, gamma, to_probs, generator) -> (tokens [γ'], q [γ', V'])

``context`` is the 1-D LongTensor of every token so far (prompt + accepted output);
``to_probs`` turns logits into probabilities with the run's sampling settings (the
same ones the target uses); ``q`` holds the distributions the tokens were drawn
from. A drafter may return fewer than γ tokens (even none) and may cover only the
first V' <= V token ids: tokens outside get q = 0, meaning "never proposed", which
leaves speculative sampling exact.

A drafter never needs to be told about rejections: it sees the new context on the
next call and can compare it with what it has cached.
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from . import kv
from .sampling import sample

ToProbs = Callable[[torch.Tensor], torch.Tensor]


class Drafter(Protocol):
    def propose(
        self, context: torch.Tensor, gamma: int, to_probs: ToProbs, generator: torch.Generator | None
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Number of leading positions where the 1-D tensors ``a`` and ``b`` agree."""
    n = min(len(a), len(b))
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0]) if len(mismatch) else n


class ModelDrafter:
    """A small causal LM drafting autoregressively, with its own KV cache.

    Args:
        model: a Hugging Face causal LM sharing the target's tokenizer.
        head_size: if set (or if ``model.config.draft_vocab_size`` is), only the
            first ``head_size`` token ids get logits: a cheaper head whose other
            tokens have q = 0 (``speculative_generate`` pads q with zeros).
    """

    def __init__(self, model: torch.nn.Module, head_size: int | None = None):
        self.model = model
        self.head_size = head_size or getattr(model.config, "draft_vocab_size", None)
        self.vocab_size = model.config.vocab_size
        self.reset()

    def reset(self) -> None:
        """Forget the cache (e.g. before a new prompt)."""
        self.cache = kv.new_cache(self.model)
        self.cached_tokens = torch.empty(0, dtype=torch.long)  # tokens whose K/V are in the cache

    def next_logits(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """Feed ``new_tokens`` ``[n]`` through the draft; logits ``[V']`` for the token after them."""
        ids = new_tokens.view(1, -1).to(self.model.device)
        if self.head_size is None:
            return kv.forward(self.model, ids, self.cache, logits_to_keep=1).logits[0, -1]
        # Reduced head: run the decoder, then multiply by the first head_size rows only.
        hidden = kv.forward(self.model.get_decoder(), ids, self.cache).last_hidden_state[0, -1]
        return F.linear(hidden, self.model.get_output_embeddings().weight[: self.head_size])

    @torch.no_grad()
    def propose(self, context, gamma, to_probs, generator=None):
        """Draft ``gamma`` tokens after ``context`` ``[n]``; returns tokens ``[γ]`` and q ``[γ, V']``."""
        # 1. Roll the cache back to what still matches the context (rejected drafts go),
        #    keeping at least one token to feed so that we get fresh logits.
        if self.cached_tokens.device != context.device:
            self.cached_tokens = self.cached_tokens.to(context.device)
        keep = min(common_prefix_length(self.cached_tokens, context), len(context) - 1)
        kv.crop(self.cache, len(self.cached_tokens) - keep)
        logits = self.next_logits(context[keep:])

        # 2. Draft autoregressively: sample from q, feed the sample back in.
        tokens, qs = [], []
        for i in range(gamma):
            q_i = to_probs(logits)
            token = sample(q_i, generator)
            tokens.append(token)
            qs.append(q_i)
            if i < gamma - 1:  # the last draft need not be fed: nobody needs what comes after it yet
                logits = self.next_logits(token)
        tokens = torch.stack(tokens)
        self.cached_tokens = torch.cat([context, tokens[:-1]])
        return tokens, torch.stack(qs)


class PromptLookupDrafter:
    """Prompt lookup (n-gram) drafting: no model, no weights.

    Find the most recent earlier place where the context's last n tokens occurred
    (n from ``max_ngram`` down to ``min_ngram``) and propose the tokens that followed
    it there. Great when the output copies from the input (summaries, edits, code).
    The draft is deterministic, so q is one-hot.
    """

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def lookup(self, context: torch.Tensor, gamma: int) -> torch.Tensor:
        """The up-to-γ tokens that followed the latest earlier match of the context's suffix."""
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            suffix = context[-n:]
            windows = context[:-1].unfold(0, n, 1)  # [len-n, n]: every earlier n-gram (not the suffix itself)
            starts = (windows == suffix).all(-1).nonzero().flatten()
            if len(starts):
                follow = int(starts[-1]) + n  # the token right after the latest match
                return context[follow : follow + gamma]
        return context[:0]

    def propose(self, context, gamma, to_probs=None, generator=None):
        """Tokens ``[γ']`` (γ' <= γ, maybe 0) and their one-hot q ``[γ', V']``."""
        tokens = self.lookup(context, gamma)
        width = int(tokens.max()) + 1 if len(tokens) else 1  # speculative_generate pads q to the full vocabulary
        return tokens, F.one_hot(tokens, width).float()
