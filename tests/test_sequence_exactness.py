"""Sequence level: 3-token continuations from speculative sampling follow the target's exact
distribution, computed by enumerating all 8^3 continuations of a tiny 8-token model."""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec_edu import autoregressive_generate, speculative_generate
from specdec_edu.course.controls import BROKEN_RULES, MisreportedQDrafter

# Every χ² test here: N_SAMPLES = 1,500 continuations from a generator seeded 0 (1 for the
# baseline), rejection at p < THRESHOLD = 1e-3. Power of the negative controls, measured once
# over generator seeds 0..4 at CONTROL_SETTINGS: every control rejected on all 5 seeds; largest
# p-values: bonus_from_previous_position 8e-6, misreported q 2e-7, resample_from_target 1e-14,
# accept_always and residual_one_position_late < 1e-300. The correct rule on the same 5 seeds:
# smallest p-value 0.14. (At T = 0.8 with top-k 3 the bonus control was rejected on only some
# seeds: top-k leaves p_1 and p_2 too alike; at T = 1 the misreported q *is* the sampled q.)
# At the truncated settings (SETTINGS[1:]), seeds 0..4: accept_always p = 0 on every seed (most of
# its samples are outcomes of probability 0); resample_from_target (every sample possible: the χ²
# itself must see it) at most 2e-28 at either setting. The baseline at T = 0.8 with top-k 3, seeds
# 0..4: smallest p-value 0.34; the same sampler at T = 1 (the temperature ignored): largest 2e-12.
PROMPT = torch.tensor([[1, 5, 2, 7]])
N_SAMPLES = 1500  # continuations per run
THRESHOLD = 1e-3  # χ² p-value level


def transformers_probs(logits, temperature, top_k, top_p):
    """``logits [..., V]`` → probabilities through Hugging Face's own warpers (temperature → top-k → top-p), not the
    package's ``logits_to_probs``: the reference must not share a warper bug with the code under test."""
    scores = TemperatureLogitsWarper(temperature)(None, logits.reshape(-1, logits.shape[-1]).clone())
    if top_k > 0:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1).reshape(logits.shape)


def exact_distribution(target, temperature, top_k, top_p, prompt=PROMPT):
    """{(x1, x2, x3): probability} under the target's warped distribution after ``prompt [1, n]``, by enumeration."""
    conts = torch.tensor(list(itertools.product(range(target.config.vocab_size), repeat=3)))  # [512, 3]
    ids = torch.cat([prompt.expand(len(conts), -1), conts], 1)
    with torch.no_grad():
        logits = target(ids).logits[:, prompt.shape[1] - 1 : -1]  # [512, 3, V]: next-token logits at each step
    probs = transformers_probs(logits.double(), temperature, top_k, top_p)
    step = probs.gather(-1, conts[..., None])[..., 0]  # [512, 3]
    return {tuple(c): float(pr) for c, pr in zip(conts.tolist(), step.prod(-1))}


def pvalue(samples, exact):
    """χ² over outcomes; outcomes expected fewer than 5 times are pooled into one bin. An outcome of probability 0
    (top-k and top-p make many) is never pooled: one such sample and the p-value is 0."""
    if any(exact.get(s, 0.0) == 0.0 for s in samples):
        return 0.0
    n = len(samples)
    big = [c for c, pr in exact.items() if pr * n >= 5]
    index = {c: i for i, c in enumerate(big)}
    counts = np.zeros(len(big) + 1)
    for s in samples:
        counts[index.get(s, len(big))] += 1
    expected = np.array([exact[c] for c in big] + [1 - sum(exact[c] for c in big)]) * n
    keep = expected > 0
    if counts[~keep].sum() > 0:  # sampled an outcome of probability 0: certainly not the target's distribution
        return 0.0
    if keep.sum() < 2:  # one possible outcome (e.g. top_k=1): nothing left to test, and χ² with df 0 is NaN
        return 1.0
    return chisquare(counts[keep], expected[keep] * counts.sum() / expected[keep].sum()).pvalue


def sample_many(fn, seed):
    gen = torch.Generator().manual_seed(seed)
    return [tuple(fn(gen).row(0).tolist()) for _ in range(N_SAMPLES)]


