"""Side-by-side benchmark: target-only vs our speculative decoding vs Hugging Face assisted generation.

Every method runs in the same process on the same prompts, interleaved (A B C A B C …)
after a warm-up, and we report medians over repeats, so that slow drifts of a noisy
machine hit all methods alike. Greedy decoding throughout, so every method must
produce the same tokens (checked).
"""

from __future__ import annotations

import datetime
import inspect
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..course.experiments import interleaved_benchmark, timed
from ..course.measure import measured_verify_cost
from ..drafters import PromptLookupDrafter
from ..generate import FEATURES_EAGER, autoregressive_generate, resolve_compile, speculative_generate
from ..models.devices import device_name
from ..models.embedded import PAIRS
from ..models.feature_drafters import load_drafter
from ..result import GenerationStats
from ..suffix import SuffixDrafter
from ..theory import drafts_short_of_gamma, expected_speedup
from .args import positive_int, positive_number, probability

SUFFIX_MIN_PROB = inspect.signature(SuffixDrafter).parameters["min_prob"].default  # for --help: the drafter's own

CHAT_PROMPTS = [  # open questions (not in the draft's training prompts)
    "Why do leaves change colour in autumn? Answer in a short paragraph.",
    "Give three tips for writing clear emails.",
    "Explain what a hash table is to a new programmer.",
]
GROUNDED_PROMPTS = [  # input-grounded: the answer copies from the prompt (where prompt lookup shines)
    "Rewrite the following paragraph in the past tense:\n\nThe library opens at nine every morning. "
    "Students arrive early to find a quiet desk near the windows. The librarian checks the returns, "
    "sorts the new books by subject, and answers questions at the front desk. In the afternoon the "
    "reading room fills up, and the printers run without a break until the doors close at six.",
    "Copy the list below and add a short description after each item:\n\n- bread\n- milk\n- apples\n- rice\n- coffee",
]


@dataclass
class MethodResult:
    name: str
    tokens_per_second: list[float] = field(default_factory=list)  # one per repeat, all prompts together
    outputs: list[list[int]] = field(default_factory=list)  # last repeat's new tokens per prompt
    stats: list = field(default_factory=list)  # our GenerationStats per prompt (last repeat)

    @property
    def median(self) -> float:
        return statistics.median(self.tokens_per_second)


def _hf_generate(target, ids, max_new_tokens, eos, **kw):
    ids = ids.to(target.device)
    return target.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
        eos_token_id=eos, pad_token_id=eos if eos is not None else 0, **kw,
    )[0, ids.shape[1]:].tolist()


def configure_hf_assistant(draft, gamma: int | None):
    """HF reads the draft length from the assistant's generation_config. gamma=None restores HF's
    out-of-the-box behaviour (up to 20 drafts, stopping early when the draft's confidence drops)."""
    cfg = draft.generation_config
    if gamma is None:
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = 20, "constant", 0.4
    else:
        cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = gamma, "constant", 0.0


DRAFTERS = ("model", "prompt-lookup", "eagle", "medusa", "prompt-lookup+eagle", "suffix")
#: The drafters that read the target's features: their trained layers (assets/eagle, assets/medusa) fit the embedded
#: target only (``scripts/train_feature_drafters.py`` trains for that one), so a hub pair refuses them before loading.
FEATURE_DRAFTERS = tuple(d for d in DRAFTERS if d.removeprefix("prompt-lookup+") in ("eagle", "medusa"))

#: Named prompt sets. "default": the built-in prompts above (chat for a model, grounded for prompt lookup). The others
#: come from assets/eval/prompts.json, the suffix drafter's evaluation set (committed before tuning; its README
#: says how it was made): "reworded" asks the reworded questions after the originals' answers joined the global index.
PROMPT_SETS = ("default", "open-chat", "input-grounded", "reworded", "tuning-input-grounded", "tuning-open-chat")


def eval_prompts(name: str) -> list[str]:
    """The prompts of the named set of ``assets/eval/prompts.json`` (``reworded``: the reworded questions)."""
    from ..models.assets import asset_dir

    if name == "reworded":
        return [reworded for _, reworded in reworded_pairs()]
    sets = json.loads((asset_dir("eval") / "prompts.json").read_text())
    if name.startswith("tuning-"):
        return sets["tuning"][name.removeprefix("tuning-").replace("-", "_")]
    return sets[name.replace("-", "_")]


