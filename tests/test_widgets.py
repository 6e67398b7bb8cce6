"""The notebook helpers: exercise checks, the exact output distribution, toy simulations and the
live widgets (driven headlessly)."""

import sys

import matplotlib
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec_edu.course import controls
from specdec_edu.course.exercises import check_answer
from specdec_edu.course.widgets import accept_rule_explorer, residual_explorer, simulate_first_token
from specdec_edu.theory import output_distribution, total_variation

matplotlib.use("Agg")  # the widgets import pyplot only when they draw, so choosing the backend here is in time


def test_check_answer_accepts_right_answers(capsys):
    assert check_answer("a", 0.2000000001, 0.2)
    assert check_answer("b", [0.75, 0, 0.25], (0.75, 0.0, 0.25))
    assert check_answer("c", torch.tensor([1, 2]), [1, 2])
    assert check_answer("d", " Smollm2 ", "smollm2")
    assert check_answer("e", np.float64(4), 4)
    assert "correct" in capsys.readouterr().out


def test_check_answer_unanswered_is_not_an_error(capsys):
    assert check_answer("a", ..., 1) is False
    assert check_answer("a", None, 1) is False
    assert "not answered yet" in capsys.readouterr().out


def test_check_answer_takes_numpy_and_tensor_scalars_for_what_they_are(capsys):
    assert check_answer("a", np.bool_(True), True) and check_answer("b", torch.tensor(0.5), 0.5)
    assert check_answer("c", [np.float32(0.25), torch.tensor(1)], [0.25, 1])


# a bool is not a number, nor a string a number: False passed for 0.0, "0.4" for 0.4, True for 1, [False, False,
# True] for [0, 0, 1]
@pytest.mark.parametrize("answer, expected", [(0.3, 0.2), ([1, 2], [1, 2, 3]), ("x", "y"), ("1", 2), ([0.7, 0.3], [0.75, 0.25]),
                                              (False, 0.0), ("0.4", 0.4), (True, 1), ([False, False, True], [0, 0, 1]),
                                              (1, True)])
def test_check_answer_rejects_wrong_answers_with_the_hint(answer, expected):
    with pytest.raises(AssertionError, match="not right. Hint: think"):
        check_answer("q", answer, expected, hint="think")


def test_output_distribution_equals_p_on_the_source_example():
    p, q = [0.5, 0.1, 0.4], [0.2, 0.5, 0.3]
    assert torch.allclose(output_distribution(p, q), torch.tensor(p, dtype=torch.float64), atol=1e-12)
    assert total_variation(p, q) == pytest.approx(0.4)


def test_output_distribution_works_row_by_row():
    """A batch [N, V] gives one output distribution per row: each equals its p (rows normalised apart)."""
    gen = torch.Generator().manual_seed(0)
    p, q = torch.rand(4, 7, generator=gen, dtype=torch.float64), torch.rand(4, 7, generator=gen, dtype=torch.float64)
    q[0] = 0
    q[0, 2] = 3.0  # a one-hot draft, given as unnormalised weights
    out = output_distribution(p, q)
    assert out.shape == (4, 7)
    torch.testing.assert_close(out, p / p.sum(-1, keepdim=True), rtol=0, atol=1e-12)


def test_output_distribution_of_a_broken_rule_is_not_p():
    """Negative control: resampling from p instead of the residual gives min(p, q) + P(reject)·p."""
    p, q = torch.tensor([0.5, 0.1, 0.4], dtype=torch.float64), torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    broken = output_distribution(p, q, resample=p)
    torch.testing.assert_close(broken, torch.minimum(p, q) + 0.4 * p, rtol=0, atol=1e-12)
    assert (broken - p).abs().max() > 0.1