# The first also serves the negative controls: a temperature below 1 makes the misreported q
# (untempered) differ from the sampled one, and no top-k keeps p_1 and p_2 (bonus) apart.
CONTROL_SETTINGS = dict(temperature=0.6, top_k=0, top_p=1.0)
SETTINGS = [CONTROL_SETTINGS, dict(temperature=0.8, top_k=3, top_p=1.0), dict(temperature=1.0, top_k=0, top_p=0.9)]


@pytest.mark.parametrize("settings", SETTINGS, ids=["T0.6", "T0.8-top3", "T1-topp0.9"])
def test_speculative_continuations_follow_target(small_vocab_pair, settings):
    target, draft = small_vocab_pair
    exact = exact_distribution(target, **settings)
    spec = sample_many(
        lambda g: speculative_generate(target, draft, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g, **settings),
        seed=0,
    )
    assert pvalue(spec, exact) > THRESHOLD


@pytest.mark.parametrize("control", [*BROKEN_RULES, "misreported_q"])
def test_negative_controls_are_rejected(small_vocab_pair, control):
    """Same test, same sample size and seed, a broken rule (via ``accept_fn``, e.g.
    ``resample_from_target``) or a drafter that misreports q: each must fail."""
    target, draft = small_vocab_pair
    if control == "misreported_q":
        draft, broken = MisreportedQDrafter(draft), {}
    else:
        broken = dict(accept_fn=BROKEN_RULES[control])
    samples = sample_many(
        lambda g: speculative_generate(
            target, draft, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g, **broken, **CONTROL_SETTINGS
        ),
        seed=0,
    )
    assert pvalue(samples, exact_distribution(target, **CONTROL_SETTINGS)) < THRESHOLD


@pytest.mark.parametrize(
    "settings, control",
    [(SETTINGS[1], "accept_always"), (SETTINGS[2], "accept_always"), (SETTINGS[1], "resample_from_target"),
     (SETTINGS[2], "resample_from_target")],
    ids=["T0.8-top3-accept_always", "T1-topp0.9-accept_always", "T0.8-top3-resample_from_target",
         "T1-topp0.9-resample_from_target"],
)
def test_negative_controls_are_rejected_at_the_truncated_settings(small_vocab_pair, settings, control):
    """test_speculative_continuations_follow_target at its truncated settings (same sample size, seed and
    level) with a broken rule: each must fail. accept_always emits drafts outside the target's top-k / top-p
    (outcomes of probability 0), which the test rejects before any χ²; resample_from_target emits only possible
    outcomes, so the χ² itself must see it, at both settings (at top-p it was not tried, and only accept_always,
    rejected without a χ², stood for the test's power there)."""
    target, draft = small_vocab_pair
    samples = sample_many(
        lambda g: speculative_generate(target, draft, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g,
                                       accept_fn=BROKEN_RULES[control], **settings),
        seed=0,
    )
    assert pvalue(samples, exact_distribution(target, **settings)) < THRESHOLD


TRUNCATED_ONLY = dict(temperature=1.0, top_k=2, top_p=1.0)  # T = 1: only the truncation tells q_warped from q_raw


@pytest.mark.parametrize("drafter", ["honest", "misreported_q"])
def test_a_drafter_that_reports_q_before_truncation_is_rejected(small_vocab_pair, drafter):
    """The misreported-q control ran only at T = 0.6, where the temperature alone gives it away: nothing tested a
    drafter that forgets the top-k or top-p it sampled with. At T = 1 with top-k 2 the same test (1,500 samples,
    seed 0, p < 1e-3) must pass the honest drafter (p was 0.93) and reject the misreporting one (5.7e-44)."""
    target, draft = small_vocab_pair
    draft = MisreportedQDrafter(draft) if drafter == "misreported_q" else draft
    samples = sample_many(
        lambda g: speculative_generate(target, draft, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g,
                                       **TRUNCATED_ONLY),
        seed=0,
    )
    p = pvalue(samples, exact_distribution(target, **TRUNCATED_ONLY))
    assert (p > THRESHOLD) if drafter == "honest" else (p < THRESHOLD), p


