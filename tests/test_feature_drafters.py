"""Medusa and EAGLE drafters (specdec_edu.models.feature_drafters) on tiny random models: exactness,
the feature/token alignment, EAGLE's cache rollback, save/load and load_drafter."""

import copy
import hashlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_llama
from safetensors.torch import load_file, save_file
from test_greedy import PROMPTS, reference
from test_sequence_exactness import PROMPT, THRESHOLD, exact_distribution, pvalue, sample_many

from specdec_edu import (
    LookupThenDrafter,
    ModelDrafter,
    PromptLookupDrafter,
    autoregressive_generate,
    speculative_generate,
)
from specdec_edu.course.controls import MisreportedQDrafter, accept_always, bonus_from_previous_position
from specdec_edu.models import feature_drafters, feature_training
from specdec_edu.models.feature_drafters import EagleDrafter, MedusaDrafter, load_drafter

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "train_feature_drafters.py"


def randomized(drafter, seed, scale=0.3):
    """The drafter with random weights in its new layers (an untrained Medusa starts at zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in drafter.net.parameters():
            w.copy_(scale * torch.randn(w.shape, generator=gen))
    return drafter


def make(kind, target, seed=0, **kwargs):
    cls = MedusaDrafter if kind == "medusa" else EagleDrafter
    return randomized(cls(target, **kwargs), seed)


def features_of(target, context):
    """f_0 … f_{L−2} for a context of L tokens, teacher-forced from scratch: ``[L−1, d]``."""
    with torch.no_grad():
        return target.get_decoder()(input_ids=context[None, :-1]).last_hidden_state[0]


# ---- exactness ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind,kwargs", [("medusa", {"n_heads": 4}), ("eagle", {"draft_vocab_size": 40})],
                         ids=["medusa", "eagle-reduced-head"])
def test_greedy_equals_generate_for_gamma_1_to_6(target, kind, kwargs):
    """Random-init drafters (exactness must not depend on their quality): prompts of 1–8 tokens × γ = 1..6.
    (EAGLE with a reduced head: its q covers 40 of 64 ids, the loop zero-pads the rest.)"""
    drafter = make(kind, target, **kwargs)
    for prompt in PROMPTS[:5]:
        expected = reference(target, prompt, 20).tolist()
        for gamma in range(1, 7):
            out = speculative_generate(target, drafter, prompt[None], max_new_tokens=20, gamma=gamma)
            assert out.sequences[0].tolist() == expected, (len(prompt), gamma)


# The χ² harness of test_sequence_exactness (1500 samples, reject at p < 1e-3), at T = 0.4 without truncation: a
# temperature further from 1 makes a misreported q (the raw softmax) differ more from the sampled one. Power,
# measured once over generator seeds 0..4: misreported q rejected on every seed (largest p: EAGLE 5.6e-5, Medusa
# 1e-16; at T = 0.6 EAGLE's seed 0 gave p = 0.079), accept_always p = 0; the honest drafters' smallest p 0.014.
FEATURE_SETTINGS = dict(temperature=0.4, top_k=0, top_p=1.0)


def feature_drafter(kind, target):
    """The drafter under test, by name: EAGLE, Medusa (2 heads), or prompt lookup on every 1-gram, else EAGLE."""
    if kind == "lookup-then-eagle":
        return LookupThenDrafter(make("eagle", target, seed=3), PromptLookupDrafter(max_ngram=2, min_ngram=1))
    return make(kind, target, seed=3, **({"n_heads": 2} if kind == "medusa" else {}))


def feature_pvalue(target, drafter, **broken):
    samples = sample_many(lambda g: speculative_generate(target, drafter, PROMPT, max_new_tokens=3, gamma=2, do_sample=True,
                                                         generator=g, **broken, **FEATURE_SETTINGS), seed=0)
    return pvalue(samples, exact_distribution(target, **FEATURE_SETTINGS))


@pytest.mark.parametrize("kind", ["medusa", "eagle", "lookup-then-eagle"])
def test_sampled_continuations_follow_target(small_vocab_pair, kind):
    """χ² over all 8^3 continuations: p > 1e-3. (Lookup drafts on every 1-gram match, so both halves draft often.)"""
    target, _ = small_vocab_pair
    assert feature_pvalue(target, feature_drafter(kind, target)) > THRESHOLD


@pytest.mark.parametrize("kind,control", [("eagle", "accept_always"), ("lookup-then-eagle", "accept_always"),
                                          ("eagle", "misreported_q"), ("medusa", "misreported_q")])
def test_negative_controls_are_rejected(small_vocab_pair, kind, control):
    """Same test, same drafter, one piece broken: the rule keeps every draft, or the drafter samples from the
    warped q but reports the raw softmax (``MisreportedQDrafter`` around the feature drafter). Each must fail."""
    target, _ = small_vocab_pair
    drafter, broken = feature_drafter(kind, target), {}
    if control == "misreported_q":
        drafter = MisreportedQDrafter(drafter)
    else:
        broken = dict(accept_fn=accept_always)
    assert feature_pvalue(target, drafter, **broken) < THRESHOLD


class TargetAsFeatureDrafter(ModelDrafter):
    """A draft that is the target itself (q = p) and reads the target's features (``observe``), so the loop takes the
    feature path (decoder and head run apart, ``target_logits_and_features``) and every round ends in a bonus token."""

    def __init__(self, model):
        super().__init__(model)
        self.observed = 0

    def observe(self, features):  # [n, d]: counted only, to show that the feature path ran
        self.observed += len(features)


def test_the_feature_paths_bonus_tokens_follow_target(small_vocab_pair):
    """Random feature drafters rarely get both drafts accepted, so the χ² above barely sees a bonus: drawn from the
    previous position's p it still passed (EAGLE p = 0.049, Medusa 0.030). Here q = p on the feature path: each
    3-token continuation at γ = 2 ends in a bonus. The same χ² (1,500 samples, seed 0, level 1e-3); that broken bonus
    (``bonus_from_previous_position``) is its control and must be rejected."""
    target, _ = small_vocab_pair
    drafter = TargetAsFeatureDrafter(copy.deepcopy(target))
    exact = exact_distribution(target, **FEATURE_SETTINGS)

    def sample(**broken):
        return pvalue(sample_many(lambda g: speculative_generate(
            target, drafter, PROMPT, max_new_tokens=3, gamma=2, do_sample=True, generator=g, **broken,
            **FEATURE_SETTINGS), seed=0), exact)

    one = speculative_generate(target, drafter, PROMPT, max_new_tokens=3, gamma=2, do_sample=True,
                               generator=torch.Generator().manual_seed(0), **FEATURE_SETTINGS)
    assert one.token_sources == [["accepted", "accepted", "bonus"]] and drafter.observed > 0  # the case meant
    assert sample() > THRESHOLD
    assert sample(accept_fn=bonus_from_previous_position) < THRESHOLD


# ---- prompt lookup first, a feature drafter elsewhere ---------------------------------------------


def test_lookup_then_eagle_greedy_equals_generate(target):
    """Both halves draft (counted), EAGLE keeps seeing every kept position (else check_context raises), and the
    output is the target's, token for token, for γ = 1..6; prompts include one that repeats itself."""
    hybrid = LookupThenDrafter(make("eagle", target, draft_vocab_size=40))
    assert hybrid.observe == hybrid.fallback.observe  # the loop must show it features
    prompts = [*PROMPTS[:4], torch.tensor([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7])]
    used = {"lookup": 0, "fallback": 0}
    for prompt in prompts:
        expected = reference(target, prompt, 20).tolist()
        for gamma in range(1, 7):
            out = speculative_generate(target, hybrid, prompt[None], max_new_tokens=20, gamma=gamma)
            assert out.sequences[0].tolist() == expected, (len(prompt), gamma)
            for key in used:
                used[key] += hybrid.rounds[key]
    assert used["lookup"] > 0 and used["fallback"] > 0, used


