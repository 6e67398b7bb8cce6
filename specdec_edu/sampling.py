"""From logits to the probabilities that speculative sampling compares.

Speculative sampling reproduces the *target's sampling distribution*, whatever it
is: plain softmax, a temperature, top-k, top-p or greedy. So p (target) must go through
the warpers the user asked for, in the same order as Hugging Face's ``generate()``:
temperature -> top-k -> top-p. Exactness asks nothing of q except that it is the
distribution the draft token was really sampled from; we warp q the same way because a
draft that samples like the target agrees with it more often (a higher α). Greedy decoding (``temperature=0``)
is the limit where p is one-hot at the argmax; the same accept/resample rule then
reduces to "accept the draft token iff it equals the target's argmax".
"""

from __future__ import annotations

import math
import numbers
import operator
from dataclasses import dataclass

import torch

from .result import warn_caller


def check_sampling_args(temperature: float, top_k: int, top_p: float) -> None:
    """Raise ``ValueError`` (naming the fix) for sampling settings that make no sense."""
    # None is how Hugging Face spells "off" in a generation config; here "off" is a number (top_k=0, top_p=1.0)
    for name, value, off in (("temperature", temperature, "temperature=0 (greedy) or a temperature > 0"),
                             ("top_k", top_k, "top_k=0 to disable top-k"), ("top_p", top_p, "top_p=1.0 to disable it")):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise ValueError(f"{name}={value!r} is not a number: use {off}.")
    if not isinstance(top_k, numbers.Integral):
        raise ValueError(f"top_k={top_k!r} is not an int: top-k keeps k tokens (top_k=0 disables it).")
    if not math.isfinite(temperature):  # NaN passes `< 0`, then every p is NaN and the sampler returns token 0 forever
        raise ValueError(f"temperature={temperature} is not finite: use a finite temperature > 0 to sample, "
                         "or temperature=0 (do_sample=False) for greedy decoding.")
    if temperature < 0:
        raise ValueError(
            f"temperature={temperature} is negative: use temperature > 0 to sample, "
            "or temperature=0 (do_sample=False) for greedy decoding."
        )
    if top_k < 0:
        raise ValueError(f"top_k={top_k} is negative: use top_k=0 to disable top-k, or a positive k.")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} is outside (0, 1]: use top_p=1.0 to disable nucleus sampling.")


