"""Speculative decoding on a GPU, measured, with no network: one script, a few minutes.

    python scripts/gpu_check.py --json gpu_check.json      # SmolLM2-1.7B / -135M shapes, bf16, CUDA
    python scripts/gpu_check.py --size 1b --json gpu.json  # ~1.1B target, ~100M draft (TinyLlama-like)
    python scripts/gpu_check.py --size tiny --device cpu   # the same steps at toy size (what CI runs)

Random-weight models need no download, and a decode step costs the same whatever the
weights are: time depends on shapes, not values. The default size has the course's GPU
pair's shapes (SmolLM2-1.7B target, 24 layers × 2048; SmolLM2-135M draft, 30 layers × 576),
so c is the real pair's c: a deep, narrow draft (30 layers of small kernels) can cost more
per step than its 13× fewer parameters suggest. What random weights cannot give is a
meaningful acceptance rate (a random draft agrees with a random target ~1/V of the time),
so α comes from a dial: ``ReplayDrafter(cost_model=draft)`` runs the real draft's
forwards (so c is measured, not assumed) but proposes the target's own greedy tokens,
each replaced by a uniformly random one with probability ``noise`` (α = 1 − noise + noise/V).
The accept/resample rule keeps the output exactly the target's whatever the drafter does;
in bf16 the verify forward (γ + 1 tokens) rounds differently from a 1-token step, which can
flip a near-tied argmax. So each output is checked against the target-only one token for
token, and where they differ ``first_divergence`` reports the first position and the
target's top-2 logit margin there: a margin of a bf16 rounding step is numerics, a large
one is a bug.

Steps, all printed and saved to ``--json``:
  1. the memory-bound curve: target forward latency vs tokens per forward (1 … 256);
  2. c = draft step / target step, and the verify cost t(γ+1)/t(1);
  3. dial-α sweep: speculative vs target-only tokens/s (interleaved, medians) against
     Leviathan's (1 − α^(γ+1)) / ((1 − α)(γc + 1)) and the same with the measured verify cost;
  4. HF ``generate(assistant_model=draft)`` vs ours with the same random draft at the same γ
     (α ≈ 0 for both: this compares the loops' overhead, not the draft's quality);
  5. where one round's time goes: ``speculative_generate(..., profile=True)`` (device synced at
     every phase boundary, so it is slower than the timed runs above, which sync once per round).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from specdec_edu import autoregressive_generate, expected_speedup, speculative_generate  # noqa: E402
from specdec_edu.bench import configure_hf_assistant  # noqa: E402
from specdec_edu.diagnostics import first_divergence  # noqa: E402
from specdec_edu.experiments import ReplayDrafter, interleaved_benchmark  # noqa: E402
from specdec_edu.measure import forward_seconds, latency_curve, parameter_bytes  # noqa: E402
from specdec_edu.result import sync  # noqa: E402

# name: (hidden, layers, intermediate, heads, kv heads). Vocabulary (and whether the LM head is the
# embedding matrix, "tied") shared by target and draft.
SIZES = {
    # HuggingFaceTB/SmolLM2-1.7B and SmolLM2-135M (config.json): 1,711,376,384 and 134,515,008 parameters
    "smollm2": {"target": (2048, 24, 8192, 32, 32), "draft": (576, 30, 1536, 9, 3), "vocab": 49152, "tied": True},
    "1b": {"target": (2048, 22, 5632, 32, 4), "draft": (768, 8, 2048, 12, 4), "vocab": 32000, "tied": False},  # ~1.1B / ~100M
    "tiny": {"target": (64, 2, 128, 4, 2), "draft": (32, 1, 64, 2, 1), "vocab": 256, "tied": False},
}
NOISES = (0.0, 0.2, 0.4, 0.6)  # α ≈ 1.0, 0.8, 0.6, 0.4


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


def generated(result) -> torch.Tensor:
    """``[n]`` the new tokens of a one-prompt ``GenerationResult``."""
    return result.row(0)


def describe(divergence: dict | None) -> str:
    """One line for ``first_divergence``'s report: "identical", or where and by what margin it differs."""
    if divergence is None:
        return "identical"
    return (f"differs at token {divergence['position']} ({divergence['reference_token']} → "
            f"{divergence['candidate_token']}; target's top-2 margin {divergence['top2_margin']:.3g})")


