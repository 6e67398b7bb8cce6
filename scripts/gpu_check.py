"""Speculative decoding on a GPU, measured against the memory floor, with no network: one script, a few minutes.

    python scripts/gpu_check.py --compile --json gpu_check.json   # SmolLM2-1.7B / -135M shapes, eager and compiled
    python scripts/gpu_check.py --size 7b --compile --json 7b.json # Llama-2-7B-shaped target, two drafts
    python scripts/gpu_check.py --quick ...                        # one γ, one α, fewer tokens and repeats
    python scripts/gpu_check.py --size tiny --device cpu --compile --compile-backend aot_eager  # what CI runs

Random-weight models need no download, and a decode step costs the same whatever the weights are:
time depends on shapes, not values. The default size has the course's GPU pair's shapes (SmolLM2-1.7B
target, 24 layers × 2048; SmolLM2-135M draft, 30 layers × 576), so c is the real pair's c: a deep,
narrow draft (30 layers of small kernels) can cost more per step than its 13× fewer parameters suggest.
What random weights cannot give is a meaningful acceptance rate, so α comes from a dial:
``ReplayDrafter(cost_model=draft)`` runs the real draft's forwards (so c is measured, not assumed) but
proposes the target's own greedy tokens, each replaced by a uniformly random one with probability
``noise`` (α = 1 − noise + noise/V). The accept/resample rule keeps the output exactly the target's
whatever the drafter does; in bf16 a (γ+1)-token verify forward rounds differently from a 1-token step
and can flip a near-tied argmax, so the target is sharpened (``--head-scale``, see ``sharpen``), the dial
replays the greedy output its own runs keep (``settled_reference``), and every output is still
checked against the target-only one, token for token (``first_divergence``).

Sections, each timed, all printed and saved to ``--json``:
  1. the device's read bandwidth: a large read-only reduction (``torch.sum``);
  2. the target's latency vs tokens per forward (1 … 256), and its memory floor;
  3. c and the verify cost t(γ+1)/t(1) from eager forwards, per draft;
  4–6. decoding, eager / compiled draft / compiled draft + target (the last two with ``--compile``):
     target-only (tokens/s, step, effective bandwidth as a fraction of section 1's) and speculative
     decoding at dial α for each draft, interleaved, medians; each speculative row with the run's own
     α, c and verify cost (from a ``profile=True`` run), Leviathan's prediction with them, and the
     fraction of the prediction reached;
  5–7. HF ``generate(assistant_model=draft)`` vs ours with the same random draft (α ≈ 0: the loops' overhead);
  8. with ``--compile``, the peers a Hugging Face user would pick, on the same shapes: ``generate`` with a static
     cache and a compiled forward against our compiled target-only, and assisted generation against our compiled
     draft + target (issue 24's goals: ≥ 1.0× and ≥ 1.5×).
``--json`` is rewritten after every section and every decoding row, so a run cut off by a time limit keeps what it
measured.

Budget: the default size with ``--compile`` is sized for < 4 minutes on an H100/H200, compiling included. Measured on
the H200 with ``--compile --quick`` (run 4 in ``assets/results/gpu_h200_2026-11-30``): 163 s in all, of which the
compiled-draft section took 56 s and the compiled draft + target section 93 s, most of both compiling. A compiled
cache now compiles all its widths (1, 8 and 16 tokens) when it is made, inside the section that first uses it.
The printed section times show where the time went. ``--size 7b`` runs two drafts, so use ``--quick`` there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from specdec_edu import autoregressive_generate, expected_speedup, kv, speculative_generate  # noqa: E402
from specdec_edu.commands.args import positive_int  # noqa: E402
from specdec_edu.commands.bench import configure_hf_assistant  # noqa: E402
from specdec_edu.course.diagnostics import first_divergence  # noqa: E402
from specdec_edu.course.experiments import ReplayDrafter, interleaved_benchmark, settled_reference, timed  # noqa: E402
from specdec_edu.course.measure import forward_seconds, latency_curve, measured_verify_cost, parameter_bytes  # noqa: E402
from specdec_edu.drafters import ModelDrafter  # noqa: E402
from specdec_edu.generate import compiled_or_eager  # noqa: E402
from specdec_edu.models.devices import default_dtype, device_name, requested_device  # noqa: E402

# name: (hidden, layers, intermediate, heads, kv heads). Vocabulary (and whether the LM head is the
# embedding matrix, "tied") shared by target and drafts; "draft" is the main draft, "extra_drafts" more.
SIZES = {
    # HuggingFaceTB/SmolLM2-1.7B and SmolLM2-135M (config.json): 1,711,376,384 and 134,515,008 parameters
    "smollm2": {"target": (2048, 24, 8192, 32, 32), "draft": (576, 30, 1536, 9, 3), "vocab": 49152, "tied": True},
    "1b": {"target": (2048, 22, 5632, 32, 4), "draft": (768, 8, 2048, 12, 4), "vocab": 32000, "tied": False},  # ~1.1B / ~100M
    # meta-llama/Llama-2-7b-hf (6,738,415,616 parameters) with the 1b size's 8-layer draft and a 30 × 576 one:
    # the target is memory-bound even compiled; the deep draft shows that c follows depth, not parameters.
    "7b": {"target": (4096, 32, 11008, 32, 32), "draft": (768, 8, 2048, 12, 4),
           "extra_drafts": {"30x576": (576, 30, 1536, 9, 3)}, "vocab": 32000, "tied": False},
    "tiny": {"target": (64, 2, 128, 4, 2), "draft": (32, 1, 64, 2, 1), "extra_drafts": {"3x32": (32, 3, 64, 2, 1)},
             "vocab": 256, "tied": False},
}
MODES = ("eager", "compiled draft", "compiled draft + target")
READ_CONVENTION = ("read bandwidth = bytes of a buffer / median seconds of torch.sum over it (each byte read once; "
                   "GB = 1e9 bytes); effective bandwidth of a target-only row = weight bytes (every parameter once, "
                   "as gpt-fast counts) × decode steps per second (prefill excluded)")


def make_model(shape, vocab: int, device, dtype, seed: int, tied: bool = False) -> LlamaForCausalLM:
    """A randomly initialised Llama of the given shape, built directly on ``device``."""
    hidden, layers, inter, heads, kv_heads = shape
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                         tie_word_embeddings=tied)
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = None  # random weights: no end-of-text, every run makes max_new_tokens
    return model.to(dtype).eval().requires_grad_(False)


def draft_shapes(spec: dict) -> dict[str, tuple]:
    """``{label: shape}`` of a size's drafts, the main one first; a label is "layers x hidden"."""
    main = spec["draft"]
    return {f"{main[1]}x{main[0]}": main, **spec.get("extra_drafts", {})}