def reworded_pairs() -> list[tuple[str, str]]:
    """(original question, the same question reworded), from ``assets/eval/prompts.json``."""
    from ..models.assets import asset_dir

    return [tuple(pair) for pair in json.loads((asset_dir("eval") / "prompts.json").read_text())["reworded_pairs"]]


def reworded_originals() -> list[str]:
    """The original questions of the reworded pairs: their answers go into the global index first."""
    return [original for original, _ in reworded_pairs()]


def bench_drafter(kind: str, target, draft, corpus_additions=(), suffix_options=None):
    """The drafter object that ``kind`` names: the pair's draft model, prompt lookup, a trained feature drafter,
    or the suffix drafter (``suffix_options``: SuffixDrafter's keyword arguments, e.g. ``min_prob``; with
    ``corpus_additions``, token id lists, added to its global index)."""
    if kind == "suffix":
        from ..suffix import suffix_drafter_for

        drafter = suffix_drafter_for(target, **(suffix_options or {}))
        for tokens in corpus_additions:
            drafter.add(tokens)
        return drafter
    if kind == "model":
        return draft
    if kind == "prompt-lookup":
        return PromptLookupDrafter()
    return load_drafter(kind, target)


def methods_for(target, draft, drafter: str, gamma: int, eos, compiled: bool = False, corpus_additions=(),
                hf_lookup: tuple[int, int] | None = None, suffix_options=None):
    """{name: fn(ids, max_new_tokens) -> (new token ids, our stats or None)}.

    Hugging Face has a counterpart for the draft model (assisted generation) and for prompt lookup;
    for EAGLE / Medusa we compare with target-only decoding only. The suffix drafter runs beside our prompt lookup
    and HF's, the latter with ``hf_lookup`` = (prompt_lookup_num_tokens, max_matching_ngram_size) (default (γ, 2)),
    e.g. the best setting of a sweep on the tuning prompts. ``compiled``: our two methods run
    compiled, and their eager twins (``*_eager``) run beside them, so that one run says what compiling
    changes here (Hugging Face's loops run eager)."""
    def ours_target(compile):
        def run(ids, n):
            r = autoregressive_generate(target, ids, max_new_tokens=n, eos_token_id=eos, compile=compile)
            return r.row(0).tolist(), r.stats
        return run

    def ours_spec(d, compile):
        def run(ids, n):
            r = speculative_generate(target, d, ids, max_new_tokens=n, gamma=gamma, eos_token_id=eos, compile=compile)
            return r.row(0).tolist(), r.stats
        return run

    def hf_assisted(g):
        def run(ids, n):
            configure_hf_assistant(draft, g)
            return _hf_generate(target, ids, n, eos, assistant_model=draft), None
        return run

    ours = bench_drafter(drafter, target, draft, corpus_additions, suffix_options)
    methods = {"target_only": ours_target(compiled), "hf_target_only": lambda ids, n: (_hf_generate(target, ids, n, eos), None)}
    methods["speculative"] = ours_spec(ours, compiled)
    if compiled:
        methods["target_only_eager"], methods["speculative_eager"] = ours_target(False), ours_spec(ours, False)
    if drafter == "model":
        methods["hf_assisted"] = hf_assisted(gamma)
        methods["hf_assisted_default"] = hf_assisted(None)
    elif drafter in ("prompt-lookup", "suffix"):
        tokens, ngram = hf_lookup or (gamma, 2)
        methods["hf_prompt_lookup"] = lambda ids, n: (_hf_generate(target, ids, n, eos, prompt_lookup_num_tokens=tokens,
                                                                   max_matching_ngram_size=ngram), None)
    if drafter == "suffix":
        methods["prompt_lookup"] = ours_spec(PromptLookupDrafter(), compiled)
    return methods


def profile_round(target, draft, ids, gamma: int, max_new_tokens: int = 32, compiled: bool = False):
    """Median milliseconds of each phase of a round (draft, verify forward, accept/resample, cache crop),
    measured inside ``speculative_generate`` itself (``profile=True``: a device sync at every phase boundary),
    and that run's stats (whose draft and verify seconds are exact on any device)."""
    run = lambda: speculative_generate(target, draft, ids, max_new_tokens=max_new_tokens, gamma=gamma, profile=True,
                                       compile=compiled)
    run()  # warm-up: first calls pay for allocations and lazy initialisation
    stats = run().stats
    return {name: 1000 * statistics.median(seconds) for name, seconds in stats.phase_seconds.items()}, stats