def test_batch_of_two_prompts_is_refused(target):
    ids = torch.stack([PROMPTS[3][:4], PROMPTS[4][:4]])
    with pytest.raises(ValueError, match="one prompt at a time"):
        speculative_generate(target, make("eagle", target), ids, max_new_tokens=5)


def test_propose_without_the_features_says_what_is_missing(target):
    drafter = make("eagle", target)
    with pytest.raises(ValueError, match="len\\(context\\) - 1"):
        drafter.propose(PROMPTS[4], 3, torch.softmax, None)


# ---- alignment: f_t pairs with x_{t+1} ----------------------------------------------------------
#
# A target whose feature at t depends on x_t alone: attention and MLP outputs zeroed, identity
# embedding, so f_t = norm(e_{x_t}) = √V·e_{x_t}; its head maps x to π(x) = x + 1 mod V (greedy
# output: x, x+1, x+2, …). On it we can WRITE the perfect drafters:
#   EAGLE: fc([f_t ; e_{x_{t+1}}]) = e_{x_{t+1}} and a layer that adds nothing → f̂_{t+1} = f_{t+1} exactly;
#   Medusa: head k = h + SiLU(2·P^k h) (P: the permutation π) → argmax π^{k+1}(x_{L−2}) = x_{L−1+k}.
# Both must then get every draft accepted. The same constructions wired one position off (EAGLE
# reading f_t instead of x_{t+1}; Medusa head k aiming at x_{t+k}) guess the token already known,
# never the next one: α = 0. Checked by mutating the code one position off, one change at a time:
# EagleDrafter feeding (f_t, x_t), MedusaDrafter reading f_{L−3}, the training losses pairing f_t with
# x_t (EAGLE) or head k with p_{t+k−1} (Medusa): each fails a test below, while greedy stays exact.

V = 16


def bigram_target():
    target = tiny_llama(seed=3, vocab_size=V, hidden=V, layers=1)
    with torch.no_grad():
        for layer in target.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        target.model.embed_tokens.weight.copy_(torch.eye(V))
        target.model.norm.weight.fill_(1.0)
        target.lm_head.weight.copy_(2 * torch.eye(V).roll(1, 0))  # row π(x) = x + 1 reads e_x
    return target


def handmade_eagle(target, shifted=False):
    drafter = EagleDrafter(target)
    net, eye = drafter.net, torch.eye(V)
    with torch.no_grad():
        net.fc.weight.copy_(torch.cat([eye, torch.zeros(V, V)] if shifted else [torch.zeros(V, V), eye], 1))
        net.fc.bias.zero_()
        for layer in net.decoder.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        net.decoder.norm.weight.fill_(1.0)
    return drafter


def handmade_medusa(target, n_heads=4, shifted=False):
    drafter = MedusaDrafter(target, n_heads=n_heads)
    P = torch.eye(V).roll(1, 0)
    with torch.no_grad():
        for k, block in enumerate(drafter.net.blocks, start=1):
            block.weight.copy_(2 * torch.linalg.matrix_power(P, k - 1 if shifted else k))
    return drafter


@pytest.mark.parametrize("build", [handmade_eagle, handmade_medusa], ids=["eagle", "medusa"])
def test_right_alignment_accepts_every_draft_and_shifted_none(build):
    target = bigram_target()
    prompt = torch.tensor([9, 3, 4])  # ends on the chain (4 = π(3)): Medusa's heads cannot see x_{L−1}, only f_{L−2}
    expected = autoregressive_generate(target, prompt[None], max_new_tokens=20).sequences
    assert expected[0, -3:].tolist() == [6, 7, 8]  # the fixture: x + 1 mod 16, 20 steps from 4
    for shifted, alpha in [(False, 1.0), (True, 0.0)]:
        out = speculative_generate(target, build(target, shifted=shifted), prompt[None], max_new_tokens=20, gamma=4)
        assert torch.equal(out.sequences, expected)
        assert out.stats.alpha == alpha, ("shifted" if shifted else "aligned", out.stats.alpha)


def test_training_losses_use_the_same_alignment():
    """The training script's pairs: the perfect EAGLE has ~0 regression loss and near-minimal
    distillation loss on teacher-forced data; the one-off wiring has large losses."""
    from specdec_edu.models import feature_training as train
    target = bigram_target()
    sequences = (torch.arange(12) + torch.tensor([[0], [5], [9], [14]])) % V  # the target's own greedy text: x, x+1, …
    data = train.collect_features(target, [(row, 1) for row in sequences.tolist()], top_k=4)  # "prompt" = 1 token
    idx = torch.arange(len(data))

    def losses(eagle):  # (regression, distillation), from the script's combined loss at two weights
        regression = float(train.eagle_loss(eagle, data, idx, w_distill=0.0, unroll=1)[0].detach())
        return regression, float(train.eagle_loss(eagle, data, idx, w_distill=1.0, unroll=1)[0].detach()) - regression

    good, bad = losses(handmade_eagle(target)), losses(handmade_eagle(target, shifted=True))
    assert good[0] < 1e-5 and good[1] < 0.1 and bad[0] > 0.3 and bad[1] > 2
    assert train.medusa_loss(handmade_medusa(target), data, idx)[0] < 0.1 * 4
    assert train.medusa_loss(handmade_medusa(target, shifted=True), data, idx)[0] > 2 * 4


# ---- EAGLE's cache rollback -----------------------------------------------------------------------


