import copy
import itertools
import types

import pytest
import torch

from specdec_edu import speculative_generate
from specdec_edu.course import measure
from specdec_edu.course.measure import forward_seconds, latency_curve, parameter_bytes
from specdec_edu.course.viz import legend, mark_tokens, token_pieces, tokens_html


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


@pytest.fixture
def forward_calls(monkeypatch):
    """(tokens fed, cache length before) of every ``kv.forward_cached`` the measuring helpers make."""
    calls = []
    real_forward = measure.kv.forward_cached

    def spy(model, input_ids, cache, **kw):
        calls.append((input_ids.shape[1], measure.kv.cache_length(cache)))
        return real_forward(model, input_ids, cache, **kw)

    monkeypatch.setattr(measure.kv, "forward_cached", spy)
    return calls


def test_forward_seconds_times_every_repeat_at_the_same_context_length(target, forward_calls, monkeypatch):
    """The cache is cropped back after each timed forward: every one appends n_new to context_length."""
    calls = forward_calls
    # the clock is read before and after each timed forward (not around the warm-up): the repeats last 3, 1 and 10 s
    readings = iter([0.0, 3.0, 0.0, 1.0, 0.0, 10.0])
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    seconds = forward_seconds(target, 3, context_length=8, repeats=3, warmup=1)
    assert seconds == 3.0  # the median of the repeats (their mean is 4.67)
    assert calls == [(8, 0)] + [(3, 8)] * 4  # the prefill, then warm-up + 3 repeats, each on 8 cached positions


@pytest.fixture
def reduced_head_draft():
    """A draft whose config names a reduced head, as the embedded draft's does (``draft_vocab_size``)."""
    from conftest import tiny_llama

    draft = tiny_llama(seed=1)
    draft.config.draft_vocab_size = 32
    return draft


@pytest.mark.parametrize("compile", [False, True])
def test_a_draft_is_timed_on_the_step_its_generation_takes(target, reduced_head_draft, monkeypatch, compile):
    """``forward_seconds(draft, 1, role="draft")``, the numerator of c in notebooks 00, 01, 06, 08 and gpu-report,
    times the module a generation's drafter forwards: the bare decoder of a reduced-head draft, with no logits (its
    head's first rows are applied by the drafter). It timed the whole LM before (a second compiled cache, and 2.4× the
    head weights for the embedded draft: c came out about twice the run's on the CPU)."""
    draft, options = reduced_head_draft, {"backend": "eager"} if compile else None
    seen = []
    real_forward = measure.kv.forward_cached

    def spy(model, input_ids, cache, **kw):
        seen.append(model)
        return real_forward(model, input_ids, cache, **kw)

    monkeypatch.setattr(measure.kv, "forward_cached", spy)
    speculative_generate(target, draft, torch.tensor([[1, 2, 3]]), max_new_tokens=6, gamma=2, compile=compile,
                         compile_options=options)
    in_generation = {id(m) for m in seen if m is not target}
    seen.clear()
    assert forward_seconds(draft, 1, context_length=8, repeats=2, role="draft", compile=compile,
                           compile_options=options) > 0
    assert {id(m) for m in seen} == in_generation == {id(draft.get_decoder())}