def method_result(name: str, repeats: list[list]) -> MethodResult:
    """One method's measurements: ``repeats[r]`` lists, per prompt, ``((new tokens, stats), seconds)``.

    Each repeat's tokens/s is all its prompts' tokens over all their seconds; outputs and stats are the last repeat's.
    """
    result = MethodResult(name)
    for runs in repeats:
        result.tokens_per_second.append(sum(len(out) for (out, _), _ in runs) / sum(seconds for _, seconds in runs))
    result.outputs = [out for (out, _), _ in repeats[-1]]
    result.stats = [stats for (_, stats), _ in repeats[-1]]
    return result


def run_bench(target, draft, inputs, *, eos_token_id=None, drafter="model", gamma=4, max_new_tokens=64, repeats=3,
              progress=True, compile=None, corpus_additions=(), hf_lookup=None, suffix_options=None):
    """Run every method on every prompt (``inputs``: list of ``[1, n]`` ids), interleaved.

    ``compile``: our methods' path, as in ``speculative_generate`` (``None``: compiled on CUDA only).
    ``corpus_additions`` / ``hf_lookup`` / ``suffix_options``: for the suffix drafter, see :func:`methods_for` and
    :func:`bench_drafter`.
    Returns the result dictionary (tokens/s per method, α, τ, c, predictions, profile).
    """
    if drafter not in DRAFTERS:
        raise ValueError(f"drafter={drafter!r}: use one of {', '.join(map(repr, DRAFTERS))}")
    # A drafter that reads the target's features runs eager, so then every method of ours does: a speedup, c or
    # verify cost must not compare an eager run with a compiled one.
    compiled = resolve_compile(compile, target.device, FEATURES_EAGER if drafter in FEATURE_DRAFTERS else None)
    methods = methods_for(target, draft, drafter, gamma, eos_token_id, compiled, corpus_additions, hf_lookup,
                          suffix_options)
    # Warm-up: first calls pay for allocations, lazy init and compiling. The longest prompt at the real length, so
    # that every compiled cache is made here at its final size (a longer run later would replace it inside the clock).
    from tqdm.auto import tqdm

    longest = max(inputs, key=lambda ids: ids.shape[-1])
    warm = "warm-up, compiling each width once (minutes)" if compiled else "warm-up"
    for fn in tqdm(methods.values(), desc=warm, unit="method", leave=False, disable=not progress):
        fn(longest, max_new_tokens)

    def every_prompt(fn):  # one repeat of a method: each prompt timed on its own
        return lambda: [timed(lambda ids=ids: fn(ids, max_new_tokens), target.device) for ids in inputs]

    runs = interleaved_benchmark({name: every_prompt(fn) for name, fn in methods.items()}, repeats=repeats, warmup=0,
                                 progress=progress)
    results = {name: method_result(name, reps) for name, reps in runs.items()}
    if progress:
        print("timing the parts of a round and the verify pass (c, verify cost) ...", file=sys.stderr, flush=True)
    profiled = profile_round(target, bench_drafter(drafter, target, draft, corpus_additions, suffix_options), inputs[0],
                             gamma, compiled=compiled)
    out = summarise(target, draft, results, drafter, gamma, inputs, compiled, profiled)
    out.update(max_new_tokens=max_new_tokens, repeats=repeats)  # the settings, not only inside "command"
    from .gpu_report import compiled_path  # lazy: the report's module is not needed to measure

    out["path"] = compiled_path(target.device) if compiled else "eager"  # on CUDA: graphs without a compiler
    if drafter == "suffix":
        out["hf_prompt_lookup_setting"] = dict(zip(("prompt_lookup_num_tokens", "max_matching_ngram_size"),
                                                   hf_lookup or (gamma, 2)))
        out["speculative_vs_prompt_lookup"] = out["tok_s"]["speculative"] / out["tok_s"]["prompt_lookup"]
        out["suffix_options"] = suffix_options or {}
    return out