@pytest.mark.parametrize("sampler", ["warped", "temperature_ignored"])
def test_target_only_sampling_passes_too(small_vocab_pair, sampler):
    """Sanity for the test itself: the baseline sampler passes it (T = 0.8, top-k 3, seed 1), and the same
    sampler drawing at T = 1 (a baseline that ignores the temperature; top-k kept, so every outcome is
    possible) is rejected by the same test."""
    target, _ = small_vocab_pair
    settings = SETTINGS[1]
    drawn = settings if sampler == "warped" else {**settings, "temperature": 1.0}
    base = sample_many(
        lambda g: autoregressive_generate(target, PROMPT, max_new_tokens=3, do_sample=True, generator=g, **drawn), seed=1
    )
    p_value = pvalue(base, exact_distribution(target, **settings))
    assert p_value > THRESHOLD if sampler == "warped" else p_value < THRESHOLD, p_value


def test_one_impossible_outcome_fails_the_test_even_where_the_pool_has_room(small_vocab_pair):
    """At top-k 3 the pooled bin expects about 21 samples, and impossible outcomes used to be pooled with the rare
    ones: 10 of them in 1,500 were rejected on 0 of 20 seeds. Exact samples pass; one impossible outcome fails."""
    target, _ = small_vocab_pair
    exact = exact_distribution(target, **SETTINGS[1])
    outcomes, probs = list(exact), np.array(list(exact.values()))
    rng = np.random.default_rng(0)
    samples = [outcomes[i] for i in rng.choice(len(outcomes), N_SAMPLES, p=probs / probs.sum())]
    assert pvalue(samples, exact) > THRESHOLD
    impossible = next(c for c, pr in exact.items() if pr == 0.0)
    assert pvalue(samples[:-1] + [impossible], exact) == 0.0


def test_a_distribution_with_one_outcome_passes_its_own_samples():
    """Greedy-like settings (top_k=1) leave one possible continuation: χ² then has no degree of freedom (scipy says
    NaN, which no threshold passes). Its own samples pass; one other outcome fails."""
    exact = {(1, 2, 3): 1.0, (1, 2, 4): 0.0}
    assert pvalue([(1, 2, 3)] * N_SAMPLES, exact) == 1.0
    assert pvalue([(1, 2, 3)] * (N_SAMPLES - 1) + [(1, 2, 4)], exact) == 0.0


def test_pair_disagrees(small_vocab_pair):
    """Guard on the fixture: target and draft must differ, or the control could pass by luck."""
    target, draft = small_vocab_pair
    with torch.no_grad():
        p, q = target(PROMPT).logits[0, -1].softmax(-1), draft(PROMPT).logits[0, -1].softmax(-1)
    assert 0.5 * (p - q).abs().sum() > 0.3


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampled"])
def test_eos_inside_accepted_drafts_counts_only_emitted_tokens(target, do_sample):
    """Draft = the target, so every draft is accepted (q = p); an EOS that the first round's
    drafts contain ends the output right there. The drafts after it were accepted but never
    emitted: they must not count, so token_sources and the counters agree, and α stays 1."""
    gamma, prompt = 4, torch.tensor([[1, 5, 9, 3, 7]])
    run = lambda eos: speculative_generate(
        target, target, prompt, max_new_tokens=10, gamma=gamma, do_sample=do_sample, temperature=0.8 if do_sample else 1.0,
        generator=torch.Generator().manual_seed(3), eos_token_id=eos,
    )
    free = run(None)
    assert free.token_sources[0][: gamma + 1] == ["accepted"] * gamma + ["bonus"]  # the round the EOS will cut
    first_round = free.row(0)[:gamma].tolist()
    # the EOS: a draft of round 1 that is not its last (cut mid-round) and appears for the first time there
    k = next(i for i in range(1, gamma - 1) if first_round[i] not in first_round[:i])  # after a kept draft
    out = run(first_round[k])
    assert out.row(0).tolist() == first_round[: k + 1]
    assert out.stats.stopped_by == "eos"
    assert out.token_sources[0] == ["accepted"] * (k + 1)
    assert out.token_sources[0].count("accepted") == out.stats.accepted == out.stats.new_tokens == k + 1
    assert out.stats.drafted == gamma and out.stats.rejected_rounds == 0 and out.stats.alpha == 1.0
    assert out.stats.accepted_per_drafted == (k + 1) / gamma  # of the γ drafted, only the emitted k + 1 count
    assert out.stats.accepted_per_round == [k + 1] and out.stats.tokens_per_round == [k + 1]