class Recorder:
    """Passes everything to ``inner`` and records each proposal: (context, tokens, logits behind q)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def reset(self):
        self.inner.reset()

    def observe(self, features):
        self.inner.observe(features)

    def propose(self, context, gamma, to_probs, generator=None):
        logits = []
        tokens, q = self.inner.propose(context, gamma, lambda x: (logits.append(x), to_probs(x))[1], generator)
        self.calls.append((context.clone(), tokens, torch.stack(logits)))
        return tokens, q


def test_eagle_rollback_matches_a_from_scratch_recompute(small_vocab_pair):
    """After rounds with rejections AND acceptances, every round's draft logits equal those of a fresh
    drafter shown only the real features of that round's context and fed the same draft tokens.
    (Sampled at T = 1 so that drafts are often accepted; the recompute is forced onto the recorded drafts.)"""
    target, _ = small_vocab_pair
    drafter = make("eagle", target, seed=5)
    recorder = Recorder(drafter)
    out = speculative_generate(target, recorder, PROMPT, max_new_tokens=40, gamma=4, do_sample=True,
                               generator=torch.Generator().manual_seed(0))
    assert out.stats.rejected_rounds > 2 and out.stats.accepted > 2  # both paths of the rollback were taken
    for context, tokens, logits in recorder.calls:
        drafter.reset()
        drafter.observe(features_of(target, context))
        recomputed = []
        fresh_tokens, _ = drafter.propose(context, len(tokens), forced_onto(tokens, recomputed))
        assert torch.equal(fresh_tokens, tokens)
        torch.testing.assert_close(torch.stack(recomputed), logits, atol=1e-5, rtol=1e-5)


def forced_onto(tokens, log):
    """A ``to_probs`` that logs the logits it gets and returns a one-hot q on the next of ``tokens``."""
    forced = iter(tokens)

    def to_probs(logits):
        log.append(logits)
        return torch.nn.functional.one_hot(next(forced), logits.shape[-1]).float()

    return to_probs


# ---- save / load / by name ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_save_load_round_trip(tmp_path, target, kind):
    """fp16 on disk: after rounding the weights to fp16 first, the reloaded drafter's q is identical."""
    drafter = make(kind, target, **({"n_heads": 3, "draft_vocab_size": 50} if kind == "medusa" else {"draft_vocab_size": 50}))
    with torch.no_grad():
        for w in drafter.net.parameters():
            w.copy_(w.half().float())
    drafter.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"config.json", "model.safetensors"}
    loaded = load_drafter(kind, target, path=tmp_path)
    assert type(loaded) is type(drafter) and loaded.width == 50
    context = PROMPTS[5]
    proposals = []
    for d in (drafter, loaded):
        d.reset()
        d.observe(features_of(target, context))
        proposals.append(d.propose(context, 3, lambda x: torch.softmax(x, -1), torch.Generator().manual_seed(0)))
    assert torch.equal(proposals[0][0], proposals[1][0]) and torch.equal(proposals[0][1], proposals[1][1])
    with pytest.raises(ValueError, match="not a 'eagle'|not a 'medusa'"):
        (EagleDrafter if kind == "medusa" else MedusaDrafter).load(tmp_path, target)
    with pytest.raises(ValueError, match="hidden size 64"):
        type(drafter).load(tmp_path, tiny_llama(seed=0, hidden=32))


def test_load_drafter_errors_and_names(tmp_path, monkeypatch, target):
    with pytest.raises(ValueError, match="'draft', 'medusa', 'eagle', 'prompt-lookup'"):
        load_drafter("lookahead", target)
    monkeypatch.setattr(feature_drafters, "asset_dir", lambda name: tmp_path / name)  # no default assets/<name>/
    for name in ("medusa", "eagle"):
        with pytest.raises(FileNotFoundError, match=f"{name}.*python scripts/train_feature_drafters.py"):
            load_drafter(name, target)
        with pytest.raises(FileNotFoundError, match="train_feature_drafters"):
            load_drafter(name, target, path=tmp_path / "nowhere")
    assert isinstance(load_drafter("prompt-lookup", target), PromptLookupDrafter)
    with pytest.raises(ValueError, match=r"unknown drafter 'nope'.*'prompt-lookup\+NAME'"):
        load_drafter("prompt-lookup+nope", target)
    make("eagle", target).save(tmp_path / "mine")
    hybrid = load_drafter("prompt-lookup+eagle", target, path=tmp_path / "mine")
    assert isinstance(hybrid, LookupThenDrafter) and isinstance(hybrid.fallback, EagleDrafter)
    # "draft": the embedded draft on the target's device (stubbed: no weights read here).
    asked = []

    def fake_load_embedded_draft(device=None):
        asked.append(device)
        return target

    monkeypatch.setattr("specdec_edu.models.embedded.load_embedded_draft", fake_load_embedded_draft)
    drafter = load_drafter("draft", target)
    assert isinstance(drafter, ModelDrafter) and drafter.model is target and asked == [target.device]
    # a target of another tokenizer (a vocabulary of another size): refused, where it ran at α = 0 before
    from conftest import tiny_llama

    with pytest.raises(ValueError, match="the embedded draft speaks SmolLM2's tokenizer .*this target has 100"):
        load_drafter("draft", tiny_llama(seed=3, vocab_size=100))


# ---- bound to the target they were trained on ------------------------------------------------------


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_another_target_is_refused_naming_the_fix(target, kind):
    """Another hidden size (a raw 'mat1 and mat2 shapes cannot be multiplied' before) and another model of
    the same shape (before: it ran, reading features it was never trained on) are refused up front, alone
    and behind prompt lookup. The same model in another object is the same target."""
    drafter = make(kind, target)
    for other, reason in [(tiny_llama(seed=0, hidden=32), "hidden size 64, this target has 32"),
                          (tiny_llama(seed=7), "another model of the same shape")]:
        for wrapped in (drafter, LookupThenDrafter(drafter)):
            with pytest.raises(ValueError, match=f"{reason}.*trains drafters for the embedded target only.*PromptLookupDrafter"):
                speculative_generate(other, wrapped, PROMPTS[5][None], max_new_tokens=5)
    same = tiny_llama(seed=0)  # the target fixture's weights, rebuilt
    drafter.check_target(same)
    same_in_bf16 = same.to(torch.bfloat16)  # the same target (the fingerprint survives the rounding) ...
    fingerprint = feature_drafters.target_fingerprint
    assert feature_drafters.fingerprint_mismatch(fingerprint(target), fingerprint(same_in_bf16)) is None
    with pytest.raises(ValueError, match="in torch.float32, this one is on cpu in torch.bfloat16: load it onto this target"):
        drafter.check_target(same_in_bf16)  # ... but this drafter's head is its own float32 copy's


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_drafter_follows_its_own_target_cast_after_loading(kind):
    """``target.to(torch.float64)`` after the drafter was made: the target's float64 features met the drafter's
    float32 layers, a raw "mat1 and mat2 must have the same dtype". Its layers now follow their target, alone and
    behind prompt lookup, and the output is the target's own."""
    for wrapped in (lambda d: d, LookupThenDrafter):
        target = tiny_llama(seed=0)
        drafter = make(kind, target)
        target.to(torch.float64)
        out = speculative_generate(target, wrapped(drafter), PROMPTS[5][None], max_new_tokens=12, gamma=3)
        assert out.row(0).tolist() == reference(target, PROMPTS[5], 12)[-12:].tolist()  # HF gives the prompt too
        assert next(drafter.net.parameters()).dtype == torch.float64


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_saved_drafter_loads_only_onto_its_target(tmp_path, target, kind):
    make(kind, target).save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["target"] == feature_drafters.target_fingerprint(target)
    with pytest.raises(ValueError, match="another model of the same shape"):
        load_drafter(kind, tiny_llama(seed=7), path=tmp_path)
    load_drafter(kind, tiny_llama(seed=0), path=tmp_path)  # the same weights in another object: fine
    # A target with a smaller head than the saved reduced head: the mismatch is named, not the drafter's own
    # argument (it was built first, and said "draft_vocab_size=40: choose 1..16", an argument nobody passed).
    make(kind, target, draft_vocab_size=40).save(tmp_path)
    with pytest.raises(ValueError, match="does not fit this target"):
        load_drafter(kind, tiny_llama(seed=0, vocab_size=16), path=tmp_path)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_a_random_target_loads_a_drafter_of_its_shape_with_a_warning(tmp_path, target, kind, monkeypatch):
    """SPECDEC_EDU_RANDOM_TARGET=1 (a GPU check, where the real target's weights cannot travel): a drafter trained on
    another model of the same shape loads, saying so; one of another shape is refused all the same."""
    make(kind, target).save(tmp_path)
    monkeypatch.setenv("SPECDEC_EDU_RANDOM_TARGET", "1")
    other = tiny_llama(seed=7)  # the same shape, other weights
    with pytest.warns(UserWarning, match="SPECDEC_EDU_RANDOM_TARGET=1 gave this target random weights"):
        drafter = load_drafter(kind, other, path=tmp_path)
    out = speculative_generate(other, drafter, PROMPTS[0][None], max_new_tokens=12, gamma=3)  # it runs, exactly
    assert out.sequences[0].tolist() == reference(other, PROMPTS[0], 12).tolist()
    with pytest.raises(ValueError, match="hidden size 64, this target has 32"):
        load_drafter(kind, tiny_llama(seed=7, hidden=32), path=tmp_path)
    monkeypatch.setenv("SPECDEC_EDU_RANDOM_TARGET", "0")  # the negative control: without the variable, refused
    with pytest.raises(ValueError, match="another model of the same shape"):
        load_drafter(kind, tiny_llama(seed=7), path=tmp_path)