def left_padded_batch(tokenizer, prompts: list[str], batch_size: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch_size`` chat prompts (``prompts`` cycled), LEFT-padded: ``(input_ids [B, n], attention_mask [B, n])``."""
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": prompts[i % len(prompts)]}], tokenize=False,
                                      add_generation_prompt=True)
        for i in range(batch_size)
    ]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"  # every row's last column must be a real token
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True)
    finally:
        tokenizer.padding_side = side
    return enc.input_ids.to(device), enc.attention_mask.to(device)


def run_batch_sweep(target, draft, tokenizer, batch_sizes, *, gamma=4, max_new_tokens=16, repeats=3,
                    progress=True) -> list[dict]:
    """Batched target-only vs batched speculative decoding (ours, exact per row) at each batch size.

    No EOS, so every row makes ``max_new_tokens`` tokens and tokens/s compare fairly. At each size, one untimed
    warm-up of both (a new batch shape's first forwards allocate: untimed, that cost lands on neither), then
    ``repeats`` interleaved runs of target-only and speculative; the row reports each method's median tokens/s
    (``*_tok_s_per_repeat`` keeps every run). Rows must be identical.
    """
    from tqdm.auto import tqdm

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def methods(ids, mask):  # the two runs of one batch, left-padded
        # eager at every size: batches always run eager, so batch 1 must too, or its row compares another path
        kw = dict(attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad, compile=False)
        return {"target_only": lambda: autoregressive_generate(target, ids, **kw),
                "speculative": lambda: speculative_generate(target, draft, ids, gamma=gamma, **kw)}

    rows = []
    for b in tqdm(list(batch_sizes), desc="batch sizes", disable=not progress):
        batch = left_padded_batch(tokenizer, CHAT_PROMPTS, b, target.device)
        runs = interleaved_benchmark(methods(*batch), repeats=repeats, warmup=1, progress=False)
        tok_s = {name: [r.stats.tokens_per_second for r in rs] for name, rs in runs.items()}
        ar, sd = runs["target_only"][-1], runs["speculative"][-1]  # greedy: every repeat gives the same tokens
        rows.append({
            "batch": b,
            "target_only_tok_s": statistics.median(tok_s["target_only"]),
            "speculative_tok_s": statistics.median(tok_s["speculative"]),
            "speedup": statistics.median(tok_s["speculative"]) / statistics.median(tok_s["target_only"]),
            "alpha": sd.stats.alpha,
            "identical_rows": ar.new_tokens.tolist() == sd.new_tokens.tolist() and ar.lengths == sd.lengths,
            "target_only_tok_s_per_repeat": tok_s["target_only"],
            "speculative_tok_s_per_repeat": tok_s["speculative"],
        })
    return rows


def format_batch_table(rows: list[dict]) -> str:
    lines = ["| batch | target-only tok/s | speculative tok/s | × target-only | α | rows identical |",
             "|---:|---:|---:|---:|---:|:---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['target_only_tok_s']:.1f} | {r['speculative_tok_s']:.1f} | {r['speedup']:.2f} | "
                     f"{r['alpha']:.2f} | {'yes' if r['identical_rows'] else 'NO'} |")
    return "\n".join(lines)


def default_prompts(drafter: str) -> list[str]:
    return GROUNDED_PROMPTS if drafter == "prompt-lookup" else CHAT_PROMPTS


def summarise(target, draft, results, drafter, gamma, inputs, compiled=False, profiled=None):
    """The result dictionary. ``profiled``: ``profile_round``'s (phase milliseconds, stats) for the same drafter."""
    spec, base = results["speculative"], results["target_only"]
    pooled, baseline = GenerationStats.pooled(spec.stats), GenerationStats.pooled(base.stats)
    alpha, tau, drafted = pooled.alpha, pooled.tau, pooled.drafted
    # c from the timed runs where their clock saw the work (a CPU). On a GPU their clock never waited for the
    # device during drafting (one read per round, at the verify): the draft's GPU time landed in the verify, and
    # c came out near 0. There it comes from the profiled run, which waits at every phase.
    costs = pooled if target.device.type == "cpu" else profiled[1]
    c = costs.draft_seconds_per_token / baseline.target_seconds_per_forward if drafted else 0.0
    verify_cost = measured_verify_cost(target, gamma + 1, sweeps=5, compile=compiled)
    reference = base.outputs
    out = {
        "drafter": drafter,
        "gamma": gamma,
        "prompts": len(inputs),
        "target_only_tok_s": base.median,
        "speculative_tok_s": spec.median,
        "speedup": spec.median / base.median,
        "alpha": alpha,
        "accepted_per_drafted": pooled.accepted_per_drafted,
        "tau": tau,
        "c": c,
        "verify_cost": verify_cost,
        "predicted_speedup": expected_speedup(alpha, gamma, c),
        "predicted_speedup_measured_verify": expected_speedup(alpha, gamma, c, verify_cost),
        "drafts_per_round": pooled.drafts_per_round,
        "identical_outputs": {name: r.outputs == reference for name, r in results.items()},
        "tok_s": {name: r.median for name, r in results.items()},
        "tok_s_per_repeat": {name: r.tokens_per_second for name, r in results.items()},
        "c_from": "the timed runs" if costs is pooled else "a profiled run of the first prompt (device waited for)",
        "round_profile_ms": profiled[0],
        "compiled": compiled,
        "device": str(target.device),
        "device_name": device_name(target.device),
        "threads": torch.get_num_threads(),
        "dtype": str(target.dtype).replace("torch.", ""),
        "versions": _versions(),
    }
    if "hf_assisted" in results:
        out["hf_assisted_tok_s"] = results["hf_assisted"].median
        out["hf_assisted_default_tok_s"] = results["hf_assisted_default"].median
        out["speculative_vs_hf_assisted"] = spec.median / results["hf_assisted"].median
    if compiled:
        out["compiled_over_eager"] = {name: results[name].median / results[f"{name}_eager"].median
                                      for name in ("target_only", "speculative")}
        if "hf_assisted" in results:  # HF's assisted generation runs eager: ours eager beside it, like for like
            out["speculative_eager_vs_hf_assisted"] = results["speculative_eager"].median / results["hf_assisted"].median
    if "hf_prompt_lookup" in results:
        out["hf_prompt_lookup_tok_s"] = results["hf_prompt_lookup"].median
        out["speculative_vs_hf_prompt_lookup"] = spec.median / results["hf_prompt_lookup"].median
    return out


def _versions():
    import transformers

    from .. import __version__

    return {"specdec_edu": __version__, "torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}


def format_table(result: dict) -> str:
    """A Markdown table of tokens/s and ratios to target-only."""
    base = result["target_only_tok_s"]
    if "path" in result:  # the compiled path's own name on the device it ran on (gpu_report.compiled_path)
        path = result["path"] + ("; the *_eager rows beside them" if result.get("compiled") else "")
    else:  # a JSON file written before "path" was recorded
        path = "compiled (torch.compile; the *_eager rows beside them)" if result.get("compiled") else "eager"
    rows = [f"our methods: {path}", "", "| method | tok/s | × target-only | same tokens |", "|---|---:|---:|:---:|"]
    for name, tps in result["tok_s"].items():
        same = "yes" if result["identical_outputs"][name] else "NO"
        rows.append(f"| {name} | {tps:.1f} | {tps / base:.2f} | {same} |")
    rows.append("")
    rows.append(
        f"α = {result['alpha']:.3f}, τ = {result['tau']:.2f} tokens per target forward, c = {result['c']:.3f}, "
        f"γ = {result['gamma']}; "
        f"Leviathan prediction {result['predicted_speedup']:.2f}× "
        f"({result['predicted_speedup_measured_verify']:.2f}× with the measured verify cost "
        f"t(γ+1)/t(1) = {result['verify_cost']:.2f}); measured {result['speedup']:.2f}×"
    )
    per_round = result.get("drafts_per_round", result["gamma"])  # absent from files written before it was recorded
    if drafts_short_of_gamma(per_round, result["gamma"]):  # prompt lookup, suffix: not the formula's rounds
        rows.append(f"drafts per round: {per_round:.2f} on average, not γ = {result['gamma']}: the formula assumes γ in "
                    "every round (and the verify cost is measured at γ + 1 tokens), so for this drafter both predictions "
                    "are rough guides")
    prof = result["round_profile_ms"]
    rows.append("one round (ms, median of a profiled 32-token run of the first prompt): "
                + ", ".join(f"{k} {v:.1f}" for k, v in prof.items()))
    return "\n".join(rows)


def plot_result(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["tok_s"])
    values = [result["tok_s"][n] for n in names]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bars = ax.barh(names, values, color=["#888" if "target" in n else "#4a8" for n in names])
    ax.bar_label(bars, [f"{v:.1f}" for v in values], padding=3)
    ax.set_xlim(0, 1.15 * max(values))  # room for the labels
    ax.set_xlabel("tokens / second (median over repeats)")
    ax.set_title(f"γ = {result['gamma']}, α = {result['alpha']:.2f}, c = {result['c']:.2f}, {result['device']} {result['dtype']}")
    ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_formats() -> dict[str, str]:
    """The file types ``plot_result`` can write ({suffix: description}), as matplotlib's Agg canvas lists them (its
    class is asked: no figure is made and the backend is not switched)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    return FigureCanvasAgg.get_supported_filetypes()


def check_outputs(json_path: str | None, plot_path: str | None) -> None:
    """Refuse, before anything loads, an output file (``--json``, ``--plot``) that the finished run could not write:
    a folder named as the file, a folder that does not exist or is not writable, a file that is not writable, a plot
    whose suffix matplotlib cannot write (or none: matplotlib would add ``.png``), and both flags naming one file."""
    if json_path and plot_path and os.path.realpath(json_path) == os.path.realpath(plot_path):
        raise SystemExit(f"--json and --plot both name {plot_path}: the plot would overwrite the JSON; give them "
                         "different names, e.g. run.json and run.png")
    for flag, path, example in (("--json", json_path, "bench.json"), ("--plot", plot_path, "bench.png")):
        if not path:
            continue
        if os.path.isdir(path):
            raise SystemExit(f"{flag} {path}: that is a folder; name a file in it, e.g. {os.path.join(path, example)}")
        folder = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(folder):
            raise SystemExit(f"{flag} {path}: its folder {folder} does not exist; create it first (mkdir -p), or write "
                             "the file elsewhere")
        if flag == "--plot":  # before the write test, which creates the file for a moment: a refused name is not touched
            formats = plot_formats()
            suffix = Path(path).suffix.lower().removeprefix(".")
            if suffix not in formats:
                given = f"matplotlib cannot write .{suffix} files" if suffix else "the name has no file type"
                raise SystemExit(f"--plot {path}: {given}; end the name with one it writes, e.g. "
                                 f"{Path(path).with_suffix('.png') if suffix else path + '.png'} (or: "
                                 f"{', '.join(sorted(formats))})")
        if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)) \
                or not can_write(path):
            raise SystemExit(f"{flag} {path}: cannot write there (no write permission); write the file elsewhere")


def can_write(path: str) -> bool:
    """Try it: open ``path`` for appending (an existing file keeps its content; a new one is removed again).
    ``os.access`` answers yes to root everywhere (Colab, Docker), also where no file can be made (``/proc``)."""
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError:
        return False
    if not existed:
        os.remove(path)
    return True


def without_nan(value):
    """``value`` with every float NaN (an undefined ratio: α where nothing was judged) replaced by None, in nested
    dicts and lists: ``json.dumps`` would write ``NaN``, which JSON readers refuse."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nan(v) for v in value]
    return value


def save_json(result: dict, path: str) -> None:
    """Write ``result`` to ``path``. If that fails after all (the disk filled up, the folder went away), the run is
    not lost: it goes to a file in the temporary folder, and one ``error:`` line says where."""
    text = json.dumps(without_nan(result), indent=2, allow_nan=False)  # NaN is no JSON: α with nothing judged is null
    try:
        Path(path).write_text(text)
    except OSError as exc:
        handle, name = tempfile.mkstemp(prefix="specdec_edu_bench_", suffix=".json")
        os.close(handle)  # mkstemp opened it; write_text opens it again
        fallback = Path(name)
        fallback.write_text(text)
        print(f"error: could not write {path} ({exc.strerror or exc}); the results went to {fallback}",
              file=sys.stderr)


# ---- command line: python -m specdec_edu bench ----------------------------------------------------
def add_arguments(parser) -> None:
    parser.add_argument("--pair", choices=sorted(PAIRS), default="embedded",
                        help="'embedded' (default, offline) or a hub pair: smollm2, qwen2.5 (downloads several GB from "
                        "the Hugging Face hub once; meant for a GPU)")
    parser.add_argument("--drafter", choices=DRAFTERS, default="model",
                        help="model: the pair's draft model; eagle / medusa: trained feature drafters (assets/); "
                        "prompt-lookup+eagle: lookup where the context repeats itself, EAGLE elsewhere; suffix: suffix "
                        "decoding over the request and the target's earlier answers (assets/feature_data)")
    parser.add_argument("--prompt-set", choices=PROMPT_SETS, default="default",
                        help="default: built-in prompts; the others are assets/eval/prompts.json's sets (reworded: "
                        "the originals' answers are added to the suffix drafter's global index first)")
    parser.add_argument("--suffix-min-prob", type=probability, default=None,
                        help=f"the suffix drafter stops before its draft's empirical probability falls below this "
                             f"(SuffixDrafter's min_prob, default {SUFFIX_MIN_PROB}), a number in [0, 1]")
    parser.add_argument("--suffix-spec-factor", type=positive_number, default=None,
                        help="suffix drafter's budget per matched token, > 0")
    parser.add_argument("--limit", type=positive_int, default=None, help="only the first N prompts of the set")
    parser.add_argument("--threads", type=positive_int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--hf-lookup", metavar="TOKENS,NGRAM", default=None,
                        help="HF prompt lookup's prompt_lookup_num_tokens,max_matching_ngram_size (default: gamma,2)")
    parser.add_argument("--gamma", type=positive_int, default=4, help="draft tokens per round (default 4)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=64, help="tokens per answer (default 64)")
    parser.add_argument("--repeats", type=positive_int, default=3, help="interleaved repeats; medians are reported "
                        "(default 3)")
    parser.add_argument("--device", default=None, help="cuda, mps or cpu (default: the best available)")
    parser.add_argument("--json", metavar="FILE", help="write the full result as JSON")
    parser.add_argument("--plot", metavar="FILE", help="write a bar chart of tokens/s (the suffix names the type: "
                        ".png, .pdf, .svg, ...)")
    parser.add_argument("--batch-sizes", metavar="LIST", default="",
                        help="also measure batched decoding at these batch sizes, e.g. 1,4,16 (model drafter only; "
                        "at each size one warm-up, then --repeats interleaved runs, medians reported)")
    parser.add_argument("--batch-new-tokens", type=positive_int, default=None,
                        help="with --batch-sizes: new tokens per row in the batch sweep (default 16)")
    parser.add_argument("--compile", choices=("auto", "on", "off"), default="auto",
                        help="our methods compiled on static KV caches, or eager. Compiled means, on CUDA, CUDA graphs "
                        "recorded from the eager forward, no compiler ($SPECDEC_EDU_COMPILE=inductor: torch.compile's "
                        "inductor with CUDA graphs); elsewhere torch.compile. auto: as $SPECDEC_EDU_COMPILE says when "
                        "set (1: compiled, 0: eager), else compiled on CUDA only. When compiled, their eager twins run "
                        "beside them")


def rerun_command(argv: list[str]) -> str:
    """The command that runs this benchmark again, from ``argv`` (``sys.argv[1:]``): the words after ``bench``, so
    that the top-level flags before it (``--traceback``) are left out, quoted for a shell."""
    argv = list(argv)
    if "bench" in argv:  # the top-level parser takes only flags before the command, so the first "bench" is it
        argv = argv[argv.index("bench") + 1:]
    return shlex.join(["python", "-m", "specdec_edu", "bench", *argv])


def main(args) -> int:
    import transformers

    from ..models.devices import requested_device
    from ..models.embedded import chat_prompt, load_pair

    transformers.utils.logging.set_verbosity_error()
    check_outputs(args.json, args.plot)  # before measuring: a finished run must have somewhere to go
    if args.drafter != "suffix" and (args.suffix_min_prob is not None or args.suffix_spec_factor is not None):
        raise SystemExit("--suffix-min-prob and --suffix-spec-factor set the suffix drafter: add --drafter suffix, or "
                         "leave them out")
    try:  # "" (the default): no sweep; an empty item ("1,,4", "4,") is a typo, not a size to skip
        batch_sizes = [int(b) for b in args.batch_sizes.split(",")] if args.batch_sizes.strip() else []
    except ValueError:
        raise SystemExit(f"--batch-sizes {args.batch_sizes!r}: give whole numbers separated by commas, e.g. 1,4,16") from None
    if any(b < 1 for b in batch_sizes):
        raise SystemExit(f"--batch-sizes {args.batch_sizes!r}: every size must be 1 or more, e.g. 1,4,16")
    if args.batch_new_tokens is not None and not batch_sizes:
        raise SystemExit("--batch-new-tokens sets the batch sweep, which only --batch-sizes runs: add --batch-sizes "
                         "(e.g. 1,4,16), or leave it out")
    if batch_sizes and args.drafter != "model":
        raise SystemExit(f"--batch-sizes runs batched drafting, which uses a draft model: add --drafter model (not "
                         f"{args.drafter}), or leave --batch-sizes out")
    try:
        hf_lookup = tuple(int(x) for x in args.hf_lookup.split(",")) if args.hf_lookup else None
        if hf_lookup is not None and (len(hf_lookup) != 2 or min(hf_lookup) < 1):
            raise ValueError
    except ValueError:
        raise SystemExit(f"--hf-lookup {args.hf_lookup!r}: give TOKENS,NGRAM, two positive whole numbers, "
                         "e.g. 4,2") from None
    if args.pair != "embedded" and args.drafter in FEATURE_DRAFTERS:  # else refused after the hub download
        raise SystemExit(f"--drafter {args.drafter} with --pair {args.pair}: the trained EAGLE and Medusa drafters in "
                         "assets/ fit the embedded target only (scripts/train_feature_drafters.py trains for that one); "
                         "use --pair embedded, or with this pair --drafter model, prompt-lookup or suffix")
    if args.hf_lookup and args.drafter not in ("prompt-lookup", "suffix"):
        raise SystemExit("--hf-lookup sets HF's prompt lookup, which runs beside --drafter prompt-lookup or suffix: "
                         "add one of those, or leave it out")
    try:
        device = requested_device(args.device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    target, draft, tokenizer = load_pair(args.pair, device=device)
    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = default_prompts(args.drafter) if args.prompt_set == "default" else eval_prompts(args.prompt_set)
    prompts = prompts[: args.limit]
    inputs = [chat_prompt(tokenizer, p, device=target.device) for p in prompts]
    additions = []
    if args.prompt_set == "reworded" and args.drafter == "suffix":  # the originals were asked (and answered) before
        additions = [autoregressive_generate(target, chat_prompt(tokenizer, p, device=target.device),
                                             max_new_tokens=args.max_new_tokens, eos_token_id=tokenizer.eos_token_id)
                     .row(0).tolist() for p in reworded_originals()[: args.limit]]
    result = run_bench(
        target, draft, inputs, eos_token_id=tokenizer.eos_token_id, drafter=args.drafter,
        gamma=args.gamma, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
        compile={"auto": None, "on": True, "off": False}[args.compile], corpus_additions=additions, hf_lookup=hf_lookup,
        suffix_options={k: v for k, v in (("min_prob", args.suffix_min_prob), ("spec_factor", args.suffix_spec_factor))
                        if v is not None},
    )
    result["pair"] = args.pair
    result["prompt_set"] = args.prompt_set
    result["command"] = rerun_command(sys.argv[1:])
    result["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(format_table(result))
    if args.json:  # now, and again after the sweep: a sweep that fails must not lose the run above
        save_json(result, args.json)
    if batch_sizes:
        result["batched"] = run_batch_sweep(target, draft, tokenizer, batch_sizes, gamma=args.gamma,
                                            max_new_tokens=args.batch_new_tokens or 16, repeats=args.repeats)
        print()
        print(format_batch_table(result["batched"]))
    if args.json:
        save_json(result, args.json)
        print(f"wrote {args.json}")
    if args.plot:
        try:
            plot_result(result, args.plot)
        except OSError as exc:  # checked before the run, but a disk can fill up meanwhile: the table is above
            print(f"error: could not write {args.plot} ({exc.strerror or exc}); the numbers are in the table above"
                  + (f" and in {args.json}" if args.json else ""), file=sys.stderr)
            return 1
        print(f"wrote {args.plot}")
    return 0