def test_a_batch_is_timed_on_the_shapes_and_the_module_of_batched_generation(target, reduced_head_draft, monkeypatch):
    """``forward_seconds(model, n, batch=b)`` feeds ``[b, n]``, as batched generation does. Notebook 09's forward-time
    model timed batch b as one row of b tokens, with the draft's whole LM head: about twice the embedded draft's
    batched step (7.2 against 3.7 ms at b = 1 on the course's CPU)."""
    draft, seen = reduced_head_draft, []
    real_forward = measure.kv.forward_cached

    def spy(model, input_ids, cache, **kw):
        seen.append((id(model), tuple(input_ids.shape), measure.kv.cache_length(cache)))
        return real_forward(model, input_ids, cache, **kw)

    monkeypatch.setattr(measure.kv, "forward_cached", spy)
    speculative_generate(target, draft, torch.tensor([[1, 2, 3], [4, 5, 6]]), max_new_tokens=4, gamma=2)
    drafting = {(m, shape) for m, shape, _ in seen if m != id(target) and shape[1] == 1}
    assert drafting == {(id(draft.get_decoder()), (2, 1))}  # the generation's draft step: the decoder, [B, 1]
    seen.clear()
    assert forward_seconds(draft, 1, context_length=8, repeats=2, role="draft", batch=2) > 0
    assert {(m, shape) for m, shape, _ in seen} == {(id(draft.get_decoder()), (2, 8)), (id(draft.get_decoder()), (2, 1))}
    assert [length for *_, length in seen] == [0] + [8] * 3  # the prefill, then warm-up + 2 repeats on 8 positions
    seen.clear()
    assert forward_seconds(target, 3, context_length=8, repeats=2, batch=4) > 0
    assert seen == [(id(target), (4, 8), 0)] + [(id(target), (4, 3), 8)] * 3
    with pytest.raises(ValueError, match="batched generation runs eager.*compile=False"):
        forward_seconds(target, 1, batch=4, compile=True)


def slow_spell_clock(monkeypatch, spell=range(2, 5)):
    """A fake forward that takes n ms on a fake clock, with a slow spell: calls 2–4 (counted from 1, warm-ups
    included) take 50 ms more, as a neighbour's burst on a shared machine would. Returns the calls' widths."""
    clock, calls = [0.0], []

    def appending(model, context_length, max_new, *args, **kwargs):
        def forward(n):
            calls.append(n)
            clock[0] += (n + (50 if len(calls) in spell else 0)) / 1e3
        return forward

    monkeypatch.setattr(measure, "_appending_forward", appending)
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    return calls


def test_latency_curve_takes_the_widths_in_turns(target, monkeypatch):
    """The curve's keys are the requested ns, in order; each repeat times every n once (after one warm-up of each),
    so a spell shorter than a round lands on one repeat of one or two ns, and every median is the n ms. The control,
    the same clock timed one width after another (``forward_seconds`` per n, as the curve was timed before): the
    spell covers all three repeats of the first width, and its point comes out 50 ms high."""
    calls = slow_spell_clock(monkeypatch)
    curve = latency_curve(target, ns=(4, 1, 16), context_length=8, repeats=3, progress=False)
    assert list(curve) == [4, 1, 16]
    assert curve == pytest.approx({4: 4e-3, 1: 1e-3, 16: 16e-3})
    assert calls == [4, 1, 16] * 4  # a warm-up round, then 3 timed rounds

    slow_spell_clock(monkeypatch)
    one_after_another = {n: forward_seconds(target, n, context_length=8, repeats=3) for n in (4, 1, 16)}
    assert one_after_another[4] == pytest.approx(54e-3) and one_after_another[1] == pytest.approx(1e-3)


