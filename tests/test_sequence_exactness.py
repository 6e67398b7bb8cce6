"""Sequence level: 3-token continuations from speculative sampling follow the target's exact
distribution, computed by enumerating all 8^3 continuations of a tiny 8-token model."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_edu import autoregressive_generate, logits_to_probs, speculative_generate
from specdec_edu.controls import accept_always

PROMPT = torch.tensor([[1, 5, 2, 7]])
N_SAMPLES = 1500  # continuations per run
THRESHOLD = 1e-3  # χ² p-value level


def exact_distribution(target, temperature, top_k, top_p):
    """{(x1, x2, x3): probability} under the target's warped distribution, by enumeration."""
    conts = torch.tensor(list(itertools.product(range(target.config.vocab_size), repeat=3)))  # [512, 3]
    ids = torch.cat([PROMPT.expand(len(conts), -1), conts], 1)
    with torch.no_grad():
        logits = target(ids).logits[:, PROMPT.shape[1] - 1 : -1]  # [512, 3, V]: next-token logits at each step
    probs = logits_to_probs(logits.double(), temperature, top_k, top_p)
    step = probs.gather(-1, conts[..., None])[..., 0]  # [512, 3]
    return {tuple(c): float(pr) for c, pr in zip(conts.tolist(), step.prod(-1))}


def pvalue(samples, exact):
    """χ² over outcomes; outcomes expected fewer than 5 times are pooled into one bin."""
    n = len(samples)
    big = [c for c, pr in exact.items() if pr * n >= 5]
    index = {c: i for i, c in enumerate(big)}
    counts = np.zeros(len(big) + 1)
    for s in samples:
        counts[index.get(s, len(big))] += 1
    expected = np.array([exact[c] for c in big] + [1 - sum(exact[c] for c in big)]) * n
    keep = expected > 0
    assert counts[~keep].sum() == 0, "sampled an outcome of probability 0"
    return chisquare(counts[keep], expected[keep] * counts.sum() / expected[keep].sum()).pvalue


def sample_many(fn, seed):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(fn(gen).new_tokens.tolist()) for _ in range(N_SAMPLES)]


SETTINGS = [dict(temperature=0.8, top_k=3, top_p=1.0), dict(temperature=1.0, top_k=0, top_p=0.9)]


@pytest.mark.parametrize("settings", SETTINGS, ids=["T0.8-top3", "T1-topp0.9"])
def test_speculative_continuations_follow_target(small_vocab_pair, settings):
    target, draft = small_vocab_pair
    exact = exact_distribution(target, **settings)
    spec = sample_many(
        lambda g: speculative_generate(target, draft, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g, **settings),
        seed=0,
    )
    assert pvalue(spec, exact) > THRESHOLD


def test_negative_control_always_accept_is_rejected(small_vocab_pair):
    """Same test, same sample size, broken rule: must fail."""
    target, draft = small_vocab_pair
    settings = SETTINGS[0]
    exact = exact_distribution(target, **settings)
    broken = sample_many(
        lambda g: speculative_generate(
            target, draft, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g, accept_fn=accept_always, **settings
        ),
        seed=0,
    )
    assert pvalue(broken, exact) < THRESHOLD


def test_target_only_sampling_passes_too(small_vocab_pair):
    """Sanity for the test itself: the baseline sampler passes it."""
    target, _ = small_vocab_pair
    settings = SETTINGS[0]
    base = sample_many(lambda g: autoregressive_generate(target, PROMPT, max_new_tokens=3, do_sample=True, generator=g, **settings), seed=1)
    assert pvalue(base, exact_distribution(target, **settings)) > THRESHOLD


def test_pair_disagrees(small_vocab_pair):
    """Guard on the fixture: target and draft must differ, or the control could pass by luck."""
    target, draft = small_vocab_pair
    with torch.no_grad():
        p, q = target(PROMPT).logits[0, -1].softmax(-1), draft(PROMPT).logits[0, -1].softmax(-1)
    assert 0.5 * (p - q).abs().sum() > 0.3
