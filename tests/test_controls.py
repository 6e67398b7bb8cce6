"""The negative controls break what their docstrings say they break, and nothing else that a
deterministic case can show. (The statistical tests that reject them: test_verify.py,
test_sequence_exactness.py; the differential one: test_hf_differential.py.)"""

import pytest
import torch

from specdec_edu.course.controls import (
    BROKEN_RULES,
    MisreportedQDrafter,
    accept_always,
    bonus_from_previous_position,
    resample_from_target,
    residual_one_position_late,
)
from specdec_edu.drafters import ModelDrafter
from specdec_edu.sampling import logits_to_probs
from specdec_edu.verify import accept_and_resample


def one_hot(*tokens, vocab=4):
    """``[len(tokens), vocab]`` rows one-hot at ``tokens``."""
    return torch.nn.functional.one_hot(torch.tensor(tokens), vocab).float()


@pytest.mark.parametrize("control", sorted(BROKEN_RULES))
def test_controls_handle_a_round_without_drafts(control):
    """speculative_generate runs γ = 0 rounds near max_new_tokens: p [1, V], q [0, V], no drafts."""
    p = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    n, token = BROKEN_RULES[control](p, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), torch.Generator().manual_seed(0))
    assert (n, token) == (0, 2)


def test_accept_always_keeps_a_draft_the_target_rules_out():
    p, q, drafts = one_hot(0, 2), one_hot(1), torch.tensor([1])  # p_0(1) = 0: the draft must go
    assert accept_and_resample(p, q, drafts) == (0, 0)
    assert accept_always(p, q, drafts) == (1, 2)


def test_bonus_from_previous_position_repeats_the_last_drafts_distribution():
    p, q, drafts = one_hot(1, 2), one_hot(1), torch.tensor([1])  # draft accepted; the bonus is p_1's token 2
    assert accept_and_resample(p, q, drafts) == (1, 2)
    assert bonus_from_previous_position(p, q, drafts) == (1, 1)


def test_residual_one_position_late_corrects_the_wrong_draft():
    # Draft 0 (token 3) is rejected for sure (p_0(3) = 0); the residual at 0 is token 0, at 1 token 1.
    p, q, drafts = one_hot(0, 1, 2), one_hot(3, 3), torch.tensor([3, 3])
    assert accept_and_resample(p, q, drafts) == (0, 0)
    assert residual_one_position_late(p, q, drafts) == (0, 1)
    # A rejection at the last draft has no later position: there the control is right.
    p, q, drafts = one_hot(3, 1, 2), one_hot(3, 3), torch.tensor([3, 3])
    assert residual_one_position_late(p, q, drafts) == accept_and_resample(p, q, drafts) == (1, 1)


def test_resample_from_target_emits_what_the_residual_excludes():
    """p_0 = [½, ½], q_0 = one-hot at 0: token 0 is accepted half the time, and after a rejection
    the residual max(0, p − q) is one-hot at 1. So 'reject, then emit 0' is impossible for the
    rule and happens 1/4 of the time for the control. 200 trials each, generators seeded 0; the
    control's count is Binomial(200, ¼): mean 50, SD 6, so the bound 20 is 5 SD below the mean."""
    p, q, drafts = torch.tensor([[0.5, 0.5], [1.0, 0.0]]), torch.tensor([[1.0, 0.0]]), torch.tensor([0])
    gen_rule, gen_control = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    rule = {accept_and_resample(p, q, drafts, gen_rule) for _ in range(200)}
    control = [resample_from_target(p, q, drafts, gen_control) for _ in range(200)]
    assert rule == {(1, 0), (0, 1)}
    assert control.count((0, 0)) > 20


def test_misreported_q_drafter_samples_warped_but_reports_raw(draft):
    """Same tokens as an honest ModelDrafter (same generator), but q is the untempered softmax."""
    context, gen = torch.tensor([1, 2, 3]), lambda: torch.Generator().manual_seed(5)
    warped = lambda logits: logits_to_probs(logits, temperature=0.5)
    honest_tokens, honest_q = ModelDrafter(draft).propose(context, 3, warped, gen())
    tokens, q = MisreportedQDrafter(draft).propose(context, 3, warped, gen())
    assert torch.equal(tokens, honest_tokens)
    with torch.no_grad():
        logits = draft(torch.cat([context, tokens[:-1]])[None]).logits[0, -3:]
    assert torch.allclose(q, logits.softmax(-1), atol=1e-5)
    assert not torch.allclose(q, honest_q, atol=1e-2)
    # At temperature 1 without truncation the two q's coincide: the bug needs a warper to show.
    plain = lambda logits: logits_to_probs(logits)
    assert torch.allclose(MisreportedQDrafter(draft).propose(context, 3, plain, gen())[1],
                          ModelDrafter(draft).propose(context, 3, plain, gen())[1], atol=1e-6)