def test_parameter_bytes_is_a_hand_count(target):
    """tiny_llama: vocab 64, hidden 64, 2 layers, MLP 128, 4 heads of 16, 2 KV heads (K, V: 32 wide), untied."""
    per_layer = (64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128 + 2 * 64  # attention, MLP, two RMSNorms
    n_params = 2 * per_layer + 64 * 64 + 64 * 64 + 64  # layers, embedding, LM head, final norm
    assert parameter_bytes(target) == 4 * n_params  # float32
    assert parameter_bytes(copy.deepcopy(target).to(torch.bfloat16)) == 2 * n_params
    # every course pair ties its LM head to the embedding: counted once (twice made the embedded target's floor 21 %
    # too high, and no test saw it: the tiny models here are untied)
    tied = copy.deepcopy(target)
    tied.lm_head.weight = tied.get_input_embeddings().weight
    assert parameter_bytes(tied) == 4 * (n_params - 64 * 64)


def test_token_rendering(target, close_draft):
    out = speculative_generate(target, close_draft, torch.tensor([[1, 2, 3]]), max_new_tokens=12, gamma=3)
    html = tokens_html(CharTokenizer(), out)
    assert html.count("<span title=") == 12
    pieces = token_pieces(CharTokenizer(), out.row(0).tolist())
    assert "".join(pieces) == CharTokenizer().decode(out.row(0).tolist())
    plain = mark_tokens(pieces, out.token_sources[0], color=False)
    assert ("[" in plain) == ("accepted" in out.token_sources[0])
    assert "\033[" in mark_tokens(pieces, out.token_sources[0], color=True) and "\033[" in legend(True)


def test_feature_drafter_diagram():
    import matplotlib

    matplotlib.use("Agg")
    from specdec_edu.course.viz import draw_feature_drafters

    fig = draw_feature_drafters()
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == 2 and titles[0].startswith("Medusa") and titles[1].startswith("EAGLE")


def test_kv_crop_picture_counts_cells_and_refuses_bad_input():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pytest

    from specdec_edu.course.viz import draw_kv_crop, kv_crop_rows

    rows = kv_crop_rows(prompt_len=10, gamma=4, n_accepted=1)
    assert [rows[m]["cached"] for m in ("before", "verified", "cropped")] == [9, 14, 11]
    # only the first disagreement is judged and rejected; the drafts after it are never judged
    assert rows["verified"]["cells"][10:] == ["accepted", "rejected", "unjudged", "unjudged", "corrected"]
    assert rows["cropped"]["cells"][10:] == ["accepted", "corrected"]
    assert kv_crop_rows(3, 2, 2)["cropped"]["cells"][-1] == "bonus"

    fig = draw_kv_crop(10, 4, 1, max_context_cells=4)
    gids = [p.get_gid() for p in fig.axes[0].patches]
    count = lambda prefix: sum(g.startswith(prefix) for g in gids)
    assert count("before:pending") == 4 and count("before:context:not cached") == 1
    assert count("verified:accepted:cached") == 1 and count("verified:rejected:cached") == 1
    assert count("verified:unjudged:cached") == 2 and count("verified:corrected:not cached") == 1
    assert count("cropped:rejected") == 0 and count("cropped:unjudged") == 0
    assert kv_crop_rows(3, 2, 1)["verified"]["cells"][3:] == ["accepted", "rejected", "corrected"]  # none left unjudged
    assert count("cropped:accepted:cached") == 1 and count("cropped:context") == 4  # 6 context cells hidden
    plt.close(fig)

    for bad, message in [((5, 4, 5), "n_accepted=5"), ((5, 0, 0), "gamma=0"), ((0, 4, 1), "prompt_len=0"),
                         ((5, 4, -1), "n_accepted=-1")]:
        with pytest.raises(ValueError, match=message):
            draw_kv_crop(*bad)
    with pytest.raises(TypeError, match="gamma must be an int"):
        draw_kv_crop(5, 2.0, 1)


def test_read_bandwidth_is_bytes_read_once_over_the_median_time(monkeypatch):
    """A read-only reduction moves each byte once: 1 MiB in a median of 2 s (after a warm-up) is 2**19 bytes/s."""
    readings = iter([0.0, 9.0, 0.0, 2.0, 0.0, 1.0, 0.0, 4.0])  # warm-up 9 s, then repeats of 2, 1 and 4 s
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    assert measure.read_bandwidth("cpu", n_bytes=2**20, repeats=3) == 2**20 / 2


# --- VerifyCost: the verify-cost curve, calibrated between the runs ---------------------------------------------

class FakeMachine:
    """A forward that logs its n and advances a fake clock by n × the machine's current speed (no real time);
    after each forward the speed changes by ``drift``."""

    def __init__(self):
        self.now, self.speed, self.drift, self.log = 0.0, 1.0, 0.0, []

    def forward(self, n):
        self.log.append(n)
        self.now += n * self.speed
        self.speed += self.drift

    def clock(self):
        return self.now


def test_verify_cost_sweeps_time_t1_around_every_sweep_and_warm_up_first():
    from specdec_edu.course.measure import VerifyCost

    machine = FakeMachine()
    cost = VerifyCost.from_forward(machine.forward, [3, 2, 1], timer=machine.clock)
    assert machine.log == [1, 2, 3], "one untimed warm-up forward per n, when made"
    for _ in range(3):
        cost.sweep()
    assert machine.log[3:] == [1, 2, 3, 1] * 3, "each sweep: t(1), every other n, t(1) again"
    assert cost.ratios() == {1: 1.0, 2: 2.0, 3: 3.0}


def test_verify_cost_ratios_survive_a_machine_that_changes_speed_between_sweeps():
    """Each sweep divides by its own t(1): a later t(n) over an earlier t(1), as a curve timed before the runs
    divides, would be inflated by the change of speed (here 4 × 1.5 / 1 = 6 for n = 4)."""
    from specdec_edu.course.measure import VerifyCost

    machine = FakeMachine()
    cost = VerifyCost.from_forward(machine.forward, range(1, 5), timer=machine.clock)
    for speed in (1.0, 1.5, 0.7, 9.0):
        machine.speed = speed
        cost.sweep()
    assert all(sweep == pytest.approx({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}) for sweep in cost.sweeps)
    assert cost.ratios() == pytest.approx({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0})


def test_verify_cost_divides_by_the_mean_of_the_sweeps_two_t1_when_speed_drifts_inside_a_sweep():
    """The machine slows by 0.5 per forward (t(1) = 1, then t(2) = 2 × 1.5, then t(1) = 2): the sweep's mean t(1)
    is the speed t(2) ran at, so the ratio is exactly 2; the opening t(1) alone would give 3, the closing one 1.5."""
    from specdec_edu.course.measure import VerifyCost

    machine = FakeMachine()
    cost = VerifyCost.from_forward(machine.forward, [1, 2], timer=machine.clock)
    machine.drift = 0.5  # from the first timed forward on (the warm-up ran at speed 1)
    for _ in range(3):
        cost.sweep()
    assert all(sweep == pytest.approx({1: 1.0, 2: 2.0}) for sweep in cost.sweeps)


def test_verify_cost_needs_three_sweeps():
    from specdec_edu.course.measure import VerifyCost

    machine = FakeMachine()
    cost = VerifyCost.from_forward(machine.forward, [1, 5], timer=machine.clock)
    cost.sweep()
    cost.sweep()
    with pytest.raises(RuntimeError, match="at least 3"):
        cost.ratios()


def test_verify_cost_times_real_forwards_at_the_same_context_length(target, forward_calls):
    """On a model: each sweep's forwards append n tokens to the same 16-token context (the cache is cropped back)."""
    from specdec_edu.course.measure import VerifyCost

    calls = forward_calls
    cost = VerifyCost(target, [1, 3], context_length=16)
    cost.sweep()
    assert calls == [(16, 0), (1, 16), (3, 16), (1, 16), (3, 16), (1, 16)]
    assert set(cost.sweeps[0]) == {1, 3} and cost.sweeps[0][1] == 1.0


def test_measured_verify_cost_holds_on_a_machine_that_slows_down_while_it_measures(monkeypatch):
    """A forward that takes n × speed units on a fake clock, the machine slowing by half a unit per forward.
    Interleaved sweeps (measured_verify_cost, what bench and gpu-report use) give t(2)/t(1) = 2 exactly; two medians
    timed one after the other (forward_seconds(2) / forward_seconds(1), what they used) give 0.91 here: the negative
    control. (It slept for real before, and a loaded machine's late wake-ups moved the ratio to 1.79.)"""
    machine = types.SimpleNamespace(speed=1.0, now=0.0)

    def slowing_forward(n):
        machine.now += n * machine.speed
        machine.speed += 0.5

    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: machine.now))
    monkeypatch.setattr(measure, "_appending_forward", lambda *args, **kwargs: slowing_forward)
    model = types.SimpleNamespace(device=torch.device("cpu"))
    assert measure.measured_verify_cost(model, 2) == pytest.approx(2.0)
    machine.speed = 1.0
    two_medians = measure.forward_seconds(model, 2) / measure.forward_seconds(model, 1)
    assert two_medians == pytest.approx(5 / 5.5)  # medians of 2 × (1.5 … 3.5) and of 4.5 … 6.5


