"""Showing what speculative decoding did: coloured tokens, in a notebook or a terminal.

Every new token carries its source (``GenerationResult.token_sources``): an accepted
draft token, a correction (residual sample after a rejection), a bonus token, or a
token the target decoded alone.
"""

from __future__ import annotations

import html

SOURCES = ("accepted", "corrected", "bonus", "target")
WORDS = {
    "accepted": "draft token accepted",
    "corrected": "target's correction after a rejection",
    "bonus": "target's bonus token (all drafts accepted)",
    "target": "target alone (no draft)",
}
BACKGROUND = {"accepted": "#c8f7c5", "corrected": "#ffc9b3", "bonus": "#c5dcff", "target": "#e8e8e8"}  # HTML
ANSI = {"accepted": "\033[32m", "corrected": "\033[1;31m", "bonus": "\033[34m", "target": "\033[0m"}  # terminal
ANSI_RESET = "\033[0m"
PLAIN_MARKERS = {"accepted": ("[", "]"), "corrected": ("{", "}"), "bonus": ("<", ">"), "target": ("", "")}


def token_pieces(tokenizer, token_ids: list[int]) -> list[str]:
    """The text each token adds, found by decoding growing prefixes.

    Decoding tokens one at a time would break characters that span several byte-level
    tokens (accents, emoji); the difference of prefix decodings never does.
    """
    pieces, previous = [], ""
    for i in range(len(token_ids)):
        text = tokenizer.decode(token_ids[: i + 1], skip_special_tokens=True)
        pieces.append(text[len(previous):] if text.startswith(previous) else text)
        previous = text
    return pieces


def mark_tokens(pieces: list[str], sources: list[str], color: bool) -> str:
    """Terminal text: runs of equal source in ANSI colour, or in plain brackets [ ] { } < >."""
    out, i = [], 0
    while i < len(pieces):
        j = i
        while j < len(pieces) and sources[j] == sources[i]:
            j += 1
        run = "".join(pieces[i:j])
        if color:
            out.append(f"{ANSI[sources[i]]}{run}{ANSI_RESET}")
        else:
            left, right = PLAIN_MARKERS[sources[i]]
            out.append(f"{left}{run}{right}")
        i = j
    return "".join(out)


def legend(color: bool) -> str:
    """One line explaining the terminal marks."""
    if color:
        parts = [f"{ANSI[s]}{WORDS[s]}{ANSI_RESET}" for s in SOURCES]
    else:
        parts = [f"{PLAIN_MARKERS[s][0]}{WORDS[s]}{PLAIN_MARKERS[s][1]}" for s in SOURCES[:-1]]
        parts.append(f"unmarked: {WORDS['target']}")
    return "legend: " + " · ".join(parts)


def tokens_html(tokenizer, result, legend: bool = True, row: int = 0) -> str:
    """HTML with one coloured span per new token of ``result``'s row ``row`` (hover shows its source)."""
    pieces = token_pieces(tokenizer, result.row(row).tolist())
    sources = result.token_sources[row]
    spans = [
        f'<span title="{s}" style="background:{BACKGROUND[s]};color:#000;border-radius:3px;padding:0 1px;'
        f'white-space:pre-wrap">{html.escape(text)}</span>'
        for text, s in zip(pieces, sources)
    ]
    body = "".join(spans)
    if legend:
        used = [s for s in SOURCES if s in set(sources)]
        keys = " ".join(
            f'<span style="background:{BACKGROUND[s]};color:#000;padding:0 4px;border-radius:3px">{WORDS[s]}</span>'
            for s in used
        )
        body += f'<div style="margin-top:6px;font-size:85%">{keys}</div>'
    return f'<div style="font-family:monospace;line-height:1.7">{body}</div>'


def show_tokens(tokenizer, result, legend: bool = True, row: int = 0):
    """Display the coloured tokens of one row in a notebook."""
    from IPython.display import HTML, display

    display(HTML(tokens_html(tokenizer, result, legend, row)))


