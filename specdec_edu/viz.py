"""Showing what speculative decoding did: coloured tokens, in a notebook or a terminal.

Every new token carries its source (``GenerationResult.token_sources``):
accepted draft token, corrected (residual sample after a rejection), bonus, or target-only.
"""

from __future__ import annotations

import html

COLOURS = {  # background (HTML) and ANSI codes per source
    "accepted": ("#c8f7c5", "\033[42;30m"),
    "corrected": ("#ffc9b3", "\033[41;97m"),
    "bonus": ("#c5dcff", "\033[44;97m"),
    "target": ("#e8e8e8", "\033[47;30m"),
}
LEGEND = {
    "accepted": "draft token accepted by the target",
    "corrected": "rejected draft replaced by a target sample (residual)",
    "bonus": "bonus token after all drafts were accepted",
    "target": "decoded by the target alone",
}
_ANSI_RESET = "\033[0m"


def token_pieces(tokenizer, result) -> list[tuple[str, str]]:
    """``[(text, source)]`` for each new token, decoded one by one."""
    ids = result.new_tokens.tolist()
    return [(tokenizer.decode([t]), s) for t, s in zip(ids, result.token_sources)]


def tokens_html(tokenizer, result, legend: bool = True) -> str:
    """HTML with one coloured span per new token (hover shows its source)."""
    spans = [
        f'<span title="{s}" style="background:{COLOURS[s][0]};color:#000;border-radius:3px;padding:0 1px;'
        f'white-space:pre-wrap">{html.escape(text)}</span>'
        for text, s in token_pieces(tokenizer, result)
    ]
    body = "".join(spans)
    if legend:
        used = [s for s in COLOURS if s in set(result.token_sources)]
        keys = " ".join(
            f'<span style="background:{COLOURS[s][0]};color:#000;padding:0 4px;border-radius:3px">{LEGEND[s]}</span>'
            for s in used
        )
        body += f'<div style="margin-top:6px;font-size:85%">{keys}</div>'
    return f'<div style="font-family:monospace;line-height:1.7">{body}</div>'


def show_tokens(tokenizer, result, legend: bool = True):
    """Display the coloured tokens in a notebook."""
    from IPython.display import HTML, display

    display(HTML(tokens_html(tokenizer, result, legend)))


def tokens_text(tokenizer, result, colour: bool) -> str:
    """Terminal version: ANSI colours, or plain markers [accepted] {corrected} <bonus>."""
    marks = {"accepted": "[{}]", "corrected": "{{{}}}", "bonus": "<{}>", "target": "{}"}
    out = []
    for text, s in token_pieces(tokenizer, result):
        out.append(f"{COLOURS[s][1]}{text}{_ANSI_RESET}" if colour else marks[s].format(text))
    return "".join(out)


def text_legend(colour: bool) -> str:
    if colour:
        return "  ".join(f"{COLOURS[s][1]} {s} {_ANSI_RESET}" for s in ("accepted", "corrected", "bonus"))
    return "[accepted draft]  {corrected by target}  <bonus>"