def test_verify_cost_warms_up_and_reports_t1_when_not_asked_for_it(target, forward_calls):
    """``ns`` without 1: t(1) is the denominator of every ratio, so it is warmed up like the others (an untimed first
    forward of width 1) and reported as 1.0, as ``ns`` with 1 would."""
    from specdec_edu.course.measure import VerifyCost

    cost = VerifyCost(target, [3], context_length=16)
    assert forward_calls == [(16, 0), (1, 16), (3, 16)]  # the prefill, then one warm-up forward per n, 1 included
    for _ in range(3):
        cost.sweep()
    assert set(cost.ratios()) == {1, 3} and cost.ratios()[1] == 1.0


def test_verify_cost_ratios_are_the_median_so_one_stalled_sweep_does_not_move_them():
    """Three sweeps, the second with a 10-unit stall inside its t(2): its ratio is 12, the others' 2. The median is 2;
    a mean (5.33) would carry the stall into every prediction made from the curve."""
    from specdec_edu.course.measure import VerifyCost

    machine, stalls = FakeMachine(), iter([False, False, True, False])  # t(2) of the warm-up, then of sweeps 1-3

    def forward(n):
        machine.forward(n)
        if n == 2 and next(stalls, False):
            machine.now += 10

    cost = VerifyCost.from_forward(forward, [1, 2], timer=machine.clock)
    for _ in range(3):
        cost.sweep()
    assert [sweep[2] for sweep in cost.sweeps] == [2.0, 12.0, 2.0]
    assert cost.ratios() == {1: 1.0, 2: 2.0}


