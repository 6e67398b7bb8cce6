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


# ---- check_same_output: identity in fp32, near-ties allowed in reduced precision -------------------------

from conftest import tiny_llama  # noqa: E402

from specdec_edu.course.diagnostics import OutputMismatch, check_same_output, logit_spread, rounding_step  # noqa: E402


@pytest.fixture(scope="module")
def bf16_case():
    """A bf16 tiny target, its greedy output for PROMPT (24 tokens), and the top-2 margin at each position."""
    model = tiny_llama(seed=0).to(torch.bfloat16)
    out = autoregressive_generate(model, PROMPT, max_new_tokens=24)
    reference = out.sequences[0, out.prompt_length:]
    logits = model(torch.cat([PROMPT[0], reference])[None]).logits[0, PROMPT.shape[1] - 1 : -1].float()
    return model, reference, logits.topk(2)


def runner_up_at(reference, top2, position):
    """The reference with its token at ``position`` replaced by the target's runner-up there."""
    candidate = reference.clone()
    candidate[position] = top2.indices[position, 1]
    return candidate


def test_fp32_requires_identity(target, reference):
    assert check_same_output(target, PROMPT, reference, reference.clone())["identical"]
    candidate = reference.clone()
    candidate[4] = (reference[4] + 1) % target.config.vocab_size
    with pytest.raises(OutputMismatch, match="float32: first divergence at new token 4"):
        check_same_output(target, PROMPT, reference, candidate, spread=1e9)  # fp32: no tolerance, whatever the spread


def test_reduced_precision_passes_a_near_tie_and_fails_a_large_margin(bf16_case):
    """The same check, two divergences: at the position of the smallest top-2 margin (a flip rounding can make
    when the spread covers it), and at the largest one (a bug: it must raise with the measured spread)."""
    model, reference, top2 = bf16_case
    margins = top2.values[:, 0] - top2.values[:, 1]  # [24]
    tie, sure = int(margins.argmin()), int(margins.argmax())
    spread = logit_spread(model, torch.cat([PROMPT[0], reference]), gamma=4)
    step = rounding_step(float(top2.values[sure, 0]), torch.bfloat16)
    assert 2 * max(spread, step) < float(margins[sure]), "the large margin must be out of rounding's reach here"
    report = check_same_output(model, PROMPT, reference, runner_up_at(reference, top2, tie), spread=float(margins[tie]))
    assert not report["identical"] and report["divergence"]["position"] == tie and "near-tie" in report["message"]
    with pytest.raises(OutputMismatch, match=f"bfloat16: first divergence at new token {sure}.*a bug"):
        check_same_output(model, PROMPT, reference, runner_up_at(reference, top2, sure))  # spread measured here


def test_a_near_tie_is_judged_by_the_candidates_own_margin(bf16_case):
    """At the position of the smallest top-2 margin, a candidate that emits the target's *least* likely token is a
    bug, though the top two are tied: what rounding can flip is a token within its reach of the top one, and this
    one is far below. Every other test plants the runner-up, whose margin is the top-2 margin, so judging by the
    top-2 margin passed them all. The control: the runner-up at the same position, with the same spread, passes."""
    model, reference, top2 = bf16_case
    margins = top2.values[:, 0] - top2.values[:, 1]
    tie = int(margins.argmin())
    logits = model(torch.cat([PROMPT[0], reference])[None]).logits[0, PROMPT.shape[1] - 1 : -1].float()
    worst = reference.clone()
    worst[tie] = logits[tie].argmin()
    spread = 2 * float(margins[tie]) + 1e-3  # covers the tie, far from the worst token's margin
    assert float(top2.values[tie, 0] - logits[tie].min()) > 10 * spread
    with pytest.raises(OutputMismatch, match=f"new token {tie}.*a bug"):
        check_same_output(model, PROMPT, reference, worst, spread=spread)
    assert "near-tie" in check_same_output(model, PROMPT, reference, runner_up_at(reference, top2, tie), spread=spread)["message"]


def test_in_16_bit_a_run_that_stops_early_is_not_a_near_tie(bf16_case):
    """A truncated candidate (a prefix of the reference, or the reference cut short) has no token where they part:
    it used to be judged on the runner-up's margin there and pass as "a near-tie" (5 of 6 random bf16 models in a
    review). Rounding can flip a token, EOS too, but cannot end a run without one. The control: the huge spread
    below would pass any flip, and the truncation still fails."""
    model, reference, _ = bf16_case
    for ref, cand in ((reference, reference[:7]), (reference[:7], reference)):
        with pytest.raises(OutputMismatch, match="one run stopped while the other went on"):
            check_same_output(model, PROMPT, ref, cand, spread=1e9)


