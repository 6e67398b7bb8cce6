import copy
import types

import torch

from specdec_edu import measure, speculative_generate
from specdec_edu.course.measure import cost_ratio, forward_seconds, latency_curve, parameter_bytes
from specdec_edu.course.viz import legend, mark_tokens, token_pieces, tokens_html


class CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


def test_forward_seconds_times_every_repeat_at_the_same_context_length(target, monkeypatch):
    """The cache is cropped back after each timed forward: every one appends n_new to context_length."""
    calls = []
    real_forward = measure.kv.forward_cached

    def spy(model, input_ids, cache, **kw):
        calls.append((input_ids.shape[1], measure.kv.cache_length(cache)))
        return real_forward(model, input_ids, cache, **kw)

    monkeypatch.setattr(measure.kv, "forward_cached", spy)
    # the clock is read before each forward and after each timed one: the repeats last 3, 1 and 10 s
    readings = iter([50.0, 0.0, 3.0, 0.0, 1.0, 0.0, 10.0])
    monkeypatch.setattr(measure, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
    seconds = forward_seconds(target, 3, context_length=8, repeats=3, warmup=1)
    assert seconds == 3.0  # the median of the repeats (their mean is 4.67)
    assert calls == [(8, 0)] + [(3, 8)] * 4  # the prefill, then warm-up + 3 repeats, each on 8 cached positions


def test_latency_curve_and_cost_ratio_pass_their_arguments_through(target, draft, monkeypatch):
    """Fake per-forward times: the curve's keys are the requested ns, in order, and c = draft / target."""
    seen = []

    def fake(model, n_new, context_length=64, repeats=5, warmup=1):
        seen.append((model, n_new, context_length, repeats))
        return (0.5 if model is draft else 2.0) * n_new

    monkeypatch.setattr(measure, "forward_seconds", fake)
    curve = latency_curve(target, ns=(4, 1, 16), context_length=8, repeats=2, progress=False)
    assert list(curve.items()) == [(4, 8.0), (1, 2.0), (16, 32.0)]
    assert seen == [(target, 4, 8, 2), (target, 1, 8, 2), (target, 16, 8, 2)]
    assert cost_ratio(draft, target, context_length=8, repeats=2) == 0.25  # not target / draft (= 4)


def test_parameter_bytes_is_a_hand_count(target):
    """tiny_llama: vocab 64, hidden 64, 2 layers, MLP 128, 4 heads of 16, 2 KV heads (K, V: 32 wide), untied."""
    per_layer = (64 * 64 + 2 * 64 * 32 + 64 * 64) + 3 * 64 * 128 + 2 * 64  # attention, MLP, two RMSNorms
    n_params = 2 * per_layer + 64 * 64 + 64 * 64 + 64  # layers, embedding, LM head, final norm
    assert parameter_bytes(target) == 4 * n_params  # float32
    assert parameter_bytes(copy.deepcopy(target).to(torch.bfloat16)) == 2 * n_params


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
