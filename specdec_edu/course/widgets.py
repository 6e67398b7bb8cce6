"""Live widgets and toy simulations for the course notebooks.

Nothing here re-implements speculative sampling: the simulations call
:func:`specdec_edu.accept_and_resample` (or a deliberately broken rule from
:mod:`specdec_edu.course.controls`) and the widgets only draw what those functions return.
The exact output distribution comes from :func:`specdec_edu.theory.output_distribution`;
the exercise checker is :func:`specdec_edu.course.exercises.check_answer`.

* :func:`simulate_first_token`: run one verification step many times on toy
  distributions and count which token comes out first.
* :func:`accept_rule_explorer` (notebook 03): sliders for p(x) and q(x), the acceptance
  probability min(1, p/q) and simulated coin flips.
* :func:`residual_explorer` (notebook 04): sliders for p and q over a small vocabulary,
  the residual normalize(max(0, p - q)) and the output distribution, which equals p.

Each explorer keeps what it shows in ``explorer.state`` (a dict in the kernel), so a
notebook cell can set ``explorer.controls[...].value = ...`` (or several at once with
``explorer.set(...)``) and assert on the state without a browser: ipywidgets fires the
callbacks in the kernel. ipywidgets is imported only when a widget is built: it comes with
the ``notebooks`` extra (``pip install "specdec-edu[notebooks]"``), and Colab has it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..theory import as_distribution, output_distribution
from ..verify import accept_and_resample, acceptance_probability, residual_distribution

__all__ = [
    "simulate_first_token",
    "Explorer",
    "accept_rule_explorer",
    "residual_explorer",
    "residual_numbers",
]


# ---- toy simulations ----------------------------------------------------------------------------
def simulate_first_token(
    p,
    q,
    n: int,
    *,
    generator: torch.Generator,
    accept_fn: Callable = accept_and_resample,
) -> tuple[np.ndarray, np.ndarray]:
    """Run one draft-and-verify step ``n`` times on toy distributions (γ = 1).

    Each trial draws a draft token x ~ q, then calls ``accept_fn(p_rows, q_rows, [x], generator)`` with
    ``p_rows [2, V]`` (p twice: the rule's row for x and its bonus row) and ``q_rows [1, V]``;
    the first token the step emits is x if it was accepted, else the token ``accept_fn``
    put in its place. Returns ``(tokens, accepted)``: the ``n`` emitted token ids and, per
    trial, whether the draft was accepted (both numpy arrays, in trial order).
    Counts per token: ``np.bincount(tokens, minlength=len(p))``.
    """
    p, q = as_distribution(p).flatten().float(), as_distribution(q).flatten().float()
    p_rows, q_rows = torch.stack([p, p]), q[None]  # p at the draft position and at the bonus position
    drafts = torch.multinomial(q, n, replacement=True, generator=generator)
    tokens, accepted = np.empty(n, dtype=np.int64), np.zeros(n, dtype=bool)
    for i, x in enumerate(drafts):
        n_acc, next_token = accept_fn(p_rows, q_rows, x[None], generator)
        accepted[i] = n_acc >= 1
        tokens[i] = int(x) if accepted[i] else next_token
    return tokens, accepted


# ---- live widgets ------------------------------------------------------------------------------
def _ipywidgets():
    """The ipywidgets module, or an error that says how to get it (it is not a core dependency)."""
    try:
        import ipywidgets
    except ImportError as exc:
        raise ImportError(
            "the live widgets need ipywidgets: pip install \"specdec-edu[notebooks]\" (or pip install ipywidgets)"
        ) from exc
    return ipywidgets


@dataclass
class Explorer:
    """A live widget: ``ui`` to display, ``controls`` to set, ``state`` to read (kernel side)."""

    ui: Any
    controls: dict
    state: dict
    redraw: Callable[[], None]
    figure: Callable[[], Any] = field(repr=False, default=None)
    _paused: dict = field(repr=False, default_factory=lambda: {"paused": False})

    def set(self, **values) -> None:
        """Set several controls at once (keys of ``controls``) with a single redraw at the end."""
        unknown = set(values) - set(self.controls)
        if unknown:
            raise KeyError(f"unknown controls {sorted(unknown)}; choose from {sorted(self.controls)}")
        self._paused["paused"] = True
        try:
            for name, value in values.items():
                self.controls[name].value = value
        finally:
            self._paused["paused"] = False
        self.redraw()

    def _observe(self) -> None:
        def on_change(_change):
            if not self._paused["paused"]:
                self.redraw()

        for c in self.controls.values():
            c.observe(on_change, names="value")

    def show_figure(self):
        """Draw the current state as an ordinary (static) figure in the cell's output."""
        import matplotlib.pyplot as plt

        self.figure()
        plt.show()


def _live_explorer(controls: dict, rows: list, state: dict, compute, figure, summary) -> Explorer:
    """Wire sliders to a redraw: recompute ``state``, print a one-line ``summary()`` (HTML), redraw ``figure()``."""
    w = _ipywidgets()
    import matplotlib.pyplot as plt

    text, out = w.HTML(), w.Output()

    def redraw(*_):
        compute()
        text.value = summary()
        with out:
            out.clear_output(wait=True)
            figure()
            plt.show()

    redraw()
    explorer = Explorer(w.VBox(rows + [text, out]), controls, state, redraw, figure)
    explorer._observe()
    return explorer


def accept_rule_explorer(p_x: float = 0.1, q_x: float = 0.5, flips: int = 1000, seed: int = 0) -> Explorer:
    """Sliders for p(x) and q(x); shows min(1, p(x)/q(x)) and ``flips`` simulated verifications.

    Each flip is a real call to :func:`accept_and_resample` on a two-token vocabulary
    {x, other} whose draft proposed x: the share of accepted flips converges to the
    acceptance probability. The generator is re-seeded at every redraw, so equal slider
    values give equal pictures.
    """
    w = _ipywidgets()
    import matplotlib.pyplot as plt

    common = {"continuous_update": False, "style": {"description_width": "initial"}}
    controls = {
        "p": w.FloatSlider(value=p_x, min=0.0, max=1.0, step=0.01, description="p(x): target", **common),
        "q": w.FloatSlider(value=q_x, min=0.01, max=1.0, step=0.01, description="q(x): draft", **common),
        "flips": w.IntSlider(value=flips, min=50, max=5000, step=50, description="simulated drafts", **common),
    }
    state: dict = {}

    def compute():
        px, qx, n = controls["p"].value, controls["q"].value, controls["flips"].value
        gen = torch.Generator().manual_seed(seed)
        p_rows = torch.tensor([[px, 1 - px], [px, 1 - px]])
        q_rows = torch.tensor([[qx, 1 - qx]])
        x = torch.tensor([0])  # the draft proposed token 0, i.e. x
        outcomes = np.array([accept_and_resample(p_rows, q_rows, x, gen)[0] for _ in range(n)])
        state.update(
            p=px,
            q=qx,
            flips=n,
            acceptance_probability=float(acceptance_probability(torch.tensor(px), torch.tensor(qx))),
            accepted=int(outcomes.sum()),
            accepted_fraction=float(outcomes.mean()),
            outcomes=outcomes,
        )

    def figure():
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.4))
        n, acc, a = state["flips"], state["accepted"], state["acceptance_probability"]
        ax1.bar(["accepted", "rejected"], [acc, n - acc], color=["#4caf50", "#e57373"], label="simulated")
        ax1.plot(["accepted", "rejected"], [a * n, (1 - a) * n], "k_", markersize=40, mew=2, label="expected")
        ax1.set_ylabel("number of drafts")
        ax1.set_title(f"p(x) = {state['p']:.2f}, q(x) = {state['q']:.2f}  →  min(1, p/q) = {a:.3f}")
        ax1.legend(loc="best", fontsize=8, markerscale=0.4)
        running = np.cumsum(state["outcomes"]) / np.arange(1, n + 1)
        ax2.plot(np.arange(1, n + 1), running, label="share accepted so far")
        ax2.axhline(a, color="k", ls="--", lw=1, label="min(1, p(x)/q(x))")
        ax2.set_ylim(-0.02, 1.02)
        ax2.set_xscale("log")
        ax2.set_xlabel("number of simulated drafts (log scale)")
        ax2.set_ylabel("share accepted")
        ax2.legend(loc="lower right", fontsize=8)
        fig.tight_layout()
        return fig

    def summary():
        return (f"<b>min(1, p/q) = {state['acceptance_probability']:.3f}</b>: accepted {state['accepted']} of "
                f"{state['flips']} simulated drafts ({state['accepted_fraction']:.3f})")

    rows = [w.HBox([controls["p"], controls["q"]]), controls["flips"]]
    return _live_explorer(controls, rows, state, compute, figure, summary)