@torch.no_grad()
def sharpen(model, scale: float) -> None:
    """Multiply the token embedding and the LM head by ``scale`` (one tensor when tied): a confident random model.

    The scaled embedding dominates the residual stream, so the last hidden state, and with it the argmax,
    hardly depends on how the layers' bf16 sums were rounded; the (γ+1)-token verify forward then picks the
    same tokens as the 1-token step. Scaling the head alone does not do it for an untied model (every logit
    and its rounding error grow alike): on the CPU in bf16 (256 × 4 layers, untied, 4 prompts × 60 tokens)
    3/4 outputs diverged unscaled, 4/4 with the head ×20, 0/4 with embedding and head ×20. Run 3 of the H200
    runs scaled the tied SmolLM2 head, i.e. both. Timing is unchanged: it depends on shapes, not values.
    """
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    embedding.mul_(scale)
    if head.data_ptr() != embedding.data_ptr():
        head.mul_(scale)


def describe(divergence: dict | None) -> str:
    """One line for ``first_divergence``'s report: "identical", or where and by what margin it differs."""
    if divergence is None:
        return "identical"
    return (f"differs at token {divergence['position']} ({divergence['reference_token']} → "
            f"{divergence['candidate_token']}; target's top-2 margin {divergence['top2_margin']:.3g})")


