"""The real loop against the reference rounds of ``tests/reference_round.py`` (the algorithm without caches,
rollbacks or bookkeeping), on random tiny pairs.

Greedy: ``speculative_generate`` emits the reference's tokens, token for token (fp32). Sampled: with the same
seed, the loop and the reference draw the same random numbers in the same order (the drafts, then γ uniforms,
then the added token), so they emit the same tokens, draw for draw; a cached forward and a full one differ in
the last bits of p and q, which could flip a draw only if a uniform fell within ~1e-7 of a boundary (it did not,
on these fixed seeds). Negative controls: with a broken accept rule (``course.controls``) in the loop, the same
comparison finds a case that differs, for each rule, mode and pair.
"""

import pytest
import torch
from conftest import perturbed_copy, tiny_llama
from reference_round import greedy_round, reference_generate, sampled_round

from specdec_edu import speculative_generate
from specdec_edu.course.controls import BROKEN_RULES

PROMPTS = [[3, 17, 5, 42, 8, 11], [60], [7, 7, 7, 7, 1, 2]]
GAMMAS = (1, 3, 5)
N_NEW = 20


def make_pair(kind):
    """A random target with a draft that mostly agrees (rounds that keep every draft and take the bonus, checked
    below), or one that does not (almost every round ends at a rejection)."""
    target = tiny_llama(seed=20)
    draft = perturbed_copy(target, noise=0.05, seed=21) if kind == "close" else tiny_llama(seed=22)
    return target, draft


@pytest.fixture(scope="module", params=["close", "unrelated"])
def pair(request):
    return make_pair(request.param)


CASES = [(mode, i, gamma) for mode in ("greedy", "sampled") for i in range(len(PROMPTS)) for gamma in GAMMAS]


@pytest.fixture(scope="module")
def reference(pair):
    """{(mode, prompt index, γ): the reference's new tokens}; a sampled case draws from a generator seeded with
    the prompt's index."""
    target, draft = pair
    out = {}
    for mode, i, gamma in CASES:
        sampled = dict(generator=torch.Generator().manual_seed(i)) if mode == "sampled" else {}
        out[mode, i, gamma] = reference_generate(sampled_round if sampled else greedy_round, PROMPTS[i], N_NEW, gamma,
                                                 target=target, draft=draft, **sampled)
    return out


def ours(pair, mode, i, gamma, accept_fn=None) -> list[int]:
    """``speculative_generate``'s new tokens in one case (the same seed as the reference's)."""
    target, draft = pair
    out = speculative_generate(target, draft, torch.tensor([PROMPTS[i]]), max_new_tokens=N_NEW, gamma=gamma,
                               do_sample=mode == "sampled", generator=torch.Generator().manual_seed(i), accept_fn=accept_fn)
    return out.row(0).tolist()


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_close_pair_has_rounds_of_every_kind(mode):
    """The comparisons below can only catch a bug in rounds the pairs produce. At γ 5 over the three prompts, the
    close pair has rounds that keep no draft, rounds that keep some, and rounds that keep all 5 and take the bonus.
    (With noise 0.2 this draft's greedy rounds never kept all 5: a tiny random model's argmax is fragile.)"""
    target, draft = make_pair("close")
    kept = set()
    for i, prompt in enumerate(PROMPTS):
        kept.update(speculative_generate(target, draft, torch.tensor([prompt]), max_new_tokens=N_NEW, gamma=5,
                                         do_sample=mode == "sampled",
                                         generator=torch.Generator().manual_seed(i)).stats.accepted_per_round)
    assert 0 in kept and 5 in kept and kept & {1, 2, 3, 4}, kept


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_loop_emits_the_reference_rounds_tokens(pair, reference, mode):
    """Every prompt and γ: greedy token for token, sampled draw for draw."""
    for case in [c for c in CASES if c[0] == mode]:
        assert ours(pair, *case) == reference[case], case


# Under greedy decoding p is one-hot: resampling from p and from the residual both give the target's argmax,
# so resample_from_target is no bug there; every other control breaks greedy output too.
CONTROLS = [("greedy", name) for name in sorted(BROKEN_RULES) if name != "resample_from_target"] + [
    ("sampled", name) for name in sorted(BROKEN_RULES)]


@pytest.mark.parametrize("mode, control", CONTROLS)
def test_a_broken_rule_in_the_loop_is_caught(pair, reference, mode, control):
    """Negative control: the same comparison, with a broken accept rule in the loop, finds a case that differs,
    for either pair."""
    cases = [c for c in CASES if c[0] == mode]
    assert any(ours(pair, *case, accept_fn=BROKEN_RULES[control]) != reference[case] for case in cases)
