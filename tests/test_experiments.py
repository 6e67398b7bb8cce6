"""Tests for specdec_edu.course.experiments on tiny random models (fast)."""

import ast
import types
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import flip_wide_forwards, tiny_llama
from scipy.stats import chisquare

from specdec_edu import (
    EagleDrafter,
    autoregressive_generate,
    speculative_generate,
)
from specdec_edu.course import experiments
from specdec_edu.course.experiments import (
    DynamicGammaDrafter,
    MixtureDrafter,
    ReplayDrafter,
    early_exit_model,
    interleaved_benchmark,
    settled_reference,
    timed,
)
from specdec_edu.drafters import ModelDrafter, wants_features

PROMPT = torch.tensor([[1, 5, 9, 3, 7]])


def greedy_reference(target, n=24):
    return autoregressive_generate(target, PROMPT, max_new_tokens=n).sequences[0]


@pytest.mark.parametrize("noise", [0.0, 0.5, 1.0])
def test_mixture_drafter_greedy_output_is_the_target(target, noise):
    ref = greedy_reference(target)
    g = torch.Generator().manual_seed(0)
    out = speculative_generate(target, MixtureDrafter(target, noise), PROMPT, max_new_tokens=24, gamma=4, generator=g)
    assert torch.equal(out.sequences[0], ref)
    if noise == 0.0:
        assert out.stats.alpha == 1.0 and out.stats.rejected_rounds == 0


def test_mixture_drafter_q_is_a_distribution_with_the_dialled_mass(target):
    d = MixtureDrafter(target, 0.3)
    g = torch.Generator().manual_seed(0)
    to_probs = lambda logits: torch.softmax(logits.float(), -1)  # noqa: E731
    tokens, q = d.propose(PROMPT[0], 3, to_probs, g)
    assert tokens.shape == (3,) and q.shape == (3, target.config.vocab_size)
    assert torch.allclose(q.sum(-1), torch.ones(3))
    assert (q >= 0.3 / target.config.vocab_size - 1e-7).all()


def test_mixture_drafter_alpha_falls_with_noise(target):
    """Greedy p is one-hot, so α = 1 − noise + noise/V: 1, 0.41, 0.016. Seed 1, 40 new tokens
    (≈ 39 judged drafts: standard error of α ≈ 0.08), tolerance 0.2 ≈ 2.5 SE. Measured once
    over seeds 0..4: α(0.6) from 0.31 to 0.51, α(1) <= 0.026. The control: a drafter dialled wrong (noise 0.95
    run where 0.6 is claimed: α 0.03 here) misses the claimed α by more than the tolerance, with the same seed."""
    def alpha_of(noise):
        g = torch.Generator().manual_seed(1)
        return speculative_generate(target, MixtureDrafter(target, noise), PROMPT, max_new_tokens=40, gamma=4,
                                    generator=g).stats.alpha

    dial = lambda noise: 1 - noise + noise / target.config.vocab_size  # noqa: E731
    alphas = [alpha_of(noise) for noise in (0.0, 0.6, 1.0)]
    assert alphas == pytest.approx([dial(0.0), dial(0.6), dial(1.0)], abs=0.2)
    assert alphas[0] == 1.0 and alphas[0] > alphas[1] > alphas[2]
    assert alpha_of(0.95) != pytest.approx(dial(0.6), abs=0.2)


def test_replay_drafter_exact_and_alpha_close_to_dial(target):
    """Seed 2, 200 new tokens (≈ 192 judged drafts at noise 0.5: standard error of α ≈ 0.036),
    tolerance 0.12 ≈ 3.3 SE. Measured once over seeds 0..4: α from 0.48 to 0.52 (dial 0.508). The control: a
    drafter dialled wrong (noise 0.75 run where 0.5 is claimed: α 0.27 here) misses the claim, with the same seed."""
    ref = greedy_reference(target, n=200)
    vocab = target.config.vocab_size

    def run(noise):
        g = torch.Generator().manual_seed(2)
        return speculative_generate(target, ReplayDrafter(ref, noise, vocab), PROMPT, max_new_tokens=200, gamma=4,
                                    generator=g)

    for noise, expected in [(0.0, 1.0), (0.5, 1 - 0.5 + 0.5 / vocab)]:
        assert ReplayDrafter(ref, noise, vocab).alpha == pytest.approx(expected)
        out = run(noise)
        assert torch.equal(out.sequences[0], ref)
        assert out.stats.alpha == pytest.approx(expected, abs=0.12)
    assert run(0.75).stats.alpha != pytest.approx(1 - 0.5 + 0.5 / vocab, abs=0.12)


