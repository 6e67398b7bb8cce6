"""``python -m specdec_edu demo``: watch speculative decoding work, and measure it.

What the demo does, step by step:

1. loads the embedded pair (target: SmolLM2-135M-Instruct, Q4_1-dequantized; draft: the tiny
   model in ``assets/draft/``; see :mod:`specdec_edu.models.embedded`);
2. warms both up (the first forward passes of a process are slow: memory allocation,
   thread pools), so that the timings compare steady states;
3. for each drafter, decodes the *same* prompt with the target alone and with speculative
   decoding, alternating the two (best of ``repeats`` runs each), so that both see the same
   machine conditions;
4. prints the speculative output with every token marked by where it came from:

   * ``[accepted]``: proposed by the drafter and accepted by the target,
   * ``{corrected}``: the target rejected a draft and put this token in its place,
   * ``<bonus>``: every draft of the round was accepted, and the verification pass gave
     this extra token for free;
   * unmarked: decoded by the target alone, because the drafter had nothing to propose
     (prompt lookup finds no earlier match of the last n-gram);

5. prints a summary: speed of both, the measured speedup, and the quantities of Leviathan
   et al.'s analysis: α (acceptance rate), τ (tokens per target forward pass), c (cost of
   one draft token relative to one target decoding step) and the predicted speedup
   ``(1 − α^(γ+1)) / ((1 − α)(γc + 1))``.

Three drafters are compared by default:

* **model**: the tiny standalone draft model; a general-purpose guesser, asked an open question.
* **prompt lookup**: no model at all; it proposes the tokens that followed the last
  occurrence of the current n-gram earlier in the context. It shines when the answer
  copies from the input, so by default it gets a "rewrite this paragraph" prompt.
* **suffix**: no model either (:mod:`specdec_edu.suffix`): the longest match of the context's
  end in the request *or* in the target's own earlier answers (``assets/feature_data``), extended
  by the most frequent continuation. It gets the open question, where prompt lookup finds little.

``--drafter eagle`` or ``medusa`` runs one feature drafter alone, and ``all`` adds EAGLE to the three
(``assets/eagle/``, ``assets/medusa/``, trained by ``scripts/train_feature_drafters.py``; not yet faster than
the target on this CPU).

With greedy decoding (the default) speculative decoding must produce *exactly* the target's
own output; the demo checks that token for token and prints ``yes`` in its ``identical to target-only`` row.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import TextIO

import torch

from ..course.diagnostics import first_difference
from ..course.viz import ANSI, ANSI_RESET, legend, mark_tokens, token_pieces  # noqa: F401 (ANSI*: re-exported for tests)
from .args import positive_float, positive_int, random_seed

DRAFTER_LABELS = {"model": "model draft", "eagle": "EAGLE (features)", "medusa": "Medusa (features)",
                  "prompt-lookup": "prompt lookup", "suffix": "suffix (no model)"}
DRAFTER_SETS = {"all": ("model", "eagle", "prompt-lookup", "suffix"), "three": ("model", "prompt-lookup", "suffix"),
                "both": ("model", "prompt-lookup")}

#: The model draft's default prompt: an open question, not one of the draft's training prompts.
DEFAULT_OPEN_PROMPT = "Why do cats purr, and what does it mean when they do? Answer in a short paragraph."

#: Prompt lookup's default prompt: the answer should copy long stretches of the input.
DEFAULT_REWRITE_PROMPT = (
    "Rewrite the following paragraph, fixing the spelling mistakes and keeping everything "
    "else the same:\n\n"
    "The Eiffel Tower was bulit in Paris for the World's Fair of 1889. Its desginer, the "
    "engineer Gustave Eiffel, used more than eighteen thousand iron parts and two and a half "
    "million rivets. Many artists of the time called the tower ugly and asked for it to be "
    "taken down. It was saved because it was useful as a radio antenna. Today it is one of "
    "the most visited monuments in the world."
)


@dataclass
class DemoSettings:
    """The knobs of one demo run (the command-line flags, minus model loading)."""

    prompt: str | None = None
    gamma: int = 4
    max_new_tokens: int = 64
    sample: bool = False
    temperature: float = 1.0
    seed: int = 0
    drafters: tuple[str, ...] = ("model", "prompt-lookup", "suffix")
    color: bool = False
    repeats: int = 2


@dataclass
class DrafterReport:
    """Everything measured for one drafter: the two runs and the derived quantities."""

    drafter: str
    prompt: str
    baseline: object  # autoregressive_generate's result (target only)
    speculative: object  # speculative_generate's result
    new_tokens: list[int] = field(default_factory=list)
    identical: bool | None = None  # None when sampling (outputs are different draws)
    first_difference: int | None = None
    near_tie: bool | None = None  # outputs that part: True where 16-bit rounding can flip that token (else a bug)
    difference_note: str = ""  # check_same_output's one line on where and why they part
    speedup: float = float("nan")
    c: float = float("nan")
    verify_cost: float = float("nan")
    predicted: float = float("nan")
    predicted_with_verify_cost: float = float("nan")


# --------------------------------------------------------------------------------------
# Running the two decoders
# --------------------------------------------------------------------------------------
def make_drafter(kind: str, draft_model, target=None):
    """Build the drafter object for ``kind`` ("model", "eagle", "medusa", "prompt-lookup" or "suffix")."""
    from .. import PromptLookupDrafter, load_drafter

    if kind in ("eagle", "medusa", "suffix"):
        return load_drafter(kind, target)
    if kind == "model":
        if draft_model is None:
            raise ValueError("the model drafter needs a draft model")
        # The model itself: speculative_generate makes a fresh ModelDrafter of it per call, compiled wherever the
        # target is (a ModelDrafter made here would stay eager beside a compiled target on a GPU).
        return draft_model
    if kind == "prompt-lookup":
        return PromptLookupDrafter(max_ngram=3)
    raise ValueError(f"unknown drafter {kind!r}; choose one of {sorted(DRAFTER_LABELS)}")


def default_prompt(kind: str) -> str:
    """The default prompt for a drafter: copy-heavy for prompt lookup, open for a model."""
    return DEFAULT_REWRITE_PROMPT if kind == "prompt-lookup" else DEFAULT_OPEN_PROMPT


def _sampling_kwargs(settings: DemoSettings, device) -> dict:
    """Arguments shared by both decoders; a fresh, equally seeded generator for every run."""
    generator = None
    if settings.sample:
        generator = torch.Generator(device=torch.device(device).type).manual_seed(settings.seed)
    return dict(
        max_new_tokens=settings.max_new_tokens,
        do_sample=settings.sample,
        temperature=settings.temperature,
        generator=generator,
    )


def run_both(target, draft_model, kind, input_ids, settings, eos_token_id):
    """Decode ``input_ids`` target-only and speculatively, alternating, best of ``repeats``.

    Returns ``(baseline, speculative)``: for each, the run with the shortest wall time
    (the one least disturbed by whatever else the machine was doing). Every run gets a
    fresh drafter, so that none reuses another's draft KV cache.
    """
    from .. import autoregressive_generate, speculative_generate
    from ..drafters import wants_features

    baselines, speculatives = [], []
    for _ in range(max(1, settings.repeats)):
        drafter = make_drafter(kind, draft_model, target)
        # A drafter that reads the target's features runs eager (never compiled): its baseline must too, or the
        # speedup, c and the verify cost would compare two paths (on CUDA, eager against CUDA graphs).
        baselines.append(autoregressive_generate(
            target, input_ids, eos_token_id=eos_token_id, compile=False if wants_features(drafter) else None,
            **_sampling_kwargs(settings, target.device)))
        speculatives.append(speculative_generate(
            target, drafter, input_ids, gamma=settings.gamma,
            eos_token_id=eos_token_id, **_sampling_kwargs(settings, target.device)))
    fastest = lambda runs: min(runs, key=lambda r: r.stats.seconds)  # noqa: E731
    return fastest(baselines), fastest(speculatives)


def cost_stats(target, draft_model, kind, input_ids, settings, eos_token_id):
    """The stats to read the draft and verify seconds from: the timed run's own on a CPU (its clock sees all the
    work), ``None``; elsewhere one more run with ``profile=True``. A GPU runs queued work asynchronously and the
    timed runs read the device once per round, at the verify, so their draft seconds are only the time to queue
    the drafting, and its GPU time lands in the verify: c near 0 and the verify cost too high."""
    from .. import speculative_generate

    if target.device.type == "cpu":
        return None
    return speculative_generate(target, make_drafter(kind, draft_model, target), input_ids, gamma=settings.gamma,
                                eos_token_id=eos_token_id, profile=True,
                                **_sampling_kwargs(settings, target.device)).stats


def warm_up(target, draft_model, kinds, input_ids, settings, eos_token_id) -> None:
    """A few tokens through every code path, so that one-off start-up costs are not timed."""
    short = dataclasses.replace(settings, max_new_tokens=4, repeats=1)
    for kind in kinds:
        run_both(target, draft_model, kind, input_ids, short, eos_token_id)


# --------------------------------------------------------------------------------------
# From two runs to the numbers of the analysis
# --------------------------------------------------------------------------------------
def target_step_seconds(baseline) -> float:
    """Seconds of one target-only decoding step (one forward, one token; prefill excluded); NaN where the run
    took none (one new token comes from the prefill): c and the verify cost are then n/a, not a ratio to the
    prefill."""
    stats = baseline.stats
    return stats.verify_seconds / stats.rounds if stats.rounds else float("nan")


def analyse(kind, prompt, input_ids, baseline, speculative, settings, costs=None) -> DrafterReport:
    """Derive speedup, c, verify cost and the predicted speedups from the two runs.

    ``costs``: the stats to take the draft and verify seconds from (default: the speculative run's; on a GPU,
    a profiled run's, see :func:`cost_stats`).

    * c = (draft seconds per drafted token) / (seconds per target-only decoding step):
      what one guess costs in units of one ordinary decoding step.
    * verify cost = (seconds per verification pass) / (seconds per target-only step).
      Leviathan et al. assume 1: checking γ+1 tokens costs as much as decoding one, true
      on a GPU while decoding is memory-bound. On a CPU it is noticeably more than 1.
    """
    from .. import expected_speedup

    stats, gamma = speculative.stats, settings.gamma
    costs = costs or stats
    n_prompt = input_ids.shape[-1]
    report = DrafterReport(kind, prompt, baseline, speculative,
                           new_tokens=speculative.sequences[0, n_prompt:].tolist())
    report.speedup = stats.tokens_per_second / baseline.stats.tokens_per_second
    step = target_step_seconds(baseline)
    if costs.drafted:
        report.c = costs.draft_seconds / costs.drafted / step
    if costs.rounds:
        report.verify_cost = costs.verify_seconds / costs.rounds / step
    if stats.drafted and report.c == report.c:  # c is not NaN
        alpha = float(stats.alpha)
        report.predicted = expected_speedup(alpha, gamma, report.c)
        report.predicted_with_verify_cost = expected_speedup(
            alpha, gamma, report.c, verify_cost=report.verify_cost)
    if not settings.sample:
        report.first_difference = first_difference(
            speculative.sequences[0], baseline.sequences[0])
        report.identical = report.first_difference is None
    return report


def compare_drafter(target, draft_model, tokenizer, kind, settings) -> DrafterReport:
    """Run target-only and speculative decoding for one drafter and analyse the pair."""
    from ..models.embedded import chat_prompt

    prompt = settings.prompt or default_prompt(kind)
    input_ids = chat_prompt(tokenizer, prompt, device=target.device)
    eos = tokenizer.eos_token_id
    baseline, speculative = run_both(target, draft_model, kind, input_ids, settings, eos)
    costs = cost_stats(target, draft_model, kind, input_ids, settings, eos)
    report = analyse(kind, prompt, input_ids, baseline, speculative, settings, costs)
    if report.identical is False:  # greedy outputs that part: say whether rounding can explain it
        explain_difference(report, target, input_ids, settings.gamma)
    return report


def explain_difference(report: DrafterReport, target, input_ids, gamma: int) -> None:
    """Fill ``report.near_tie`` and ``report.difference_note`` for greedy outputs that part.

    The notebooks' one comparison, ``check_same_output``: in float32 any difference is a bug; in bf16/fp16 a
    token whose top-2 margin is within the measured rounding of a 1-token vs a (γ + 1)-token forward can flip
    (on a GPU, or with ``SPECDEC_EDU_DTYPE``), and the demo says so instead of a bare "NO".
    """
    from ..course.diagnostics import OutputMismatch, check_same_output

    try:
        check = check_same_output(target, input_ids, report.baseline.row(0), report.speculative.row(0), gamma)
        report.near_tie, report.difference_note = True, check["message"]
    except OutputMismatch as exc:
        report.near_tie, report.difference_note = False, str(exc)


# --------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------
def _fmt(x, spec: str = ".2f", suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "n/a"
    return f"{x:{spec}}{suffix}"


def identical_text(report: DrafterReport) -> str:
    """The summary's "identical to target-only" cell: yes, a 16-bit near-tie, NO (a bug), or n/a when sampling."""
    if report.identical is None:
        return "n/a (sampling)"
    if report.identical:
        return "yes"
    if report.near_tie:
        return f"no, from token {report.first_difference}: a 16-bit near-tie"
    return f"NO, from token {report.first_difference}"


def summary_rows(reports: list[DrafterReport], gamma: int) -> list[tuple[str, list[str]]]:
    """The summary table as (row label, one cell per drafter) pairs."""
    def row(label, get):
        return (label, [get(r) for r in reports])

    return [
        row("target-only tokens/s", lambda r: _fmt(r.baseline.stats.tokens_per_second, ".1f")),
        row("speculative tokens/s", lambda r: _fmt(r.speculative.stats.tokens_per_second, ".1f")),
        row("measured speedup", lambda r: _fmt(r.speedup, ".2f", "x")),
        row("α  acceptance rate", lambda r: _fmt(_float(r.speculative.stats.alpha))),
        row("τ  tokens per target forward", lambda r: _fmt(_float(r.speculative.stats.tau))),
        row("c  draft token / target step", lambda r: _fmt(r.c, ".3f")),
        row(f"predicted speedup (γ={gamma})", lambda r: _fmt(r.predicted, ".2f", "x")),
        row("verify cost / target step", lambda r: _fmt(r.verify_cost)),
        row("predicted, with that cost", lambda r: _fmt(r.predicted_with_verify_cost, ".2f", "x")),
        row("identical to target-only", identical_text),
    ]


def _float(x):
    return None if x is None else float(x)


def format_table(reports: list[DrafterReport], gamma: int) -> str:
    """Render :func:`summary_rows` as aligned text, one column per drafter."""
    header = ("", [DRAFTER_LABELS[r.drafter] for r in reports])
    rows = [header] + summary_rows(reports, gamma)
    w0 = max(len(label) for label, _ in rows)
    widths = [max(len(cells[i]) for _, cells in rows) for i in range(len(reports))]
    lines = ["  ".join([label.ljust(w0)] + [c.rjust(w) for c, w in zip(cells, widths)])
             for label, cells in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def print_report(report: DrafterReport, tokenizer, settings: DemoSettings, out: TextIO) -> None:
    """Print one drafter's prompt and marked output."""
    stats = report.speculative.stats
    print(f"\n=== {DRAFTER_LABELS[report.drafter]} (γ={settings.gamma}) ===", file=out)
    print(f"prompt: {_shorten(report.prompt)}", file=out)
    pieces = token_pieces(tokenizer, report.new_tokens)
    print(mark_tokens(pieces, list(report.speculative.token_sources[0]), settings.color), file=out)
    print(f"({stats.new_tokens} tokens in {stats.rounds} target forward passes; "
          f"{stats.accepted} of {stats.drafted} drafts accepted, of {stats.accepted + stats.rejected_rounds} judged: "
          "α counts the judged, and drafts after a rejection go unjudged)", file=out)


def _shorten(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verify_cost_note(reports: list[DrafterReport]) -> str:
    """What this run measured for checking γ+1 tokens, in target steps: more than one, about one, or n/a."""
    costs = [r.verify_cost for r in reports if r.verify_cost == r.verify_cost]
    if not costs:
        return " (not measured here: no target-only decoding step was timed)"
    low, high = min(costs), max(costs)
    size = "more than one" if low > 1.1 else "about one" if high < 1.1 else "one or more"
    span = f"{low:.2f}" if high - low < 0.005 else f"{low:.2f}–{high:.2f}"
    return f" (here checking γ+1 tokens cost {span} target steps: {size})"


def short_drafts_note(reports: list[DrafterReport], gamma: int) -> str:
    """A line naming the drafters that drafted under 0.9 γ per round on average (prompt lookup, suffix), or ""."""
    from ..theory import drafts_short_of_gamma

    short = [(DRAFTER_LABELS[r.drafter], r.speculative.stats.drafts_per_round) for r in reports
             if drafts_short_of_gamma(r.speculative.stats.drafts_per_round, gamma)]
    if not short:
        return ""
    per_round = ", ".join(f"{name} {d:.1f}" for name, d in short)
    return (f"drafts per round: {per_round}, not γ = {gamma}: the formula assumes γ drafts in every round, and their "
            "measured verify cost averages shorter checks, so for them both predictions are rough guides.")


def print_summary(reports: list[DrafterReport], settings: DemoSettings, out: TextIO, machine: str = "") -> None:
    """Print the table and the one-line explanations that go with it (``machine``: where it ran, for the header)."""
    mode = f"sampling, T={settings.temperature}, seed {settings.seed}" if settings.sample else "greedy"
    runs = "one run each" if settings.repeats <= 1 else f"best of {settings.repeats} runs each"
    print(f"\n=== summary ({mode}, {runs}) ===", file=out)
    if machine:  # on the output too, not only on stderr: every ratio below belongs to this machine
        print(f"measured on {machine}", file=out)
    print(format_table(reports, settings.gamma), file=out)
    print("predicted speedup: Leviathan et al., (1 − α^(γ+1)) / ((1 − α)(γc + 1)), which "
          "assumes a verify pass costs one target step;\n'with that cost' replaces the 1 "
          f"by the measured verify cost{verify_cost_note(reports)}: a round's verify forward, accept rule and read, "
          "over a target-only step, which counts its own sampling and read.", file=out)
    if note := short_drafts_note(reports, settings.gamma):
        print(note, file=out)
    for report in reports:
        if report.difference_note:
            print(f"{DRAFTER_LABELS[report.drafter]}: {report.difference_note}", file=out)


# --------------------------------------------------------------------------------------
# Entry points
# --------------------------------------------------------------------------------------
def run_demo(target, draft_model, tokenizer, settings: DemoSettings | None = None,
             out: TextIO | None = None) -> list[DrafterReport]:
    """Run the whole demo on given models and print it; returns one report per drafter.

    ``draft_model`` may be ``None`` when only the prompt-lookup drafter is used. This
    function does no model loading, so tests can call it with tiny random models.
    """
    settings = settings or DemoSettings()
    out = out or sys.stdout
    from ..models.embedded import chat_prompt

    warm_ids = chat_prompt(tokenizer, "Hello!", device=target.device)
    warm_up(target, draft_model, settings.drafters, warm_ids, settings, tokenizer.eos_token_id)
    print(legend(settings.color), file=out)
    reports = []
    for i, kind in enumerate(settings.drafters, start=1):  # each drafter's output as soon as it is measured
        print(f"[{i}/{len(settings.drafters)}] {DRAFTER_LABELS[kind]}: target-only and speculative, "
              f"{settings.repeats} run{'s' if settings.repeats > 1 else ''} each ...", file=sys.stderr, flush=True)
        reports.append(compare_drafter(target, draft_model, tokenizer, kind, settings))
        print_report(reports[-1], tokenizer, settings, out)
        out.flush()
    print_summary(reports, settings, out, describe_machine(target))
    return reports


def describe_machine(target) -> str:
    """Where the target runs, by name: the device, and on a CPU its thread count (every ratio depends on it)."""
    from ..models.devices import device_name

    where = f"{target.device} ({device_name(target.device)})"
    if target.device.type == "cpu":
        threads = torch.get_num_threads()
        where += f" with {threads} thread{'s' * (threads != 1)}"
    return where


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``demo`` subcommand's flags."""
    parser.add_argument("--prompt", default=None,
                        help="your own prompt (default: one suited to each drafter)")
    parser.add_argument("--gamma", type=positive_int, default=4, help="draft tokens per round (default 4)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens per answer (default 64)")
    parser.add_argument("--sample", action="store_true",
                        help="sample instead of greedy decoding: speculative and target-only outputs are "
                             "then different draws from the same distribution")
    parser.add_argument("--temperature", type=positive_float, default=None, help="with --sample (default 1.0)")
    parser.add_argument("--seed", type=random_seed, default=None, help="with --sample (default 0)")
    parser.add_argument("--drafter", choices=["model", "eagle", "medusa", "prompt-lookup", "suffix", "both", "three", "all"],
                        default="three", help="three: model, prompt-lookup and suffix (default); both: model and "
                        "prompt-lookup; all: model, eagle, prompt-lookup and suffix")
    parser.add_argument("--repeats", type=positive_int, default=2,
                        help="timed runs per decoder; the fastest counts (default 2)")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: best available)")
    parser.add_argument("--threads", type=positive_int, default=None,
                        help="torch CPU threads (default: torch's); the CPU's speed, and so every ratio, depends on it")
    parser.add_argument("--no-color", action="store_true", help="plain-text markers, no ANSI colour")


def settings_from_args(args: argparse.Namespace, out: TextIO) -> DemoSettings:
    """Turn parsed flags into :class:`DemoSettings`."""
    drafters = DRAFTER_SETS.get(args.drafter, (args.drafter,))
    if args.prompt is not None and not args.prompt.strip():  # `or default_prompt` would replace it in silence
        raise SystemExit("--prompt is empty: give the text to answer, or leave --prompt out for each drafter's own")
    if not args.sample and (args.temperature is not None or args.seed is not None):  # they would be ignored in silence
        raise SystemExit("--temperature and --seed set how --sample draws: add --sample, or leave them out "
                         "(greedy decoding draws nothing)")
    # Colour only for a terminal, and never if the user asked not to (--no-color, or the
    # NO_COLOR environment variable, a convention many command-line tools follow).
    color = (not args.no_color and "NO_COLOR" not in os.environ
             and hasattr(out, "isatty") and out.isatty())
    return DemoSettings(prompt=args.prompt, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                        sample=args.sample, temperature=1.0 if args.temperature is None else args.temperature,
                        seed=args.seed or 0,
                        drafters=drafters, color=color, repeats=args.repeats)


def load_models(settings: DemoSettings, device=None):
    """Load the embedded target, tokenizer and (if a drafter needs it) the draft model.

    If the draft model is missing but prompt lookup can still run (``--drafter both``),
    carry on without it and say so, rather than fail.
    """
    from ..models.devices import requested_device
    from ..models.embedded import load_embedded_draft, load_embedded_target, load_embedded_tokenizer
    from ..models.weights import EmbeddedModelError

    try:
        device = requested_device(device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    target = load_embedded_target(device)
    tokenizer = load_embedded_tokenizer()
    draft = None
    if "model" in settings.drafters:
        try:
            draft = load_embedded_draft(device)
        except EmbeddedModelError as exc:
            if settings.drafters == ("model",):
                raise
            settings.drafters = tuple(d for d in settings.drafters if d != "model")
            print(f"note: {exc}\nnote: continuing without the draft model: {', '.join(settings.drafters)}.",
                  file=sys.stderr)
    return target, draft, tokenizer


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """``python -m specdec_edu demo``: load the embedded pair and run :func:`run_demo`."""
    from ..models.devices import requested_device
    from ..models.weights import EmbeddedModelError

    out = out or sys.stdout
    settings = settings_from_args(args, out)
    try:
        device = requested_device(args.device)  # a bad --device is refused before anything loads
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    pair = os.environ.get("SPECDEC_EDU_PAIR", "").strip()
    if pair and pair != "embedded":
        print(f"note: SPECDEC_EDU_PAIR={pair} picks the notebooks' and gpu-report's pair; the demo always runs the "
              "embedded pair (bench --pair runs a hub pair)", file=sys.stderr)
    print("loading the embedded pair ...", file=sys.stderr, flush=True)
    try:
        target, draft, tokenizer = load_models(settings, device)
    except EmbeddedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.threads:
        torch.set_num_threads(args.threads)
    from ..generate import compiles_by_default

    path = "compiled (the warm-up compiles)" if compiles_by_default(target.device) else "eager"
    if path != "eager" and {"eagle", "medusa"} & set(settings.drafters):  # they read the target's features: eager
        path += "; EAGLE and Medusa, and their baselines, eager"
    dtype = str(next(target.parameters()).dtype).removeprefix("torch.")  # SPECDEC_EDU_DTYPE can change it: say which
    print(f"running on {describe_machine(target)}, {dtype}, {path}: warm-up, then target-only and speculative decoding "
          "alternately ...", file=sys.stderr, flush=True)
    run_demo(target, draft, tokenizer, settings, out)
    return 0
