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