def test_measured_verify_cost_times_the_path_it_is_asked_for(monkeypatch):
    """``compile`` and ``compile_options`` reach the forward that is timed: bench and gpu-report pass a run's
    ``stats.compiled``, and a compiled run's verify cost timed on the eager path is another machine's number."""
    seen = []

    def fake_appending_forward(model, context_length, max_new, compile, compile_options, *rest):
        seen.append((context_length, max_new, compile, compile_options))
        return lambda n: None

    monkeypatch.setattr(measure, "_appending_forward", fake_appending_forward)
    model = types.SimpleNamespace(device=torch.device("cpu"))
    measure.measured_verify_cost(model, 4, context_length=32, compile=True, compile_options={"backend": "eager"})
    assert seen == [(32, 4, True, {"backend": "eager"})]
    with pytest.raises(RuntimeError, match="at least 3"):  # fewer sweeps than a median needs: refused, not topped up
        measure.measured_verify_cost(model, 4, sweeps=2)


def test_every_timer_syncs_the_device_before_each_clock_reading(monkeypatch):
    """On a GPU a forward (or a reduction) returns when it is queued: a clock read without a sync just before it
    times the launch, not the work. Each timed interval here must be: sync, clock, work, sync, clock."""
    events, ticks = [], itertools.count(1.0)
    monkeypatch.setattr(measure, "sync", lambda device: events.append("sync"))
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: events.append("clock") or next(ticks)))
    monkeypatch.setattr(measure, "_appending_forward", lambda *args, **kwargs: lambda n: events.append("work"))
    interval = ["sync", "clock", "work", "sync", "clock"]
    model = types.SimpleNamespace(device=torch.device("cpu"))

    measure.forward_seconds(model, 2, repeats=2, warmup=1)
    assert events == ["work"] + interval * 2  # the warm-up is not timed
    events.clear()
    measure.latency_curve(model, ns=(1, 4), repeats=2, progress=False)
    assert events == ["work"] * 2 + interval * 4  # a warm-up of each width, then 2 rounds of both
    events.clear()
    cost = measure.VerifyCost(model, [2])
    events.clear()  # the untimed warm-up
    cost.sweep()
    assert events == interval * 3  # t(1), t(2), t(1)
    events.clear()
    measure.read_bandwidth("cpu", n_bytes=1024, repeats=2)
    assert events == [e for e in interval if e != "work"] * 3


