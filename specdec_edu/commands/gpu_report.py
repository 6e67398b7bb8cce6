"""``python -m specdec_edu gpu-report``: what the course will see on this device, in one command.

Made for a Colab GPU (in a notebook cell: ``!python -m specdec_edu gpu-report``), it runs anywhere:

1. the device, the dtype the course picks there (``models.devices.default_dtype``) and the path (compiled or
   eager, ``compiles_by_default``);
2. the cold start of this process: loading the pair, compiling it (or capturing its CUDA graphs), and the
   first generated token, each timed;
3. the target's memory floor (its weight bytes ÷ the read bandwidth measured here), the measured target and
   draft steps on the path in use, c = draft step ÷ target step, and the verify cost (a (γ + 1)-token forward
   ÷ a one-token one);
4. the measured speedup of greedy speculative decoding with the pair's own draft, over a few chat prompts,
   and with a dial drafter at α = 0.8 (``ReplayDrafter``: α known, c the real draft's), each beside
   Leviathan's prediction, and a verdict sentence computed from them.

The pair is ``default_pair()`` (``--pair`` to choose): ``smollm2`` on a Colab GPU, the embedded pair on a CPU.
``--quick`` shortens the answers and the repeats (the tests use it). On a T4 the default settings are meant to
finish in under 3 minutes after the download (unmeasured: no T4 has run it yet).

:func:`predicted_table` is the README's "what to expect on your GPU" table: a *prediction* from datasheet
bandwidths and the per-layer cost measured on one H200 (``--predict`` prints it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import torch

from .. import kv
from ..result import GenerationStats

#: A few chat prompts of the kind the course asks (the pair's own draft is measured on these).
CHAT_PROMPTS = (
    "Explain photosynthesis in two sentences.",
    "Give three tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
)
DIAL_ALPHA = 0.8
#: The seed of every speculative run's generator here: the dial's reference is settled with the same draws.
DIAL_SEED = 0


@dataclass
class ReportSettings:
    """The knobs of one report: answer length, γ, repeats of each timing, prompts used."""

    max_new_tokens: int = 64
    gamma: int = 4
    repeats: int = 2
    prompts: tuple[str, ...] = CHAT_PROMPTS
    bandwidth_bytes: int | None = None  # the read-bandwidth buffer (default: see step_costs)
    quick: bool = False  # the --quick settings (a disagreement then says to run without it)

    @classmethod
    def quick_settings(cls) -> ReportSettings:
        return cls(max_new_tokens=16, gamma=4, repeats=1, prompts=CHAT_PROMPTS[:1], quick=True)


def step_costs(target, draft, gamma: int, compiled: bool, bandwidth_bytes: int | None = None, repeats: int = 5) -> dict:
    """What one decoding step costs here, on the path in use (``compiled``): seconds and ratios.

    Returns ``read_bandwidth`` (bytes/s, ``torch.sum`` over ``bandwidth_bytes``), ``weight_bytes`` and
    ``memory_floor`` (weight bytes ÷ bandwidth: no step can be faster), ``target_step`` and ``draft_step``
    (a one-token step, median of ``repeats``: the draft's as its drafter takes it, with its reduced head if it has
    one), ``c`` (the median of their ratio over ``repeats`` sweeps that time them in turns, ``step_seconds``) and
    ``verify_cost`` (a (γ + 1)-token
    target forward ÷ a one-token one: the median of ``repeats`` interleaved sweeps, ``measured_verify_cost``).
    ``bandwidth_bytes`` defaults to 1 GiB on CUDA (so that the reduction outlasts its launch) and 256 MiB elsewhere
    (more than a CPU's caches).
    """
    from ..course.measure import VerifyCost, measured_verify_cost, parameter_bytes, read_bandwidth, step_seconds

    if bandwidth_bytes is None:
        bandwidth_bytes = 2**30 if target.device.type == "cuda" else 2**28
    bandwidth = read_bandwidth(target.device, bandwidth_bytes)
    weight_bytes = parameter_bytes(target)
    target_step, draft_step, c = step_seconds(target, draft, repeats=repeats, compile=compiled)  # the generations' caches
    verify_cost = measured_verify_cost(target, gamma + 1, sweeps=max(VerifyCost.MIN_SWEEPS, repeats),
                                       compile=compiled)
    return {"read_bandwidth": bandwidth, "weight_bytes": weight_bytes, "memory_floor": weight_bytes / bandwidth,
            "target_step": target_step, "draft_step": draft_step, "c": c,
            "verify_cost": verify_cost}


def verdict(costs: dict, alpha: float, gamma: int, measured: float | None = None, subject: str = "this pair",
            quick: bool = False) -> str:
    """The sentence that says whether ``subject`` pays here, computed from ``costs`` (``step_costs``) and α.

    With ``measured`` (the speedup a run just measured), the sentence gives it beside the prediction and concludes only
    where both agree: a sentence must not say "pays" under a measured slowdown, or the other way round. ``quick``: the
    run was ``--quick``'s, and a disagreement says to run without it."""
    from ..theory import alpha_for_speedup, expected_speedup

    c, verify = costs["c"], costs["verify_cost"]
    if alpha != alpha:  # NaN: no draft was judged (every round drafted nothing), so the formula has no α to take
        return ("No draft was judged in this run, so α is undefined and Leviathan's formula predicts nothing"
                + (f"; measured {measured:.2f}×." if measured is not None else "."))
    leviathan = expected_speedup(alpha, gamma, c)
    with_verify = expected_speedup(alpha, gamma, c, verify)
    try:
        needed = f"it breaks even from α ≈ {alpha_for_speedup(1.0, gamma, c, verify):.2f}"
    except ValueError:
        needed = "no α breaks even at this γ"
    predicted = (f"Leviathan's formula predicts {leviathan:.2f}× with c = {c:.2f}, and {with_verify:.2f}× with the "
                 f"verify cost measured here ({verify:.2f} steps)")
    pays = "pays" if with_verify > 1 else "does not pay"
    if measured is None:
        return f"At α = {alpha:.2f}, γ = {gamma}: {predicted}, so {subject} {pays} on this device ({needed})."
    if (measured > 1) != (with_verify > 1):
        return (f"At α = {alpha:.2f}, γ = {gamma}: measured {measured:.2f}×, but {predicted}: they disagree on whether "
                f"{subject} pays here ({needed}). Short runs are noisy: "
                + ("run without --quick, on an idle device." if quick else "run again on an idle device."))
    return (f"At α = {alpha:.2f}, γ = {gamma}: measured {measured:.2f}×; {predicted}. So {subject} {pays} on this "
            f"device ({needed}).")


def describe_costs(costs: dict, device, dtype, compiled: bool, draft_eager: bool = False) -> str:
    """Lines for ``step_costs``'s numbers: the memory floor first, then the steps and c. ``draft_eager``: the draft
    runs eager on a compiled path (compiling it failed), and its step was timed so."""
    ms = lambda s: f"{s * 1e3:.2f} ms"  # noqa: E731
    path = "compiled" + (" (the draft eager)" if draft_eager else "") if compiled else "eager"
    return "\n".join([
        f"memory floor of a target step: {costs['weight_bytes'] / 1e9:.2f} GB of weights ÷ "
        f"{costs['read_bandwidth'] / 1e9:.0f} GB/s read here = {ms(costs['memory_floor'])}",
        f"measured on {torch.device(device).type}, {str(dtype).removeprefix('torch.')}, {path}: target step "
        f"{ms(costs['target_step'])} ({costs['target_step'] / costs['memory_floor']:.1f}× its floor), draft step "
        f"{ms(costs['draft_step'])}, c = {costs['c']:.2f}, verify of γ + 1 tokens = {costs['verify_cost']:.2f} steps",
    ])


def _median_speedup(target, drafter, prompt, settings: ReportSettings, eos) -> tuple[float, GenerationStats, dict]:
    """(speedup, stats, check report) of greedy speculative decoding over target-only, interleaved: the speedup is
    the median's, the stats the speculative runs' totals (``GenerationStats.pooled``: their α from all the drafts
    judged)."""
    from .. import autoregressive_generate, speculative_generate
    from ..course.diagnostics import OutputMismatch, check_same_output
    from ..course.experiments import interleaved_benchmark

    kw = dict(max_new_tokens=settings.max_new_tokens, eos_token_id=eos)
    runs = interleaved_benchmark({
        "target": lambda: autoregressive_generate(target, prompt, **kw),
        # a fresh generator for each run, seeded as the dial's reference was settled
        "spec": lambda: speculative_generate(target, drafter, prompt, gamma=settings.gamma, **kw,
                                             generator=torch.Generator(prompt.device).manual_seed(DIAL_SEED)),
    }, repeats=settings.repeats, progress=False)
    base, spec = runs["target"][-1], runs["spec"][-1]
    try:
        check = check_same_output(target, prompt, base.row(0), spec.row(0), gamma=settings.gamma)
    except OutputMismatch as exc:  # the report goes on: its numbers still say what this device does
        check = {"identical": False, "message": f"OUTPUT CHECK FAILED: {exc}"}
    speed = lambda rs: statistics.median(r.stats.tokens_per_second for r in rs)  # noqa: E731
    return speed(runs["spec"]) / speed(runs["target"]), GenerationStats.pooled([r.stats for r in runs["spec"]]), check


def run_report(target, draft, tokenizer, settings: ReportSettings | None = None, out: TextIO = sys.stdout,
               pair: str = "?", load_seconds: float | None = None) -> dict:
    """Measure and print the report for a loaded pair; returns its numbers (a dict)."""
    from .. import autoregressive_generate, chat_prompt, speculative_generate
    from ..course.experiments import ReplayDrafter, settled_reference
    from ..generate import compiles_by_default
    from ..models.devices import device_name, dtype_reason

    settings = settings or ReportSettings()
    device, dtype = target.device, next(target.parameters()).dtype
    name = device_name(device)
    say = lambda line="": print(line, file=out, flush=True)  # noqa: E731
    say(f"device: {device.type} ({name}) · torch {torch.__version__} · pair: {pair}")
    say(f"dtype:  {dtype_reason(device, dtype)}")

    eos, prompts = tokenizer.eos_token_id, [chat_prompt(tokenizer, p, device=device) for p in settings.prompts]
    start = time.perf_counter()  # the first call compiles (or captures) both models' caches, then decodes
    first_run = speculative_generate(target, draft, prompts[0], max_new_tokens=1, gamma=settings.gamma)
    first = time.perf_counter() - start
    compiled = first_run.stats.compiled  # the target's path: False where compiling failed and it fell back to eager
    draft_eager = compiled and not first_run.stats.draft_compiled  # the draft's compile can fail on its own
    fell_back = (" (compiling failed here: see the warning above)" if compiles_by_default(device) and not compiled else
                 " for the target; the draft runs eager (compiling it failed here: see the warning above)" if draft_eager
                 else "")
    say(f"path:   {compiled_path(device) if compiled else 'eager'}{fell_back}; SPECDEC_EDU_COMPILE=0/1/inductor changes it")
    loaded = f"load {load_seconds:.1f} s + " if load_seconds is not None else ""
    first_part = "compile/capture and first token" if compiled else "first token (eager: nothing to compile)"
    say(f"cold start in this process: {loaded}{first_part} {first:.1f} s "
        "(scripts/cold_start.py times a fresh process, part by part)")

    costs = step_costs(target, draft, settings.gamma, compiled, settings.bandwidth_bytes, repeats=3 * settings.repeats)
    say(describe_costs(costs, device, dtype, compiled, draft_eager))

    speedups, own_stats = [], []
    for i, prompt in enumerate(prompts, start=1):  # a line before each: minutes of silence would look like a hang
        say(f"  timing prompt {i}/{len(prompts)}: target-only and speculative, {settings.repeats} run(s) each ...")
        speedup, stats, check = _median_speedup(target, draft, prompt, settings, eos)
        speedups.append(speedup)
        own_stats.append(stats)
        if not check["identical"]:
            say(f"  note: {check['message']}")
    # α from every draft judged on every prompt, as bench and the notebooks take it: a median of per-prompt α
    # would weigh a prompt whose answer stopped after a few drafts as much as one with hundreds
    alpha_own, speedup_own = GenerationStats.pooled(own_stats).alpha, statistics.median(speedups)
    say(f"the pair's own draft, {len(prompts)} chat prompt(s), {settings.max_new_tokens} new tokens, γ = "
        f"{settings.gamma}: measured {speedup_own:.2f}× (median over prompts), α = {alpha_own:.2f} (all prompts' drafts)")
    say("  " + verdict(costs, alpha_own, settings.gamma, speedup_own, quick=settings.quick))

    vocab = target.config.vocab_size
    reference = autoregressive_generate(target, prompts[0], max_new_tokens=settings.max_new_tokens).sequences[0]
    noise = (1 - DIAL_ALPHA) / (1 - 1 / vocab)  # α = 1 − noise + noise / V
    # in 16 bit a verify pass can break a near-tie otherwise than one-token steps: replay what the dial's run keeps
    reference, replays = settled_reference(target, reference, prompts[0].shape[1], settings.gamma, noise=noise,
                                           seed=DIAL_SEED)
    if replays > 1:
        say(f"  note: the dial replays the greedy output its run keeps, found in {replays} runs (in "
            f"{str(dtype).replace('torch.', '')} a verify pass broke a near-tie otherwise than one-token steps)")
    dial = ReplayDrafter(reference, noise, vocab, cost_model=draft, device=device)
    dial_speedup, dial_stats, _ = _median_speedup(target, dial, prompts[0], settings, eos=None)
    dial_alpha = dial_stats.alpha
    say(f"dial drafter at α = {DIAL_ALPHA} (the real draft's cost, α set by a dial): measured {dial_speedup:.2f}× "
        f"(α = {dial_alpha:.2f} in the run, by chance on {settings.max_new_tokens} tokens)")
    # the prediction at the α the run had, which the measured speedup answers to (the dial sets 0.8 on average)
    say("  " + verdict(costs, dial_alpha, settings.gamma, dial_speedup,
                       subject=f"a drafter with this draft's cost at α = {dial_alpha:.2f}", quick=settings.quick))
    return {"device": name, "dtype": str(dtype), "compiled": compiled, "first_call_seconds": first, **costs,
            "speedup_own": speedup_own, "alpha_own": alpha_own, "speedup_dial": dial_speedup,
            "alpha_dial": dial_alpha, "dial_reference_replays": replays}


def compiled_path(device: torch.device) -> str:
    """The compiled path's name on ``device``, as ``kv.full_compile_options`` picks it."""
    if kv.full_compile_options(device, None).get("backend") == kv.CAPTURE:
        return "compiled (CUDA graphs recorded from the eager forward, no compiler)"
    return "compiled (torch.compile" + ("; inductor with CUDA graphs)" if device.type == "cuda" else ")")


# ---- the README's "what to expect on your GPU" table: a prediction ------------------------------------------

#: Datasheet memory bandwidth (GB/s) of the GPUs learners meet; the README's table predicts from these.
DATASHEET_GB_S = {"T4": 320, "L4": 300, "A100 40 GB": 1555, "A100 80 GB": 2039, "H100 SXM": 3350, "H200": 4800}
#: Measured on one H200 (``assets/results/gpu_h200_2026-11-30``, gpu_check, compiled with CUDA graphs, bf16):
#: the 24-layer SmolLM2-1.7B target step 2.43 ms, the 30-layer SmolLM2-135M draft 9.58 ms per 4 drafted tokens.
H200_TARGET_MS, H200_DRAFT_MS_PER_TOKEN, H200_READ_FRACTION = 2.431, 9.583 / 4, 4.21 / 4.8
#: The same run's compiled draft + target row at the dial's α 0.80, γ 4: its c (draft seconds per drafted token ÷
#: the target step, over the whole run: more than the median round's 9.58 / 4 ms), its verify pass in target steps,
#: and its measured speedup.
H200_RUN = {"c": 1.048, "verify_cost": 1.20, "speedup": 0.637}
SMOLLM2 = {"target_bytes": 3_422_752_768, "target_layers": 24, "draft_bytes": 2 * 134_515_008, "draft_layers": 30}


def predicted_row(gb_s: float, gamma: int = 4, alpha: float = DIAL_ALPHA) -> dict:
    """Predicted target step, draft step, c and speedup for the ``smollm2`` pair (16-bit) on a GPU of ``gb_s``.

    A compiled step costs at least its memory floor (weight bytes ÷ read bandwidth, taken as the datasheet
    figure × the 88 % the H200 read) and at least its layers × the per-layer cost measured on the H200 (the
    fixed work per layer that left the H200's steps 3× above their floor). An older GPU likely spends more
    per layer than the H200, so for the draft this is optimistic: a prediction, not a measurement.
    """
    from ..theory import expected_speedup

    read = gb_s * 1e9 * H200_READ_FRACTION
    per_layer_target, per_layer_draft = H200_TARGET_MS / 24, H200_DRAFT_MS_PER_TOKEN / 30
    target_ms = max(SMOLLM2["target_bytes"] / read * 1e3, SMOLLM2["target_layers"] * per_layer_target)
    draft_ms = max(SMOLLM2["draft_bytes"] / read * 1e3, SMOLLM2["draft_layers"] * per_layer_draft)
    c = draft_ms / target_ms
    return {"target_ms": target_ms, "draft_ms": draft_ms, "c": c, "speedup": expected_speedup(alpha, gamma, c)}


def predicted_table(gamma: int = 4, alpha: float = DIAL_ALPHA) -> str:
    """The README's table (markdown): predicted rows for every GPU in :data:`DATASHEET_GB_S`, then the one
    measured row (H200, gpu_check)."""
    lines = [f"| GPU | datasheet bandwidth | target step | draft step | c | speedup at α {alpha}, γ {gamma} | source |",
             "|---|---|---|---|---|---|---|"]
    for gpu, gb_s in DATASHEET_GB_S.items():
        r = predicted_row(gb_s, gamma, alpha)
        lines.append(f"| {gpu} | {gb_s:,} GB/s | {r['target_ms']:.1f} ms | {r['draft_ms']:.1f} ms | {r['c']:.2f} | "
                     f"{r['speedup']:.2f}× | predicted |")
    run = H200_RUN  # its draft step is c × target step: the step its c was measured with (the columns then agree)
    lines.append(f"| H200 | 4,800 GB/s | {H200_TARGET_MS:.1f} ms | {run['c'] * H200_TARGET_MS:.1f} ms | {run['c']:.2f} | "
                 f"{run['speedup']:.2f}× | measured (random weights; α 0.80, γ 4, its verify pass {run['verify_cost']:.2f} "
                 "steps) |")
    return "\n".join(lines)


# ---- the command ---------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..models.embedded import PAIRS

    parser.add_argument("--pair", choices=sorted(PAIRS), default=None,
                        help="model pair (default: default_pair(): $SPECDEC_EDU_PAIR if set, else smollm2 on a Colab GPU, "
                        "else embedded); a hub pair downloads several GB from the Hugging Face hub once")
    parser.add_argument("--quick", action="store_true", help="short answers, one prompt, one repeat (a smoke test)")
    parser.add_argument("--predict", action="store_true", help="print the README's predicted table and exit")


def main(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from ..models.embedded import default_pair, load_pair

    out = out or sys.stdout
    if args.predict:
        if args.quick or args.pair:  # a prediction from datasheets: nothing of either would be used
            raise SystemExit("--predict prints a fixed table (datasheet bandwidths, no model runs): leave out "
                             "--quick and --pair, or leave out --predict to measure")
        print(predicted_table(), file=out)
        return 0
    from ..models.devices import on_colab

    if on_colab() and not torch.cuda.is_available():  # the report would be about Colab's CPU, in silence
        print("note: this Colab runtime has no GPU, so this reports its CPU: Runtime > Change runtime type > T4 GPU, "
              "then run it again", file=out, flush=True)
    pair = args.pair or default_pair()
    start = time.perf_counter()
    target, draft, tokenizer = load_pair(pair)
    run_report(target, draft, tokenizer, ReportSettings.quick_settings() if args.quick else ReportSettings(), out,
               pair=pair, load_seconds=time.perf_counter() - start)
    return 0
