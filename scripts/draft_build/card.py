"""The model card: ``assets/draft/DRAFT_CARD.md``, written from the build's recorded numbers (never re-measured)."""

from __future__ import annotations

from pathlib import Path

import torch


def write_card(args, out: Path, info: dict):
    ev, tr = info.get("eval", {}), info.get("train", {})
    K = ev.get("k_final", args.k_train)
    th = str(str(args.timing_threads).split(",")[0])
    tm = ev.get("timing", {}).get(th, {})
    lines = [
        "# Embedded draft model (specdec-edu)",
        "",
        "A tiny `LlamaForCausalLM` distilled from the embedded target (SmolLM2-135M-Instruct, Q4_1 GGUF "
        "dequantized to float32) to serve as the draft model of the offline (\"embedded\") pair. "
        "Built by `python scripts/build_draft.py` "
        + ("with default flags." if not args.quick else "in --quick mode (smoke test, not a usable draft)."),
        "",
        "## Architecture",
        "",
        f"- width {args.width}, {args.layers} layers, {args.heads} query heads / {args.kv_heads} key-value heads "
        f"(head dim {args.width // args.heads}), SwiGLU MLP {args.ffn}, RoPE theta 100000, RMSNorm; "
        f"{tr.get('n_params', 0) / 1e6:.2f} M parameters, {info.get('size_bytes', 0) / 1e6:.1f} MB on disk "
        "(fp16; load as float32).",
        "- vocabulary: the target's tokenizer and all 49,152 ids (tied input/output embeddings, initialised "
        + {"hidden-pca": "from the top principal directions of the target's final hidden states",
           "embed-pca": "from a PCA of the target's 576-d embeddings"}.get(getattr(args, "init", None), "at random") + ").",
        f"- **reduced head**: `draft_vocab_size = {K}` in config.json. Only the first {K} token ids get logits "
        "(`hidden_last @ lm_head.weight[:K].T` via `get_decoder()` / `get_output_embeddings()`); the other ids get "
        "q = 0, which keeps speculative decoding exact. The model itself is a standard LlamaForCausalLM: its full "
        "forward gives all 49,152 logits (rows >= K were not trained as outputs).",
        "",
        "## Data (no Hub access)",
        "",
        f"- {args.n_prompts} programmatic chat prompts (topics x question templates, code, maths, rewriting, advice, "
        f"recipes, small talk; seed {args.seed}), through the chat template with the default system prompt.",
        f"- The target answered each prompt, at most {args.max_new} new tokens, {args.greedy_frac:.0%} greedy and "
        f"the rest sampled at T = {args.temperature}; its top-{args.topk} logits and log-normaliser were kept at "
        f"every position: {tr.get('n_answers', '?')} answers, {tr.get('n_positions', '?')} teacher positions.",
        f"- Loss: {args.w_soft} x soft cross-entropy to the teacher's top-{args.topk} probabilities (ids < {args.k_train}) "
        f"+ {args.w_hard} x cross-entropy on the teacher's argmax"
        + (f" + {args.w_mse} x a regression of the draft's final hidden state on the target's"
           if getattr(args, "w_mse", 0) else "") + f"; AdamW lr {args.lr}, cosine, "
        f"{tr.get('steps', '?')} steps of <= {args.batch_tokens} tokens ({args.epochs} epochs).",
        f"- Validation top-1 agreement per epoch (held-out greedy answers, K={args.k_train}): "
        + ", ".join(f"{h['val_top1']:.3f}" for h in tr.get("history", [])),
        "",
        "## Build",
        "",
        f"- Hardware: {info.get('hardware')}; torch {torch.__version__}, transformers {info.get('transformers')}.",
        f"- Wall time: total {info.get('total_min', 0):.1f} min (data {info.get('data_min', 0):.1f}, training "
        f"{info.get('train_min', 0):.1f}, evaluation {info.get('eval_min', 0):.1f}); caps fired: data "
        f"{info.get('data', {}).get('capped', False)}, training {tr.get('capped', False)}.",
        f"- Command: `{info.get('command')}`",
        "",
        f"## Measured (held-out prompts: {len(ev.get('prompts', []))} chat prompts x {ev.get('n_new', '?')} tokens, "
        "none in the training set)",
        "",
        f"Timing with torch.set_num_threads({th}), median per decode token with a KV cache; load average "
        f"before/after {ev.get('loadavg_before')} / {ev.get('loadavg_after')} (other jobs shared the 2 cores: "
        "expect +-20 % between runs).",
        "",
        "| head size K | greedy α | coverage cap | draft ms/token | c = draft/target |",
        "|---|---|---|---|---|",
    ]
    for k in args.k_candidates:
        sk = str(k)
        if sk in ev.get("alpha", {}) and sk in tm.get("draft_ms", {}):
            lines.append(f"| {k}{' (chosen)' if k == K else ''} | {ev['alpha'][sk]:.3f} | {ev['coverage'].get(sk, 1):.3f} | "
                         f"{tm['draft_ms'][sk]:.2f} | {tm['c'][sk]:.4f} |")
    if "49152" in ev.get("alpha", {}):
        full_ms = tm.get("draft_ms", {}).get("49152", float("nan"))
        lines.append(f"| 49152 (full, not used) | {ev['alpha']['49152']:.3f} | 1.000 | {full_ms:.2f} | – |")
    lines += [
        "",
        f"- Target: {tm.get('target_ms', float('nan')):.1f} ms/token at decode; full HF forward of the draft (all logits): "
        f"{tm.get('draft_full_hf_ms', float('nan')):.2f} ms.",
        "- Target verify cost t_verify(n) for n = 1..8 tokens in one forward (ms): "
        + ", ".join(f"{v:.0f}" for v in tm.get("verify_ms", {}).values()),
        "",
        f"Predicted greedy speed-up with K = {K} (α = {ev.get('alpha', {}).get(str(K), float('nan')):.3f}, "
        f"c = {tm.get('c', {}).get(str(K), float('nan')):.4f}):",
        "",
        "| γ | Leviathan (1 − α^(γ+1)) / ((1 − α)(γc + 1)) | with verify cost: E[tokens] / (γc + t_verify(γ+1)/t_1) |",
        "|---|---|---|",
    ]
    for g in range(3, 7):
        p = tm.get("pred", {}).get(str(K), {}).get(str(g))
        if p:
            lines.append(f"| {g} | {p[0]:.2f}× | {p[1]:.2f}× |")
    if ev.get("e2e"):
        lines += ["", f"Measured end-to-end greedy speculative decoding with torch.set_num_threads({ev.get('e2e_threads')}) "
                  f"({min(args.e2e_prompts, len(ev.get('prompts', [])))} of the prompts, {ev.get('n_new')} tokens; "
                  "`specdec_edu.speculative_generate` with `ModelDrafter(draft, head_size=K)` vs `autoregressive_generate`; "
                  "speed-up = target-alone time / speculative time, prefill included; the prediction is "
                  "`expected_speedup(α, γ, c, verify_cost)` with α, c and the verify cost of the same run):", "",
                  "| γ | speed-up | predicted from the run | α | tokens per target forward | identical output |",
                  "|---|---|---|---|---|---|"]
        for g, e in ev["e2e"].items():
            lines.append(f"| {g} | {e['speedup']:.2f}× | {e.get('predicted', float('nan')):.2f}× | "
                         f"{e.get('alpha', float('nan')):.3f} | {e['tokens_per_round']:.2f} | {e['identical']} |")
    other = [t for t in ev.get("timing", {}) if t != th]
    for t in other:
        tm2 = ev["timing"][t]
        lines += ["", f"With torch.set_num_threads({t}): target {tm2['target_ms']:.1f} ms, draft (K={K}) "
                  f"{tm2['draft_ms'].get(str(K), float('nan')):.2f} ms, c = {tm2['c'].get(str(K), float('nan')):.4f}; predicted "
                  + ", ".join(f"γ={g}: {v[0]:.2f}× / {v[1]:.2f}×" for g, v in tm2['pred'].get(str(K), {}).items())
                  + "; verify(n=1..8) " + ", ".join(f"{v:.0f}" for v in tm2['verify_ms'].values()) + " ms."]
    lines += ["", "Held-out prompts:", ""] + [f"- {p}" for p in ev.get("prompts", [])] + [""]
    (out / "DRAFT_CARD.md").write_text("\n".join(lines))