def test_a_timed_forward_computes_the_logits_of_every_token_it_appends(target, monkeypatch):
    """A verify pass needs the logits of all n positions (the target judges every draft), and that head work is part
    of t(n): the timed forwards of n = 3 return 3 rows of logits, the prefill only its last."""
    rows = []
    real_forward = measure.kv.forward_cached

    def spy(model, input_ids, cache, **kw):
        out = real_forward(model, input_ids, cache, **kw)
        rows.append(out.logits.shape[1])
        return out

    monkeypatch.setattr(measure.kv, "forward_cached", spy)
    forward_seconds(target, 3, context_length=8, repeats=2, warmup=1)
    assert rows == [1, 3, 3, 3]


def test_a_compiled_draft_is_timed_on_its_compiled_drafter(reduced_head_draft, monkeypatch):
    """``forward_seconds(draft, 1, role="draft", compile=True)`` builds the drafter a compiled generation uses
    (``compile`` and ``compile_options`` reach ``model_drafter``), not an eager one."""
    from specdec_edu import generate

    made, real = [], generate.model_drafter

    def spy(model, compile=False, compile_options=None, **kwargs):
        made.append((compile, compile_options))
        return real(model, compile, compile_options, **kwargs)

    monkeypatch.setattr(generate, "model_drafter", spy)
    options = {"backend": "eager"}
    forward_seconds(reduced_head_draft, 1, context_length=8, repeats=1, role="draft", compile=True, compile_options=options)
    assert made == [(True, options)]


def test_a_draft_step_is_timed_at_the_context_length_asked(reduced_head_draft, forward_calls):
    """``role="draft"``: the drafter first reads ``context_length`` tokens, then each timed step appends one token to
    them and is cropped back, so every step sees the same cache of 8, not an empty one."""
    forward_seconds(reduced_head_draft, 1, context_length=8, repeats=2, warmup=1, role="draft")
    assert forward_calls == [(8, 0)] + [(1, 8)] * 3


def test_a_compiled_forward_gets_room_for_the_tokens_it_appends():
    """The compiled static cache holds ``context_length + n_new`` positions: 252 + 8 needs more than the smallest
    cache (256 positions), and a cache sized for the context alone refuses the timed forward."""
    from conftest import tiny_llama

    model = tiny_llama(seed=0, max_positions=512)
    assert forward_seconds(model, 8, context_length=252, repeats=1, compile=True, compile_options={"backend": "eager"}) > 0


def test_a_compiled_verify_cost_sweeps_at_its_own_context_after_a_generation_filled_the_shared_cache(forward_calls):
    """Compiled, the calibration's cache is the shared one every compiled generation of the model rewinds and fills
    (the default on CUDA; torch.compile's eager backend here). Notebook 07 sweeps between generations: a sweep then
    timed its forwards at the generation's length (here 44 positions, not 16), and near the cache's end raised. Each
    sweep now puts its context back first, untimed."""
    from conftest import tiny_llama

    from specdec_edu import autoregressive_generate
    from specdec_edu.course.measure import VerifyCost

    model, options = tiny_llama(seed=0, max_positions=512), {"backend": "eager"}
    cost = VerifyCost(model, [1, 3], context_length=16, compile=True, compile_options=options)
    out = autoregressive_generate(model, torch.tensor([[1, 2, 3, 4]]), max_new_tokens=40, compile=True,
                                  compile_options=options)
    assert out.stats.compiled
    forward_calls.clear()
    cost.sweep()
    timed = [call for call in forward_calls if call[0] in (1, 3)]
    assert timed and all(length == 16 for _, length in timed), forward_calls


