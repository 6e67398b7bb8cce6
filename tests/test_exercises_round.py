"""The "build it yourself" checker of notebook 06: a correct greedy round passes, a round that forgets to roll
back the target's KV cache fails visibly, and an unwritten one is reported as such."""

import torch

from specdec_edu import kv
from specdec_edu.course.exercises import check_speculative_round

PROMPT = torch.tensor([3, 17, 5, 42, 8, 11])


def greedy_round(target, draft, cache, context, gamma, crop=True):
    """Notebook 06's solution: draft γ tokens, verify in one target forward, keep the agreeing prefix, crop."""
    drafts = []
    for _ in range(gamma):  # the draft re-reads the whole context (no draft cache: simple, and it is small)
        ids = torch.cat([context, torch.tensor(drafts, dtype=torch.long)])[None]
        drafts.append(int(draft(input_ids=ids, logits_to_keep=1).logits[0, -1].argmax()))
    drafts = torch.tensor(drafts)
    choice = kv.forward_cached(target, torch.cat([context[-1:], drafts])[None], cache).logits[0].argmax(-1)  # [γ+1]
    n = 0
    while n < gamma and int(choice[n]) == int(drafts[n]):
        n += 1
    if crop:
        kv.crop(cache, gamma - n)
    return drafts[:n].tolist() + [int(choice[n])]


def test_a_correct_round_reproduces_the_target(target, close_draft, draft, capsys):
    for d in (close_draft, draft):  # many accepted drafts / almost every draft rejected
        assert check_speculative_round(greedy_round, target, d, PROMPT, gamma=4, max_new_tokens=20) is True
        assert "PASS" in capsys.readouterr().out


def test_a_round_that_does_not_crop_fails_with_a_position(target, draft, capsys):
    no_crop = lambda *args: greedy_round(*args, crop=False)
    assert check_speculative_round(no_crop, target, draft, PROMPT, gamma=4, max_new_tokens=20) is False
    out = capsys.readouterr().out
    assert "FAIL: first divergent position" in out and "crop the rejected drafts" in out


def test_unwritten_and_malformed_rounds(target, draft, capsys):
    assert check_speculative_round(lambda *args: NotImplemented, target, draft, PROMPT) is None
    assert "not written yet" in capsys.readouterr().out
    too_many = lambda target, draft, cache, context, gamma: [1] * (gamma + 2)
    assert check_speculative_round(too_many, target, draft, PROMPT, gamma=3) is False
    assert "emits 1 to γ + 1 = 4" in capsys.readouterr().out