def draw_feature_drafters():
    """Medusa and EAGLE side by side, as block diagrams (matplotlib). Returns the figure.

    Both read f_t, the target's last hidden state (the input of its ``lm_head``), which the
    verify pass computed anyway. Medusa puts K extra heads on f_t, each guessing one position
    further; EAGLE runs one small decoder layer on (f_t, x_{t+1}) to predict the next *feature*
    f̂_{t+1}, reads it with the target's own head, and repeats on its own prediction.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6))

    def box(ax, x, y, w, h, text, color):
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.02", fc=color, ec="#333"))
        ax.text(x, y, text, ha="center", va="center", fontsize=9)

    def arrow(ax, x0, y0, x1, y1, style="-|>", color="#333"):
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), arrowprops=dict(arrowstyle=style, color=color, lw=1.2))

    frozen, new, token = "#dde6f3", "#f6d8b8", "#e3f1dc"
    ax = axes[0]
    ax.set_title("Medusa: K heads on the target's last feature")
    box(ax, 0.2, 0.15, 0.3, 0.12, "target decoder\n(frozen)", frozen)
    box(ax, 0.2, 0.45, 0.22, 0.1, r"$f_t$", frozen)
    arrow(ax, 0.2, 0.21, 0.2, 0.4)
    box(ax, 0.2, 0.8, 0.22, 0.1, r"lm_head → $x_{t+1}$", frozen)
    arrow(ax, 0.2, 0.5, 0.2, 0.75)
    for k, y in enumerate((0.8, 0.6, 0.4), start=1):
        box(ax, 0.6, y, 0.2, 0.13, f"head {k}\nh + SiLU(W h)", new)
        box(ax, 0.88, y, 0.18, 0.1, f"lm_head → $x_{{t+{k + 1}}}$", token)
        arrow(ax, 0.31, 0.45, 0.5, y)
        arrow(ax, 0.7, y, 0.79, y)
    ax.text(0.6, 0.22, "all heads guess at once,\nfrom the same $f_t$", ha="center", fontsize=9, style="italic")
    ax = axes[1]
    ax.set_title("EAGLE: one layer that predicts the next feature")
    box(ax, 0.14, 0.62, 0.2, 0.1, r"$f_t$ (target)", frozen)
    box(ax, 0.14, 0.38, 0.2, 0.1, r"embed($x_{t+1}$)", frozen)
    box(ax, 0.4, 0.5, 0.14, 0.1, "fc([f ; e])", new)
    arrow(ax, 0.24, 0.62, 0.33, 0.52)
    arrow(ax, 0.24, 0.38, 0.33, 0.48)
    box(ax, 0.62, 0.5, 0.18, 0.12, "1 decoder layer\n(own KV cache)", new)
    arrow(ax, 0.47, 0.5, 0.53, 0.5)
    box(ax, 0.86, 0.5, 0.16, 0.1, r"$\hat f_{t+1}$", new)
    arrow(ax, 0.71, 0.5, 0.78, 0.5)
    box(ax, 0.86, 0.8, 0.2, 0.1, r"lm_head → $x_{t+2}$", token)
    arrow(ax, 0.86, 0.55, 0.86, 0.75)
    ax.annotate("", xy=(0.14, 0.69), xytext=(0.86, 0.45), arrowprops=dict(
        arrowstyle="-|>", color="#c60", lw=1.2, connectionstyle="arc3,rad=-0.5", linestyle="--"))
    ax.text(0.5, 0.12, r"next draft step: $\hat f_{t+1}$ and the drafted $x_{t+2}$ go back in (dashed)",
            ha="center", fontsize=9, style="italic")
    for ax in axes:
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.axis("off")
    fig.tight_layout()
    return fig


#: Colours of the KV-cache picture: the token colours above, plus drafts not yet judged and rejected ones.
KV_COLORS = {"context": BACKGROUND["target"], "pending": "#fff2cc", "accepted": BACKGROUND["accepted"],
             "rejected": "#ffffff", "unjudged": "#ffffff", "corrected": BACKGROUND["corrected"], "bonus": BACKGROUND["bonus"]}
KV_HATCHES = {"rejected": "xx", "unjudged": ".."}  # the two kinds of draft that the crop removes


def kv_crop_rows(prompt_len: int, gamma: int, n_accepted: int) -> dict[str, dict]:
    """The numbers behind :func:`draw_kv_crop`: for each moment of one greedy round, how many positions the
    target's KV cache holds (``cached``) and which cells are drawn (``cells``, a list of kinds).

    The package's bookkeeping (``speculative_generate``): the cache holds every token of the context except
    the last one, which is fed, with the γ drafts, to the one verify forward. ``prompt_len`` is the length of
    the context when the round starts (the prompt, or everything generated so far).

    After the verify forward the drafts are ``accepted`` (the agreeing prefix), then at most one ``rejected``
    (the first disagreement: the only draft the rule judged and turned down), then ``unjudged``: drafts after a
    rejection are never judged, because the target's correction replaces the text they were drafted after.
    """
    for name, value in (("prompt_len", prompt_len), ("gamma", gamma), ("n_accepted", n_accepted)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if prompt_len < 1:
        raise ValueError(f"prompt_len={prompt_len}: a round starts from at least one token of context")
    if gamma < 1:
        raise ValueError(f"gamma={gamma}: a round drafts at least one token")
    if not 0 <= n_accepted <= gamma:
        raise ValueError(f"n_accepted={n_accepted}: a round accepts between 0 and gamma={gamma} drafts")
    last = "bonus" if n_accepted == gamma else "corrected"
    rejected = ["rejected"] + ["unjudged"] * (gamma - n_accepted - 1) if n_accepted < gamma else []
    return {
        "before": {"cached": prompt_len - 1, "cells": ["context"] * prompt_len + ["pending"] * gamma},
        "verified": {"cached": prompt_len + gamma,
                     "cells": ["context"] * prompt_len + ["accepted"] * n_accepted + rejected + [last]},
        "cropped": {"cached": prompt_len + n_accepted,
                    "cells": ["context"] * prompt_len + ["accepted"] * n_accepted + [last]},
    }


def draw_kv_crop(prompt_len: int, gamma: int, n_accepted: int, max_context_cells: int = 6):
    """The target's KV cache in one greedy round, as three rows of cells (matplotlib). Returns the figure.

    1. before the verify pass: the context is cached except its last token (dashed: not cached yet); the γ
       drafts (pale yellow) are not in the target's cache;
    2. after the verify forward over [last] + γ drafts: all of them are cached; the target accepted the
       first ``n_accepted`` (green), rejected the next one (cross-hatched), never judged the drafts after it
       (dotted) and chose one more token, a correction (orange) or, if all were accepted, a bonus (blue),
       which is not cached yet;
    3. after ``crop``: the positions of the rejected and the never-judged drafts are removed; the cache again
       holds everything except the newest token, which the next round's verify pass feeds first.

    Long contexts are drawn as their last ``max_context_cells`` cells after an ellipsis; each row's label
    gives the real number of cached positions (``kv_crop_rows`` has the numbers).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    rows = kv_crop_rows(prompt_len, gamma, n_accepted)
    if max_context_cells < 1:
        raise ValueError(f"max_context_cells={max_context_cells}: draw at least one context cell")
    hidden = max(0, prompt_len - max_context_cells)  # context cells left out of the drawing
    titles = {
        "before": f"before verify: {rows['before']['cached']} cached",
        "verified": f"after the verify forward: {rows['verified']['cached']} cached",
        "cropped": f"after the crop: {rows['cropped']['cached']} cached",
    }
    width = 2.6 + 0.42 * (min(prompt_len, max_context_cells) + gamma + 3.5 + (hidden > 0))
    fig, ax = plt.subplots(figsize=(max(7.0, width), 3.2))
    for r, (moment, row) in enumerate(rows.items()):
        y = 2 - r
        ax.text(-0.3, y + 0.4, titles[moment], ha="right", va="center", fontsize=9)
        x = 0.0
        if hidden:
            ax.text(x + 0.5, y + 0.4, f"…{hidden}", ha="center", va="center", fontsize=8)
            x += 1
        for i, kind in enumerate(row["cells"]):
            if kind == "context" and i < hidden:
                continue
            cached = i < row["cached"]
            rect = Rectangle((x + 0.05, y + 0.05), 0.9, 0.7, facecolor=KV_COLORS[kind], edgecolor="#333",
                             linestyle="-" if cached else "--", hatch=KV_HATCHES.get(kind),
                             gid=f"{moment}:{kind}:{'cached' if cached else 'not cached'}")
            ax.add_patch(rect)
            x += 1
        if moment == "cropped":
            removed = gamma - n_accepted
            note = "nothing to remove" if not removed else f"{removed} position{'s' * (removed != 1)} removed:\n" + (
                f"1 rejected, {removed - 1} never judged" if removed > 1 else "the rejected draft")
            ax.text(x + 0.2, y + 0.4, note, ha="left", va="center", fontsize=8, style="italic")
    labels = [("context", "context"), ("pending", "draft, before the verify pass"), ("accepted", "accepted draft"),
              ("rejected", "rejected draft (judged)"), ("unjudged", "never judged (after a rejection)"),
              ("corrected" if n_accepted < gamma else "bonus", "correction" if n_accepted < gamma else "bonus token")]
    handles = [Rectangle((0, 0), 1, 1, facecolor=KV_COLORS[k], edgecolor="#333", hatch=KV_HATCHES.get(k)) for k, _ in labels]
    handles.append(Rectangle((0, 0), 1, 1, facecolor="white", edgecolor="#333", linestyle="--"))
    ax.legend(handles, [t for _, t in labels] + ["dashed: not in the cache"], loc="upper center",
              bbox_to_anchor=(0.5, -0.02), ncol=3, fontsize=8, frameon=False)
    ax.set_xlim(-0.2, (hidden > 0) + min(prompt_len, max_context_cells) + gamma + 4)  # room for the crop's note
    ax.set_ylim(-0.1, 3)
    ax.axis("off")
    ax.set_title(f"The target's KV cache in one round: γ = {gamma}, {n_accepted} accepted", fontsize=10)
    fig.tight_layout()
    return fig