def test_c_is_timed_in_turns_so_a_machine_that_slows_down_does_not_move_it(monkeypatch):
    """gpu-report's c was two medians timed one after the other (all target steps, then all draft steps): on a machine
    slowing down as it measures, the draft's came from a slower moment and c came out high (about 0.71 here for a
    true 0.4; a review saw c swing from 0.02 to 0.07 under load). ``step_seconds`` times target, draft, target in each sweep and
    takes the median of the sweeps' ratios: 0.4. A fake clock; every forward 10 % slower than the one before."""
    clock, order = [0.0], []

    def fake_forward(model, context_length, max_new, compile, compile_options, role="target", batch=1):
        base = 0.004 if role == "draft" else 0.010

        def forward(n):
            order.append(role)
            clock[0] += base * 1.1 ** len(order)
        return forward

    monkeypatch.setattr(measure, "_appending_forward", fake_forward)
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock[0])
    model = types.SimpleNamespace(device=torch.device("cpu"))
    target_step, draft_step, c = measure.step_seconds(model, model, repeats=5)
    assert order == ["target", "draft"] + ["target", "draft", "target"] * 5  # a warm-up of each, then in turns
    assert c == pytest.approx(0.4, rel=0.01) and target_step > 0 and draft_step > 0
    # the old way, a warm-up and 5 target steps, then the same for the draft: c = 0.4 × 1.1^6 ≈ 0.71


def test_tokens_html_draws_the_asked_row_escaped_with_the_sources_it_uses():
    """Row ``row`` of a batch: its tokens and its sources (row 0's were drawn for every row); the text is HTML-escaped
    (a token "<b" would open a tag); the legend names only the sources that occur."""
    result = types.SimpleNamespace(row=lambda i: torch.tensor([[0, 1], [2, 3]])[i],
                                   token_sources=[["target", "target"], ["accepted", "corrected"]])

    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "".join({0: "x", 1: "y", 2: "<b", 3: "&"}[i] for i in ids)

    html = tokens_html(Tok(), result, row=1)
    assert [s.split('"')[0] for s in html.split('<span title="')[1:]] == ["accepted", "corrected"]
    assert ">&lt;b</span>" in html and ">&amp;</span>" in html and "<b" not in html
    assert "draft token accepted" in html and "correction after a rejection" in html and "target alone" not in html


def test_token_pieces_keep_the_text_when_a_prefix_decodes_otherwise():
    """A tokenizer that rewrites earlier text as more tokens come (clean-up of spaces): the piece is then the whole
    new text, not lost."""
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return {1: "a ", 2: "a.", 3: "a.b"}[len(ids)]

    assert token_pieces(Tok(), [7, 8, 9]) == ["a ", "a.", "b"]


def test_plain_legend_marks_each_source_once():
    assert legend(False) == ("legend: [draft token accepted] · {target's correction after a rejection} · "
                             "<target's bonus token (all drafts accepted)> · unmarked: target alone (no draft)")


def test_kv_crop_picture_prints_the_real_counts():
    """The labels carry numbers a learner reads: each row's count of cached positions, the hidden context cells, what
    the crop removed, γ and the accepted count (prompt 10, γ = 4, 1 accepted, 4 context cells drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdec_edu.course.viz import draw_kv_crop, kv_crop_rows

    fig = draw_kv_crop(10, 4, 1, max_context_cells=4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    for label in ("before verify: 9 cached", "after the verify forward: 14 cached", "after the crop: 11 cached",
                  "3 positions removed:\n1 rejected, 2 never judged"):
        assert label in texts, (label, texts)
    assert texts.count("…6") == 3
    assert fig.axes[0].get_title() == "The target's KV cache in one round: γ = 4, 1 accepted"
    plt.close(fig)
    fig = draw_kv_crop(3, 2, 1)
    assert "1 position removed:\nthe rejected draft" in [t.get_text() for t in fig.axes[0].texts]
    plt.close(fig)
    with pytest.raises(ValueError, match="max_context_cells=0"):
        draw_kv_crop(5, 2, 1, max_context_cells=0)
    with pytest.raises(TypeError, match="gamma must be an int, got bool"):
        kv_crop_rows(5, True, 1)


def test_medusa_heads_guess_one_position_further_each():
    """Head k of the diagram predicts x_{t+k+1}; the target's own head x_{t+1}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specdec_edu.course.viz import draw_feature_drafters

    fig = draw_feature_drafters()
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert [t for t in texts if t.startswith("lm_head")] == [f"lm_head → $x_{{t+{k}}}$" for k in (1, 2, 3, 4)]
    plt.close(fig)