def logits_to_probs(
    logits: torch.Tensor, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, check_finite: bool = True
) -> torch.Tensor:
    """Warp logits and normalise them into probabilities.

    Args:
        logits: ``[..., V]`` raw scores from a model's head.
        temperature: divides the logits; ``0`` means greedy (one-hot at the argmax).
        top_k: keep the ``k`` largest logits (``0`` disables).
        top_p: keep the smallest set of tokens whose probability reaches ``top_p``
            (``1.0`` disables); the most likely token is always kept.
        check_finite: raise on NaN/+inf logits (``logits_broken``). Checking reads a flag back from the device
            (a host sync), so ``speculative_generate`` turns it off and checks once per round.

    Returns:
        ``[..., V]`` probabilities, float32 (float64 if ``logits`` is float64).
    """
    check_sampling_args(temperature, top_k, top_p)
    if check_finite and logits_broken(logits):
        raise nonfinite_logits_error("model")
    logits = logits.double() if logits.dtype == torch.float64 else logits.float()

    if temperature == 0:  # greedy: all the mass on the argmax (ties: the first, like torch.argmax)
        top = logits.argmax(-1, keepdim=True)
        # argmax picks NaN or +inf (an overflowed forward) as if it were a token; its mass, value − value + 1, is then
        # NaN, not 1, so the checks that run without a sync (q is a distribution; the batched loop's flag) see the row,
        # as when sampling. (Three small kernels on one value per row, not a pass over it: this runs per drafted token.)
        value = logits.gather(-1, top)
        return torch.zeros_like(logits).scatter_(-1, top, value - value + 1)

    if temperature < 1e-3:  # shift by the row's max first (softmax does not change): dividing by a tiny T (1e-39)
        logits = logits - logits.amax(-1, keepdim=True)  # would overflow the top logit to +inf, and every p to NaN
    logits = logits / temperature  # (at usual temperatures unshifted: the same rounding as transformers' warper)
    if top_k > 0:
        kth_largest = torch.topk(logits, min(top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if top_p < 1.0:
        # Sort ascending; drop tokens whose cumulative mass (from the least likely up)
        # stays within 1 - top_p. The most likely token always survives.
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cumulative <= 1 - top_p
        drop_sorted[..., -1] = False
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def logits_broken(logits: torch.Tensor) -> torch.Tensor:
    """True (a 0-dim bool tensor: no host sync) where ``logits`` ``[..., V]`` hold NaN or +inf, the marks of an
    overflowed forward pass, or a row whose every logit is −inf (nothing to sample). A −inf among finite logits is a
    masked token, not an overflow: it gets probability 0."""
    return torch.isnan(logits).any() | torch.isposinf(logits).any() | torch.isneginf(logits).all(-1).any()


def nonfinite_logits_error(who: str) -> ValueError:
    """The error for NaN/+inf logits (an overflowed forward pass), naming the fix."""
    return ValueError(f"the {who} produced NaN or +inf logits (or a row of only −inf): its forward pass overflowed. "
                      "Run it in float32: "
                      "load_pair(PAIR, dtype=torch.float32), or SPECDEC_EDU_DTYPE=fp32 set before the models load "
                      "(the notebooks' setup cell reads it); or check its weights.")


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per distribution: ``probs`` ``[..., V]`` (weights ≥ 0, not necessarily normalised) → ids ``[...]``
    (a 0-dim LongTensor for one ``[V]``); each row is an independent draw.

    The exponential race: with E_i ~ Exp(1) independent, argmax_i probs_i / E_i is token i with probability
    probs_i / Σ probs. It is the very draw ``torch.multinomial(probs, 1)`` makes (the same random numbers from the
    same generator, so the same token), minus multinomial's checks of its input, which read values back from the
    device: on a GPU two waits per call, several per round. A NaN or negative weight is not refused here; the
    loops check the logits and q they came from once per round, in the round's one read.
    """
    check_generator(generator, probs.device)
    return (probs / torch.empty_like(probs).exponential_(1, generator=generator)).argmax(-1)


def check_generator(generator: torch.Generator | None, device: torch.device) -> None:
    """A generator must be a ``torch.Generator`` on the device of the tensors it draws for."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"generator={generator!r} is not a torch.Generator: pass "
            f"generator=torch.Generator(device='{device.type}').manual_seed(seed) (a seed alone is not a generator)."
        )
    if generator is not None and generator.device.type != device.type:
        raise ValueError(
            f"the torch.Generator is on {generator.device.type} but the tensors are on {device.type}: "
            f"create it with torch.Generator(device='{device.type}').manual_seed(seed)."
        )


@dataclass(frozen=True)
class GenerationConfig:
    """How tokens are picked and when generation stops, in the spirit of HF's ``GenerationConfig``.

    ``speculative_generate`` and ``autoregressive_generate`` build one from their keyword
    arguments (and validate it here, once); the loops read everything from it.
    """

    max_new_tokens: int
    do_sample: bool = False  # False: greedy (temperature 0), as in HF generate(do_sample=False)
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    eos_token_id: int | list[int] | tuple[int, ...] | None = None
    pad_token_id: int = 0

    def __post_init__(self):
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, numbers.Integral):
            raise ValueError(f"max_new_tokens={self.max_new_tokens!r}: give a whole number of new tokens (an int).")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: ask for at least 1 new token.")
        if self.pad_token_id is None:  # found only after the whole generation, when the result is padded
            raise ValueError("pad_token_id=None: give an int, the id that fills rows that end early (a tokenizer "
                             "without a pad token: pad_token_id=tokenizer.eos_token_id).")
        try:
            operator.index(self.pad_token_id)  # an int, a numpy int or an integer 0-dim tensor; not 1.5, not True
            if isinstance(self.pad_token_id, bool):
                raise TypeError
        except TypeError:
            raise ValueError(f"pad_token_id={self.pad_token_id!r}: give an int token id (e.g. tokenizer.pad_token_id).") from None
        check_sampling_args(self.temperature, self.top_k, self.top_p)
        _ = self.eos  # refuse a malformed eos_token_id now, not at the first token
        if not self.do_sample and (self.temperature not in (0, 1) or self.top_k or self.top_p != 1):
            # As Hugging Face's generate warns: these settings only shape sampling, and greedy decoding ignores them.
            warn_caller(f"temperature={self.temperature}, top_k={self.top_k}, top_p={self.top_p} are ignored: "
                        "do_sample=False decodes greedily. Pass do_sample=True to sample with them.")

    @property
    def eos(self) -> frozenset[int]:
        """The token ids that end a sequence (generation stops right after one): from an int, a list or tuple of
        ints, a tensor or a numpy integer, as ``generate`` accepts them. Python ints, so that ``token in eos`` finds a
        host token id (a set of tensors would hash each by identity and never match)."""
        if self.eos_token_id is None:
            return frozenset()
        try:
            ids = torch.as_tensor(self.eos_token_id)
        except (TypeError, ValueError, RuntimeError):  # a string, a ragged list: as_tensor's own message names no fix
            ids = None
        if ids is not None and ids.numel() == 0:
            raise ValueError(f"eos_token_id={self.eos_token_id!r} is empty: give at least one id, or None for no "
                             "early stop.")
        if ids is None or ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
            raise ValueError(f"eos_token_id={self.eos_token_id!r}: token ids are integers (e.g. tokenizer.eos_token_id).")
        return frozenset(ids.flatten().tolist())

    def to_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """``[..., V]`` logits → the probabilities both p and q are drawn from (greedy: one-hot at the argmax).

        No NaN check here (it would cost a device sync per call): the loops check the
        target's logits once per round instead.
        """
        temperature = self.temperature if self.do_sample else 0.0
        return logits_to_probs(logits, temperature=temperature, top_k=self.top_k, top_p=self.top_p, check_finite=False)