@pytest.mark.embedded
@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_committed_drafters_are_bound_to_the_embedded_target(kind):
    """assets/<kind>/config.json holds the embedded target's fingerprint; a model with the same shape but
    other weights (the embedding rows rolled by one) is refused."""
    from specdec_edu.models.embedded import load_embedded_target

    target = load_embedded_target(device="cpu")
    assert "weights" in json.loads((feature_drafters.asset_dir(kind) / "config.json").read_text())["target"]
    drafter = load_drafter(kind, target)
    other = load_embedded_target(device="cpu")
    with torch.no_grad():
        other.get_input_embeddings().weight.copy_(other.get_input_embeddings().weight.roll(1, 0))
    with pytest.raises(ValueError, match="another model of the same shape"):
        drafter.check_target(other)


# ---- the training script --------------------------------------------------------------------------


def load_script():
    spec = importlib.util.spec_from_file_location("train_feature_drafters", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_smoke_runs_and_lowers_the_losses():
    """15 steps lower each drafter's loss on all 16 training sequences (one fixed batch, before and after);
    control: the same 15 steps at learning rate 0 (every batch, noise draw and mode switch, no update) must not
    pass the same criterion, so the drop comes from the updates and not from the loop's side effects."""
    results = load_script().smoke(seed=0, steps=15)
    control = load_script().smoke(seed=0, steps=15, lr=0.0)
    for kind in ("medusa", "eagle"):
        assert results[kind]["last_loss"] < results[kind]["first_loss"], kind
        assert not control[kind]["last_loss"] < control[kind]["first_loss"], kind


def test_a_target_that_changes_its_logits_after_the_head_is_refused():
    """Gemma 2 soft-caps its logits after lm_head. A feature drafter makes the loop compute p as lm_head(hidden), so
    p was not the target's: 1,500 sampled tokens were 0.89 in total variation from the target's distribution (a
    review helper measured it), while greedy output matched (soft-capping keeps the argmax). Such a target is now
    refused by name; the same model without soft-capping passes, and a standalone draft still runs with it."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    def gemma(softcap):
        torch.manual_seed(0)
        cfg = Gemma2Config(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=1, head_dim=16, max_position_embeddings=64, final_logit_softcapping=softcap,
                           initializer_range=0.5, sliding_window=64)
        return Gemma2ForCausalLM(cfg).eval().requires_grad_(False)

    prompt = torch.tensor([[1, 5, 7, 3]])
    capped = gemma(1.0)
    with pytest.raises(ValueError, match="changes its logits after lm_head.*use a draft model or PromptLookupDrafter"):
        speculative_generate(capped, MedusaDrafter(capped, n_heads=2), prompt, max_new_tokens=3, do_sample=True,
                             generator=torch.Generator().manual_seed(0), compile=False)
    plain = gemma(None)
    out = speculative_generate(plain, MedusaDrafter(plain, n_heads=2), prompt, max_new_tokens=3, compile=False)
    assert out.sequences[0].tolist() == reference(plain, prompt[0], 3).tolist()
    assert speculative_generate(capped, PromptLookupDrafter(), prompt, max_new_tokens=3, compile=False).stats.new_tokens == 3


def test_building_eagle_leaves_every_global_generator_alone(target, monkeypatch):
    """Its layer is initialised from a seed inside fork_rng(devices=[]), which restores the CPU generator only, but
    torch.manual_seed also reseeds every GPU's generator (and MPS's), for good: a GPU run sampling with
    generator=None repeated itself after each load_drafter('eagle'). (Spied on here: this CPU has no GPU.)"""
    seeded = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: seeded.append(("cuda", seed)))
    if hasattr(torch, "mps"):
        monkeypatch.setattr(torch.mps, "manual_seed", lambda seed: seeded.append(("mps", seed)))
    before = torch.random.get_rng_state()
    a, b = EagleDrafter(target, seed=7), EagleDrafter(target, seed=7)
    assert not seeded and torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(x, y) for x, y in zip(a.net.parameters(), b.net.parameters()))  # still seeded


def test_a_save_stopped_between_its_two_moves_is_refused_at_load(tmp_path, target, monkeypatch):
    """The weights moved into place, then the save stopped before the config did: the folder held new weights
    beside the old config, and load() took them without a word. The config now names its weights by SHA-256."""
    make("eagle", target, seed=1).save(tmp_path)
    load_drafter("eagle", target, tmp_path)  # whole: loads
    moves = []

    def second_move_fails(src, dst):
        if moves:
            raise KeyboardInterrupt
        moves.append(dst)
        os.rename(src, dst)

    monkeypatch.setattr(feature_drafters.os, "replace", second_move_fails)
    with pytest.raises(KeyboardInterrupt):
        make("eagle", target, seed=2).save(tmp_path)
    monkeypatch.undo()
    with pytest.raises(ValueError, match="not the ones its config.json was saved with.*save the drafter again"):
        load_drafter("eagle", target, tmp_path)
    make("eagle", target, seed=2).save(tmp_path)  # saved again: whole
    load_drafter("eagle", target, tmp_path)


@pytest.mark.parametrize("damage, problem", [
    (lambda text: text[: len(text) // 2], "is not JSON"),
    (lambda text: "[]", "lacks 'kind' \\(str\\), 'args' \\(dict\\), 'target' \\(dict\\)"),
    (lambda text: text.replace('"target"', '"trained_on"'), "lacks 'target' \\(dict\\)"),
    (lambda text: text.replace('"args": {', '"args": [{').replace("},\n  \"target", "}],\n  \"target"), "lacks 'args'"),
], ids=["truncated", "not an object", "a key renamed", "args not an object"])
def test_a_damaged_config_names_the_file_and_the_fix(tmp_path, target, damage, problem):
    """A truncated or hand-edited config.json failed with a bare JSONDecodeError or ``KeyError: 'target'``."""
    make("eagle", target, seed=1).save(tmp_path)
    config = tmp_path / "config.json"
    text = config.read_text()
    config.write_text(damage(text))
    assert config.read_text() != text
    with pytest.raises(ValueError, match=f"config.json {problem}.*train it:  python scripts/train_feature_drafters.py"):
        load_drafter("eagle", target, tmp_path)
    config.write_text(text)  # the control: the file as save() wrote it loads
    load_drafter("eagle", target, tmp_path)


def test_an_interrupted_save_leaves_the_saved_drafter_whole(tmp_path, target, monkeypatch):
    """Saving over a drafter wrote the new weights first, then the config: stopped in between, the folder held new
    weights beside the old config, and it loaded without an error. Now both are written aside and moved in."""
    make("eagle", target, seed=1).save(tmp_path)
    before = {f: (tmp_path / f).read_bytes() for f in ("model.safetensors", "config.json")}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(feature_drafters.json, "dumps", interrupted)
    with pytest.raises(KeyboardInterrupt):
        make("eagle", target, seed=2).save(tmp_path)
    assert {f: (tmp_path / f).read_bytes() for f in before} == before


class Float64OnlyOnTheHost(torch.overrides.TorchFunctionMode):
    """Apple's MPS rule, on the CPU: float64 is made only from a tensor that went through ``.cpu()`` first (MPS has
    no float64: ``.double()`` on an MPS tensor raises). Tensors made before the mode (the model's) are on the device;
    those ``.cpu()`` returns, or that are made from host tensors only, are on the host. A ``.double()`` or
    ``.to(torch.float64)`` of a device tensor raises here."""

    def __init__(self):
        super().__init__()
        self.on_host = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        to_float64 = func is torch.Tensor.double or (func is torch.Tensor.to and torch.float64 in (*args[1:], *kwargs.values()))
        if to_float64 and args[0].dtype != torch.float64 and id(args[0]) not in self.on_host:  # float64 is host-made
            raise TypeError("Cannot convert a MPS Tensor to float64 dtype (simulated)")
        out = func(*args, **kwargs)
        inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        if isinstance(out, torch.Tensor) and (func is torch.Tensor.cpu or all(id(a) in self.on_host for a in inputs)):
            self.on_host.add(id(out))  # from .cpu(), made here (on the host), or computed from host tensors only
        return out


def test_the_fingerprint_reads_float64_sums_on_the_host(target):
    """``target_fingerprint`` (every feature drafter's construction and load) summed its rows in float64 on the
    target's device, which raises on Apple's MPS; the sums go to the host anyway. Simulated MPS rule above; its control:
    a plain ``.double()`` of a model tensor is refused."""
    expected = feature_drafters.target_fingerprint(target)
    with Float64OnlyOnTheHost():
        assert feature_drafters.target_fingerprint(target) == expected
    with pytest.raises(TypeError, match="MPS"), Float64OnlyOnTheHost():
        target.lm_head.weight[:2].double()


# ---- pinned where hand mutations of feature_drafters.py went unseen by the suite ------------------


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_q_is_a_distribution_over_the_reduced_head(target, kind):
    """With ``draft_vocab_size=40`` (of the target's 64 ids), each q row is a distribution over exactly those 40 ids
    (the loop zero-pads the rest), and every drafted token is one of them."""
    drafter = make(kind, target, draft_vocab_size=40)
    context = PROMPTS[5]
    drafter.observe(features_of(target, context))
    tokens, q = drafter.propose(context, 3, lambda x: torch.softmax(x, -1), torch.Generator().manual_seed(0))
    assert q.shape == (3, 40) and (q >= 0).all() and (tokens < 40).all()
    torch.testing.assert_close(q.sum(-1), torch.ones(3))


@pytest.mark.parametrize("cls", [MedusaDrafter, EagleDrafter])
def test_a_reduced_head_wider_than_the_targets_is_refused(target, cls):
    with pytest.raises(ValueError, match="draft_vocab_size=100: choose 1..64"):
        cls(target, draft_vocab_size=100)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_features_for_too_many_positions_are_refused(target, kind):
    """The drafter needs the features of every position but the last: shown the last one too (the caller fed the whole
    context), it would pair features with the wrong tokens; it says so instead."""
    drafter = make(kind, target)
    context = PROMPTS[5]
    drafter.observe(features_of(target, torch.cat([context, context[-1:]])))  # len(context) features
    with pytest.raises(ValueError, match="len\\(context\\) - 1"):
        drafter.propose(context, 3, torch.softmax)


def test_reset_forgets_medusas_feature(target):
    """After a generation, ``reset`` leaves Medusa with no feature: a one-token prompt then has none, and drafts nothing
    (it drafted from the previous generation's last feature)."""
    drafter = make("medusa", target)
    speculative_generate(target, drafter, PROMPTS[5][None], max_new_tokens=5, gamma=3)
    drafter.reset()
    tokens, q = drafter.propose(PROMPTS[5][:1], 3, lambda x: torch.softmax(x, -1))
    assert len(tokens) == 0 and q.shape[0] == 0


def test_eagle_drafts_each_step_from_the_feature_it_predicted(target):
    """EAGLE's draft step i + 1 reads the pair (f̂ of step i, draft i): recomputed here with no cache, as one causal
    sequence of real features f_0 … f_{L−2} followed by the predicted ones, paired with x_1 … x_{L−1} and the drafts."""
    drafter = make("eagle", target, seed=5)
    context = PROMPTS[5]
    features = features_of(target, context)
    drafter.observe(features)
    logged = []
    tokens, _ = drafter.propose(context, 4, lambda x: (logged.append(x), torch.softmax(x, -1))[1],
                                torch.Generator().manual_seed(0))
    inputs, paired, expected = features, context[1:], []
    with torch.no_grad():
        for token in tokens:
            f_hat = drafter.net(inputs[None], drafter.embed(paired)[None])[0, -1]
            expected.append(drafter.head(f_hat))
            inputs, paired = torch.cat([inputs, f_hat[None]]), torch.cat([paired, token[None]])
    torch.testing.assert_close(torch.stack(logged), torch.stack(expected), atol=1e-5, rtol=1e-5)


def test_weights_missing_a_layer_are_refused_at_load(tmp_path, target):
    """A weights file that lacks one of the layer's tensors (written by another version of the drafter) must not load
    with that tensor left at its random initialisation: the drafter would run, exactly, at α ≈ 0, in silence."""
    make("eagle", target, seed=1).save(tmp_path)
    state = load_file(tmp_path / "model.safetensors")
    del state["fc.bias"]
    save_file(state, tmp_path / "model.safetensors")
    config = json.loads((tmp_path / "config.json").read_text())
    config["weights_sha256"] = hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match="fc.bias"):
        load_drafter("eagle", target, tmp_path)


def test_a_fingerprint_without_weights_still_compares_the_vocabulary(target):
    """A config saved before the weight checksum existed has the shape keys only: a target whose head has another
    number of rows (ids the drafter was never trained to propose, or lacks) is still refused, by that key."""
    from specdec_edu.models.feature_drafters import fingerprint_mismatch, target_fingerprint

    old = {key: value for key, value in target_fingerprint(target).items() if key != "weights"}
    assert fingerprint_mismatch(old, target_fingerprint(target)) is None
    assert fingerprint_mismatch(old, target_fingerprint(tiny_llama(seed=0, vocab_size=16))) == (
        "it was trained on a target with vocabulary size 64, this target has 16")


def test_save_writes_the_layers_in_the_dtype_asked(tmp_path, target):
    """``save(path, dtype)``: float16 by default (the committed drafters), float32 when asked, the weights kept
    bit for bit then."""
    drafter = make("medusa", target, n_heads=2)
    drafter.save(tmp_path / "half")
    drafter.save(tmp_path / "full", dtype=torch.float32)
    assert {w.dtype for w in load_file(tmp_path / "half" / "model.safetensors").values()} == {torch.float16}
    full = load_file(tmp_path / "full" / "model.safetensors")
    assert all(torch.equal(full[name], w) for name, w in drafter.net.state_dict().items())


def test_an_untrained_medusa_head_is_the_targets_own_head(target):
    """Medusa's blocks are residual and start at zero: untrained, every head's q is the target's own next-token
    distribution at the latest feature (training starts from there, not from a uniform guess)."""
    drafter = MedusaDrafter(target, n_heads=3)
    context = PROMPTS[5]
    features = features_of(target, context)
    drafter.observe(features)
    _, q = drafter.propose(context, 3, lambda x: torch.softmax(x, -1), torch.Generator().manual_seed(0))
    with torch.no_grad():
        own = torch.softmax(target.get_output_embeddings()(features[-1]), -1)
    torch.testing.assert_close(q, own.expand(3, -1))


# ---- the training functions (feature_training.py), pinned where hand mutations went unseen ---------


def corpus_of(lengths, prompt_lengths, n, d=4, k=3):
    """A Corpus of zeros with the given lengths (only the lengths matter to ``answer_mask`` and ``batch_of``)."""
    S = len(lengths)
    return feature_training.Corpus(torch.zeros(S, n, d, dtype=torch.float16), torch.zeros(S, n, dtype=torch.long),
                        torch.zeros(S, n, k, dtype=torch.int32), torch.zeros(S, n, k, dtype=torch.float16),
                        torch.tensor(lengths), torch.tensor(prompt_lengths))


def test_answer_mask_counts_exactly_the_answer_tokens_that_exist():
    """Position t + shift's p predicts x_{t+shift+1}: counted iff that token is in the answer (>= the prompt length)
    and exists (< the length). One position off either way counts a prompt token or a padding slot, or drops the
    first answer token, and every loss and agreement the training prints moves with it."""
    data = corpus_of([5, 3], [2, 1], n=5)
    idx = torch.arange(2)
    assert data.answer_mask(idx, 0).tolist() == [[False, True, True, True, False], [True, True, False, False, False]]
    assert data.answer_mask(idx, 1).tolist() == [[True, True, True, False], [True, False, False, False]]
    assert data.answer_mask(idx, 2).tolist() == [[True, True, False], [False, False, False]]


def test_batch_of_keeps_the_longest_sequence_whole():
    data = corpus_of([5, 3], [1, 1], n=7)
    features, tokens, top_ids, top_logp, n = feature_training.batch_of(data, torch.tensor([1, 0]), "cpu", torch.float32)
    assert n == 5 and features.shape == (2, 5, 4) and tokens.shape == (2, 5) and top_ids.shape == top_logp.shape == (2, 5, 3)


def test_batch_of_keeps_each_sequences_features_tokens_and_targets_together():
    """Training draws its sequences at random (and may draw one twice): row i of every output must be sequence
    idx[i]. On a corpus of zeros, indexing the tokens in sorted order, or the top-k by position, passed every test."""
    S, n, d, k = 3, 4, 2, 2
    seq = torch.arange(S)[:, None, None]  # every value of sequence s carries s
    data = feature_training.Corpus(
        (seq + torch.zeros(S, n, d)).half(), (seq[..., 0] + torch.zeros(S, n, dtype=torch.long)),
        (seq + torch.zeros(S, n, k)).int(), (seq + torch.zeros(S, n, k)).half(),
        torch.tensor([4, 2, 3]), torch.tensor([1, 1, 1]))
    idx = torch.tensor([2, 0, 2])
    features, tokens, top_ids, top_logp, m = feature_training.batch_of(data, idx, "cpu", torch.float32)
    assert m == 4
    for i, s in enumerate(idx.tolist()):
        assert (features[i] == s).all() and (tokens[i] == s).all() and (top_ids[i] == s).all() and (top_logp[i] == s).all()


def test_distillation_loss_renormalises_over_the_drafts_ids_and_skips_rows_without_any():
    """With a reduced head (V' = 4 here), the target's top-k is renormalised over the ids < V'; an id equal to V' is
    outside; a row whose top-k has no id < V' carries no signal: it is left out of the mean (not counted as 0) and
    gives no gradient (not NaN, which would poison every weight at the next step)."""
    logits = torch.randn(3, 4, generator=torch.Generator().manual_seed(0), requires_grad=True)
    top_ids = torch.tensor([[1, 4, 3], [2, 0, 9], [4, 5, 6]])
    top_logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -3.0, -1.0], [-0.1, -0.2, -0.3]])
    mask = torch.ones(3, dtype=torch.bool)
    log_q = logits.detach().log_softmax(-1)
    expected = []
    for row, ids in ((0, [1, 3]), (1, [2, 0])):
        p = top_logp[row, [list(top_ids[row]).index(i) for i in ids]].softmax(-1)
        expected.append(-(p * log_q[row, ids]).sum())
    loss = feature_training.distill_loss(logits, top_ids, top_logp, mask)
    torch.testing.assert_close(loss, torch.stack(expected).mean())
    loss.backward()
    assert torch.isfinite(logits.grad).all() and logits.grad[2].abs().sum() == 0