def test_every_broken_rule_is_listed_under_its_own_name():
    """The statistical tests run each rule of ``BROKEN_RULES`` (and nothing else); a rule dropped from it, or a
    name bound to another rule, silently leaves one bug unchecked."""
    from specdec_edu.course import controls

    rules = {name for name in controls.__all__ if name not in ("MisreportedQDrafter", "BROKEN_RULES")}
    assert set(BROKEN_RULES) == rules
    assert all(rule is getattr(controls, name) for name, rule in BROKEN_RULES.items())


@pytest.mark.parametrize("control", ["resample_from_target", "bonus_from_previous_position",
                                     "residual_one_position_late"])
def test_controls_accept_what_the_real_rule_accepts_from_the_same_uniforms(control):
    """The docstring's promise: a control differs from the real rule only in the piece it breaks. Its accepted
    prefix is the real rule's, draw for draw: γ uniforms from the same generator, each against min(1, p/q) at its
    own position, the prefix ending at the first rejection. Random p, q over 6 tokens, γ 1 to 4, drafts from q,
    generators seeded 0..49 (a draft rejected before a kept one happens in most rounds here)."""
    gen = torch.Generator().manual_seed(0)
    for gamma in range(1, 5):
        p = torch.rand(gamma + 1, 6, generator=gen).softmax(-1)
        q = (3 * torch.rand(gamma, 6, generator=gen)).softmax(-1)
        drafts = torch.multinomial(q, 1, generator=gen)[:, 0]
        for seed in range(50):
            real = accept_and_resample(p, q, drafts, torch.Generator().manual_seed(seed))
            broken = BROKEN_RULES[control](p, q, drafts, torch.Generator().manual_seed(seed))
            assert broken[0] == real[0], (gamma, seed)


def test_residual_one_position_late_is_right_when_every_draft_is_kept():
    """A round that keeps every draft emits its bonus token from p_γ, as the real rule does: the control breaks
    the correction after a rejection, nothing else."""
    p, q, drafts = one_hot(1, 3, 2), one_hot(1, 3), torch.tensor([1, 3])
    assert residual_one_position_late(p, q, drafts) == accept_and_resample(p, q, drafts) == (2, 2)


def test_residual_one_position_late_takes_p_and_q_of_the_same_later_position():
    """After a rejection at 0 the control samples max(0, p_1 − q_1), both of position 1: here one-hot at token 1.
    A residual mixing p_1 with q_0 would be p_1 itself, token 0 half the time (20 draws, seeds 0..19)."""
    p = torch.tensor([[1.0, 0, 0, 0], [0.5, 0.5, 0, 0], [0, 0, 1.0, 0]])
    q, drafts = one_hot(3, 0), torch.tensor([3, 0])  # draft 0 (token 3) has p_0(3) = 0: rejected for sure
    assert {residual_one_position_late(p, q, drafts, torch.Generator().manual_seed(s)) for s in range(20)} == {(0, 1)}


def test_resample_from_target_resamples_from_the_rejected_positions_p():
    """After a rejection at n the control samples p_n (the row the rejected draft was judged on), not another row:
    draft 0 (token 3, p_0(3) = 0) is rejected, p_0 is one-hot at 1, the bonus row p_2 at 2."""
    p, q, drafts = one_hot(1, 0, 2), one_hot(3, 0), torch.tensor([3, 0])
    assert resample_from_target(p, q, drafts, torch.Generator().manual_seed(0)) == (0, 1)


@pytest.mark.parametrize("control", sorted(BROKEN_RULES))
def test_controls_draw_a_round_without_drafts_as_the_real_rule_does(control):
    """With no drafts every control is the real rule: the target's token from p_0, drawn from the run's generator
    (seeds 0..19, p over 5 tokens), so a seeded run that ends in such a round is reproducible with a control in it."""
    p = torch.rand(1, 5, generator=torch.Generator().manual_seed(1)).softmax(-1)
    none, no_q = torch.zeros(0, dtype=torch.long), torch.zeros(0, 5)
    for seed in range(20):
        expected = accept_and_resample(p, no_q, none, torch.Generator().manual_seed(seed))
        assert BROKEN_RULES[control](p, no_q, none, torch.Generator().manual_seed(seed)) == expected, seed