def test_output_distribution_refuses_non_distributions():
    with pytest.raises(ValueError, match="non-negative weights"):
        output_distribution([0.5, -0.1, 0.6], [0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="positive sum"):
        output_distribution([0.5, 0.5], [0.0, 0.0])


def test_simulate_first_token_matches_p_and_controls_do_not():
    p, q = [0.5, 0.1, 0.4], [0.2, 0.5, 0.3]
    n = 4000
    tokens, accepted = simulate_first_token(p, q, n, generator=torch.Generator().manual_seed(0))
    counts = np.bincount(tokens, minlength=3)
    assert counts.sum() == n and len(accepted) == n
    # Σ min(p, q) = 0.6; the standard error at n = 4,000 is √(0.6 · 0.4 / n) ≈ 0.0077, so ±0.03 is ≈ 3.9 SE
    assert accepted.mean() == pytest.approx(0.6, abs=0.03)
    _, accepted_always = simulate_first_token(p, q, n, generator=torch.Generator().manual_seed(0),
                                              accept_fn=controls.accept_always)
    assert accepted_always.mean() != pytest.approx(0.6, abs=0.03)  # control: a rule that accepts every draft
    assert chisquare(counts, np.array(p) * n).pvalue > 1e-3
    for broken in (controls.accept_always, controls.resample_from_target):
        bad, _ = simulate_first_token(p, q, n, generator=torch.Generator().manual_seed(0), accept_fn=broken)
        assert chisquare(np.bincount(bad, minlength=3), np.array(p) * n).pvalue < 1e-6


def test_accept_rule_explorer_updates_its_state_when_sliders_move():
    ex = accept_rule_explorer(p_x=0.8, q_x=0.6, flips=200)
    assert ex.state["acceptance_probability"] == pytest.approx(1.0)
    assert ex.state["accepted"] == 200
    ex.controls["p"].value = 0.1
    ex.controls["q"].value = 0.5
    assert ex.state["acceptance_probability"] == pytest.approx(0.2)
    # 200 flips at probability 0.2 (seed 0): standard error 0.028, so ± 0.1 is ≈ 3.5 standard errors
    assert ex.state["accepted_fraction"] == pytest.approx(0.2, abs=0.1)
    ex.controls["q"].value = 0.25  # the control: min(1, 0.1 / 0.25) = 0.4, which the same window must reject
    assert ex.state["accepted_fraction"] != pytest.approx(0.2, abs=0.1)
    ex.controls["q"].value = 0.5
    ex.controls["flips"].value = 1000
    assert ex.state["flips"] == 1000 and len(ex.state["outcomes"]) == 1000


def test_residual_explorer_output_is_always_p():
    ex = residual_explorer(samples=500)
    np.testing.assert_allclose(ex.state["residual"], [0.75, 0, 0.25], atol=1e-12)
    assert ex.state["rejection_probability"] == pytest.approx(0.4)
    ex.controls["q[today]"].value = 0.0
    ex.controls["p[everyday]"].value = 0.9
    np.testing.assert_allclose(ex.state["output"], ex.state["p"], atol=1e-12)  # the simulation: the next test
    for t in ("everyday", "today", "tomorrow"):
        ex.controls[f"p[{t}]"].value = 0.0
    assert ex.state["error"]  # all-zero p: a message instead of a crash
    ex.figure()


def test_residual_explorer_labels_weights_and_shows_the_normalised_p_and_q_live():
    """The sliders hold weights; next to them the learner reads the p and q the rule uses (issue 20: q(today) = 0
    left the sliders at 0.2 / 0 / 0.3 while the rule used q = 0.4 / 0 / 0.6)."""
    ex = residual_explorer(samples=100)
    assert all(c.description.startswith("weight of ") for c in ex.controls.values())
    assert "p(tomorrow) = 0.40, q(tomorrow) = 0.30" in ex.ui.children[2].children[2].value  # rows: everyday, today, tomorrow
    ex.controls["q[today]"].value = 0.0  # q's weights now sum to 0.5: the rule uses q = (0.4, 0, 0.6)
    assert "q(tomorrow) = 0.60" in ex.ui.children[2].children[2].value
    assert "q(everyday) = 0.40" in ex.ui.children[0].children[2].value


def test_explorer_set_changes_several_controls_with_one_redraw():
    ex = residual_explorer(samples=100)
    calls = []
    original = ex.redraw
    ex.redraw = lambda: (calls.append(1), original())
    ex.set(**{"p[today]": 0.7, "q[today]": 0.05, "q[tomorrow]": 0.9})
    assert len(calls) == 1
    assert ex.state["p"][1] == pytest.approx(0.7 / 1.6)
    np.testing.assert_allclose(ex.state["output"], ex.state["p"], atol=1e-12)
    with pytest.raises(KeyError, match="unknown controls"):
        ex.set(nope=1)


def test_widgets_without_ipywidgets_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "ipywidgets", None)  # as if not installed
    with pytest.raises(ImportError, match=r"specdec-edu\[notebooks\]"):
        accept_rule_explorer()