def test_top1_agreement_compares_with_the_targets_likeliest_token():
    logits = torch.tensor([[0.0, 5.0, 1.0], [3.0, 0.0, 1.0]])
    top_ids = torch.tensor([[1, 2], [2, 0]])  # row 0: argmax 1 = the target's top-1; row 1: argmax 0 is its second
    assert feature_training.top1_agreement(logits, top_ids, torch.tensor([True, True])) == 0.5
    assert feature_training.top1_agreement(logits, top_ids, torch.tensor([True, False])) == 1.0


def test_collected_features_stay_with_their_own_sequence():
    """``collect_features`` runs sequences sorted by length, in batches: each sequence's features, tokens and top-k
    land in its own row (in the caller's order), the same as a forward of that sequence alone."""
    target = tiny_llama(seed=0)
    rows = [(list(range(3, 9)), 2), (list(range(10, 13)), 1), (list(range(20, 25)), 3)]  # lengths 6, 3, 5: sorted 1, 2, 0
    data = feature_training.collect_features(target, rows, top_k=4, batch_size=2)
    assert data.lengths.tolist() == [6, 3, 5] and data.prompt_lengths.tolist() == [2, 1, 3]
    for i, (ids, _) in enumerate(rows):
        L = len(ids)
        with torch.no_grad():
            alone = target.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0]
            top = target.get_output_embeddings()(alone).log_softmax(-1).topk(4, -1)
        assert data.tokens[i, :L].tolist() == ids and not data.tokens[i, L:].any()
        torch.testing.assert_close(data.features[i, :L].float(), alone, atol=2e-3, rtol=2e-3)
        assert torch.equal(data.top_ids[i, :L], top.indices.int())


