"""first_divergence: position, tokens and the target's margin, checked against a recomputation."""

import pytest
import torch

from specdec_edu import autoregressive_generate
from specdec_edu.course.diagnostics import first_divergence

PROMPT = torch.tensor([[5, 9, 2, 7]])


@pytest.fixture(scope="module")
def reference(target):
    """The tiny target's greedy new tokens for PROMPT: [12]."""
    out = autoregressive_generate(target, PROMPT, max_new_tokens=12)
    return out.sequences[0, out.prompt_length:]


def recomputed_logits(target, reference):
    """[len(reference), V]: row i predicts new token i, from one forward over prompt + the whole reference
    (a different forward from the function's, which stops at the divergence)."""
    logits = target(torch.cat([PROMPT[0], reference])[None]).logits[0].float()
    return logits[PROMPT.shape[1] - 1 : -1]


def test_identical_outputs_have_no_divergence(target, reference):
    assert first_divergence(target, PROMPT, reference, reference.clone()) is None
    assert first_divergence(target, PROMPT[0], reference.tolist(), reference.tolist()) is None


@pytest.mark.parametrize("position", [0, 5, 11])
def test_a_changed_token_is_found_with_the_targets_margin(target, reference, position):
    vocab = target.config.vocab_size
    candidate = reference.clone()
    candidate[position] = (reference[position] + 1) % vocab
    candidate[position + 1 :] = 3  # what follows a divergence is irrelevant
    report = first_divergence(target, PROMPT, reference, candidate)

    logits = recomputed_logits(target, reference)[position]
    top = logits.topk(2)
    assert report["position"] == position
    assert report["reference_token"] == int(reference[position])
    assert report["candidate_token"] == int(candidate[position])
    assert int(top.indices[0]) == report["reference_token"]  # greedy: the reference is the target's argmax
    assert report["top2_margin"] == pytest.approx(float(top.values[0] - top.values[1]), abs=1e-4)
    assert report["candidate_margin"] == pytest.approx(float(logits.max() - logits[candidate[position]]), abs=1e-4)
    # negative control: the neighbouring position's margin is a different number, so an off-by-one would show
    neighbour = recomputed_logits(target, reference)[position - 1 if position else 1].topk(2).values
    assert abs(report["top2_margin"] - float(neighbour[0] - neighbour[1])) > 1e-3


def test_a_shorter_candidate_parts_where_it_stops(target, reference):
    report = first_divergence(target, PROMPT, reference, reference[:7])
    assert report["position"] == 7 and report["candidate_token"] is None and report["candidate_margin"] is None
    assert report["reference_token"] == int(reference[7])
    top2 = recomputed_logits(target, reference)[7].topk(2).values
    assert report["top2_margin"] == pytest.approx(float(top2[0] - top2[1]), abs=1e-4)
    longer = first_divergence(target, PROMPT, reference[:7], reference)
    assert longer["position"] == 7 and longer["reference_token"] is None and longer["candidate_token"] == int(reference[7])


def test_a_batch_is_a_clear_error(target, reference):
    with pytest.raises(ValueError, match="once per row"):
        first_divergence(target, PROMPT, torch.stack([reference, reference]), reference)