def test_residual_explorer_shows_no_residual_when_q_equals_p():
    """q = p (notebook 04 asks the learner to try it): nothing is rejected, and no residual exists. The widget drew
    residual_distribution's fallback, p itself, as red "residual" bars and printed it as the residual."""
    import matplotlib.pyplot as plt

    plt.close("all")  # each redraw draws a figure: the earlier tests' must not pile up past matplotlib's warning
    ex = residual_explorer(samples=100)
    for t in ("everyday", "today", "tomorrow"):
        ex.controls[f"q[{t}]"].value = ex.controls[f"p[{t}]"].value
    assert ex.state["rejection_probability"] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_array_equal(ex.state["residual"], [0, 0, 0])
    np.testing.assert_allclose(ex.state["output"], ex.state["p"], atol=1e-12)
    summary = ex.ui.children[-2].value  # the one-line HTML above the figure
    assert "residual: none (q = p" in summary, summary
    ex.figure()
    plt.close("all")


# ---- what the widgets show: the numbers in the state, the one-line summary and the figure -------------------------
def _bar_heights(container):
    return [r.get_height() for r in container]


def test_accept_rule_explorer_counts_fraction_summary_and_seed_agree():
    """The accepted count, the share and the summary line all come from the same simulated flips (a count of n, or a
    share copied from min(1, p/q), would still pass a ± window), and the generator is re-seeded at every redraw, as the
    docstring promises: equal slider values give equal flips."""
    ex = accept_rule_explorer(p_x=0.1, q_x=0.5, flips=200)
    s = ex.state
    assert (s["p"], s["q"], s["flips"]) == (0.1, 0.5, 200) and len(s["outcomes"]) == 200
    assert set(np.unique(s["outcomes"])) <= {0, 1}
    assert s["accepted"] == int(s["outcomes"].sum()) and 0 < s["accepted"] < 200
    assert s["accepted_fraction"] == s["accepted"] / 200 != s["acceptance_probability"]
    summary = ex.ui.children[-2].value
    assert f"accepted {s['accepted']} of 200 simulated drafts ({s['accepted'] / 200:.3f})" in summary, summary
    assert "min(1, p/q) = 0.200" in summary
    first = s["outcomes"].copy()
    ex.controls["q"].value = 0.3
    assert ex.state["acceptance_probability"] == pytest.approx(1 / 3)
    ex.controls["q"].value = 0.5
    np.testing.assert_array_equal(ex.state["outcomes"], first)


def test_accept_rule_explorer_figure_draws_the_state():
    """The static figure (explorer.show_figure in notebook 03) draws the state's numbers: the bars are the accepted and
    rejected counts, the markers n·a and n·(1 − a), the running share is cumsum(outcomes) / (1..n) and the dashed line
    and the title give a = min(1, p/q)."""
    import matplotlib.pyplot as plt

    ex = accept_rule_explorer(p_x=0.1, q_x=0.5, flips=200)
    s, n = ex.state, 200
    fig = ex.figure()
    ax1, ax2 = fig.axes
    assert _bar_heights(ax1.containers[0]) == [s["accepted"], n - s["accepted"]]
    np.testing.assert_allclose(ax1.lines[0].get_ydata(), [0.2 * n, 0.8 * n], rtol=1e-6)
    assert "p(x) = 0.10, q(x) = 0.50" in ax1.get_title() and "min(1, p/q) = 0.200" in ax1.get_title()
    running, limit = ax2.lines
    np.testing.assert_allclose(running.get_xdata(), np.arange(1, n + 1))
    np.testing.assert_allclose(running.get_ydata(), np.cumsum(s["outcomes"]) / np.arange(1, n + 1))
    np.testing.assert_allclose(limit.get_ydata(), [0.2, 0.2], rtol=1e-6)
    plt.close("all")
    before = len(plt.get_fignums())
    ex.show_figure()  # Agg: plt.show() draws nothing, the figure stays open
    assert len(plt.get_fignums()) == before + 1
    plt.close("all")


