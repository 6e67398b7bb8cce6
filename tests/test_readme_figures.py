"""Every figure the README quotes from a notebook or a results file is read from that source here.

``FIGURES`` maps a phrase of the README (a regular expression over its text, line breaks ignored) with one group
per quoted figure to where each figure comes from: a value a notebook ``record``-ed, a constant of a notebook's
code, a key of a JSON file or a line of a log in ``assets/results/``. A quoted figure must equal its source
rounded to the digits the README shows. Re-executing a notebook or re-running a benchmark therefore fails this
test until the README says what the new outputs say. A second test makes the table complete: every measured
figure in the README's result sections (a decimal number, or a number followed by ×, ms, % or GiB) must belong
to one of the phrases below, so that no new figure escapes the check. Fast: JSON and text only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import pytest
from claims_eval import recorded_values

from specdec_edu.theory import expected_speedup

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "assets" / "results"
OLDER_TRANSFORMERS = RESULTS / "notebooks_older_transformers_cpu_2026-12-06.txt"
H200 = RESULTS / "gpu_h200_2026-11-30"


def flat(text: str) -> str:
    """The text with every run of whitespace made one space: line wrapping does not matter."""
    return " ".join(text.split())


README = flat((ROOT / "README.md").read_text(encoding="utf-8"))


# ---- sources ------------------------------------------------------------------------------------------------

@cache
def notebook(number: str) -> dict:
    path = next((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
    return json.loads(path.read_text(encoding="utf-8"))


def nb(number: str, name: str) -> Callable[[], float]:
    """A value notebook ``number`` stored with ``record(name=...)``."""
    return lambda: recorded_values(notebook(number))[name]


def nb_code(number: str, pattern: str) -> Callable[[], float]:
    """A constant in notebook ``number``'s code cells (the first group of ``pattern``)."""
    def read():
        code = "\n".join("".join(c["source"]) for c in notebook(number)["cells"] if c["cell_type"] == "code")
        return float(re.search(pattern, code).group(1))
    return read


@cache
def nb_printed(number: str, pattern: str) -> Callable[[], float]:
    """A number notebook ``number`` printed (the first group of ``pattern`` in its code cells' text outputs)."""
    def read():
        text = "\n".join("".join(o.get("text", "")) for c in notebook(number)["cells"] if c["cell_type"] == "code"
                         for o in c.get("outputs", []))
        return float(re.search(pattern, text).group(1))
    return read