def read_bandwidth(device: torch.device, n_bytes: int, dtype: torch.dtype, sums: int = 10, repeats: int = 5) -> float:
    """Bytes per second that ``torch.sum`` reads from an ``n_bytes`` buffer: the device's read bandwidth.

    ``sums`` reductions run between two syncs, so launch and sync overheads are spread over them;
    the median of ``repeats`` such timings (after one warm-up) is taken.
    """
    x = torch.ones(n_bytes // dtype.itemsize, dtype=dtype, device=device)
    seconds = interleaved_benchmark({"sum": lambda: timed(lambda: [x.sum() for _ in range(sums)], device)[1]},
                                    repeats=repeats, warmup=1, progress=False)["sum"]
    return x.numel() * x.element_size() * sums / statistics.median(seconds)


def maybe(x: float) -> float | None:
    """``x``, or None where it is not a finite number (JSON has no NaN)."""
    return x if x is not None and math.isfinite(x) else None


@contextlib.contextmanager
def section(title: str, seconds: dict):
    """Print ``title``, run the block, print and record how long it took."""
    print(f"\n{title}", flush=True)
    start = time.perf_counter()
    yield
    seconds[title] = time.perf_counter() - start
    print(f"   ({seconds[title]:.1f} s)", flush=True)


class Check:
    """What every measurement shares: the target, its prompt and greedy reference, and the run's settings."""

    DIAL_SEED = 0  # the seed of every speculative run's generator: the dials' references are settled with it

    def __init__(self, args, target, device):
        self.args, self.target, self.device = args, target, device
        self.vocab = target.config.vocab_size
        gen = torch.Generator().manual_seed(0)
        self.prompt = torch.randint(0, self.vocab, (1, args.prompt_length), generator=gen).to(device)
        self.n_new = args.max_new_tokens
        self.reference_new = autoregressive_generate(target, self.prompt, max_new_tokens=self.n_new, compile=False).row(0)
        self.reference = torch.cat([self.prompt[0], self.reference_new])  # on the device: the dial builds q there

    def target_kwargs(self, mode: str) -> dict:
        """The generate functions' extra arguments in ``mode``: a compiled target only in the last mode (and an eager
        one, said explicitly, in the others: the package's default compiles on CUDA)."""
        if mode != "compiled draft + target":
            return {"compile": False}
        return {"compile": True, "compile_options": self.args.compile_options}

    def speculative(self, dial, gamma: int, mode: str, max_new_tokens: int | None = None, profile: bool = False):
        """``speculative_generate`` with ``dial`` in ``mode``; the dial's draws from a fresh generator seeded DIAL_SEED."""
        return speculative_generate(self.target, dial, self.prompt, max_new_tokens=max_new_tokens or self.n_new, gamma=gamma,
                                    generator=torch.Generator(self.device).manual_seed(self.DIAL_SEED), profile=profile,
                                    **self.target_kwargs(mode))

    def hf_generate(self, n_new: int, **kwargs) -> torch.Tensor:
        """HF ``generate``'s greedy new tokens ``[n_new]`` for the prompt (``kwargs``: its cache, compile, assistant)."""
        ids = self.prompt
        return self.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_new, do_sample=False,
                                    pad_token_id=0, **kwargs)[0, ids.shape[1]:]

    def benchmark(self, fns: dict) -> dict:
        """``{name: [(result, seconds)]}``: the functions interleaved, one warm-up, ``repeats`` timed rounds."""
        return interleaved_benchmark({name: (lambda fn=fn: timed(fn, self.device)) for name, fn in fns.items()},
                                     repeats=self.args.repeats, warmup=1, progress=False)