def test_explorer_stays_live_after_set():
    """``set`` pauses the callbacks while it sets several controls; after it, a slider moved alone redraws again."""
    ex = accept_rule_explorer(p_x=0.8, q_x=0.6, flips=100)
    ex.set(p=0.1, q=0.5)
    assert ex.state["acceptance_probability"] == pytest.approx(0.2)
    ex.controls["q"].value = 0.25
    assert ex.state["acceptance_probability"] == pytest.approx(0.4)


def test_residual_explorer_figure_and_summary_draw_the_state():
    """Each bar series of the figure is the state's array of its label; the second panel stacks min(p, q) and
    P(reject) × residual on it, which add up to p (the black marks); the titles and the summary line print P(reject),
    the residual and max |output − p|. (Source example: min(p, q) = 0.2 / 0.1 / 0.3, residual 0.75 / 0 / 0.25.)"""
    import matplotlib.pyplot as plt

    plt.close("all")
    ex = residual_explorer(samples=500)
    s = ex.state
    np.testing.assert_allclose(s["min_pq"], [0.2, 0.1, 0.3], atol=1e-6)
    fig = ex.figure()
    ax1, ax2 = fig.axes
    drawn = {c.get_label(): _bar_heights(c) for c in ax1.containers}
    expected = {"q (draft)": s["q"], "p (target)": s["p"], "min(p, q)": s["min_pq"], "residual": s["residual"],
                "output (exact)": s["output"], "output (500 simulated)": s["simulated"]}
    assert drawn.keys() == expected.keys()
    for label, values in expected.items():
        np.testing.assert_allclose(drawn[label], values, atol=1e-12, err_msg=label)
    assert ax1.get_title().startswith("P(reject) = 0.400; max |output − p| = ")
    accepted, rejected = ax2.containers
    np.testing.assert_allclose(_bar_heights(accepted), s["min_pq"], atol=1e-12)
    np.testing.assert_allclose(_bar_heights(rejected), 0.4 * np.array([0.75, 0, 0.25]), atol=1e-6)
    np.testing.assert_allclose([r.get_y() for r in rejected], s["min_pq"], atol=1e-12)
    np.testing.assert_allclose([r.get_y() + r.get_height() for r in rejected], s["p"], atol=1e-6)
    np.testing.assert_allclose(ax2.lines[0].get_ydata(), s["p"], atol=1e-12)
    summary = ex.ui.children[-2].value
    assert "P(reject) = 0.400" in summary and "residual: everyday 0.75, today 0.00, tomorrow 0.25" in summary, summary
    plt.close("all")


def test_residual_explorer_draws_what_output_distribution_returns(monkeypatch):
    """The widget must show the computed output distribution, not p: with a broken rule in its place (resample from p
    instead of the residual) the state, the bars, the title and the summary show output ≠ p (min(p, q) + 0.4·p =
    0.40 / 0.14 / 0.46: max |output − p| = 0.1)."""
    import matplotlib.pyplot as plt

    from specdec_edu.course import widgets

    monkeypatch.setattr(widgets, "output_distribution", lambda p, q: output_distribution(p, q, resample=p))
    ex = residual_explorer(samples=100)
    broken = torch.minimum(torch.tensor([0.5, 0.1, 0.4]), torch.tensor([0.2, 0.5, 0.3])) + 0.4 * torch.tensor([0.5, 0.1, 0.4])
    np.testing.assert_allclose(ex.state["output"], broken.numpy(), atol=1e-6)
    assert ex.state["max_abs_diff"] == pytest.approx(0.1, abs=1e-6)
    assert "max |output − p| = 1.0e-01" in ex.ui.children[-2].value
    ax1 = ex.figure().axes[0]
    assert ax1.get_title().endswith("max |output − p| = 1.0e-01")
    exact_bars = next(c for c in ax1.containers if c.get_label() == "output (exact)")
    np.testing.assert_allclose(_bar_heights(exact_bars), broken.numpy(), atol=1e-6)
    plt.close("all")


