#!/usr/bin/env python
"""Train Medusa heads and an EAGLE layer on the embedded target's own features (issue 11).

    python scripts/feature_data.py --minutes 30             # 1. the target's answers (token ids, resumable)
    python scripts/train_feature_drafters.py --minutes 12   # 2. features → train both → assets/eagle, assets/medusa
    python scripts/train_feature_drafters.py --smoke        # the whole pipeline on a tiny random model, in seconds

Pipeline::

    token ids (assets/feature_data) ──collect_features──> Corpus (teacher-forced target: f_t, x_t, top-k of p_t)
        ──train_medusa / train_eagle──> drafter ──drafter.save──> assets/medusa/, assets/eagle/

Shift conventions (the classic replication bug is an off-by-one here), for a sequence x_0 … x_{n−1}:

* ``features[:, t]`` = f_t, the target's last hidden state after reading x_0 … x_t;
* ``top_ids/top_logp[:, t]`` = the target's next-token distribution p_t over x_{t+1} (= softmax(lm_head(f_t)));
* Medusa head k on f_t guesses x_{t+k+1}: its target is p_{t+k};
* EAGLE reads (f_t, x_{t+1}) and predicts f̂_{t+1}: targets f_{t+1} (regression) and p_{t+1} (distillation).

Losses count only positions whose predicted token lies in the *answer* (the prompt and the chat template
are easy and would inflate every number). Drift across draft steps is the known weakness of a feature
drafter: at draft step 2 its input is its own f̂, not the target's f. Two remedies are implemented:
``--noise`` (EAGLE-1: uniform noise on the input features) and ``--unroll`` (a simple form of EAGLE-3's
"training-time test": a second pass whose inputs are the layer's own predictions, trained on the same targets).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, from a checkout

from specdec_edu import autoregressive_generate, speculative_generate  # noqa: E402
from specdec_edu.models.feature_drafters import EagleDrafter, MedusaDrafter  # noqa: E402
from specdec_edu.models.feature_training import (  # noqa: E402
    Corpus,  # noqa: F401  (here so that feature caches pickled by earlier runs of this script unpickle)
    collect_features,
    eagle_loss,
    evaluate_teacher_forced,
    load_token_data,
    medusa_loss,
    train,
)

REPO = Path(__file__).resolve().parent.parent


def held_out_prompts() -> list[str]:
    """Open chat prompts that no training data used (``build_prompts`` excludes them)."""
    sys.path.insert(0, str(REPO / "scripts"))
    from draft_build.prompts import EVAL_PROMPTS

    return list(EVAL_PROMPTS)


def evaluate(target, tokenizer, kinds: list[str], *, gammas=(2, 3, 4), max_new_tokens: int = 64, repeats: int = 1,
             n_prompts: int = 6, seed: int = 0, sampled: bool = True, weights=None) -> dict:
    """Greedy, held-out prompts: α per draft position, τ, tokens/s vs target-only (interleaved, medians), c,
    and identity with the target's own output; then (``sampled``) one sampled run (T = 0.7) per drafter against
    target-only. ``weights``: the directory holding ``eagle/`` and ``medusa/`` (default: ``assets/``)."""
    import statistics

    from specdec_edu import GenerationStats, chat_prompt, expected_speedup, load_drafter
    from specdec_edu.course.experiments import interleaved_benchmark
    from specdec_edu.course.measure import measured_verify_cost

    prompts = [chat_prompt(tokenizer, p) for p in held_out_prompts()[:n_prompts]]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    trained = lambda kind: weights is not None and kind.split("+")[-1] in ("eagle", "medusa")  # weights in a folder
    drafters = {kind: load_drafter(kind, target, path=Path(weights) / kind.split("+")[-1] if trained(kind) else None)
                for kind in kinds}

    def run_all(make):
        return lambda: [make(ids) for ids in prompts]

    fns = {"target_only": run_all(lambda ids: target_only_generate(target, ids, max_new_tokens, eos))}
    for kind, drafter in drafters.items():
        for g in gammas:
            fns[f"{kind}_g{g}"] = run_all(lambda ids, d=drafter, g=g: speculative_generate(
                target, d, ids, max_new_tokens=max_new_tokens, gamma=g, eos_token_id=eos))
    runs = interleaved_benchmark(fns, repeats=repeats)
    base = runs["target_only"]
    tok_s = {name: statistics.median(sum(r.stats.new_tokens for r in rep) / sum(r.stats.seconds for r in rep) for rep in reps)
             for name, reps in runs.items()}
    reference = [r.row(0).tolist() for r in base[-1]]
    t_target = GenerationStats.pooled([r.stats for r in base[-1]]).target_seconds_per_forward
    report = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "repeats": repeats,
              "target_only_tok_s": tok_s["target_only"], "drafters": {}}
    for name, reps in runs.items():
        if name == "target_only":
            continue
        kind, g = name.rsplit("_g", 1)
        g = int(g)
        pooled = GenerationStats.pooled([r.stats for r in reps[-1]])
        c = pooled.draft_seconds_per_token / t_target
        verify_cost = measured_verify_cost(target, g + 1)
        report["drafters"].setdefault(kind, {})[g] = {
            "alpha": pooled.alpha, "alpha_per_position": pooled.alpha_per_position(g),
            "judged_per_position": pooled.judged_per_position(g), "tau": pooled.tau, "c": c,
            "verify_cost": verify_cost, "tok_s": tok_s[name], "speedup": tok_s[name] / tok_s["target_only"],
            "predicted": expected_speedup(min(pooled.alpha, 0.999), g, c),
            "predicted_with_verify_cost": expected_speedup(min(pooled.alpha, 0.999), g, c, verify_cost),
            "identical": [r.row(0).tolist() for r in reps[-1]] == reference,
        }
    # Sampling at T = 0.7 with the best γ of each drafter: faster than target-only? (exactness: tests/)
    for kind, drafter in drafters.items() if sampled else ():
        best = max(report["drafters"][kind], key=lambda g: report["drafters"][kind][g]["speedup"])
        sampled = {}
        runners = {
            "target_only": lambda ids, gen: target_only_generate(target, ids, max_new_tokens, eos, do_sample=True,
                                                                          generator=gen),
            "speculative": lambda ids, gen, d=drafter, g=best: speculative_generate(
                target, d, ids, max_new_tokens=max_new_tokens, gamma=g, eos_token_id=eos, do_sample=True, temperature=0.7,
                generator=gen),
        }
        for name, make in runners.items():
            gen = torch.Generator().manual_seed(seed)
            results = [make(ids, gen) for ids in prompts]
            sampled[name] = sum(r.stats.new_tokens for r in results) / sum(r.stats.seconds for r in results)
        report["drafters"][kind]["sampled_T0.7"] = {"gamma": best, "tok_s": sampled,
                                                     "speedup": sampled["speculative"] / sampled["target_only"]}
    return report


def target_only_generate(target, ids, max_new_tokens, eos, **kw):
    """Target-only decoding (the package's baseline: same sampling code as the speculative loop); T = 0.7 when sampling."""
    if kw.get("do_sample"):
        kw.setdefault("temperature", 0.7)
    return autoregressive_generate(target, ids, max_new_tokens=max_new_tokens, eos_token_id=eos, **kw)


def smoke(seed: int = 0, steps: int = 40, lr: float = 3e-3) -> dict:
    """The whole pipeline on a tiny random Llama, in seconds: data → features → train → save/load → decode.
    ``lr=0`` runs the same steps without learning (the test's control)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    generator = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        config = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128, initializer_range=0.2)
        target = LlamaForCausalLM(config).eval().requires_grad_(False)
    # Self-distillation data: the target's own sampled continuations of random prompts ("prompt" = 4 tokens).
    prompts = torch.randint(32, (16, 4), generator=generator)
    sequences = autoregressive_generate(target, prompts, max_new_tokens=20, do_sample=True, generator=generator).sequences
    data = collect_features(target, [(row, 4) for row in sequences.tolist()], top_k=8)
    results = {}
    everything = torch.arange(len(data))
    for drafter, loss_fn, eval_fn in [
        (MedusaDrafter(target, n_heads=3), lambda d, idx: medusa_loss(d, data, idx),
         lambda d: medusa_loss(d, data, everything)),
        (EagleDrafter(target, seed=seed), lambda d, idx: eagle_loss(d, data, idx, noise=0.1, unroll=2, generator=generator),
         lambda d: eagle_loss(d, data, everything, unroll=2)),
    ]:
        # Progress is judged on one batch before and after (all 16 sequences, no noise): the training loop's
        # own first and last losses are two different minibatches, and their order is partly chance.
        drafter.net.eval()
        with torch.no_grad():
            first = eval_fn(drafter)[0].item()
        train(drafter, lambda idx, d=drafter, fn=loss_fn: fn(d, idx), data, minutes=5, lr=lr, batch_size=8,
              generator=generator, desc=drafter.kind, max_steps=steps)
        with torch.no_grad():
            last = eval_fn(drafter)[0].item()  # train() leaves the net in eval mode
        with tempfile.TemporaryDirectory() as tmp:  # the round trip the real run does into assets/
            drafter.save(tmp)
            drafter = type(drafter).load(tmp, target)
        prompt = sequences[0, :6]
        out = speculative_generate(target, drafter, prompt[None], max_new_tokens=16, gamma=3)
        base = autoregressive_generate(target, prompt[None], max_new_tokens=16)
        assert out.sequences.tolist() == base.sequences.tolist(), "greedy speculative output differs from the target's"
        results[drafter.kind] = {"first_loss": first, "last_loss": last, "alpha": out.stats.alpha}
    return results


def make_loss(drafter, args, generator):
    """``corpus -> (idx -> (loss, agreement))`` for the drafter's kind, with the run's hyper-parameters."""
    if drafter.kind == "eagle":
        return lambda corpus: lambda idx: eagle_loss(drafter, corpus, idx, noise=args.noise, unroll=args.unroll,
                                                     generator=generator)
    return lambda corpus: lambda idx: medusa_loss(drafter, corpus, idx)


def validation_loss(drafter):
    """``corpus -> (idx -> (loss, agreement))`` for validation: no noise, and EAGLE fed its own features for three
    passes whatever it was trained with (agreement at pass j ≈ draft position j: how much it drifts)."""
    if drafter.kind == "eagle":
        return lambda corpus: lambda idx: eagle_loss(drafter, corpus, idx, unroll=3)
    return lambda corpus: lambda idx: medusa_loss(drafter, corpus, idx)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="run the pipeline on a tiny random model (seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=40, help="--smoke: training steps")
    ap.add_argument("--data", default=str(REPO / "assets" / "feature_data"))
    ap.add_argument("--workdir", default="/tmp/featwork", help="cached features (not in the repository)")
    ap.add_argument("--drafters", default="eagle,medusa")
    ap.add_argument("--minutes", type=float, default=12.0, help="training time per drafter")
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many steps (a busy CPU cannot shrink it)")
    ap.add_argument("--resume", action="store_true", help="start from the drafter already in --out (then train more)")
    ap.add_argument("--draft-vocab-size", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=4, help="Medusa heads")
    ap.add_argument("--noise", type=float, default=0.0, help="EAGLE: uniform noise on input features")
    ap.add_argument("--unroll", type=int, default=2, help="EAGLE: training-time-test passes (1 = off)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--held-out", type=float, default=0.05, help="share of sequences kept for validation")
    ap.add_argument("--out", default=str(REPO / "assets"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval", action="store_true", help="measure the trained drafters in --out on held-out prompts")
    ap.add_argument("--gammas", default="2,3,4", help="--eval: draft lengths")
    ap.add_argument("--no-sampled", action="store_true", help="--eval: skip the sampled (T = 0.7) run")
    ap.add_argument("--eval-json", default=str(REPO / "assets" / "results" / "feature_drafters_cpu.json"))
    args = ap.parse_args(argv)
    if args.smoke:
        for kind, r in smoke(args.seed, args.steps).items():
            print(f"{kind:7s} loss on all sequences {r['first_loss']:.3f} → {r['last_loss']:.3f}   "
                  f"greedy α on a training prompt {r['alpha']:.2f}")
        return

    from specdec_edu.models.embedded import load_embedded_target

    torch.set_num_threads(args.threads)
    target = load_embedded_target(device="cpu")
    if args.eval:
        from specdec_edu.models.embedded import load_embedded_tokenizer

        report = evaluate(target, load_embedded_tokenizer(), args.drafters.split(","), seed=args.seed, weights=args.out,
                          gammas=[int(g) for g in args.gammas.split(",")], sampled=not args.no_sampled)
        Path(args.eval_json).write_text(json.dumps(report, indent=1) + "\n")
        print(json.dumps(report, indent=1))
        return
    cache = Path(args.workdir) / "corpus.pt"
    rows = load_token_data(args.data)
    if cache.exists() and torch.load(cache, weights_only=False)["n_rows"] == len(rows):
        data = torch.load(cache, weights_only=False)["corpus"]
    else:
        data = collect_features(target, rows)
        cache.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"n_rows": len(rows), "corpus": data}, cache)
    generator = torch.Generator().manual_seed(args.seed)
    perm = torch.randperm(len(data), generator=generator)
    n_val = max(1, int(args.held_out * len(data)))
    val, trainset = data.subset(perm[:n_val]), data.subset(perm[n_val:])
    answer_tokens = int(sum((trainset.lengths - trainset.prompt_lengths).tolist()))
    print(f"corpus: {len(trainset)} training sequences ({answer_tokens} answer tokens), {len(val)} validation sequences")
    for kind in args.drafters.split(","):
        out = Path(args.out) / kind
        cls = EagleDrafter if kind == "eagle" else MedusaDrafter
        if args.resume:
            drafter = cls.load(out, target)
            before = json.loads((out / "training.json").read_text()) if (out / "training.json").exists() else {}
        elif kind == "eagle":
            drafter, before = EagleDrafter(target, draft_vocab_size=args.draft_vocab_size, seed=args.seed), {}
        else:
            drafter, before = MedusaDrafter(target, n_heads=args.heads, draft_vocab_size=args.draft_vocab_size), {}
        hyper = {"noise": args.noise, "unroll": args.unroll} if kind == "eagle" else {"heads": drafter.n_heads}
        loss_on = make_loss(drafter, args, generator)  # loss_on(corpus)(idx) -> (loss, top-1 agreement per head/pass)
        start = time.time()
        losses = train(drafter, loss_on(trainset), trainset, minutes=args.minutes, lr=args.lr,
                       batch_size=args.batch_size, generator=generator, desc=kind, max_steps=args.max_steps)
        agreement = evaluate_teacher_forced(drafter, validation_loss(drafter)(val), val)
        drafter.save(out)
        info = {"kind": kind, "steps": len(losses), "minutes": (time.time() - start) / 60, "first_loss": losses[0],
                "last_loss": losses[-1], "validation_top1": agreement, "train_sequences": len(trainset),
                "train_answer_tokens": answer_tokens, "draft_vocab_size": args.draft_vocab_size, "lr": args.lr,
                "batch_size": args.batch_size, "seed": args.seed, **hyper}
        if before:  # a resumed run: keep what came before
            info["resumed_from"] = {k: before[k] for k in ("steps", "minutes", "lr", "validation_top1", "noise", "unroll",
                                                           "resumed_from") if k in before}
        (out / "training.json").write_text(json.dumps(info, indent=1) + "\n")
        print(json.dumps(info))


if __name__ == "__main__":
    main()
