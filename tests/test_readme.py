"""The README's cheat-sheet, FAQ and references stay correct: links resolve, formulas and numbers match the package.

Fast (text only, no models): the README's worked examples of Leviathan's formula are recomputed here from
``specdec_edu.theory``. The figures it quotes from notebooks and results files are checked by
``tests/test_readme_figures.py``.
"""

import json
import re
import unicodedata
from pathlib import Path

import pytest

from specdec_edu.theory import expected_speedup, expected_tokens_per_round, optimal_gamma

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def section(title: str) -> str:
    """The text of the ``## title`` section, up to the next ``## `` heading."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.MULTILINE | re.DOTALL)
    assert match, f"README.md has no '## {title}' section"
    return match.group(1)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower()
    text = "".join(ch for ch in text if ch in " -_" or unicodedata.category(ch)[0] in "LN")
    return text.replace(" ", "-")


def anchors() -> set[str]:
    return {github_slug(h) for h in re.findall(r"^#{1,6} (.+)$", README, re.MULTILINE)}


def number(text: str) -> float:
    return float(text.replace("×", ""))


def test_ci_runs_the_readmes_test_command():
    """CI calls the README's test command: its pytest, as the README writes it, is a line of ``.ci/run``."""
    installs = [line for line in re.findall(r"^python3 -m venv .*$", README, re.MULTILINE) if '".[test]"' in line]
    assert len(installs) == 1, installs
    pytest_command = installs[0].rsplit(" && ", 1)[1]
    assert pytest_command.startswith(".venv/bin/python -m pytest"), pytest_command
    assert pytest_command in (ROOT / ".ci" / "run").read_text().splitlines()


# --- structure ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("title", ["Cheat-sheet", "FAQ", "References"])
def test_the_three_closing_sections_exist(title):
    assert section(title).strip()


def test_the_cheat_sheet_anchor_that_notebook_10_links_to_exists():
    assert "cheat-sheet" in anchors()


def test_the_cheat_sheet_fits_on_one_page():
    lines = section("Cheat-sheet").strip().splitlines()
    assert len(lines) <= 80, f"the cheat-sheet has {len(lines)} lines; keep it to one page"


def test_the_cheat_sheet_states_the_rule_the_residual_the_bonus_and_the_proof():
    sheet = section("Cheat-sheet")
    for phrase in ["min(1, p(x)/q(x))", "normalize(max(0, p − q))", "bonus", "= p(x)",
                   "Σ max(0, p − q)", "1 − TV(p, q)", "α = E[β]", "(1 − α^(γ+1))/(1 − α)"]:
        assert phrase in sheet, phrase
    for drafter in ["separate small model", "prompt lookup", "LayerSkip", "Medusa", "EAGLE-3", "MTP"]:
        assert drafter in sheet, drafter


def test_the_faq_answers_the_readers_questions():
    faq = section("FAQ")
    questions = re.findall(r"^\*\*(.+?\?)\*\*", faq, re.MULTILINE)
    for topic in ["change the output", "Why not always", "batching", "memory", "temperature"]:
        assert any(topic.lower() in q.lower() for q in questions), f"no FAQ question about {topic!r}: {questions}"
    for answer in re.split(r"^\*\*.+?\?\*\*", faq, flags=re.MULTILINE)[1:]:
        assert re.search(r"\]\(notebooks/\d\d_\w+\.ipynb\)|\]\(#[\w-]+\)", answer), f"answer without a link: {answer[:80]}"


# --- links -------------------------------------------------------------------------------------------------------

EXPECTED_REFERENCES = [
    "https://arxiv.org/abs/2211.17192", "https://arxiv.org/abs/2302.01318", "https://arxiv.org/abs/2401.10774",
    "https://arxiv.org/abs/2401.15077", "https://arxiv.org/abs/2406.16858", "https://arxiv.org/abs/2503.01840",
    "https://arxiv.org/abs/2305.09781", "https://arxiv.org/abs/2404.16710",
    "https://github.com/apoorvumang/prompt-lookup-decoding", "https://arxiv.org/abs/2412.19437",
    "https://arxiv.org/abs/2401.07851",
]
ARXIV = re.compile(r"https://arxiv\.org/abs/\d{4}\.\d{4,5}")
GITHUB = re.compile(r"https://github\.com/[A-Za-z0-9-]+/[A-Za-z0-9._-]+")


def test_every_reference_link_is_well_formed_and_every_expected_one_is_there():
    refs = section("References")
    urls = re.findall(r"https?://[^\s)>]+", refs)
    assert urls, "no links in References"
    for url in urls:
        assert ARXIV.fullmatch(url) or GITHUB.fullmatch(url), f"malformed reference link: {url}"
    assert len(urls) == len(set(urls)), "a reference is listed twice"
    assert set(EXPECTED_REFERENCES) <= set(urls), set(EXPECTED_REFERENCES) - set(urls)


def test_every_reference_says_which_notebook_uses_it():
    entries = re.findall(r"^- (.+?)(?=^- |\Z)", section("References"), re.MULTILINE | re.DOTALL)
    assert len(entries) >= len(EXPECTED_REFERENCES)
    for entry in entries:
        assert re.search(r"\]\(notebooks/\d\d_\w+\.ipynb\)", entry), f"no notebook named in: {entry[:80]}"