def residual_numbers(p_weights, q_weights, samples: int, generator: torch.Generator) -> dict:
    """What :func:`residual_explorer` draws, for weights ``p_weights`` and ``q_weights`` ``[V]`` (each row
    normalised here): numpy arrays ``[V]`` for ``p``, ``q``, ``min_pq``, ``accepted`` (q · min(1, p/q), the
    same as min(p, q)), ``residual``, ``output`` (exact) and ``simulated`` (the share of ``samples`` simulated
    verification steps that emitted each token), and the floats ``rejection_probability`` and ``max_abs_diff``
    (max |output − p|), with ``residual_used`` (False where q = p, so nothing is ever rejected)."""
    pt, qt = as_distribution(p_weights), as_distribution(q_weights)
    accepted = qt * acceptance_probability(pt, qt)
    never_rejects = float(1 - accepted.sum()) <= 1e-12  # q = p: nothing to correct
    # residual_distribution falls back to p when max(0, p − q) is all zero (the loop never uses it then);
    # the widget must not draw that p as "the residual"
    residual = torch.zeros_like(pt) if never_rejects else residual_distribution(pt, qt)
    exact = output_distribution(pt, qt)
    tokens_out, _ = simulate_first_token(pt, qt, samples, generator=generator)
    return dict(
        p=pt.numpy(),
        q=qt.numpy(),
        min_pq=torch.minimum(pt, qt).numpy(),
        accepted=accepted.numpy(),
        rejection_probability=float(1 - accepted.sum()),
        residual=residual.numpy(),
        residual_used=not never_rejects,
        output=exact.numpy(),
        simulated=np.bincount(tokens_out, minlength=len(pt)) / samples,  # one entry per token, emitted or not
        max_abs_diff=float((exact - pt).abs().max()),
    )