def test_a_spread_of_0_still_allows_one_rounding_step(bf16_case):
    """On a CPU the measured spread can be exactly 0 (the check saw it: bf16 kernels that accumulate in fp32 agree),
    yet a logit is rounded to bf16's grid everywhere, so two runs can part where the margin is one step of it. The
    tolerance is never below that step: a one-step margin is a near-tie, a five-step one still a bug."""
    model, reference, top2 = bf16_case
    margins = top2.values[:, 0] - top2.values[:, 1]
    steps = [rounding_step(float(top), torch.bfloat16) for top in top2.values[:, 0]]
    one = next(i for i, (m, st) in enumerate(zip(margins, steps)) if float(m) == st)  # a margin of exactly one step
    five = next(i for i, (m, st) in enumerate(zip(margins, steps)) if 4.5 * st < float(m) < 8 * st)
    report = check_same_output(model, PROMPT, reference, runner_up_at(reference, top2, one), spread=0.0)
    assert "near-tie" in report["message"] and report["tolerance"] == 2 * steps[one] and report["spread"] == 0.0
    with pytest.raises(OutputMismatch, match=f"new token {five}.*a bug"):
        check_same_output(model, PROMPT, reference, runner_up_at(reference, top2, five), spread=0.0)


@pytest.mark.parametrize("value, dtype, step", [(3.39, torch.bfloat16, 2**-6), (4.25, torch.bfloat16, 2**-5),
                                                (0.75, torch.bfloat16, 2**-8), (3.39, torch.float16, 2**-9),
                                                (-3.39, torch.bfloat16, 2**-6), (1.0, torch.float32, 2**-23)])
def test_the_rounding_step_is_the_gap_to_the_next_number(value, dtype, step):
    assert rounding_step(value, dtype) == step
    x = torch.tensor(abs(value), dtype=dtype)  # the grid itself: x + step is the next number, x + step / 4 rounds back
    assert float(x + torch.tensor(step, dtype=dtype)) > float(x) and float(x + torch.tensor(step / 4, dtype=dtype)) == float(x)


def test_the_rounding_step_at_a_logit_of_0_is_the_smallest_normal_number_not_0():
    """A top logit of exactly 0 with a measured spread of 0 must still allow one step, or no margin could pass."""
    assert rounding_step(0.0, torch.bfloat16) == torch.finfo(torch.bfloat16).tiny > 0


def test_the_spread_is_rounding(target, bf16_case):
    """Scoring γ + 1 tokens in one forward or one at a time agrees to rounding (on this CPU even bf16 can agree
    exactly: its kernels accumulate in fp32; a GPU's need not); too short a context is a clear error."""
    model, reference, _ = bf16_case
    context = torch.cat([PROMPT[0], reference])
    fp32, bf16 = logit_spread(target, context, gamma=4), logit_spread(model, context, gamma=4)
    assert 0 <= fp32 < 1e-4 and 0 <= bf16 < 0.5
    with pytest.raises(ValueError, match="more than"):
        logit_spread(target, context[:5], gamma=4)


def width_dependent_backend(gm, example_inputs):
    """A compiler whose multi-token forwards round 0.01 away from its one-token ones (a stand-in for compiled
    kernels that round differently per width): every floating output of a width > 1 program is shifted."""
    width = max((t.shape[1] for t in example_inputs if isinstance(t, torch.Tensor) and t.dtype == torch.long
                 and t.dim() == 2), default=1)

    def run(*args):
        outputs = gm(*args)
        if width == 1:
            return outputs
        return type(outputs)(o + 0.01 if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dim() == 3
                             and o.shape[-1] == 64 else o for o in outputs)
    return run


def test_the_spread_is_measured_on_the_compiled_path_once_a_generation_compiled_it():
    """The outputs a notebook compares came from the compiled kernels on a GPU: their rounding counts. Before
    any compiled generation the spread is the eager one (about 0 in fp32); after one, it covers the compiled
    widths' difference (0.01 here), without compiling anything itself."""
    model = tiny_llama(seed=3)  # a model of its own: the compiled cache is kept per model
    context = torch.cat([PROMPT[0], torch.arange(10, 22)])
    assert logit_spread(model, context, gamma=4) < 1e-4
    autoregressive_generate(model, PROMPT, max_new_tokens=4, compile=True,
                            compile_options={"backend": width_dependent_backend})
    assert 0.009 < logit_spread(model, context, gamma=4) < 0.02


def shifted_backend(gm, example_inputs):
    """A compiler whose every width rounds 0.03 away from eager (compiled kernels fuse and round differently):
    one-token and multi-token compiled forwards agree with each other, not with eager ones."""
    def run(*args):
        outputs = gm(*args)
        return type(outputs)(o + 0.03 if isinstance(o, torch.Tensor) and o.is_floating_point() and o.dim() == 3
                             and o.shape[-1] == 64 else o for o in outputs)
    return run


def test_the_spread_covers_eager_against_compiled():
    """``first_divergence`` reads the margin from an eager forward, while the outputs it explains came from
    compiled kernels: the reach must include how far those two paths sit apart. Before: the spread compared widths
    within each path only, 0 here, and a flip inside the compiled path's reach could be called a bug."""
    model = tiny_llama(seed=4)
    context = torch.cat([PROMPT[0], torch.arange(10, 22)])
    autoregressive_generate(model, PROMPT, max_new_tokens=4, compile=True, compile_options={"backend": shifted_backend})
    assert 0.029 < logit_spread(model, context, gamma=4) < 0.04