def test_every_notebook_the_readme_names_exists_and_every_notebook_is_in_the_course_table():
    named = set(re.findall(r"notebooks/[\w.-]+\.ipynb", README))
    assert named
    for path in named:
        assert (ROOT / path).is_file(), f"README.md names {path}, which does not exist"
    course = section("The course")
    for nb in NOTEBOOKS:
        assert f"(notebooks/{nb.name})" in course, f"{nb.name} is missing from the course table"


def test_every_in_page_anchor_resolves():
    known = anchors()
    for anchor in re.findall(r"\]\(#([\w-]+)\)", README):
        assert anchor in known, f"README.md links #{anchor}, which is no heading"


def test_notebook_links_into_the_readme_resolve():
    """Notebooks link to README sections (notebook 10: the cheat-sheet); those anchors must exist."""
    known = anchors()
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for anchor in re.findall(r"README\.md#([\w-]+)", text):
            assert anchor in known, f"{nb.name} links README.md#{anchor}, which is no heading"


# --- numbers -----------------------------------------------------------------------------------------------------

def test_the_speedup_formula_is_the_packages():
    sheet = section("Cheat-sheet")
    assert "**speedup = (1 − α^(γ+1)) / ((1 − α)(γc + 1))**" in sheet
    assert "**τ = 1 + α + … + α^γ = (1 − α^(γ+1))/(1 − α)**" in sheet
    for alpha, gamma, c in [(0.8, 4, 0.05), (0.6, 3, 0.1), (0.3, 7, 0.02)]:  # the formula as written, at a few points
        written = (1 - alpha ** (gamma + 1)) / ((1 - alpha) * (gamma * c + 1))
        assert expected_speedup(alpha, gamma, c) == pytest.approx(written, rel=1e-12)


def test_the_worked_example_table_matches_the_package():
    rows = re.findall(r"^\| (0\.\d+) \| ([\d.]+) \| ([\d.]+×) \| (\d+) \| ([\d.]+×) \|$", section("Cheat-sheet"), re.MULTILINE)
    header = re.search(r"^\| α \(c = ([\d.]+)\) \| τ at γ = (\d+) \|", section("Cheat-sheet"), re.MULTILINE)
    assert header and len(rows) >= 2, "the worked-example table is missing"
    c, gamma = float(header.group(1)), int(header.group(2))
    assert any(float(r[0]) == 0.8 for r in rows) and (c, gamma) == (0.05, 4)  # the example the issue asks for
    for alpha, tau, speedup, best, best_speedup in rows:
        alpha = float(alpha)
        assert number(tau) == pytest.approx(expected_tokens_per_round(alpha, gamma), abs=0.005)
        assert number(speedup) == pytest.approx(expected_speedup(alpha, gamma, c), abs=0.005)
        assert int(best) == optimal_gamma(alpha, c)
        assert number(best_speedup) == pytest.approx(expected_speedup(alpha, int(best), c), abs=0.005)


def test_the_worked_example_matches_the_formula():
    sheet = section("Cheat-sheet")
    match = re.search(r"5 ms vs 50 ms per token \(c = ([\d.]+)\), γ = (\d+), so a round costs (\d+) × 5 \+ 50 = (\d+) ms",
                      " ".join(sheet.split()))
    assert match
    c, gamma, drafts, round_ms = float(match.group(1)), int(match.group(2)), int(match.group(3)), int(match.group(4))
    assert c == 5 / 50 and drafts == gamma and round_ms == gamma * 5 + 50
    quoted = [number(x) for x in re.findall(r"tokens?\s+in\s+70\s+ms\s+instead\s+of\s+\d+\s+ms,\s+([\d.]+×)", sheet)]
    assert quoted == pytest.approx([expected_speedup(1.0, gamma, c),  # all accepted + the bonus
                                    4 / (gamma * c + 1),              # 3 accepted + 1 correction
                                    1 / (gamma * c + 1)], abs=0.005)  # none accepted


@pytest.mark.embedded
def test_the_package_in_30_seconds_runs_as_written(capsys):
    """The README's first code block, run as written on the embedded pair: the answer ends at the model's EOS and
    prints no special tokens. Before, it passed no eos_token_id and printed `<|im_end|>` and the start of another
    turn after the answer (stopped_by 'max_new_tokens')."""
    code = re.search(r"## The package in 30 seconds\n+```python\n(.*?)```", README, re.DOTALL).group(1)
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)
    printed = capsys.readouterr().out
    assert scope["out"].stats.stopped_by == "eos" and "<|im_" not in printed, printed


def test_every_relative_link_in_the_readme_resolves():
    """A link's target on one line, naming a file or folder of the repository (a target wrapped onto the next line
    renders as text: a rewrap once split `assets/results/noteboo` / `ks_older_…`)."""
    text = README
    targets = re.findall(r"\]\(([^)]*)\)", text)
    assert targets, "no links found"
    broken = [t for t in targets if "\n" in t or " " in t.strip()]
    assert broken == [], broken
    missing = [t for t in targets if not re.match(r"[a-z]+:|#", t) and not (ROOT / t.split("#")[0]).exists()]
    assert missing == [], missing