def test_token_data_reads_each_sequence_of_each_shard(tmp_path):
    """Shards hold their sequences back to back (``tokens``) with their ``lengths`` and ``prompt_lengths``; answers
    come before documentation text."""
    np.savez(tmp_path / "text_000.npz", tokens=np.array([7, 8], dtype=np.int32), lengths=np.array([2]),
             prompt_lengths=np.array([0]))
    np.savez(tmp_path / "answers_000.npz", tokens=np.array([1, 2, 3, 4, 5], dtype=np.int32), lengths=np.array([3, 2]),
             prompt_lengths=np.array([1, 1]))
    assert feature_training.load_token_data(tmp_path) == [([1, 2, 3], 1), ([4, 5], 1), ([7, 8], 0)]


def test_evaluation_covers_every_sequence_once():
    """Batches of 2 over 3 sequences: the last batch holds the one sequence left, not an index past the end."""
    seen = []

    def loss_fn(idx):
        seen.append(idx.tolist())
        return None, [float(len(idx))]

    three = feature_training.Corpus(*[torch.zeros(3, 1)] * 6)
    assert feature_training.evaluate_teacher_forced(None, loss_fn, three, batch_size=2) == [1.5]
    assert seen == [[0, 1], [2]]


def bigram_corpus(target, lengths, prompt_length=1):
    """The bigram target's own greedy text (x, x+1, …) of the given lengths, teacher-forced."""
    rows = [[(start + i) % V for i in range(n)] for start, n in zip((0, 5, 9, 14), lengths)]
    return feature_training.collect_features(target, [(row, prompt_length) for row in rows], top_k=4)


