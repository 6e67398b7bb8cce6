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