def median_seconds(fns: dict, repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds per method: A B C … in turn, one warm-up then ``repeats`` rounds, device synced around each call."""
    def timed(fn):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        return time.perf_counter() - start

    seconds = interleaved_benchmark({name: (lambda fn=fn: timed(fn)) for name, fn in fns.items()},
                                    repeats=repeats, warmup=1, progress=False)
    return {name: statistics.median(times) for name, times in seconds.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="smollm2")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default=None,
                        help="default: bfloat16 on CUDA, float32 elsewhere")
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    transformers.utils.logging.set_verbosity_error()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no GPU; use --device cpu (with --size tiny)")
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    spec = SIZES[args.size]
    target = make_model(spec["target"], spec["vocab"], device, dtype, seed=0, tied=spec["tied"])
    draft = make_model(spec["draft"], spec["vocab"], device, dtype, seed=1, tied=spec["tied"])
    n_t = sum(p.numel() for p in target.parameters())
    n_d = sum(p.numel() for p in draft.parameters())
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    print(f"device {name} · {dtype} · target {n_t / 1e6:.0f}M params ({parameter_bytes(target) / 2**30:.2f} GiB) · "
          f"draft {n_d / 1e6:.0f}M · torch {torch.__version__} · transformers {transformers.__version__}")
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, spec["vocab"], (1, args.prompt_length), generator=gen).to(device)
    g = args.gamma

    # 1–2. The memory-bound curve, c and the verify cost.
    ns = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    curve = latency_curve(target, ns=ns, context_length=args.prompt_length, repeats=5, progress=False)
    t1 = curve[1]
    t_draft = forward_seconds(draft, 1, args.prompt_length, repeats=7)
    c = t_draft / t1
    verify_cost = forward_seconds(target, g + 1, args.prompt_length, repeats=7) / t1
    print("\n1. target forward latency vs tokens per forward (memory-bound: flat, then linear)")
    for n, t in curve.items():
        print(f"   {n:4d} tokens: {1e3 * t:8.2f} ms   ({t / t1:5.2f}× one token, {n * t1 / t:6.1f}× tokens/s)")
    print(f"2. c = {c:.3f} (draft step {1e3 * t_draft:.2f} ms / target step {1e3 * t1:.2f} ms); "
          f"verify cost t({g + 1})/t(1) = {verify_cost:.2f}")

    # 3. Dial-α sweep against the formula.
    n_new = args.max_new_tokens
    reference_new = generated(autoregressive_generate(target, prompt, max_new_tokens=n_new))
    reference = torch.cat([prompt[0], reference_new]).cpu()  # the drafter reads it on the host, as the loop's context is
    target_only = lambda: autoregressive_generate(target, prompt, max_new_tokens=n_new)
    rows = []
    print(f"\n3. dial-α drafter (γ = {g}, {n_new} new tokens, medians of {args.repeats}, interleaved)")
    print("   noise   α(dial)  α(run)   tok/s spec  tok/s target  speedup  Leviathan  w/ verify cost  same as target")
    for noise in NOISES:
        drafter = ReplayDrafter(reference, noise, spec["vocab"], cost_model=draft)
        run = lambda drafter=drafter: speculative_generate(target, drafter, prompt, max_new_tokens=n_new, gamma=g,
                                                           generator=torch.Generator(device=device).manual_seed(0))
        med = median_seconds({"target": target_only, "spec": run}, args.repeats, device)
        result = run()
        new = generated(result)
        alpha = result.stats.alpha
        divergence = first_divergence(target, prompt, reference_new, new)
        row = {
            "noise": noise, "alpha_dial": drafter.alpha, "alpha": alpha, "tau": result.stats.tau,
            "target_only_tok_s": n_new / med["target"], "speculative_tok_s": len(new) / med["spec"],
            "identical_to_target": divergence is None, "divergence": divergence,
        }
        row["speedup"] = row["speculative_tok_s"] / row["target_only_tok_s"]
        row["predicted_speedup"] = float(expected_speedup(min(alpha, 0.999999), g, c))
        row["predicted_speedup_verify_cost"] = float(expected_speedup(min(alpha, 0.999999), g, c, verify_cost))
        rows.append(row)
        print(f"   {noise:5.2f}   {row['alpha_dial']:6.3f}  {alpha:6.3f}   {row['speculative_tok_s']:10.1f}  "
              f"{row['target_only_tok_s']:12.1f}  {row['speedup']:6.2f}×  {row['predicted_speedup']:8.2f}×  "
              f"{row['predicted_speedup_verify_cost']:13.2f}×  {describe(divergence)}")

    # 4. The same random draft through HF's assisted generation and through ours.
    mask = torch.ones_like(prompt)
    configure_hf_assistant(draft, g)

    def hf():
        return target.generate(prompt, attention_mask=mask, assistant_model=draft, max_new_tokens=n_new,
                               do_sample=False, pad_token_id=0)

    hf_tokens = hf()[0, prompt.shape[1]:]
    assert len(hf_tokens) == n_new, "HF stopped early: random models must have no EOS"

    ours = lambda: speculative_generate(target, draft, prompt, max_new_tokens=n_new, gamma=g)
    med = median_seconds({"target": target_only, "ours": ours, "hf": hf}, args.repeats, device)
    hf_vs = {k: n_new / v for k, v in med.items()}
    ours_result = ours()
    ours_new, ours_alpha = generated(ours_result), ours_result.stats.alpha
    same_tokens = ours_new.tolist() == hf_tokens.tolist()
    ours_divergence = first_divergence(target, prompt, reference_new, ours_new)
    hf_divergence = first_divergence(target, prompt, reference_new, hf_tokens)
    print(f"\n4. same random draft (α = {ours_alpha:.3f}), γ = {g}: target-only {hf_vs['target']:.1f} tok/s · "
          f"ours {hf_vs['ours']:.1f} · HF assisted {hf_vs['hf']:.1f} → ours / HF = {hf_vs['ours'] / hf_vs['hf']:.2f}× "
          f"(same tokens: {same_tokens})\n   vs target-only: ours {describe(ours_divergence)} · HF {describe(hf_divergence)}")

    # 5. One round's parts, from the loop itself (profile=True syncs the device at each phase boundary).
    profiled = speculative_generate(target, draft, prompt, max_new_tokens=n_new, gamma=g, profile=True).stats
    phases_ms = {phase: 1e3 * statistics.median(times) for phase, times in profiled.phase_seconds.items()}
    draft_ms_per_token = 1e3 * profiled.draft_seconds_per_token
    print(f"\n5. one round, same draft, profile=True (median ms over {profiled.rounds} rounds): "
          + " · ".join(f"{phase} {ms:.2f}" for phase, ms in phases_ms.items())
          + f"; draft {draft_ms_per_token:.2f} ms per drafted token")

    out = {
        "device": str(device), "device_name": name, "dtype": str(dtype).replace("torch.", ""), "size": args.size,
        "target_params": n_t, "draft_params": n_d, "gamma": g, "max_new_tokens": n_new,
        "prompt_length": args.prompt_length, "repeats": args.repeats,
        "latency_ms": {str(n): 1e3 * t for n, t in curve.items()}, "c": c, "verify_cost": verify_cost,
        "dial": rows,
        "same_draft": {"alpha": ours_alpha, "target_only_tok_s": hf_vs["target"], "speculative_tok_s": hf_vs["ours"],
                       "hf_assisted_tok_s": hf_vs["hf"], "ours_over_hf": hf_vs["ours"] / hf_vs["hf"],
                       "identical_to_hf": same_tokens, "divergence": ours_divergence, "hf_divergence": hf_divergence},
        "round_ms": {**phases_ms, "draft_per_token": draft_ms_per_token},
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
    }
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
        print(f"\nwrote {args.json}")
    return out


if __name__ == "__main__":
    main()