@pytest.mark.parametrize("rule", [None, "accept_always", "resample_from_target"])
def test_residual_explorer_simulation_follows_p(monkeypatch, rule):
    """The simulated bars come from verification steps that draft from q and verify against p: their counts fit p, not
    q (the source example, 2000 samples, seed 0; χ² level 1e-3). Controls: the explorer's simulation run with a broken
    rule (always accept; resample from p instead of the residual) must fail the same test against p (p-value < 1e-6;
    measured 0.0 and 2e-16)."""
    from functools import partial

    from specdec_edu.course import widgets

    if rule:
        monkeypatch.setattr(widgets, "simulate_first_token",
                            partial(simulate_first_token, accept_fn=controls.BROKEN_RULES[rule]))
    ex = residual_explorer(samples=2000)
    counts = ex.state["simulated"] * 2000
    if rule:
        assert chisquare(counts, ex.state["p"] * 2000).pvalue < 1e-6
        return
    assert chisquare(counts, ex.state["p"] * 2000).pvalue > 1e-3
    assert chisquare(counts, ex.state["q"] * 2000).pvalue < 1e-6


def test_residual_explorer_keeps_one_entry_per_token_when_the_last_has_no_mass():
    """p(tomorrow) = 0: no simulated step emits the last token, and the simulated counts must still have one entry
    per token (a short bincount broke the figure)."""
    import matplotlib.pyplot as plt

    ex = residual_explorer(samples=200)
    ex.controls["p[tomorrow]"].value = 0.0
    assert ex.state["simulated"].shape == (3,) and ex.state["simulated"][2] == 0
    np.testing.assert_allclose(ex.state["output"], ex.state["p"], atol=1e-12)
    ex.figure()
    plt.close("all")


def test_residual_explorer_refuses_lengths_that_differ():
    with pytest.raises(ValueError, match="same length"):
        residual_explorer(tokens=("a", "b"), p=(0.5, 0.5), q=(0.2, 0.3, 0.5))


def test_residual_explorer_with_no_q_mass_shows_the_message_not_stale_numbers():
    """All-zero q weights: a message in the summary, in the readouts next to the sliders and in the figure, instead of a
    crash, or of the numbers of the previous slider setting. The state forgets those numbers too (a cell that read
    ``state["p"]`` got the last valid p beside the error), and gets them back with the weights."""
    import matplotlib.pyplot as plt

    ex = residual_explorer(samples=100)
    for t in ("everyday", "today", "tomorrow"):
        ex.controls[f"q[{t}]"].value = 0.0
    assert ex.state["error"] == "give p and q at least one positive weight each"
    assert ex.ui.children[-2].value == "<b>give p and q at least one positive weight each</b>"
    assert all(row.children[2].value == "→ p, q undefined" for row in ex.ui.children[:3])
    fig = ex.figure()
    assert not fig.axes[0].patches and [t.get_text() for t in fig.axes[0].texts] == [ex.state["error"]]
    plt.close("all")
    assert set(ex.state) == {"tokens", "error"}, sorted(ex.state)
    ex.controls["q[today]"].value = 0.5
    assert ex.state["error"] is None and ex.state["q"].tolist() == [0.0, 1.0, 0.0]


def test_residual_numbers_need_no_widgets():
    """The explorer's numbers come from one function a learner can call without ipywidgets: min(p, q) + P(reject) ×
    residual = p, the exact output is p, and the simulated shares sum to 1 over every token (the last has no mass)."""
    from specdec_edu.course.widgets import residual_numbers

    out = residual_numbers([0.5, 0.5, 0.0], [0.2, 0.3, 0.5], 1000, torch.Generator().manual_seed(0))
    np.testing.assert_allclose(out["min_pq"] + out["rejection_probability"] * out["residual"], out["p"], atol=1e-6)
    np.testing.assert_allclose(out["output"], out["p"], atol=1e-6)
    assert out["simulated"].shape == (3,) and out["simulated"].sum() == pytest.approx(1) and out["simulated"][2] == 0
    assert out["residual_used"] and out["rejection_probability"] == pytest.approx(0.5)
    same = residual_numbers([1, 2, 3], [1, 2, 3], 10, torch.Generator().manual_seed(0))  # q = p: no residual
    assert not same["residual_used"] and not same["residual"].any() and same["rejection_probability"] == pytest.approx(0)