def test_the_perfect_eagle_has_no_regression_loss_on_any_pass_or_length():
    """The handmade, perfectly aligned EAGLE predicts f_{t+1} exactly: on sequences of different lengths (right-padded)
    its regression loss is ~0 on every pass of the training-time test, which feeds pass j+1 the predictions f̂_t at
    the positions they predict. Padding slots (features 0) must not count, and a pass fed its predictions one
    position off is not perfect."""
    target = bigram_target()
    data = bigram_corpus(target, [12, 7, 9, 4])
    loss, _ = feature_training.eagle_loss(handmade_eagle(target), data, torch.arange(len(data)), w_distill=0.0, unroll=3)
    assert float(loss.detach()) < 1e-5


def test_eagle_noise_is_symmetric_and_bounded():
    """``noise=a``: U(−a, a) on pass 1's input features, as in EAGLE-1: centred on the real features, never past a."""
    target = bigram_target()
    data = bigram_corpus(target, [12, 12])
    drafter = handmade_eagle(target)
    net, inputs = drafter.net, []

    def recording(features, embeds):
        inputs.append(features)
        return net(features, embeds)

    drafter.net = recording
    feature_training.eagle_loss(drafter, data, torch.arange(2), noise=0.5, generator=torch.Generator().manual_seed(0))
    offset = inputs[0] - data.features[:, :-1].float()
    assert offset.abs().max() <= 0.5 and offset.min() < -0.4 and offset.max() > 0.4 and abs(float(offset.mean())) < 0.05
    with pytest.raises(ValueError, match="noise=0.5 needs a generator"):  # never torch's global RNG, in silence
        feature_training.eagle_loss(drafter, data, torch.arange(2), noise=0.5)


def test_each_medusa_head_is_scored_on_its_own_answer_positions():
    """Head k on f_t is scored against p_{t+k} where x_{t+k+1} is an answer token. Prompt of 5 tokens, 6 in all: the
    one answer token x_5 is head 1's at t = 3 and head 2's at t = 2. The target's p_5 (which predicts a token past the
    end) is made wrong here: a head scored one position late meets it and loses its agreement."""
    target = bigram_target()
    data = bigram_corpus(target, [6], prompt_length=5)
    data.top_ids[0, 5] = (data.top_ids[0, 5] + 3) % V
    _, agree = feature_training.medusa_loss(handmade_medusa(target, n_heads=2), data, torch.arange(1))
    assert agree == [1.0, 1.0]


def test_the_second_pass_reads_each_prediction_at_the_position_it_predicts():
    """Training-time test: pass 1 maps (f_t, x_{t+1}) to f̂_{t+1}; pass 2 reads f̂_t at position t (f_0 stays real),
    as draft step 2 reads the layer's own output. Recorded on a random EAGLE (the handmade one ignores its features)."""
    target = tiny_llama(seed=0)
    data = feature_training.collect_features(target, [(list(range(3, 11)), 2), (list(range(20, 28)), 2)], top_k=4)
    drafter = make("eagle", target, seed=1)
    net, calls = drafter.net, []

    def recording(features, embeds):
        out = net(features, embeds)
        calls.append((features, out))
        return out

    drafter.net = recording
    feature_training.eagle_loss(drafter, data, torch.arange(2), unroll=2)
    (first_in, first_out), (second_in, _) = calls
    assert torch.equal(second_in[:, 0], first_in[:, 0]) and torch.equal(second_in[:, 1:], first_out[:, :-1])


def test_training_decays_the_learning_rate_along_a_cosine(monkeypatch):
    """``train``: AdamW at ``lr`` on step 0, then lr · (1 + cos(π · step / max_steps)) / 2 (half-way: lr / 2)."""
    target = bigram_target()
    data = bigram_corpus(target, [12, 12])
    drafter = handmade_medusa(target, n_heads=2)
    rates = []

    class RecordingAdamW(torch.optim.AdamW):
        def step(self, *args, **kwargs):
            rates.append(self.param_groups[0]["lr"])
            return super().step(*args, **kwargs)

    monkeypatch.setattr(torch.optim, "AdamW", RecordingAdamW)
    feature_training.train(drafter, lambda idx: feature_training.medusa_loss(drafter, data, idx), data, minutes=10,
                           lr=1e-3, batch_size=2, generator=torch.Generator().manual_seed(0), desc="test", max_steps=4)
    expected = [1e-3 * (1 + np.cos(np.pi * step / 4)) / 2 for step in range(4)]
    assert rates == pytest.approx(expected) and rates[2] == pytest.approx(5e-4)