def at_least_two(text: str) -> int:
    """A whole number >= 2 (new tokens: the first comes from the prefill, so one token times no decode step)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{value}: give at least 2 new tokens (the first comes from the prefill, "
                                         "so 1 would time no decode step)")
    return value


def dial_points(gamma: int, quick: bool) -> list[tuple[float, int]]:
    """(noise, γ) of the speculative rows: α ≈ 0.8 at γ first (the goals' point), then α ≈ 1, then γ ∓ 2."""
    if quick:
        return [(0.2, gamma)]
    return [(0.2, gamma), (0.0, gamma)] + [(0.2, g) for g in (gamma - 2, gamma + 2) if g >= 1]


def target_only_row(check: Check, mode: str, runs: list, read_bytes_per_s: float) -> dict:
    """Tokens/s, decode step and effective bandwidth of the target-only runs (``runs``: [(result, seconds)])."""
    step = statistics.median(r.stats.verify_seconds / r.stats.rounds for r, _ in runs)  # prefill excluded
    weight_bytes = parameter_bytes(check.target)
    effective = weight_bytes / step
    new_tokens, seconds = runs[-1][0].stats.new_tokens, statistics.median(s for _, s in runs)
    return {"mode": mode, "target": "compiled" if runs[-1][0].stats.compiled else "eager",  # the path the run took
            "new_tokens": new_tokens, "seconds": seconds, "tok_s": new_tokens / seconds, "step_ms": 1e3 * step,
            "weight_bytes": weight_bytes, "effective_GB_s": effective / 1e9,
            "fraction_of_read_bandwidth": effective / read_bytes_per_s}


def speculative_row(check: Check, mode: str, label: str, point, dial, runs: list, base: dict,
                    reference_new: torch.Tensor) -> dict:
    """One dial-α row: measured speedup against the run's own α, c, verify cost and Leviathan's prediction.

    ``base`` is the target-only row of the same mode: speedup = its seconds per token / this row's, and
    c and the verify cost are this row's draft time per token and verify forward over its decode step
    (``*_with_rule``: the verify cost counts the accept rule, its read and the cache crop too, as the target-only
    step counts its own sampling and read).
    ``reference_new``: that mode's target-only greedy tokens, which the output is compared with."""
    noise, gamma = point
    result = runs[-1][0]
    new = result.row(0)
    seconds, step = statistics.median(s for _, s in runs), base["step_ms"] / 1e3
    speedup = (base["seconds"] / base["new_tokens"]) / (seconds / len(new))
    profiled = check.speculative(dial, gamma, mode, profile=True).stats
    phases = {phase: statistics.median(times) for phase, times in profiled.phase_seconds.items()}
    alpha, c, verify_cost = result.stats.alpha, profiled.draft_seconds_per_token / step, phases["verify_forward"] / step
    # A round's other non-draft work (the accept rule with the round's one read, the cache crop) has its counterpart in
    # the target-only step (its sampling and read): with it, the verify cost is all of a round but the drafting.
    verify_cost_with_rule = sum(t for phase, t in phases.items() if phase != "draft") / step
    known = None not in (maybe(alpha), maybe(c))  # NaN when nothing was judged or drafted (the dial left the reference)
    predicted = expected_speedup(min(alpha, 0.999999), gamma, c, verify_cost) if known else None
    predicted_with_rule = expected_speedup(min(alpha, 0.999999), gamma, c, verify_cost_with_rule) if known else None
    divergence = first_divergence(check.target, check.prompt, reference_new, new)
    return {"mode": mode, "target": "compiled" if result.stats.compiled else "eager", "draft": label, "noise": noise,
            "gamma": gamma, "alpha_dial": dial.alpha, "alpha": maybe(alpha), "tau": maybe(result.stats.tau),
            "new_tokens": len(new), "seconds": seconds, "speedup": speedup,
            "draft_ms_per_token": maybe(1e3 * profiled.draft_seconds_per_token), "c": maybe(c), "verify_cost": verify_cost,
            "predicted_speedup": maybe(predicted), "fraction_of_prediction": maybe(speedup / predicted) if predicted else None,
            "verify_cost_with_rule": verify_cost_with_rule, "predicted_speedup_with_rule": maybe(predicted_with_rule),
            "fraction_of_prediction_with_rule": maybe(speedup / predicted_with_rule) if predicted_with_rule else None,
            "round_ms": {phase: 1e3 * t for phase, t in phases.items()},
            "identical_to_target": divergence is None, "divergence": divergence}


def decoding_rows(check: Check, mode: str, drafters: dict, points: list, read_bytes_per_s: float,
                  keep=lambda kind, row: None) -> tuple[dict, list]:
    """Target-only and speculative decoding in ``mode``, interleaved: the target-only row and one row per (draft, point).

    ``keep(kind, row)`` is called with each row as it is made (kind "target_only", then "speculative" for each): the
    runs are interleaved, so no row exists before all are timed, but each speculative row then costs a profiled run
    (at 7b, compiled), and a time limit in that stretch keeps the rows done.

    The dial replays the greedy output of the target *on this mode's path*. A compiled target in bf16 can break a
    near-tie otherwise than the eager one: on the H200 (assets/results/gpu_h200_2026-12-04_lease2) the compiled
    7b target left the eager reference at new token 7, the dial then proposed nothing, and every row measured
    target-only decoding (τ 1.12 at dial α 0.8). The base row says where the two paths part (``divergence_from_eager``).
    A (γ+1)-token verify forward can break such a tie otherwise than that output's one-token steps, too, so each dial
    replays it *settled* at its point (``settled_reference``: the output a run at that noise, γ and seed keeps to the
    end); the base row says how many runs that took and where the settled output parts from the target-only one
    (``dial_reference``). The rows' ``divergence`` still compares their output with the target-only one.
    """
    kw, target, prompt, n_new = check.target_kwargs(mode), check.target, check.prompt, check.n_new
    reference_new = check.reference_new
    if kw.get("compile"):
        reference_new = autoregressive_generate(target, prompt, max_new_tokens=n_new, **kw).row(0)
    # (noise, γ) -> (the dial's reference [n], replays): what a run at that point, seeded as check.speculative
    # seeds it, keeps to the end (settled_reference)
    target_only = torch.cat([prompt[0], reference_new])
    settled = {point: settled_reference(target, target_only, prompt.shape[1], point[1], noise=point[0],
                                        seed=check.DIAL_SEED, **kw) for point in points}
    fns, dials = {"target": lambda: autoregressive_generate(target, prompt, max_new_tokens=n_new, **kw)}, {}
    for label, drafter in drafters.items():
        for point in points:
            # eager mode hands in bare models: keep them eager (a bare model's default is compiled on CUDA)
            dial = dials[label, point] = ReplayDrafter(settled[point][0], point[0], check.vocab, cost_model=drafter,
                                                       compile=mode != "eager")
            fns[label, point] = lambda dial=dial, g=point[1]: check.speculative(dial, g, mode)
    runs = check.benchmark(fns)
    base = target_only_row(check, mode, runs["target"], read_bytes_per_s)
    base["divergence_from_eager"] = first_divergence(target, prompt, check.reference_new, reference_new)
    base["dial_reference"] = [{"noise": noise, "gamma": g, "replays": replays, "divergence_from_target_only":
                               first_divergence(target, prompt, reference_new, reference[prompt.shape[1]:])}
                              for (noise, g), (reference, replays) in settled.items()]
    keep("target_only", base)
    rows = []
    for (label, point), dial in dials.items():
        rows.append(speculative_row(check, mode, label, point, dial, runs[label, point], base, reference_new))
        keep("speculative", rows[-1])
    return base, rows


def print_decoding(base: dict, rows: list) -> None:
    print(f"   target-only ({base['target']} target): {base['tok_s']:.1f} tok/s, step {base['step_ms']:.2f} ms → weights read at "
          f"{base['effective_GB_s']:.0f} GB/s = {100 * base['fraction_of_read_bandwidth']:.0f} % of the read bandwidth "
          "(weight bytes × decode steps/s ÷ section 1's torch.sum bytes/s)")
    if base.get("divergence_from_eager"):
        print("   this path's target-only output vs the eager one: "
              f"{describe(base['divergence_from_eager'])}")
    for settled in base["dial_reference"]:
        if settled["replays"] > 1:  # in float32 the first run keeps the target-only output
            print(f"   the dial's reference at noise {settled['noise']:.2f}, γ = {settled['gamma']} (settled in "
                  f"{settled['replays']} runs) vs this path's target-only output: "
                  f"{describe(settled['divergence_from_target_only'])}")
    print("   draft   noise  γ  α(dial) α(run)  speedup    c     verify  predicted  reached  same as target")
    fmt = lambda x, spec: "n/a" if x is None else format(x, spec)  # noqa: E731
    for r in rows:
        print(f"   {r['draft']:7s} {r['noise']:4.2f} {r['gamma']:2d}  {r['alpha_dial']:6.3f}  {fmt(r['alpha'], '6.3f')}  "
              f"{r['speedup']:6.2f}×  {fmt(r['c'], '6.3f')}  {r['verify_cost']:6.2f}  {fmt(r['predicted_speedup'], '8.2f')}×  "
              f"{fmt(r['fraction_of_prediction'], '6.0%')}  {describe(r['divergence'])}")


def tokens_per_second(runs: dict, n_new: int) -> dict:
    """``{name: n_new / median seconds}`` for ``Check.benchmark``'s runs."""
    return {name: n_new / statistics.median(s for _, s in r) for name, r in runs.items()}


def hf_comparison(check: Check, draft, gamma: int, n_new: int) -> dict:
    """The same random draft through HF's assisted generation and through ours (eager, greedy)."""
    target, prompt = check.target, check.prompt
    configure_hf_assistant(draft, gamma)
    fns = {
        "target": lambda: autoregressive_generate(target, prompt, max_new_tokens=n_new, compile=False).row(0),
        "ours": lambda: speculative_generate(target, draft, prompt, max_new_tokens=n_new, gamma=gamma, compile=False),
        "hf": lambda: check.hf_generate(n_new, assistant_model=draft),
    }
    runs = check.benchmark(fns)
    tok_s = tokens_per_second(runs, n_new)
    ours, hf_tokens = runs["ours"][-1][0], runs["hf"][-1][0]
    assert len(hf_tokens) == n_new, "HF stopped early: random models must have no EOS"
    reference = runs["target"][-1][0]
    return {"gamma": gamma, "max_new_tokens": n_new, "alpha": maybe(ours.stats.alpha), "target_only_tok_s": tok_s["target"],
            "speculative_tok_s": tok_s["ours"], "hf_assisted_tok_s": tok_s["hf"], "ours_over_hf": tok_s["ours"] / tok_s["hf"],
            "identical_to_hf": ours.row(0).tolist() == hf_tokens.tolist(),
            "divergence": first_divergence(target, prompt, reference, ours.row(0)),
            "hf_divergence": first_divergence(target, prompt, reference, hf_tokens)}


def hf_peers(check: Check, drafter, draft, gamma: int, n_new: int, compile_options: dict) -> dict:
    """Ours compiled against what a Hugging Face user would pick, on the same shapes, interleaved: target-only
    ``generate`` with a static cache and a compiled forward (the same backend and mode as ours; where ours records
    CUDA graphs without a compiler, ``kv.CAPTURE``, which HF cannot, HF's own compiled path: inductor with CUDA
    graphs), and assisted generation (``assistant_model=draft``, its default caches) beside our compiled draft +
    target."""
    from transformers import CompileConfig

    target, prompt = check.target, check.prompt
    if compile_options["backend"] == kv.CAPTURE:
        hf_compile = CompileConfig(backend="inductor", mode="reduce-overhead")
    else:
        hf_compile = CompileConfig(backend=compile_options["backend"], mode=compile_options.get("mode"))
    hf_compile._compile_all_devices = True  # HF compiles a static-cache generate on CUDA by itself; this asks it on a CPU too
    configure_hf_assistant(draft, gamma)
    ours = {"compile": True, "compile_options": compile_options}
    fns = {
        "ours target-only": lambda: autoregressive_generate(target, prompt, max_new_tokens=n_new, **ours).row(0),
        "HF target-only": lambda: check.hf_generate(n_new, cache_implementation="static", compile_config=hf_compile),
        "ours speculative": lambda: speculative_generate(target, drafter, prompt, max_new_tokens=n_new, gamma=gamma,
                                                         **ours).row(0),
        "HF assisted": lambda: check.hf_generate(n_new, assistant_model=draft),
    }
    runs = check.benchmark(fns)
    tok_s = tokens_per_second(runs, n_new)
    reference = check.reference_new[:n_new]  # the eager target-only output: a compiled path can part from it at a
    divergence = {name: first_divergence(target, prompt, reference, r[-1][0]) for name, r in runs.items()}  # near-tie
    compiled_reference = runs["ours target-only"][-1][0]  # so each is also compared with our compiled target-only
    from_compiled = {name: first_divergence(target, prompt, compiled_reference, r[-1][0]) for name, r in runs.items()
                     if name != "ours target-only"}
    return {"gamma": gamma, "max_new_tokens": n_new, "tok_s": tok_s, "divergence": divergence,
            "divergence_from_compiled_target_only": from_compiled,
            "hf_compiled_forward": hasattr(target, "_compiled_call"),  # where HF keeps it (a private name: reported only)
            "target_only_ours_over_hf": tok_s["ours target-only"] / tok_s["HF target-only"],
            "speculative_ours_over_hf_assisted": tok_s["ours speculative"] / tok_s["HF assisted"]}


def save(out: dict, path: str | None) -> None:
    """Write what has been measured so far (after every section and decoding row: a run cut off by a time limit keeps
    the rest)."""
    if path:
        Path(path).write_text(json.dumps(out, indent=2))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="smollm2")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                        help="default: the course's rule (bfloat16 where native, float16 on older GPUs such as a T4, "
                             "float32 on a CPU; $SPECDEC_EDU_DTYPE overrides)")
    parser.add_argument("--gamma", type=positive_int, default=4,
                        help="γ of the main rows (the default run adds γ ∓ 2 at α ≈ 0.8)")
    parser.add_argument("--quick", action="store_true", help="one γ and one α, fewer tokens and repeats")
    parser.add_argument("--max-new-tokens", type=at_least_two, default=None,
                        help="default 96 (48 with --quick); at least 2: a decode step is timed after the prefill's token")
    parser.add_argument("--prompt-length", type=positive_int, default=64)
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help="timed rounds after one warm-up; default 3 (1 with --quick)")
    parser.add_argument("--head-scale", type=float, default=20.0,
                        help="sharpen the random target (embedding and head × this) so that bf16 cannot flip its argmax; 1: off")
    parser.add_argument("--bandwidth-mib", type=positive_int, default=None,
                        help="buffer of the read-bandwidth sum (default 1024; 64 on CPU)")
    parser.add_argument("--compile", action="store_true", help="add the compiled rows (draft, then draft + target)")
    parser.add_argument("--goals", action="store_true",
                        help="with --compile: issue 24's goals only, the compiled draft + target rows and the compiled peers "
                        "(no eager or compiled-draft decoding section, no eager HF comparison: what a 7b lease has time for)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend (aot_eager: the CPU test), or capture: CUDA graphs recorded from the "
                        "eager forward, no compiler (kv.CAPTURE)")
    parser.add_argument("--compile-mode", default=None,
                        help="torch.compile mode (default: reduce-overhead, i.e. CUDA graphs, with inductor on CUDA)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    if args.max_new_tokens is None:  # `is None`, not `or`: an explicit value is never swapped for the default
        args.max_new_tokens = 48 if args.quick else 96
    if args.repeats is None:
        args.repeats = 1 if args.quick else 3
    if args.goals and not args.compile:
        parser.error("--goals measures the compiled rows: add --compile")
    try:
        device = requested_device(args.device)  # the commands' one check of a device torch cannot use here
    except ValueError as exc:
        parser.error(f"{exc} (with --size tiny)")
    if args.compile_mode is None and args.compile_backend == "inductor" and device.type == "cuda":
        args.compile_mode = "reduce-overhead"
    args.compile_options = {"backend": args.compile_backend, **({"mode": args.compile_mode} if args.compile_mode else {})}
    if args.bandwidth_mib is None:
        args.bandwidth_mib = 1024 if device.type == "cuda" else 64
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    transformers.utils.logging.set_verbosity_error()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else default_dtype(device)  # a T4: fp16 (bf16 is emulated there)
    spec, seconds = SIZES[args.size], {}
    target = make_model(spec["target"], spec["vocab"], device, dtype, seed=0, tied=spec["tied"])
    if args.head_scale != 1:
        sharpen(target, args.head_scale)
    drafts = {label: make_model(shape, spec["vocab"], device, dtype, seed=1 + i, tied=spec["tied"])
              for i, (label, shape) in enumerate(draft_shapes(spec).items())}
    name = device_name(device)
    params = {label: sum(p.numel() for p in m.parameters()) for label, m in {"target": target, **drafts}.items()}
    print(f"device {name} · {dtype} · target {params['target'] / 1e6:.0f}M params ({parameter_bytes(target) / 2**30:.2f} GiB) · "
          f"drafts {', '.join(f'{k} {v / 1e6:.0f}M' for k, v in params.items() if k != 'target')} · "
          f"torch {torch.__version__} · transformers {transformers.__version__}")
    check, g = Check(args, target, device), args.gamma
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),  # provenance: when, and the command
           "command": " ".join(["python scripts/gpu_check.py", *(sys.argv[1:] if argv is None else argv)]),
           "device": str(device), "device_name": name, "dtype": str(dtype).replace("torch.", ""), "size": args.size,
           "quick": args.quick, "target_params": params.pop("target"), "draft_params": params, "gamma": g,
           "max_new_tokens": check.n_new, "prompt_length": args.prompt_length, "repeats": args.repeats,
           "head_scale": args.head_scale}

    with section(f"1. read bandwidth: torch.sum over {args.bandwidth_mib} MiB", seconds):
        read = read_bandwidth(device, args.bandwidth_mib * 2**20, dtype)
        print(f"   {read / 1e9:.0f} GB/s  ({READ_CONVENTION})")
    out["read_bandwidth"] = {"bytes_per_s": read, "buffer_bytes": args.bandwidth_mib * 2**20, "convention": READ_CONVENTION}
    out["versions"] = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__}
    out["section_seconds"] = seconds  # filled in as the sections end
    save(out, args.json)

    ns = (1, 4, 16, 64) if args.quick else (1, 2, 4, 8, 16, 32, 64, 128, 256)
    with section("2. target forward latency vs tokens per forward, against the memory floor", seconds):
        curve = latency_curve(target, ns=ns, context_length=args.prompt_length, repeats=5, progress=False)
        t1, floor = curve[1], parameter_bytes(target) / read
        for n, t in curve.items():
            print(f"   {n:4d} tokens: {1e3 * t:8.2f} ms   ({t / t1:5.2f}× one token, {n * t1 / t:6.1f}× tokens/s)")
        print(f"   memory floor (weight bytes / read bandwidth): {1e3 * floor:.3f} ms; "
              f"one eager step is {t1 / floor:.1f}× above it")
    out.update(latency_ms={str(n): 1e3 * t for n, t in curve.items()}, memory_floor_ms=1e3 * floor)
    save(out, args.json)

    with section(f"3. eager c = draft step / target step, and verify cost t({g + 1})/t(1)", seconds):
        out["c_eager"] = {label: forward_seconds(m, 1, args.prompt_length, repeats=7, role="draft") / t1
                         for label, m in drafts.items()}  # role: the step its drafter takes (a reduced head)
        out["verify_cost_eager"] = measured_verify_cost(target, g + 1, sweeps=7, context_length=args.prompt_length)
        print("   " + " · ".join(f"c({label}) = {c:.3f}" for label, c in out["c_eager"].items())
              + f" · verify cost {out['verify_cost_eager']:.2f}")
    save(out, args.json)

    modes = [MODES[-1]] if args.goals else list(MODES if args.compile else MODES[:1])
    compiled = {}  # label -> its compiled ModelDrafter, made (and so compiled) in the first compiled section
    out["compile"] = {"options": args.compile_options if args.compile else None, "modes": modes}
    out["target_only"], out["speculative"] = [], []

    def keep(kind: str, row: dict) -> None:  # each decoding row saved as it is made: a cut section keeps its rows
        out[kind].append(row)
        save(out, args.json)

    for i, mode in enumerate(modes, start=4):
        with section(f"{i}. decoding, {mode} (α from the dial; {check.n_new} new tokens, medians of {args.repeats})",
                     seconds):
            if mode != "eager" and not compiled:  # a compiler failure: that draft runs eager, with a warning (as in
                compiled = {label: compiled_or_eager(  # a generation), and the JSON says which drafts compiled
                    lambda m=m: ModelDrafter(m, max_cache_len=args.prompt_length + check.n_new + g + 16, compile=True,
                                             compile_options=args.compile_options),
                    lambda m=m: ModelDrafter(m), f"draft {label}") for label, m in drafts.items()}
                out["compile"]["drafts_compiled"] = {label: d.static is not None for label, d in compiled.items()}
            base, rows = decoding_rows(check, mode, drafts if mode == "eager" else compiled, dial_points(g, args.quick), read,
                                       keep)
            print_decoding(base, rows)
        save(out, args.json)  # the section's time

    main_draft = next(iter(drafts.values()))
    if not args.goals:  # --goals: the peers below compare the compiled paths; this eager comparison is an extra
        with section(f"{4 + len(modes)}. same random draft, eager: ours vs HF generate(assistant_model=draft)", seconds):
            hf = out["same_draft"] = hf_comparison(check, main_draft, g, min(check.n_new, 16 if args.quick else 32))
            print(f"   α = {hf['alpha']}, γ = {g}: target-only {hf['target_only_tok_s']:.1f} tok/s · ours "
                  f"{hf['speculative_tok_s']:.1f} · HF assisted {hf['hf_assisted_tok_s']:.1f} → ours / HF = "
                  f"{hf['ours_over_hf']:.2f}× (same tokens: {hf['identical_to_hf']})\n   vs target-only: ours "
                  f"{describe(hf['divergence'])} · HF {describe(hf['hf_divergence'])}")
        save(out, args.json)

    if args.compile:  # last: at 7b shapes it compiles the target once more (HF's own compiled forward)
        n_peer = min(check.n_new, 16 if args.quick else 32)
        title = (f"{5 + len(modes) - args.goals}. the peers, compiled: HF generate (static cache, compiled forward) "
                 "and assisted, vs ours")
        with section(title, seconds):
            main_label = next(iter(drafts))
            peers = out["peers"] = hf_peers(check, compiled[main_label], drafts[main_label], g, n_peer, args.compile_options)
            t = peers["tok_s"]
            print(f"   {main_label} draft, γ = {g}, {n_peer} new tokens, tok/s: ours target-only {t['ours target-only']:.1f} · "
                  f"HF target-only {t['HF target-only']:.1f} → {peers['target_only_ours_over_hf']:.2f}× (goal ≥ 1.0×)\n"
                  f"   ours speculative {t['ours speculative']:.1f} · HF assisted {t['HF assisted']:.1f} → "
                  f"{peers['speculative_ours_over_hf_assisted']:.2f}× (goal ≥ 1.5×)\n   vs eager target-only: "
                  + " · ".join(f"{name} {describe(d)}" for name, d in peers["divergence"].items())
                  + "\n   vs our compiled target-only: "
                  + " · ".join(f"{name} {describe(d)}" for name, d in peers["divergence_from_compiled_target_only"].items()))
        save(out, args.json)

    print(f"\ntotal {sum(seconds.values()):.0f} s in the sections")
    if args.json:
        print(f"wrote {args.json}")
    return out


if __name__ == "__main__":
    main()