def residual_explorer(
    tokens: Sequence[str] = ("everyday", "today", "tomorrow"),
    p: Sequence[float] = (0.5, 0.1, 0.4),
    q: Sequence[float] = (0.2, 0.5, 0.3),
    samples: int = 2000,
    seed: int = 0,
) -> Explorer:
    """Sliders for the (unnormalised) weights of p and q over a few tokens.

    The sliders hold weights, not probabilities: each row is divided by its sum before use, and
    the normalised p(token) and q(token) are shown next to each pair of sliders, live (in
    ``state["p"]``, ``state["q"]`` too), so that what the learner reads is what the rule uses.
    Redraws q, p, min(p, q), the residual normalize(max(0, p − q)) and the output
    distribution, both computed exactly (:func:`output_distribution`) and estimated from
    ``samples`` simulated verification steps (:func:`simulate_first_token`); a second
    panel stacks accepted mass min(p, q) and rejected mass × residual, which add up to p.
    """
    w = _ipywidgets()
    import matplotlib.pyplot as plt

    if not len(tokens) == len(p) == len(q):
        raise ValueError("tokens, p and q must have the same length")
    tokens = list(tokens)
    style = {"description_width": "initial"}

    def slider(value, label):
        return w.FloatSlider(value=value, min=0.0, max=1.0, step=0.01, description=label, continuous_update=False, style=style)

    controls = {f"p[{t}]": slider(v, f"weight of {t} in p") for t, v in zip(tokens, p)}
    controls.update({f"q[{t}]": slider(v, f"weight of {t} in q") for t, v in zip(tokens, q)})
    normalised = {t: w.HTML() for t in tokens}  # next to each token's sliders: the p and q the rule really uses
    state: dict = {"tokens": tokens}

    def compute():
        pw = [controls[f"p[{t}]"].value for t in tokens]
        qw = [controls[f"q[{t}]"].value for t in tokens]
        if sum(pw) <= 0 or sum(qw) <= 0:
            # forget the last valid numbers: a cell that reads state["p"] now gets a KeyError, not a stale p
            state.clear()
            state.update(tokens=tokens, error="give p and q at least one positive weight each")
            for readout in normalised.values():
                readout.value = "→ p, q undefined"
            return
        state.update(error=None, **residual_numbers(pw, qw, samples, torch.Generator().manual_seed(seed)))
        for t, p_t, q_t in zip(tokens, state["p"], state["q"]):
            normalised[t].value = f"→ p({t}) = {p_t:.2f}, q({t}) = {q_t:.2f}"

    def figure():
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [3, 2]})
        if state.get("error"):
            ax1.text(0.5, 0.5, state["error"], ha="center", transform=ax1.transAxes)
            return fig
        x = np.arange(len(tokens))
        series = [
            ("q (draft)", state["q"], "#90caf9"),
            ("p (target)", state["p"], "#1565c0"),
            ("min(p, q)", state["min_pq"], "#81c784"),
            ("residual", state["residual"], "#e57373"),
            ("output (exact)", state["output"], "#6a1b9a"),
            (f"output ({samples} simulated)", state["simulated"], "#ce93d8"),
        ]
        width = 0.8 / len(series)
        for i, (label, values, colour) in enumerate(series):
            ax1.bar(x + (i - len(series) / 2 + 0.5) * width, values, width, label=label, color=colour)
        ax1.set_xticks(x, tokens)
        ax1.set_ylabel("probability")
        ax1.set_title(f"P(reject) = {state['rejection_probability']:.3f}; max |output − p| = {state['max_abs_diff']:.1e}")
        ax1.legend(loc="best", fontsize=7, ncol=2)
        rejected = state["rejection_probability"] * state["residual"]
        ax2.bar(x, state["min_pq"], color="#81c784", label="accepted: min(p, q)")
        ax2.bar(x, rejected, bottom=state["min_pq"], color="#e57373", label="rejected × residual")
        ax2.plot(x, state["p"], "k_", markersize=30, mew=2, label="p (target)")
        ax2.set_xticks(x, tokens)
        ax2.set_ylabel("probability")
        ax2.set_title("accepted + rejected × residual = p")
        ax2.legend(loc="best", fontsize=7, markerscale=0.4)
        fig.tight_layout()
        return fig

    def summary():
        if state.get("error"):
            return f"<b>{state['error']}</b>"
        residual = ", ".join(f"{t} {r:.2f}" for t, r in zip(tokens, state["residual"])) if state["residual_used"] else \
            "none (q = p: no draft is ever rejected, so no residual is ever sampled)"
        return (f"<b>P(reject) = {state['rejection_probability']:.3f}</b>; residual: {residual}; "
                f"max |output − p| = {state['max_abs_diff']:.1e}")

    rows = [w.HBox([controls[f"p[{t}]"], controls[f"q[{t}]"], normalised[t]]) for t in tokens]
    return _live_explorer(controls, rows, state, compute, figure, summary)