def test_training_main_splits_trains_saves_and_resumes(monkeypatch, tmp_path, capsys):
    """train_feature_drafters.main on a tiny target (the embedded one and the token data stubbed out): a seeded
    held-out split (max(1, 10 %) of 20 sequences), both drafters trained --max-steps steps with the run's
    --draft-vocab-size / --heads / --noise / --unroll and saved with them; training.json records the run; the
    teacher features are cached and reused while the data has as many rows (collected again when it grows);
    --resume starts from the saved drafter (its own heads) and keeps what came before under "resumed_from"."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_edu.models import embedded

    torch.manual_seed(0)
    target = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                          initializer_range=0.2)).eval().requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    rows = [(torch.randint(32, (int(n),), generator=gen).tolist(), 4) for n in torch.randint(8, 14, (20,), generator=gen)]
    script = load_script()
    monkeypatch.setattr(embedded, "load_embedded_target", lambda device: target)
    monkeypatch.setattr(script, "load_token_data", lambda path: rows)
    seen = []
    real_eagle = script.eagle_loss
    monkeypatch.setattr(script, "eagle_loss", lambda *a, **kw: seen.append(kw) or real_eagle(*a, **kw))
    argv = ["--workdir", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--max-steps", "2", "--threads", "1",
            "--draft-vocab-size", "24", "--noise", "0.25", "--unroll", "2", "--held-out", "0.1", "--batch-size", "4",
            "--seed", "3"]
    script.main(argv + ["--heads", "2"])
    assert "corpus: 18 training sequences" in capsys.readouterr().out
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(3))
    answer_tokens = sum(len(rows[i][0]) - 4 for i in perm[2:].tolist())
    for kind, hyper in (("eagle", {"noise": 0.25, "unroll": 2}), ("medusa", {"heads": 2})):
        info = json.loads((tmp_path / "out" / kind / "training.json").read_text())
        assert info["steps"] == 2 and info["train_sequences"] == 18 and info["train_answer_tokens"] == answer_tokens
        assert {k: info[k] for k in ("draft_vocab_size", "lr", "batch_size", "seed")} == {
            "draft_vocab_size": 24, "lr": 1e-3, "batch_size": 4, "seed": 3}
        assert {k: info[k] for k in hyper} == hyper and "resumed_from" not in info
        drafter = (EagleDrafter if kind == "eagle" else MedusaDrafter).load(tmp_path / "out" / kind, target)
        assert drafter.width == 24 and (kind == "eagle" or drafter.n_heads == 2)
    assert {(kw.get("noise", 0.0), kw["unroll"]) for kw in seen} == {(0.25, 2), (0.0, 3)}  # training, validation
    assert torch.load(tmp_path / "work" / "corpus.pt", weights_only=False)["n_rows"] == 20
    monkeypatch.setattr(script, "collect_features", lambda *a, **kw: pytest.fail("the cached features were not used"))
    script.main(argv + ["--resume", "--drafters", "medusa", "--max-steps", "1", "--lr", "0.002"])
    info = json.loads((tmp_path / "out" / "medusa" / "training.json").read_text())
    assert info["steps"] == 1 and info["resumed_from"]["steps"] == 2 and info["resumed_from"]["lr"] == 1e-3
    assert info["heads"] == 2  # the resumed drafter's own heads, not --heads' default
    calls = []
    monkeypatch.setattr(script, "collect_features",
                        lambda *a, **kw: calls.append(1) or feature_training.collect_features(*a, **kw))
    rows.append(rows[0])  # the data grew: the cache no longer matches
    script.main(argv + ["--drafters", "medusa", "--max-steps", "1"])
    assert calls == [1] and "corpus: 19 training sequences" in capsys.readouterr().out


def test_training_smoke_fails_when_speculative_output_differs(monkeypatch):
    """smoke's exactness check can fail: a speculative run whose greedy output differs from the target's (its last
    token changed) stops the smoke with the assertion's message."""
    script = load_script()
    real = script.speculative_generate

    def one_token_off(*a, **kw):
        out = real(*a, **kw)
        out.sequences[0, -1] = (out.sequences[0, -1] + 1) % 32
        return out

    monkeypatch.setattr(script, "speculative_generate", one_token_off)
    with pytest.raises(AssertionError, match="greedy speculative output differs"):
        script.smoke(seed=0, steps=1)


def test_target_only_baseline_samples_at_the_speculative_runs_temperature():
    """evaluate's baseline: target_only_generate samples at T = 0.7 (the speculative run's temperature) unless told
    otherwise, with the same draws as autoregressive_generate at 0.7 from the same generator, and decodes greedily
    without do_sample."""
    from specdec_edu import autoregressive_generate

    script, target = load_script(), tiny_llama(seed=0)
    ids = torch.tensor([[5, 9, 13, 2]])
    run = lambda **kw: script.target_only_generate(target, ids, 12, None, **kw).sequences.tolist()  # noqa: E731
    ref = lambda t: autoregressive_generate(target, ids, max_new_tokens=12, do_sample=True, temperature=t,  # noqa: E731
                                            generator=torch.Generator().manual_seed(4)).sequences.tolist()
    assert run(do_sample=True, generator=torch.Generator().manual_seed(4)) == ref(0.7) != ref(1.0)
    assert run() == autoregressive_generate(target, ids, max_new_tokens=12).sequences.tolist()


def test_evaluate_reports_every_drafter_and_gamma_from_its_own_runs(monkeypatch, tmp_path, char_tokenizer):
    """train_feature_drafters.evaluate on a tiny chat target (two held-out prompts, 6 tokens): a row per drafter and
    γ, with α per draft position (γ entries), the speedup as the ratio of the run's tokens/s to target-only's, both of
    Leviathan's predictions from the row's own α, γ, c and verify cost, greedy identity with target-only, and a
    sampled run at the γ that measured fastest, with the EOS of ``<|im_end|>``. A run whose output differs (its last
    token changed) is reported as not identical: the flag can fail."""
    from specdec_edu import expected_speedup

    script = load_script()
    torch.manual_seed(0)
    target = tiny_llama(seed=0, vocab_size=len(char_tokenizer), hidden=32, max_positions=512)
    MedusaDrafter(target, n_heads=3).save(tmp_path / "medusa")
    eos = char_tokenizer.convert_tokens_to_ids("<|im_end|>")
    seen_eos = set()
    real = script.speculative_generate
    monkeypatch.setattr(script, "speculative_generate", lambda *a, **kw: seen_eos.add(kw["eos_token_id"]) or real(*a, **kw))

    def run():
        return script.evaluate(target, char_tokenizer, ["prompt-lookup", "medusa"], gammas=(2, 3), max_new_tokens=6,
                               n_prompts=2, seed=0, weights=tmp_path)

    report = run()
    assert (report["prompts"], report["max_new_tokens"], report["repeats"]) == (2, 6, 1) and seen_eos == {eos}
    for kind in ("prompt-lookup", "medusa"):
        rows = report["drafters"][kind]
        assert set(rows) == {2, 3, "sampled_T0.7"}
        for g in (2, 3):
            row = rows[g]
            assert row["identical"] is True and len(row["alpha_per_position"]) == g
            assert row["speedup"] == pytest.approx(row["tok_s"] / report["target_only_tok_s"])
            alpha = min(row["alpha"], 0.999)
            assert row["predicted"] == pytest.approx(expected_speedup(alpha, g, row["c"]))
            assert row["predicted_with_verify_cost"] == pytest.approx(expected_speedup(alpha, g, row["c"], row["verify_cost"]))
        sampled = rows["sampled_T0.7"]
        assert sampled["gamma"] == max((2, 3), key=lambda g: rows[g]["speedup"])
        assert sampled["speedup"] == pytest.approx(sampled["tok_s"]["speculative"] / sampled["tok_s"]["target_only"])

    def one_token_off(*a, **kw):
        out = real(*a, **kw)
        out.sequences[0, -1] = (out.sequences[0, -1] + 1) % len(char_tokenizer)
        return out

    monkeypatch.setattr(script, "speculative_generate", one_token_off)
    report = run()
    assert not any(report["drafters"][kind][g]["identical"] for kind in ("prompt-lookup", "medusa") for g in (2, 3))