def result(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def js(name: str, *keys) -> Callable[[], float]:
    """``assets/results/<name>``, then ``[key][key]…``."""
    def read():
        value = result(name)
        for key in keys:
            value = value[key]
        return value
    return read


def log(name: str, pattern: str, group: int = 1, folder: Path = H200) -> Callable[[], float]:
    """A number in a committed log of an H200 run (default: ``assets/results/gpu_h200_2026-11-30/``)."""
    return lambda: float(re.search(pattern, (folder / name).read_text(), re.MULTILINE).group(group).replace(",", ""))


DIAL_BF16 = "notebook07_dial_bf16_cpu_2026-12-04.txt"  # notebook 07's dial in bf16 on the CPU, before and after settling
COURSE_H200 = RESULTS / "gpu_h200_2026-12-04"  # the notebooks, fp16, the compiler failure and the cold start on CUDA


log2 = functools.partial(log, folder=COURSE_H200)  # a number in a file of the course's H200 run
log_results = functools.partial(log, folder=RESULTS)  # a number in a text file of assets/results/


def passed_rows(table: str) -> list[str]:
    """The notebooks with a "pass" row in a table of ``scripts/execute_notebooks.py``."""
    return re.findall(r"^(\d\d_\w+\.ipynb)\s+\d+\s+[\d.]+\s+pass", table, re.MULTILINE)


def older_transformers_table(k: int) -> str:
    """Section ``k`` of the older-transformers record: 4.56.2 before the RoPE fix (1), 5.25.0 (2), 4.56.2 after (3),
    the values compared (4), 5.2.0 (5), 5.17.0 on another machine (6)."""
    return OLDER_TRANSFORMERS.read_text().split("## ")[k]


def passed(call: str) -> list[str]:
    """The notebooks with a "pass" row in one call's table (``call1_notebooks.txt``, …)."""
    return passed_rows((COURSE_H200 / call).read_text())


def notebooks_passed_on_cuda() -> float:
    """Notebooks that passed in either call (call 2 reran the one call 1 failed)."""
    return len(set(passed("call1_notebooks.txt") + passed("call2_notebooks.txt")))


def warm_compiles() -> tuple[Callable, Callable]:
    """The 135 M target's compile times in notebooks 04-09 (started once 00-03 had filled inductor's disk cache)."""
    def seconds():
        text = (COURSE_H200 / "notebook_compiles.txt").read_text()
        return [float(s) for s in re.findall(r"^0[4-9]_\S+\tcell \d+\tLlamaForCausalLM \(135 M\)\t(\d+)$", text, re.MULTILINE)]
    return (lambda: min(seconds())), (lambda: max(seconds()))


def cold_row(cache: str) -> Callable[[], float]:
    return lambda: next(r for r in json.loads((COURSE_H200 / "call2_cold_start.json").read_text())["rows"]
                        if r["path"] == "cudagraphs" and r["cache"] == cache)["seconds"]["total"]


FP16 = "call1_gpu_report_fp16.txt"

LEASE2 = RESULTS / "gpu_h200_2026-12-04_lease2"  # the cold start with recorded CUDA graphs, and the 7b shapes


def cold2(path: str, cache: str, key: str = "total") -> Callable[[], float]:
    """A row of the second lease's cold start (``call1_cold_start.json``): its total seconds, or its target step."""
    def read():
        row = next(r for r in json.loads((LEASE2 / "call1_cold_start.json").read_text())["rows"]
                   if r["path"] == path and r["cache"] == cache)
        return row["target_step_ms"] if key == "step" else row["seconds"]["total"]
    return read


def cold2_overcounts() -> list[float]:
    """Per row of the second lease's cold start: its total less the sum of its parts (which end at the first token):
    the interpreter's start and, as the script then measured, the rounds after the first token."""
    rows = json.loads((LEASE2 / "call1_cold_start.json").read_text())["rows"]
    return [r["seconds"]["total"] - sum(v for k, v in r["seconds"].items() if k != "total") for r in rows]


def run7b(backend: str, *keys) -> Callable[[], float]:
    """A value of the second lease's 7b run: ``inductor`` (call 3) or ``capture`` (call 2)."""
    name = {"inductor": "call3_7b_inductor.json", "capture": "call2_7b_capture.json"}[backend]
    return js(f"{LEASE2.name}/{name}", *keys)


def ratio(a: Callable, b: Callable) -> Callable[[], float]:
    return lambda: a() / b()


def spread(*sources: Callable) -> tuple[Callable, Callable]:
    """The smallest and the largest of several sources: a range the README quotes as "low–high"."""
    return (lambda: min(s() for s in sources)), (lambda: max(s() for s in sources))


BENCH, LOOKUP, FEATURES = "bench_cpu_model.json", "bench_cpu_prompt_lookup.json", "feature_drafters_cpu.json"
EXACT = "run1_gpu_exact.log"
# The H200 run notebook 01 reads (gpu_check.py --compile --quick): eager and compiled rows
RUN4 = "gpu_h200_2026-11-30/run4_compiled_smollm2_quick.json"
H200_STEP_MS = js(RUN4, "latency_ms", "1")
H200_LONGEST = (lambda: max(int(n) for n in result(RUN4)["latency_ms"]))  # noqa: E731 (tokens in its longest forward)
H200_FLOOR_MS = js(RUN4, "memory_floor_ms")
H200_C = js(RUN4, "c_eager", "30x576")
H200_PARAM_RATIO = ratio(js(RUN4, "target_params"), js(RUN4, "draft_params", "30x576"))
DRAFT_ALPHAS = spread(nb("00", "alpha_model"), nb("00", "alpha_demo"), nb("02", "alpha_model"), nb("06", "alpha"))
CPU_VERIFY_COSTS = spread(nb("01", "t5_ratio"), nb("06", "verify_cost"), nb("07", "vc5"), nb("08", "vc"))


def feature(drafter: str, key: str):
    """Over γ = 2, 3, 4 of ``feature_drafters_cpu.json``: (smallest, largest) ``key`` of one drafter."""
    return spread(*[js(FEATURES, "drafters", drafter, g, key) for g in ("2", "3", "4")])


def one_of(pair):
    """A range that the README quotes as one number: both ends must round to it."""
    return pair


def drift_cut():
    """How much training-time test raised EAGLE's agreement at passes 2 and 3, relative to no remedy (%)."""
    runs = result("feature_drafters_remedies_cpu.json")["runs"]
    plain = runs["no remedy (unroll 1, noise 0)"]["validation_top1_per_pass"]
    ttt = next(r for name, r in runs.items() if name.startswith("training-time test"))["validation_top1_per_pass"]
    return 100 * sum(ttt[i] / plain[i] - 1 for i in (1, 2)) / 2


def round_overhead():
    """The loop's own share of a round (accept/resample, cache crop), in %."""
    phases = result(BENCH)["round_profile_ms"]
    return 100 * (phases["accept_resample"] + phases["cache_crop"]) / sum(phases.values())


def tok_s(name: str, method: str):
    return js(name, "tok_s", method)


def vs_target(name: str, method: str):
    return ratio(tok_s(name, method), tok_s(name, "target_only"))


def batched(batch: int, key: str):
    return lambda: next(row[key] for row in result(BENCH)["batched"] if row["batch"] == batch)


NUM = r"([\d.,]+)"
SUFFIX_BENCH = {key: f"suffix_bench_{key}_cpu.json" for key in ("input_grounded", "open_chat", "reworded")}
SUFFIX_BUDGET, SUFFIX_CURVE = "suffix_budget_cpu.json", "suffix_corpus_curve_cpu.json"


def suffix_repeat_spread() -> float:
    """The largest spread between the repeats of one method in the suffix benchmarks, in percent."""
    return 100 * max(max(v) / min(v) - 1 for key in SUFFIX_BENCH for v in result(SUFFIX_BENCH[key])["tok_s_per_repeat"].values())


def suffix_default(name: str) -> Callable[[], float]:
    """A default of ``SuffixDrafter`` (a setting chosen on the tuning prompts, quoted by the README)."""
    def read():
        import inspect

        from specdec_edu.suffix import SuffixDrafter

        return inspect.signature(SuffixDrafter).parameters[name].default
    return read


# (the README's phrase, one regex group per figure; the source of each figure, in order)
FIGURES: list[tuple[str, list]] = [
    # The course table, notebook 01
    (rf"a one-token step \(≈ {NUM} ms\) sits {NUM}× above its floor \(≈ {NUM} ms\)",
     [nb("01", "step_ms"), ratio(nb("01", "step_ms"), nb("01", "mem_floor_ms")), nb("01", "mem_floor_ms")]),
    (rf"on an H200 the course's 1\.7B target, eager, is nearly flat from 1 to {NUM} tokens yet {NUM}× above its floor",
     [H200_LONGEST, ratio(H200_STEP_MS, H200_FLOOR_MS)]),
    (rf"costs more per step than the target \(c = {NUM}\)\. A large model", [H200_C]),
    (rf"the worked example's 70B target: ≈ {NUM} ms of weight reads", [nb("01", "gpu_mem_floor_70b_ms")]),
    # The embedded pair
    (rf"is {NUM}–{NUM} in the notebooks' single-prompt runs \(notebooks 00, 02, 06\) and {NUM} pooled",
     [*DRAFT_ALPHAS, js(BENCH, "alpha")]),
    (rf"costs as much per step as the compiled target \({NUM}× at α = {NUM}\)",
     [js(RUN4, "speculative", 2, "speedup"), js(RUN4, "speculative", 2, "alpha")]),
    # Measured on this machine: the side-by-side benchmark
    (rf"\| target-only \(ours\) \| {NUM} \| {NUM} \| \| target-only \(HF `generate`\) \| {NUM} \| {NUM} \|",
     [tok_s(BENCH, "target_only"), vs_target(BENCH, "target_only"), tok_s(BENCH, "hf_target_only"),
      vs_target(BENCH, "hf_target_only")]),
    (rf"\*\*speculative, embedded draft \(ours\)\*\* \| \*\*{NUM}\*\* \| \*\*{NUM}\*\* \|",
     [tok_s(BENCH, "speculative"), js(BENCH, "speedup")]),
    (rf"same γ = 4 \| {NUM} \| {NUM} \| .{{0,80}}HF's defaults \| {NUM} \| {NUM} \|",
     [tok_s(BENCH, "hf_assisted"), vs_target(BENCH, "hf_assisted"), tok_s(BENCH, "hf_assisted_default"),
      vs_target(BENCH, "hf_assisted_default")]),
    (rf"Ours / HF assisted at the same γ: \*\*{NUM}×\*\*\. The run's own α = {NUM}, c = {NUM}: Leviathan's formula "
     rf"predicts {NUM}×; .{{0,80}}costs {NUM} one-token steps, .{{0,40}}it predicts {NUM}×; measured {NUM}×\. One round: "
     rf"draft {NUM} ms, verify forward {NUM} ms, accept/resample {NUM} ms, cache crop {NUM} ms "
     rf"— the loop's own overhead is ≈ {NUM} %",
     [js(BENCH, "speculative_vs_hf_assisted"), js(BENCH, "alpha"), js(BENCH, "c"), js(BENCH, "predicted_speedup"),
      js(BENCH, "verify_cost"), js(BENCH, "predicted_speedup_measured_verify"), js(BENCH, "speedup"),
      *[js(BENCH, "round_profile_ms", k) for k in ("draft", "verify_forward", "accept_resample", "cache_crop")],
      round_overhead]),
    (rf"\| target-only \(ours\) \| {NUM} \| {NUM} \| \| \*\*prompt lookup \(ours\)\*\* \| \*\*{NUM}\*\* \| \*\*{NUM}\*\* \| "
     rf"\| HF `generate\(prompt_lookup_num_tokens=4\)` \| {NUM} \| {NUM} \|",
     [tok_s(LOOKUP, "target_only"), vs_target(LOOKUP, "target_only"), tok_s(LOOKUP, "speculative"), js(LOOKUP, "speedup"),
      tok_s(LOOKUP, "hf_prompt_lookup"), vs_target(LOOKUP, "hf_prompt_lookup")]),
    (r" ".join(rf"\| {b} \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|" for b in (1, 4, 16)),
     [batched(b, k) for b in (1, 4, 16) for k in ("target_only_tok_s", "speculative_tok_s", "speedup", "alpha")]),
    (rf"on its own prompts \({NUM}× at batch 1, {NUM}× at batch 16, on the CPU of the committed notebooks,",
     [nb("09", "batch_speedup_1"), nb("09", "batch_speedup_16")]),
    # Measured on this machine: from the committed notebooks
    (rf"a bare target forward ≈ {NUM} ms in notebook 06", [nb("06", "t_target_ms")]),
    (rf"\| embedded draft \(γ = 4\) \| open chat questions \| {NUM} \| {NUM} \| \*\*{NUM}×\*\* \(Leviathan {NUM}×, "
     rf"with the measured verify cost {NUM}×\) \| notebook 06",
     [nb("06", "alpha"), nb("06", "tau_measured"), nb("06", "speedup"), nb("06", "ideal"), nb("06", "adjusted")]),
    *[(rf"\| prompt lookup \(γ = {NUM}\) \| {task} \| — \| {NUM} \| (?:\*\*)?{NUM}×(?:\*\*)? \| notebook 08",
       [nb_code("08", r"N_NEW, GAMMA_PL = \(\d+ if QUICK else \d+\), (\d+)"), nb("08", f"pl_tau_{key}"),
        nb("08", f"pl_speedup_{key}")])
      for task, key in [("rewrite a pasted paragraph", "rewrite"), ("extract from a pasted text", "extract"),
                        ("open-ended question", "open")]],
    (rf"best fixed γ = {NUM} / dynamic γ \| — \| {NUM} dialled \({NUM} measured\) \| — \| \*\*{NUM}×\*\* / {NUM} of it \(one",
     [nb("07", "g_best_dial"), nb_printed("07", r"\(the dial sets ([\d.]+)\)"),
      nb_printed("07", r"dial drafter: α = ([\d.]+) in its fixed-γ runs"), nb("07", "dial_best"),
      nb("07", "dyn_ratio_dial")]),
    (rf"prompt lookup, best fixed γ = {NUM} / dynamic γ \| copy from the input \| — \| — \| \*\*{NUM}×\*\* / {NUM} of it",
     [nb("07", "g_best_lookup"), nb("07", "lookup_best"), nb("07", "dyn_ratio_look")]),
    (rf"open chat \| — \| — \| {NUM}× \(ours in the same run: {NUM}×\) \| notebook 10",
     [nb("10", "speedup_hf_assisted"), nb("10", "speedup_ours")]),
    (rf"\| EAGLE head \(γ = 4\) \| 2 open questions \+ 1 copy task \| {NUM} \| — \| {NUM}× \| notebook 11",
     [nb("11", "alpha_eagle"), nb("11", "measured_eagle")]),
    (rf"open question / rewrite \| {NUM} / {NUM} \| — \| {NUM}× / \*\*{NUM}×\*\* \| notebook 00",
     [nb("00", "alpha_model"), nb("00", "alpha_lookup"), nb("00", "speedup_model"), nb("00", "speedup_lookup")]),
    (rf"A verify pass over 5 tokens costs {NUM}–{NUM} one-token steps on the notebooks' CPU "
     rf"\(notebooks 01, 06, 07, 08; {NUM} in",
     [*CPU_VERIFY_COSTS, js(BENCH, "verify_cost")]),
    (rf"too weak \(α {NUM}–{NUM}, above\)", [*DRAFT_ALPHAS]),
    (rf"left its answer at new token {NUM} in two of its seven fixed-γ runs before \(τ {NUM} at\s+γ = 1, {NUM} at γ = 12\) "
     rf"and in none after \(τ {NUM} and {NUM};",
     [log_results(DIAL_BF16, r"first divergence at new token (\d+)"), log_results(DIAL_BF16, r"^γ = 1 +α [\d.]+ +τ ([\d.]+)"),
      log_results(DIAL_BF16, r"^γ = 12 +α [\d.]+ +τ ([\d.]+)"),
      log_results(DIAL_BF16, r"## after[^#]*?^γ = 1 +α [\d.]+ +τ ([\d.]+)"),
      log_results(DIAL_BF16, r"## after[^#]*?^γ = 12 +α [\d.]+ +τ ([\d.]+)")]),
    # On a GPU: the H200 run
    (rf"p = {NUM} \(T = 1\) and {NUM} \(T = 0\.7, top-k 5\), n = {NUM} each; greedy batch-2 output identical to "
     rf"target-only in {NUM} of {NUM} rows",
     [log(EXACT, r"T=1\.0 .* p=([\d.]+)"), log(EXACT, r"T=0\.7 .* p=([\d.]+)"), log(EXACT, r"n=(\d+)"),
      log(EXACT, r"identity on cuda: (\d+)/"), log(EXACT, r"identity on cuda: \d+/(\d+)")]),
    (rf"one-token forward takes {NUM} ms, and {NUM} ms for {NUM} tokens, against a memory floor of ≈ {NUM} ms \(its "
     rf"{NUM} GB of weights at the {NUM} TB/s the run read\): {NUM}× above it",
     [H200_STEP_MS, lambda: result(RUN4)["latency_ms"][str(H200_LONGEST())], H200_LONGEST, H200_FLOOR_MS,
      lambda: js(RUN4, "target_only", 0, "weight_bytes")() / 1e9, lambda: js(RUN4, "read_bandwidth", "bytes_per_s")() / 1e12,
      ratio(H200_STEP_MS, H200_FLOOR_MS)]),
    (rf"The 30-layer draft, {NUM}× smaller, costs more per step than the 24-layer target: c = {NUM}\.",
     [H200_PARAM_RATIO, H200_C]),
    (rf"even with a dial drafter at α = {NUM}: {NUM}× at γ = 4", [js(RUN4, "speculative", 0, "alpha"),
                                                                 js(RUN4, "speculative", 0, "speedup")]),
    (rf"target's one-token step falls from {NUM} ms to {NUM} ms, which reads its weights at {NUM} % of the read bandwidth "
     rf"measured in the same run \(a `torch\.sum` over 1 GiB: {NUM} TB/s\)\. A compiled draft in front of the eager target "
     rf"reaches {NUM}× at α = {NUM}, {NUM} % of Leviathan's prediction",
     [js(RUN4, "target_only", 0, "step_ms"), js(RUN4, "target_only", 2, "step_ms"),
      lambda: 100 * js(RUN4, "target_only", 2, "fraction_of_read_bandwidth")(),
      lambda: js(RUN4, "read_bandwidth", "bytes_per_s")() / 1e12,
      js(RUN4, "speculative", 1, "speedup"), js(RUN4, "speculative", 1, "alpha"),
      lambda: 100 * js(RUN4, "speculative", 1, "fraction_of_prediction")()]),
    (rf"charges the verify pass one step, the formula's \"\+ 1\" \(the H200 measured {NUM}\)",
     [js(RUN4, "speculative", 2, "verify_cost")]),
    (rf"this CPU pays {NUM} steps for 5 tokens, and the compiled 1\.7B target on an H200 paid {NUM}",
     [js(BENCH, "verify_cost"), js(RUN4, "speculative", 2, "verify_cost")]),
    (rf"costs as much as the 24-layer target's \(c = {NUM}\), and speculative decoding runs at {NUM}× target-only, as "
     rf"predicted \({NUM} % of it\)",
     [js(RUN4, "speculative", 2, "c"), js(RUN4, "speculative", 2, "speedup"),
      lambda: 100 * js(RUN4, "speculative", 2, "fraction_of_prediction")()]),
    # On a GPU: the course on the H200 (2026-12-04)
    (rf"\*\*{NUM} of {NUM} notebooks ran to the end on CUDA\*\*",
     [notebooks_passed_on_cuda, lambda: len(list((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")))]),
    (rf"{NUM} passed at the first call, in {NUM} s\. Notebook 11",
     [lambda: len(passed("call1_notebooks.txt")),
      log2("call1_notebooks.txt", r"^12 notebooks in (\d+) s")]),
    (rf"fixed, it passed in {NUM} s", [log2("call2_notebooks.txt", r"^11_drafting_from_features\.ipynb\s+(\d+)")]),
    (rf"three widths took {NUM} s on a fresh machine \({NUM} CPUs\), and {NUM}–{NUM} s once",
     [log2("notebook_compiles.txt", r"^11_\S+\tcell \d+\tLlamaForCausalLM \(135 M\)\t(\d+)$"),
      lambda: json.loads((COURSE_H200 / "call2_cold_start.json").read_text())["cpu_count"], *warm_compiles()]),
    (rf"a target step of {NUM} ms, {NUM}× its memory floor, and c = {NUM}\. The dial drafter set to α = {NUM} ran at "
     rf"{NUM}× \(α {NUM} in the run\), where Leviathan's formula at that α, with the run's c and verify cost, gives "
     rf"about {NUM}×: on {NUM} tokens",
     [log2(FP16, r"target step ([\d.]+) ms"), log2(FP16, r"\(([\d.]+)× its floor\)"), log2(FP16, r"c = ([\d.]+), verify"),
      log2(FP16, r"^dial drafter at α = ([\d.]+)"), log2(FP16, r"^dial drafter .*: measured ([\d.]+)×"),
      log2(FP16, r"^dial drafter .*\(α = ([\d.]+) in the run"),
      lambda: expected_speedup(log2(FP16, r"^dial drafter .*\(α = ([\d.]+) in the run")(), 4,
                               log2(FP16, r"c = ([\d.]+), verify")(), log2(FP16, r"verify of γ \+ 1 tokens = ([\d.]+) steps")()),
      log2(FP16, r"prompt\(s\), (\d+) new tokens")]),
    (rf"reach the first token in {NUM} s cold and {NUM} s warm", [cold_row("cold"), cold_row("warm")]),
    (rf"with their full\s+settings and seed 16: all {NUM} passed their prose checks",
     [lambda: len(passed_rows(older_transformers_table(3)))]),
    (rf"at the same seed\. So did all\s+{NUM} on 5\.2\.0, the oldest 5\.x",
     [lambda: len(passed_rows(older_transformers_table(5)))]),
    (rf"On 5\.17\.0, the version on the GPU image that `scripts/gpu_course_checks\.sh` runs on, {NUM} of {NUM} passed",
     [lambda: len(passed_rows(older_transformers_table(6))),
      lambda: len(re.findall(r"^\d\d_", older_transformers_table(6), re.MULTILINE))]),
    (rf"silently, and {NUM} of the {NUM} notebooks failed some of their claims",
     [lambda: len(re.findall(r"^\d\d_\S+\s+\d+\s+[\d.]+\s+FAIL: \d+ of \d+ checks", older_transformers_table(1), re.MULTILINE)),
      lambda: len(re.findall(r"^\d\d_", older_transformers_table(1), re.MULTILINE))]),
    (rf"all {NUM} pass in the quick mode in bf16 and in fp16",  # both tables: every row passes
     [lambda: min(len(passed_rows(table))
                  for table in (RESULTS / "notebooks_16bit_cpu_2026-12-04.txt").read_text().split("## ")[1:])]),
    (rf"had not reached it in the {NUM} s the call had left for it",
     [lambda: log2("call2_output_tail.txt", r"^end at (\d+) s")() - log2("call2_output_tail.txt", r"^cold start from (\d+) s")()
      - cold_row("cold")() - cold_row("warm")()]),
    # On a GPU: the second lease (recorded CUDA graphs, the 7b shapes)
    (rf"a fresh process reached its first token in {NUM} s cold and {NUM} s warm, and the target then stepped in {NUM} ms\. "
     rf"With inductor: {NUM} s cold, {NUM} s warm, then {NUM} ms steps\. Eager: {NUM} s, then {NUM} ms steps",
     [cold2("capture", "cold"), cold2("capture", "warm"), cold2("capture", "cold", "step"), cold2("default", "cold"),
      cold2("default", "warm"), cold2("default", "cold", "step"), cold2("eager", "cold"), cold2("eager", "cold", "step")]),
    (rf"compiling took minutes under two CPUs on the H200, {NUM} s cold", [cold2("default", "cold")]),
    (rf"it exceeds the sum of its parts, which end at the first token, by {NUM}–{NUM} s",
     [lambda: min(cold2_overcounts()), lambda: max(cold2_overcounts())]),
    (rf"inductor's target-only step took {NUM} ms, reading the weights at {NUM} % of the read bandwidth \(goal ≥ 50 %\); "
     rf"the recorded graphs took {NUM} ms \({NUM} %\)",
     [run7b("inductor", "target_only", 0, "step_ms"),
      lambda: 100 * run7b("inductor", "target_only", 0, "fraction_of_read_bandwidth")(),
      run7b("capture", "target_only", 0, "step_ms"),
      lambda: 100 * run7b("capture", "target_only", 0, "fraction_of_read_bandwidth")()]),
    (rf"our target-only decoding ran {NUM}× its `generate` with a static cache and a compiled forward \(goal ≥ 1\.0×; "
     rf"recorded graphs: {NUM}×\), and our speculative decoding with the random draft {NUM}× its assisted generation "
     rf"\(goal ≥ 1\.5×; recorded graphs: {NUM}×\)",
     [run7b("inductor", "peers", "target_only_ours_over_hf"), run7b("capture", "peers", "target_only_ours_over_hf"),
      run7b("inductor", "peers", "speculative_ours_over_hf_assisted"),
      run7b("capture", "peers", "speculative_ours_over_hf_assisted")]),
    (rf"near-tie at new token {NUM} \(top-2 margin {NUM}\) otherwise than the eager reference the dial replayed, so the "
     rf"dial proposed nothing after it: τ = {NUM} and {NUM}×",
     [run7b("inductor", "speculative", 0, "divergence", "position"),
      run7b("inductor", "speculative", 0, "divergence", "top2_margin"),
      run7b("inductor", "speculative", 0, "tau"), run7b("inductor", "speculative", 0, "speedup")]),
    # On a GPU: the compiled path on this CPU
    (rf"the target alone ran {NUM}× and speculative decoding {NUM}× as fast as eager",
     [js("bench_cpu_compiled.json", "compiled_over_eager", "target_only"),
      js("bench_cpu_compiled.json", "compiled_over_eager", "speculative")]),
    (rf"took {NUM} s for the target and {NUM} s for the draft",
     [js("compile_cost_cpu.json", "target_seconds"), js("compile_cost_cpu.json", "draft_seconds")]),
    (rf"on a pair where the draft is {NUM}× smaller than the target", [H200_PARAM_RATIO]),
    # On a GPU: feature drafters
    (rf"EAGLE reaches α {NUM}–{NUM} \({NUM}–{NUM}× target-only; {NUM}× sampled at T = 0\.7\), prompt lookup \+ EAGLE "
     rf"α {NUM} \({NUM}–{NUM}×\) and Medusa α {NUM} \({NUM}–{NUM}×\); in notebook 11's own run \(greedy, γ = 4\) "
     rf"EAGLE's α is {NUM} and it runs at {NUM}×",
     [*feature("eagle", "alpha"), *feature("eagle", "speedup"), js(FEATURES, "drafters", "eagle", "sampled_T0.7", "speedup"),
      one_of(feature("prompt-lookup+eagle", "alpha")), *feature("prompt-lookup+eagle", "speedup"),
      one_of(feature("medusa", "alpha")), *feature("medusa", "speedup"), nb("11", "alpha_eagle"), nb("11", "measured_eagle")]),
    (rf"raises its agreement with the target at draft steps 2 and 3 by about {NUM} %", [drift_cut]),
    (rf"EAGLE would need α ≈ {NUM} for 1\.5×", [nb("11", "needed_eagle")]),
    # FAQ (the side-by-side benchmark)
    (rf"so verifying 5 tokens costs {NUM} one-token steps; with the weak embedded draft \(α = {NUM}, c = {NUM}\) "
     rf"speculative decoding ran at \*\*{NUM}×\*\* target-only",
     [js(BENCH, "verify_cost"), js(BENCH, "alpha"), js(BENCH, "c"), js(BENCH, "speedup")]),
    (rf"prompt lookup on input-grounded prompts ran at \*\*{NUM}×\*\*\. The Python loop itself is ≈ {NUM} % of a round",
     [js(LOOKUP, "speedup"), round_overhead]),
    (rf"it loses at every size: {NUM}× / {NUM}× / {NUM}× at batch 1 / 4 / 16", [batched(b, "speedup") for b in (1, 4, 16)]),
    # The suffix drafter
    (rf"below `min_prob` \({NUM}, chosen on the tuning prompts", [suffix_default("min_prob")]),
    (rf"the index over a million tokens holds {NUM} MB and builds in {NUM} s; one more answer is added in {NUM} ms\. "
     rf"One `propose` takes {NUM} µs at the median on contexts the corpus holds, against a {NUM} ms target step: c = {NUM}\.",
     [js(SUFFIX_BUDGET, "index_mb"), js(SUFFIX_BUDGET, "build_s"), js(SUFFIX_BUDGET, "add_one_answer_ms"),
      js(SUFFIX_BUDGET, "propose_us_median_seen"), js(SUFFIX_BUDGET, "target_step_ms"),
      js(SUFFIX_BUDGET, "c_propose_median")]),
    (rf"the same script on the same CPU gave {NUM} ms per added answer and {NUM} µs per `propose`",
     [js(SUFFIX_BUDGET, "before_index_fix", "add_one_answer_ms"),
      js(SUFFIX_BUDGET, "before_index_fix", "propose_us_median_seen")]),
    (rf"The same method's tokens/s moved by up to {NUM} % between repeats", [suffix_repeat_spread]),
    *[(rf"\| {label} \(\d+\) \| {NUM} \| \*\*{NUM}×\*\* \| {NUM}× \| {NUM}× \| {NUM} \| {NUM} \| {NUM} \| {NUM} \| {NUM} \|",
       [tok_s(SUFFIX_BENCH[key], "target_only"), vs_target(SUFFIX_BENCH[key], "speculative"),
        vs_target(SUFFIX_BENCH[key], "prompt_lookup"), vs_target(SUFFIX_BENCH[key], "hf_prompt_lookup"),
        js(SUFFIX_BENCH[key], "speculative_vs_hf_prompt_lookup"), js(SUFFIX_BENCH[key], "alpha"),
        js(SUFFIX_BENCH[key], "tau"), js(SUFFIX_BENCH[key], "c"), js(SUFFIX_BENCH[key], "verify_cost")])
      for key, label in [("input_grounded", "input-grounded"), ("open_chat", "open chat"),
                         ("reworded", "reworded, originals answered first")]],
    (rf"at γ = 8 and the measured α predicts {NUM}× \(input-grounded\), {NUM}× \(open chat\), {NUM}× \(reworded\)",
     [js(SUFFIX_BENCH[key], "predicted_speedup_measured_verify") for key in ("input_grounded", "open_chat", "reworded")]),
    (rf"the suffix drafter now runs at {NUM}–{NUM}× target-only and {NUM}–{NUM}× HF's prompt lookup on the three sets "
     rf"\(open chat's {NUM}× is within the {NUM} % the repeats moved\)",
     [*spread(*(vs_target(SUFFIX_BENCH[key], "speculative") for key in SUFFIX_BENCH)),
      *spread(*(js(SUFFIX_BENCH[key], "speculative_vs_hf_prompt_lookup") for key in SUFFIX_BENCH)),
      vs_target(SUFFIX_BENCH["open_chat"], "speculative"), suffix_repeat_spread]),
    (rf"had it at {NUM}–{NUM}× HF's prompt lookup and {NUM}–{NUM}× target-only with the same α",
     [*spread(*(js(SUFFIX_BENCH[key], "before_index_fix", "speculative_vs_hf_prompt_lookup") for key in SUFFIX_BENCH)),
      *spread(*(js(SUFFIX_BENCH[key], "before_index_fix", "speedup") for key in SUFFIX_BENCH))]),
    (rf"the drafter drafts far fewer than γ tokens in most rounds \({NUM}–{NUM} on average", [*spread(*(
        (lambda key=key: (result(SUFFIX_BENCH[key])["tau"] - 1) / result(SUFFIX_BENCH[key])["accepted_per_drafted"])
        for key in SUFFIX_BENCH))]),
    (rf"from α {NUM} with the request alone to {NUM} with all of it\. The speedup went from {NUM}× to {NUM}× with all of "
     rf"it \({NUM}× and {NUM}× at a quarter and at half of it",
     [js(SUFFIX_CURVE, "rows", 0, "alpha"), js(SUFFIX_CURVE, "rows", -1, "alpha"), js(SUFFIX_CURVE, "rows", 0, "speedup"),
      js(SUFFIX_CURVE, "rows", -1, "speedup"), js(SUFFIX_CURVE, "rows", 1, "speedup"), js(SUFFIX_CURVE, "rows", 2, "speedup")]),
    (rf"barely moved α: reworded α {NUM}, open chat {NUM}\.",
     [js(SUFFIX_BENCH["reworded"], "alpha"), js(SUFFIX_BENCH["open_chat"], "alpha")]),
    (rf"The fix moved reworded α from {NUM} to {NUM}",
     [js(SUFFIX_BENCH["reworded"], "before_index_fix", "alpha"), js(SUFFIX_BENCH["reworded"], "alpha")]),
]

# Sections whose every measured figure must be one of the FIGURES, and the numbers there that are not measurements.
CHECKED_SECTIONS = ["The course", "The embedded model pair", "Measured on this machine", "On a GPU", "What the code does",
                    "FAQ"]
NOT_FIGURES = [
    r"\d+(?:\.\d+)?[BM]\b", r"Qwen2\.5", r"SmolLM2-[\d.]+", r"torch 2\.13", r"transformers 5\.2[45]",  # names, versions
    r"T = 0\.7", r"\| 0\.8 \|", r"1\.5×",  # settings and goals
    r"α ≈ 0\.8 at γ, α ≈ 1, then α ≈ 0\.8 at γ ∓ 2; `--quick`: α ≈ 0\.8 alone",  # gpu_check's dial settings
    r"input-grounded 1\.3× HF's prompt lookup, open chat 1\.15× target-only",  # the suffix drafter's goals
    r"if its α is near 0\.8", r"Leviathan's formula at α = 0\.8",  # settings
    r"p\(x\) = 0\.25, q\(x\) = 0\.5",  # a screenshot's slider values
    r"over 1 GiB",  # the size of gpu_check's read-bandwidth buffer, a setting
    r"The 2\.0× goal at dial α 0\.8", r"goal ≥ \d[\d.]*( %|×)",  # issue 24's goals: settings
    r"compute capability ≥ 8\.0", r"dial drafter at α = 0\.8", r"the 3\.7 GB download",  # a rule, a setting, a size
    # the predicted GPU table is computed by gpu_report.predicted_table: tests/test_gpu_report.py checks the README quotes it
    r"### What to expect on your GPU.*?(?=What the code does on CUDA)",
]
MEASURED = re.compile(r"\d[\d,]*\.\d+|\d[\d,]*(?=×| ms| %| GiB)")


def half_unit(quoted: str) -> float:
    """Half of the last digit shown: "0.66" stands for anything in [0.655, 0.665]."""
    decimals = len(quoted.split(".")[1]) if "." in quoted else 0
    return 0.5 * 10.0 ** -decimals + 1e-9


def mismatches(readme: str) -> list[str]:
    """Every phrase missing from ``readme`` and every quoted figure that is not its source, rounded."""
    problems = []
    for pattern, sources in FIGURES:
        match = re.search(pattern, readme)
        if not match:
            problems.append(f"the README no longer says: {pattern[:100]}")
            continue
        for quoted, source in zip(match.groups(), sources, strict=True):
            for read in source if isinstance(source, tuple) else (source,):
                value = float(read())
                if abs(float(quoted.replace(",", "")) - value) > half_unit(quoted):
                    problems.append(f"README says {quoted} in {match.group(0)[:80]!r}; its source says {value:.4g}")
    return problems


def section_spans(readme: str) -> list[tuple[int, int]]:
    spans = []
    for title in CHECKED_SECTIONS:
        start = readme.index(f"## {title}")
        end = readme.find(" ## ", start + 3)
        spans.append((start, end if end >= 0 else len(readme)))
    return spans


def unchecked(readme: str) -> list[str]:
    """Measured-looking numbers in the checked sections that no FIGURES phrase covers."""
    covered = set()
    for pattern, _ in FIGURES:
        match = re.search(pattern, readme)
        if match:
            for g in range(1, len(match.groups()) + 1):
                covered.update(range(*match.span(g)))
    for pattern in NOT_FIGURES + [r"`[^`]*`"]:  # code is not prose: versions, flags, examples
        for match in re.finditer(pattern, readme):
            covered.update(range(*match.span()))
    found = []
    for start, end in section_spans(readme):
        for match in MEASURED.finditer(readme, start, end):
            if not set(range(*match.span())) <= covered:
                found.append(f"{match.group(0)} in …{readme[max(0, match.start() - 60):match.end() + 10]}…")
    return found


def test_every_quoted_figure_equals_its_source():
    problems = mismatches(README)
    assert not problems, "\n".join(problems)


def test_every_measured_figure_in_the_result_sections_has_a_source():
    found = unchecked(README)
    assert not found, "figures with no source in tests/test_readme_figures.py:\n" + "\n".join(found)


def test_a_drifted_or_unsourced_figure_is_caught():
    """Negative controls: a figure changed by one in its last digit, and a new figure with no source."""
    quoted = re.search(FIGURES[0][0], README).group(2)  # the CPU step over its memory floor, e.g. "5.7"
    drifted = README.replace(f"sits {quoted}× above", f"sits {float(quoted) + 0.1:.1f}× above", 1)
    assert any("its source says" in p for p in mismatches(drifted))
    gpu = README.index("## On a GPU")
    assert unchecked(README[:gpu] + "## On a GPU It ran at 0.77×. " + README[gpu + len("## On a GPU"):])


@pytest.mark.parametrize("pattern,sources", FIGURES, ids=[p[:40] for p, _ in FIGURES])
def test_each_phrase_names_one_source_per_figure(pattern, sources):
    assert re.compile(pattern).groups == len(sources), pattern


def test_the_batch_paragraph_orders_its_sweeps_as_their_sources_do():
    """The README says where the bench's batch ratio is lowest and that batch 4 came out above batch 1, and that
    notebook 09's ratio falls from batch 1 to batch 16. Words, not figures: checked here against the sources."""
    bench = {b: batched(b, "speedup")() for b in (1, 4, 16)}
    lowest = re.search(r"in this run the ratio was lowest at batch (\d+), and batch 4 came out (above|below) batch 1", README)
    assert lowest, "the README no longer says where the bench's batch ratio is lowest"
    assert int(lowest.group(1)) == min(bench, key=bench.get), bench
    assert (bench[4] > bench[1]) == (lowest.group(2) == "above"), bench
    assert "where the ratio fell from batch 1 to batch 16" in README
    assert nb("09", "batch_speedup_16")() < nb("09", "batch_speedup_1")()
