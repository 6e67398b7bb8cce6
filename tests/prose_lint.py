"""Find prose that states the direction of a comparison without a check (test-side, used by
``tests/test_notebook_prose.py``).

``record`` + ``<!-- check: ... -->`` (``specdec_edu.course.claims``) catch a number or a comparison that a re-run
flips, but only where the prose carries a check. A *direction* written in words ("most points sit below it",
"the ratio falls as the batch grows", "furthest below at high α") drifts just as easily, and nothing catches it.
So every clause of a notebook's markdown that uses a comparison word must either

* end before a ``<!-- check: ... -->`` that tests it (a check covers the comparison words of its clause that come
  *before* it: checks go at the end of what they check), or
* be printed by the code instead (the prose then says where to look, with no direction of its own), or
* be conceptual (true whatever a run measures) and stand on the allow-list (``tests/prose_allowed.txt``) with
  its reason.

A clause is a piece of a sentence between ``.``, ``;`` or ``:`` outside parentheses (a bullet or a table row is its
own sentence).
Questions are not claims, and the Objectives list and the exercise statements are skipped; the recaps
("What you learned") are not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

COMPARISON = re.compile(
    r"\b(above|below|under|beneath|more|less|fewer|faster|slower|quicker|higher|lower|larger|smaller|bigger|"
    r"cheaper|dearer|costlier|longer|shorter|better|worse|rises?|rising|rose|falls?|falling|fell|grows?|growing|grew|"
    r"shrinks?|shrinking|shrank|climbs?|climbing|drops?|dropping|dropped|drifts?|increases?|decreases?|"
    r"most|least|closer|closest|furthest|farther|farthest|exceeds?|exceeding|beats?|beating|"
    r"outperforms?|overshoots?|undershoots?|loses|losing|wins?|winning|best|worst|highest|lowest|largest|smallest)\b",
    re.IGNORECASE,
)
"""Words that state which way a comparison goes. A clause holding one needs a check (or the allow-list)."""

NOT_A_COMPARISON = re.compile(
    r"\b(?:at (?:least|most|best)|most likely|no (?:more|longer)|more or less|one more (?:token|row)|best fixed γ)\b|"
    r"\b(?:above|below)\b(?!\s+(?:(?:it|them|the|this|that|these|those|its|their|a|an|half|one|zero|what|any|"
    r"every|FORMULA|CODE)\b|[\d≈~]))",
    re.IGNORECASE,
)
"""Phrases that use a comparison word for something else: a bound ("at least one token"), a choice ("the most
likely token"), or a place on the page ("printed above", "(α above)", "the table below shows"): "above" and
"below" compare only when an object follows ("below it", "above the curve", "below 1")."""

CHECK = re.compile(r"<!--\s*check:.*?-->", re.DOTALL)
_MARK = "\x00"  # a check's place in the text, one character wide
_SKIPPED_SECTIONS = ("## Objectives", "## Exercises")
_HEADING = re.compile(r"^#{1,6} ", re.MULTILINE)


@dataclass(frozen=True)
class Flag:
    """One clause whose comparison words carry no check: where it is, and the words."""

    notebook: str
    cell: int
    sentence: str
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.notebook} cell {self.cell}: [{', '.join(self.words)}] {self.sentence}"


MEASURED = re.compile(
    r"\b(?:measur\w*|printed|plotted|shown|timed|here|this run|the runs?|runs?|in the table|the (?:plot|figure|bars?|"
    r"curve|points?|columns?)|on this (?:cpu|device|machine|gpu)|on (?:the|one) h200|h200|notebook \d\d|"
    r"than (?:the )?target(?:-only| alone)?|than (?:a |the )?(?:small |standalone )?draft(?: model)?'?s?)\b|"
    r"\d(?:×|x\b)|\d\s*(?:ms\b|%)",
    re.IGNORECASE,
)
"""What makes a sentence speak of a measurement: a word pointing at a run or an output, a measured quantity
(a ratio ×, milliseconds, a percentage), or a comparison with the target or the draft ("faster than the
target": what the notebooks measure, and what a review found written without a check). A comparison in a
sentence without any of them is taken as conceptual (a property of the formula or the algorithm, true whatever a
run measures) and not flagged."""


def _plain(markdown: str) -> str:
    """The markdown's prose: checks become one marker each; code, formulas, links' targets and HTML go."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.DOTALL)  # fenced code
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.DOTALL)  # display formulas
    text = CHECK.sub(_MARK, text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)  # other comments
    text = re.sub(r"<[^>]+>", " ", text)  # HTML tags (a <details> summary keeps its words)
    text = re.sub(r"`[^`]*`", "CODE", text)  # inline code: a name, not a claim
    text = re.sub(r"\$[^$\n]+\$", "FORMULA", text)
    text = re.sub(r"(?<=\S)\*+|\*+(?=\S)", "", text)  # *emphasis* and **bold** (a bullet's "* " stays)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    return text


def _without_skipped_sections(markdown: str) -> str:
    """The cell minus its Objectives and Exercises sections (each runs to the next heading of any level)."""
    pieces = _HEADING.split(markdown)
    heads = _HEADING.findall(markdown)
    kept = [pieces[0]]
    for head, body in zip(heads, pieces[1:]):
        if not any((head + body).startswith(s) for s in _SKIPPED_SECTIONS):
            kept.append(head + body)
    return "".join(kept)


def sentences(markdown: str) -> list[str]:
    """The cell's sentences (a bullet, a table row and a heading are sentences too), checks as markers."""
    text = _plain(markdown)
    text = re.sub(r"^#{1,6} +([^\n]*)\n", r"\1\n\n", text, flags=re.MULTILINE)  # a heading is a sentence of its own
    text = re.sub(r"\n\s*(?:[-*+]|\d+\.|\|)\s+", "\n\n", text)  # each bullet / numbered item / table row apart
    found = []
    for block in re.split(r"\n\s*\n|\n(?=#)|(?<=\|)\n", text):
        block = " ".join(block.split())
        found += [s for s in re.split(r"(?:(?<=[.!?])|(?<=[.!?][)\]\"']))\s+(?=[^a-z\s])", block) if s.strip()]
    # a check written just after a sentence's full stop belongs to that sentence
    for i in range(1, len(found)):
        while found[i].startswith(_MARK):
            found[i - 1] += _MARK
            found[i] = found[i][1:].lstrip()
    return [s for s in found if s.strip(_MARK + " ")]


def unchecked(sentence: str) -> list[str]:
    """The comparison words of ``sentence`` (checks as markers) that no check covers.

    The sentence is cut into clauses at ``;`` and ``:`` outside parentheses; within a clause a check covers the
    words before it.
    A question is not a claim: it has none.
    """
    if sentence.rstrip(_MARK + " ").endswith("?") or not MEASURED.search(sentence):
        return []
    words = []
    for clause in _clauses(sentence):
        tail = clause.rsplit(_MARK, 1)[-1]  # the words after the clause's last check
        tail = NOT_A_COMPARISON.sub(" ", tail)
        words += [m.group(0) for m in COMPARISON.finditer(tail)]
    return words


def _clauses(sentence: str) -> list[str]:
    """The sentence cut at ``;`` and ``:`` outside parentheses (a parenthesis is part of its clause)."""
    clauses, depth, start = [], 0, 0
    for i, ch in enumerate(sentence):
        depth += (ch == "(") - (ch == ")")
        if ch in ";:" and depth <= 0 and sentence[i + 1:i + 2].isspace():
            clauses.append(sentence[start:i])
            start = i + 1
    return clauses + [sentence[start:]]


def readable(sentence: str) -> str:
    """A sentence as the report shows it: each check as ``<check>``."""
    return sentence.replace(_MARK, " <check>").strip()


def markdown_cells(notebook: Mapping) -> list[tuple[int, str]]:
    """(index, source) of the markdown cells the lint reads: all but the exercise statements and solutions
    (every markdown cell from the one that opens '## Exercises' up to the '**Next:**' link)."""
    cells, in_exercises = [], False
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if "## Exercises" in source:
            in_exercises = True
            source = source.split("## Exercises")[0]
        elif in_exercises and not source.lstrip().startswith("**Next:**"):
            continue
        cells.append((index, _without_skipped_sections(source)))
    return cells


def lint(notebook: Mapping, name: str) -> list[Flag]:
    """Every sentence of ``notebook`` with a comparison word that no check covers."""
    flags = []
    for index, source in markdown_cells(notebook):
        for sentence in sentences(source):
            words = unchecked(sentence)
            if words:
                flags.append(Flag(name, index, readable(sentence), tuple(words)))
    return flags


@dataclass(frozen=True)
class Allowed:
    """An allow-list entry: a conceptual sentence (by a unique piece of it) and why it needs no check."""

    notebook: str
    piece: str
    reason: str


def allow_list(path: Path) -> list[Allowed]:
    """Read ``notebook | piece of the sentence | reason`` lines (``#`` starts a comment line)."""
    entries = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in line.split(" | ")]
        if len(parts) != 3 or not all(parts):
            raise ValueError(f"{path.name}:{number}: write 'notebook | piece of the sentence | reason', got {line!r}")
        entries.append(Allowed(*parts))
    return entries


def _matches(entry: Allowed, flag: Flag) -> bool:
    return flag.notebook.startswith(entry.notebook) and entry.piece in flag.sentence


def is_allowed(flag: Flag, entries: list[Allowed]) -> bool:
    return any(_matches(e, flag) for e in entries)


def review(flags: list[Flag], entries: list[Allowed]) -> tuple[list[str], list[str]]:
    """(flagged sentences no entry allows, entries that do not match exactly one flagged sentence).

    An entry must pick out one sentence: a piece that matched several could wave through a measured direction
    written next to a conceptual one.
    """
    unexplained = [str(f) for f in flags if not is_allowed(f, entries)]
    loose = [f"{e.notebook} | {e.piece}  (matches {n} flagged sentences)" for e in entries
             if (n := sum(_matches(e, f) for f in flags)) != 1]
    return unexplained, loose