def draws_pvalues(drafter, context, q, n=2000, seed=0):
    """χ² p-value of each row of ``q [γ, V]`` against the tokens of ``n`` proposals of γ = len(q) after ``context``."""
    gen = torch.Generator().manual_seed(seed)
    draws = torch.stack([drafter.propose(context, len(q), None, gen)[0] for _ in range(n)])  # [n, γ]
    expected = n * q.double() / q.double().sum(-1, keepdim=True)
    return [chisquare(np.bincount(draws[:, i].numpy(), minlength=q.shape[1]), expected[i].numpy()).pvalue
            for i in range(len(q))]


def test_replay_drafter_q_is_the_dial_and_nothing_crosses_devices(target):
    """q [γ, V] is exactly (1 − noise)·one_hot(reference) + noise/V, and building it and drawing from it
    moves no tensor between devices: no .to / .cpu / copy_ (the loop's context is already on the host).
    The tokens are drawn from that q: 2,000 proposals (seed 0), χ² per row at level 1e-3 (every token
    expected ≥ 7 times); the same test rejects the draws of a drafter dialled at noise 0.35 instead of
    0.25. Measured once over seeds 0..4: smallest p-value 0.04; the 0.35 dial's largest 3e-9."""
    ref = greedy_reference(target, n=8)
    vocab, noise = target.config.vocab_size, 0.25
    d = ReplayDrafter(ref, noise, vocab, device="cpu")
    moves = []

    class CountMoves(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func in (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda, torch.Tensor.copy_):
                moves.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with CountMoves():
        tokens, q = d.propose(ref[:7], 3, None, torch.Generator().manual_seed(0))
    assert moves == []
    truth = ref[7:10]
    expected = torch.full((3, vocab), noise / vocab)
    expected[torch.arange(3), truth] = 1 - noise + noise / vocab
    assert torch.allclose(q, expected, rtol=0, atol=1e-7)
    assert tokens.shape == (3,) and tokens.device == q.device == d.device == torch.device("cpu")
    assert min(draws_pvalues(d, ref[:7], q)) > 1e-3  # drawn from q
    assert max(draws_pvalues(ReplayDrafter(ref, 0.35, vocab), ref[:7], q)) < 1e-3  # the control: another q


def test_replay_drafter_off_reference_proposes_nothing_and_says_so_once(target):
    """A context that left the reference (in 16 bit, a near-tie the verify pass flipped) gets no drafts for the rest
    of the generation, with one warning naming the token; a context back on the reference still gets none (the run's
    τ would otherwise mix two regimes); ``reset`` (a new generation) starts over. Before: nothing said so, and the
    dial's runs silently decoded target-only from there."""
    ref = greedy_reference(target, n=8)
    d = ReplayDrafter(ref, 0.0, target.config.vocab_size)
    off = ref[:6].clone()
    off[4] = (off[4] + 1) % target.config.vocab_size
    assert d.left_at is None and len(d.propose(ref[:4], 4)[0]) == 4
    with pytest.warns(UserWarning, match="left the reference at token 4.*target decodes the rest"):
        tokens, q = d.propose(off, 4)
    assert len(tokens) == 0 and q.shape == (0, target.config.vocab_size) and d.left_at == 4
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per generation
        assert len(d.propose(torch.cat([off, ref[6:7]]), 4)[0]) == 0 and len(d.propose(ref[:6], 4)[0]) == 0
    d.reset()
    assert d.left_at is None and len(d.propose(ref[:6], 2)[0]) == 2


def test_a_settled_reference_keeps_the_dial_drafting_where_the_verify_pass_breaks_a_near_tie(target):
    """In bf16 the H200's verify pass picked the other token of a near-tie at new token 7; the dial, replaying the
    one-token reference, proposed nothing from there (τ 1.12 at dial α 0.8). Here the target's forwards of more than one
    token pick the runner-up at new tokens 6 and 13 (``flip_wide_forwards``); 20 new tokens, γ 4, draws seeded 0.
    - Control: the one-token reference, replayed at noise 0.2, is left at new token 6 (a warning), and τ falls below 2.
    - ``settled_reference`` at the run's noise and seed returns the output such a run keeps, which leaves the one-token
      reference at new token 6; the run, seeded alike, never leaves it, and its output is it. At noise 0 (every draft
      right) that takes three runs: one per flipped token, and one that keeps its reference.
    - In float32 without flips the first run keeps the reference: it comes back unchanged.
    - ``max_replays=1`` is too few here: it says so and returns the last output."""
    n, vocab = PROMPT.shape[1], target.config.vocab_size
    plain = greedy_reference(target, n=20)
    settled, replays = settled_reference(target, plain, n, 4, noise=0.2)
    assert torch.equal(settled, plain) and replays == 1
    run = lambda reference, noise: speculative_generate(  # noqa: E731
        target, ReplayDrafter(reference, noise, vocab), PROMPT, max_new_tokens=20, gamma=4,
        generator=torch.Generator().manual_seed(0))
    handle = flip_wide_forwards(target, [n + 6 - 1, n + 13 - 1])  # the rows that predict new tokens 6 and 13
    try:
        reference = greedy_reference(target, n=20)  # one-token steps: untouched by the flips
        assert torch.equal(reference, plain)
        with pytest.warns(UserWarning, match=f"left the reference at token {n + 6}"):
            assert run(reference, 0.2).stats.tau < 2
        for noise in (0.2, 0.0):
            settled, replays = settled_reference(target, reference, n, 4, noise=noise)
            assert int((settled != reference).nonzero()[0]) == n + 6  # then another context: later tokens may differ
            with warnings.catch_warnings():
                warnings.filterwarnings("error", message="ReplayDrafter")
                out = run(settled, noise)
            assert torch.equal(out.sequences[0], settled) and out.stats.tau > 2
        assert replays == 3 and out.stats.tau == 5.0  # noise 0: four rounds of γ + 1 = 5 tokens
        with pytest.warns(UserWarning, match="all 1 runs left their reference"):
            assert settled_reference(target, reference, n, 4, max_replays=1)[1] == 1
    finally:
        handle.remove()


def test_dynamic_gamma_grows_on_full_acceptance_and_stays_exact(target, draft):
    ref = greedy_reference(target, n=30)
    perfect = DynamicGammaDrafter(ReplayDrafter(ref, 0.0, target.config.vocab_size), start=2, grow=2)
    out = speculative_generate(target, perfect, PROMPT, max_new_tokens=30, gamma=16)
    assert torch.equal(out.sequences[0], ref)
    assert perfect.history[:3] == [2, 4, 6]

    poor = DynamicGammaDrafter(ModelDrafter(draft), start=5)
    out = speculative_generate(target, poor, PROMPT, max_new_tokens=30, gamma=16)
    assert torch.equal(out.sequences[0], ref)
    assert min(poor.history) < 5  # rejections shrank it
    assert poor.history == [g for g in out.stats.drafted_per_round if g > 0]  # rounds with room 0 skip the drafter

    # a new prompt restarts the schedule
    speculative_generate(target, poor, torch.tensor([[4, 4]]), max_new_tokens=10, gamma=16)
    assert poor.history[0] == 5


class NextOf:
    """Drafts what follows ``ref`` after the context (right while the context follows ``ref``), with one-hot q."""

    def __init__(self, ref, vocab=50):
        self.ref, self.vocab = ref, vocab

    def propose(self, context, gamma, to_probs=None, generator=None):
        tokens = self.ref[len(context): len(context) + gamma]
        return tokens, torch.nn.functional.one_hot(tokens, self.vocab).float()


def test_dynamic_gamma_stops_at_the_ceiling_so_a_rejection_lowers_it():
    """Ceiling 4, every draft kept for four rounds, then one rejected: γ grows 2 → 4 and stays there, and the
    rejection takes it to 3. Before, the state kept growing (6, 8, 10) behind the ceiling, and the rounds after a
    rejection still asked for 4 while the state only walked back down towards it."""
    ref = torch.arange(100) % 50
    dyn = DynamicGammaDrafter(NextOf(ref), start=2, grow=2, shrink=1)
    context = ref[:5]
    for _ in range(5):  # a round that keeps every draft: the context grows by them and the target's next token
        tokens, _ = dyn.propose(context, 4, None)
        context = ref[: len(context) + len(tokens) + 1]
    assert dyn.history == [2, 4, 4, 4, 4] and dyn.gamma == 4
    tokens, _ = dyn.propose(context, 4, None)
    dyn.propose(torch.cat([context, (tokens[:1] + 1) % 50]), 4, None)  # its first draft rejected: the target's differs
    assert dyn.history[-1] == 3


def test_dynamic_gamma_history_is_the_gamma_asked_not_the_drafts_found(target):
    """A drafter that finds nothing (prompt lookup without a match) leaves γ as it was: the history shows that γ."""
    ref = greedy_reference(target, n=8)
    nothing = DynamicGammaDrafter(ReplayDrafter(ref, 0.0, target.config.vocab_size), start=3)
    with pytest.warns(UserWarning, match="left the reference at token 0"):  # a prompt that is not the reference's
        out = speculative_generate(target, nothing, torch.tensor([[2, 2, 2, 2, 2, 2]]), max_new_tokens=12, gamma=8)
    assert out.stats.drafted == 0 and out.stats.rounds == 12  # off the reference: every round drafted nothing
    assert nothing.history[:9] == [3] * 9  # the last rounds' γ is cut by the room left (3, 2, 1, then none asked)


def test_dynamic_gamma_never_drafts_more_than_the_rounds_gamma(target, draft):
    """Near the end the loop cuts γ to the room left (here 1 < min_gamma = 2): the wrapper must not ask for more.
    Before, it asked for min_gamma and the run failed ("returned 2 tokens but was asked for at most γ = 1")."""
    ref = autoregressive_generate(target, PROMPT, max_new_tokens=5).sequences[0]
    dyn = DynamicGammaDrafter(ModelDrafter(draft), start=3, min_gamma=2)
    out = speculative_generate(target, dyn, PROMPT, max_new_tokens=5, gamma=4)
    assert torch.equal(out.sequences[0], ref)
    assert dyn.history[-1] == 1  # the last round's room


def test_dynamic_gamma_and_mixture_pass_the_drafters_hooks_through(target):
    """check_target, observe (only where the wrapped drafter has it) and drafted_elsewhere reach the wrapped
    drafter. Before, a feature drafter inside DynamicGammaDrafter was never shown features (a misleading "has seen
    target features for 0 positions"), and a draft of another vocabulary got a generic error, not check_draft_head's."""
    ref = greedy_reference(target, n=12)
    eagle = DynamicGammaDrafter(EagleDrafter(target, seed=7), start=2)
    assert wants_features(eagle) and not wants_features(DynamicGammaDrafter(ModelDrafter(target)))
    assert torch.equal(speculative_generate(target, eagle, PROMPT, max_new_tokens=12, gamma=4).sequences[0], ref)
    wider = tiny_llama(seed=3, vocab_size=80)  # a head of 80 token ids for a 64-id target
    for wrapped in (DynamicGammaDrafter(ModelDrafter(wider)), MixtureDrafter(wider, 0.5)):
        with pytest.raises(ValueError, match="vocabulary mismatch: the draft's head produces 80"):
            speculative_generate(target, wrapped, PROMPT, max_new_tokens=4, gamma=2)
    mixture = MixtureDrafter(target, 0.5)
    mixture.propose(PROMPT[0], 3, lambda x: x.softmax(-1))
    mixture.drafted_elsewhere()  # its model drafter must not take the next context's tokens for its drafts
    assert mixture._inner.n_draft_cached == 0


def test_dynamic_gamma_told_drafted_elsewhere_forgets_its_drafts():
    """A round another drafter drafted says nothing about this one's γ: before, the wrapper compared its own last
    drafts with the other drafter's tokens (here equal: it grew γ, as if they were all accepted)."""
    class Same:  # drafts 7, 7, …: the other drafter below drafts the same tokens
        def propose(self, context, gamma, to_probs=None, generator=None):
            tokens = torch.full((gamma,), 7)
            return tokens, torch.nn.functional.one_hot(tokens, 8).float()

    dyn, context = DynamicGammaDrafter(Same(), start=2, grow=2), torch.tensor([1, 2, 3])
    dyn.propose(context, 8, None)
    dyn.drafted_elsewhere()
    dyn.propose(torch.cat([context, torch.tensor([7, 7, 5])]), 8, None)  # the other drafter's 7, 7, then the target's
    assert dyn.history == [2, 2]


def test_early_exit_model_shares_weights_and_matches_full_depth(target):
    n = target.config.num_hidden_layers
    full = early_exit_model(target, n)
    ids = PROMPT
    assert torch.allclose(full(ids).logits, target(ids).logits, atol=1e-5)
    shallow = early_exit_model(target, 1)
    assert shallow.lm_head.weight.data_ptr() == target.lm_head.weight.data_ptr()
    assert len(target.model.layers) == n  # the target is untouched
    out = speculative_generate(target, shallow, PROMPT, max_new_tokens=20, gamma=3)
    assert torch.equal(out.sequences[0], greedy_reference(target, n=20))
    with pytest.raises(ValueError):
        early_exit_model(target, n + 1)


def test_interleaved_benchmark_order_and_warmup():
    calls = []
    fns = {"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2}
    res = interleaved_benchmark(fns, repeats=2, warmup=1, progress=False)
    assert calls == ["a", "b"] * 3
    assert res == {"a": [1, 1], "b": [2, 2]}
    for repeats, warmup in ((0, 1), (2, -2)):  # returned empty lists before (a median of nothing failed later)
        with pytest.raises(ValueError, match="repeats >= 1"):
            interleaved_benchmark(fns, repeats=repeats, warmup=warmup, progress=False)


def test_timed_returns_the_result_and_the_seconds_between_two_clock_readings(monkeypatch):
    readings = iter([1.0, 3.5])
    monkeypatch.setattr(experiments, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    assert timed(lambda: "out", "cpu") == ("out", 2.5)


def test_timed_names_its_device_everywhere():
    """``timed`` synced the CPU unless told otherwise, so a GPU's work was timed by when it was queued:
    scripts/suffix_eval.py timed its five runs that way. Now the device is required, and every call names one."""
    with pytest.raises(TypeError):
        timed(lambda: "out")
    root = Path(__file__).resolve().parents[1]
    short = []
    for path in [*(root / "specdec_edu").rglob("*.py"), *(root / "scripts").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "timed":
                if len(node.args) + len(node.keywords) < 2:
                    short.append(f"{path.name}:{node.lineno}")
    assert not short, short


def test_course_seed_is_the_default_unless_the_environment_overrides_it(monkeypatch):
    monkeypatch.delenv("SPECDEC_EDU_SEED", raising=False)
    assert experiments.course_seed(0) == 0 and experiments.course_seed(7) == 7
    monkeypatch.setenv("SPECDEC_EDU_SEED", " 3 ")
    assert experiments.course_seed(0) == 3
    monkeypatch.setenv("SPECDEC_EDU_SEED", "")
    assert experiments.course_seed(5) == 5
    monkeypatch.setenv("SPECDEC_EDU_SEED", "one")
    with pytest.raises(ValueError, match="SPECDEC_EDU_SEED='one' is not an integer"):
        experiments.course_seed(0)


@pytest.mark.parametrize(("value", "quick"), [(None, False), ("", False), ("0", False), ("1", True), (" 1 ", True)])
def test_quick_run_reads_the_variable_the_test_suite_sets(monkeypatch, value, quick):
    if value is None:
        monkeypatch.delenv("SPECDEC_EDU_QUICK", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_EDU_QUICK", value)
    assert experiments.quick_run() is quick


def test_quick_run_refuses_a_value_it_would_have_to_guess(monkeypatch):
    monkeypatch.setenv("SPECDEC_EDU_QUICK", "yes")
    with pytest.raises(ValueError, match="SPECDEC_EDU_QUICK='yes': set it to 1"):
        experiments.quick_run()


def test_replay_drafter_pays_the_draft_the_run_would_use(target, monkeypatch):
    """A bare cost model becomes the ModelDrafter ``speculative_generate`` would make of it: eager where the run
    is eager (the CPU default), compiled where the run compiles (``SPECDEC_EDU_COMPILE=1``, as on a GPU), so the
    dial's c is the real run's c. The output stays the target's either way."""
    from conftest import tiny_llama

    from specdec_edu import kv

    ref = greedy_reference(target, n=12)
    cost_model = tiny_llama(seed=3)
    eager = ReplayDrafter(ref, 0.5, target.config.vocab_size, cost_model=cost_model)
    assert isinstance(eager._cost, ModelDrafter) and eager._cost.static is None
    monkeypatch.setenv("SPECDEC_EDU_COMPILE", "1")
    compiled = ReplayDrafter(ref, 0.5, target.config.vocab_size, cost_model=cost_model,
                             compile_options={"backend": "aot_eager"})
    assert isinstance(compiled._cost.static, kv.StaticKV) and compiled._cost.static.widths
    out = speculative_generate(target, compiled, PROMPT, max_new_tokens=12, gamma=4, compile=False,
                               generator=torch.Generator().manual_seed(0))
    assert torch.equal(out.sequences[0], ref)


def test_the_cost_models_draws_leave_the_global_rng_alone(target):
    """The cost model drafts (and draws) to pay its cost; those draws come from the drafter's own generator. Before,
    they came from the global RNG: a dial run moved ``torch.manual_seed``'s stream. The control: the dial's own draw
    without a generator does move it, so the comparison can see a move."""
    from conftest import tiny_llama

    ref = greedy_reference(target, n=12)
    drafter = ReplayDrafter(ref, 0.5, target.config.vocab_size, cost_model=tiny_llama(seed=3))
    to_probs = lambda logits: torch.softmax(logits, -1)  # noqa: E731

    def moves_global_rng(generator):
        torch.manual_seed(0)
        before = torch.get_rng_state()
        drafter.reset()
        drafter.propose(ref[:5].cpu(), 4, to_probs, generator)
        return not torch.equal(before, torch.get_rng_state())

    assert not moves_global_rng(torch.Generator().manual_seed(1))
    assert moves_global_rng(None)  # the control


def test_dynamic_gamma_shrinks_after_any_rejection_and_restarts_on_any_new_prompt():
    """γ grows only when *every* draft was kept: a round whose second draft was rejected shrinks it. A context that
    does not extend the last one is a new generation even when it is longer (a new, longer prompt): the schedule
    starts over."""
    ref = torch.arange(100) % 50
    dyn = DynamicGammaDrafter(NextOf(ref), start=3, grow=2, shrink=1)
    context = ref[:5]
    tokens, _ = dyn.propose(context, 8, None)  # drafts ref[5:8]; the target keeps the first, rejects the second
    context = torch.cat([ref[:6], (ref[6:7] + 1) % 50])
    dyn.propose(context, 8, None)
    assert dyn.history == [3, 2]
    dyn.propose(torch.arange(20) % 7 + 1, 8, None)  # longer than the last context, but not an extension of it
    assert dyn.history == [3] and dyn.gamma == 3


def test_replay_drafter_pays_for_the_tokens_it_drafts_not_the_gamma_asked(target, monkeypatch):
    """Two reference tokens left, γ = 4: the simulated cost sleeps for 2 tokens, and a cost drafter is asked for 2,
    as the real drafter would be (the loop cuts γ to the room left; a drafter asked for more pays for drafts the run
    never judges, and c comes out too high)."""
    ref = greedy_reference(target, n=4)
    slept, asked = [], []
    monkeypatch.setattr(experiments, "time", types.SimpleNamespace(sleep=slept.append))

    class Cost:  # any drafter (not a model): its propose is what the dial pays
        def propose(self, context, gamma, to_probs, generator=None):
            asked.append(gamma)

        def reset(self):
            asked.append("reset")

    d = ReplayDrafter(ref, 0.5, target.config.vocab_size, seconds_per_token=0.01, cost_model=Cost())
    tokens, q = d.propose(ref[:-2], 4, None, torch.Generator().manual_seed(0))
    assert len(tokens) == len(q) == 2
    assert slept == [pytest.approx(0.02)] and asked == [2]
    d.reset()  # a new generation: the cost drafter starts over too, as the real one does (its prompt is not cached)
    assert asked == [2, "reset"]


def test_settled_reference_runs_the_dial_as_it_is_told(target, monkeypatch):
    """The run that settles the reference draws from a generator seeded ``seed``, drafts through ``wrap(dial)`` and
    passes ``generate_kwargs`` on: the measured runs repeat it, and a reference settled on another run's draws,
    drafter or path can still be left by them."""
    seen = []

    def spy(target_, drafter, prompt, **kwargs):
        seen.append((type(drafter), kwargs["generator"].initial_seed(), kwargs.get("compile")))
        return speculative_generate(target_, drafter, prompt, **kwargs)

    monkeypatch.setattr(experiments, "speculative_generate", spy)
    plain = greedy_reference(target, n=10)
    wrap = lambda dial: DynamicGammaDrafter(dial, start=2)  # noqa: E731
    settled, replays = settled_reference(target, plain, PROMPT.shape[1], 4, noise=0.2, seed=3, wrap=wrap, compile=False,
                                         max_replays=1)  # float32: one run keeps its reference
    assert torch.equal(settled, plain) and replays == 1
    assert seen == [(DynamicGammaDrafter, 3, False)]


def test_early_exit_model_keeps_exactly_its_first_layers(target):
    """``early_exit_model(target, 1)`` holds the target's first decoder layer and no other, and its output is that
    layer's, read through the final norm and head; 0 layers is no model."""
    shallow = early_exit_model(target, 1)
    assert list(shallow.model.layers) == [target.model.layers[0]] and shallow.config.num_hidden_layers == 1
    with torch.no_grad():
        hidden = target(PROMPT, output_hidden_states=True).hidden_states[1]  # after layer 0
        assert torch.allclose(shallow(PROMPT).logits, target.lm_head(target.model.norm(hidden)), atol=1e-5)
    with pytest.raises(ValueError, match="must lie in 1"):
        early_exit_model(target, 0)


def test_timed_syncs_the_device_before_each_clock_reading(monkeypatch):
    """sync, clock, work, sync, clock: without the second sync a GPU's work is timed by when it was queued."""
    events = []
    monkeypatch.setattr(experiments, "sync", lambda device: events.append("sync"))
    monkeypatch.setattr(experiments, "time", types.SimpleNamespace(perf_counter=lambda: events.append("clock") or 0.0))
    timed(lambda: events.append("work"), "cpu")
    assert events == ["sync", "clock", "work", "sync", "clock"]


def test_early_exit_model_keeps_the_layer_types_of_the_layers_it_keeps():
    """A hybrid model (layer 0 full attention, layer 1 sliding) cut to one layer has one full-attention layer: its
    config says so, and nothing takes it for a sliding-window model."""
    from test_sliding_window import hybrid_qwen2

    from specdec_edu.models.shapes import sliding_window

    shallow = early_exit_model(hybrid_qwen2(seed=0), 1)
    assert shallow.config.layer_types == ["full_attention"]
    assert sliding_window(shallow) is None


@pytest.mark.parametrize("make", [lambda target, noise: MixtureDrafter(target, noise),
                                  lambda target, noise: ReplayDrafter(torch.tensor([1, 2]), noise, target.config.vocab_size)])
def test_dial_drafters_refuse_a_noise_outside_0_1(target, make):
    """noise is a mixing weight: 1.5 would give q negative entries, -0.5 an α above 1."""
    for noise in (-0.5, 1.5):
        with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
            make(target, noise)
