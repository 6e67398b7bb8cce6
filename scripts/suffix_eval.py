#!/usr/bin/env python
r"""Measurements for the suffix drafter (issue 26) that the bench command does not make (the commands that made the
committed files):

    python scripts/suffix_eval.py sweep --max-new-tokens 32 --tokens 2,4,7,10 --ngrams 2,4 \
        --out assets/results/suffix_hf_lookup_sweep_cpu.json
    python scripts/suffix_eval.py curve --prompts 4 --max-new-tokens 32 --fractions 0,0.25,0.5,1 \
        --out assets/results/suffix_corpus_curve_cpu.json
    python scripts/suffix_eval.py tune --max-new-tokens 32 --out assets/results/suffix_tuning_cpu.json

``sweep``: Hugging Face's prompt lookup over ``prompt_lookup_num_tokens`` × ``max_matching_ngram_size`` on the
*tuning* input-grounded prompts (``assets/eval/prompts.json``), greedy; the best setting is what
``bench --drafter suffix --hf-lookup TOKENS,NGRAM`` compares with. ``curve``: speedup over target-only on open chat
prompts with the global index built from the first fraction of the corpus (0 = the request alone), methods
interleaved per prompt. ``tune``: the suffix drafter's own settings (``--settings gamma/min_prob/spec_factor,...``) on
the tuning prompts. Each records date, machine, versions and the command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, from a checkout

from specdec_edu import autoregressive_generate, chat_prompt, load_embedded_pair, speculative_generate  # noqa: E402
from specdec_edu.commands.args import positive_int  # noqa: E402
from specdec_edu.commands.bench import _hf_generate, _versions, eval_prompts  # noqa: E402
from specdec_edu.course.experiments import timed  # noqa: E402
from specdec_edu.models.devices import device_name  # noqa: E402
from specdec_edu.result import GenerationStats  # noqa: E402
from specdec_edu.suffix import SuffixDrafter, embedded_corpus  # noqa: E402


def provenance(command: str) -> dict:
    """Date, machine, threads, versions and ``command``, the run's own command line (``main``'s arguments: a call from
    code has no command line of its own, and ``sys.argv`` is then the caller's)."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": device_name("cpu"), "threads": torch.get_num_threads(),
            "versions": _versions(), "command": command,
            "note": "shared 2-core CPU (other jobs running): timings are noisy; greedy, fp32"}


def sweep(args, target, tokenizer) -> dict:
    inputs = [chat_prompt(tokenizer, p) for p in eval_prompts("tuning-input-grounded")]
    eos = tokenizer.eos_token_id
    settings = [(t, g) for t in args.tokens for g in args.ngrams]
    reference = [autoregressive_generate(target, ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos).row(0).tolist()
                 for ids in inputs]
    rows = []
    for t, g in settings:
        runs = [timed(lambda ids=ids, t=t, g=g: _hf_generate(target, ids, args.max_new_tokens, eos, prompt_lookup_num_tokens=t,
                                                   max_matching_ngram_size=g), target.device) for ids in inputs]
        rows.append({"prompt_lookup_num_tokens": t, "max_matching_ngram_size": g,
                     "tok_s": sum(len(o) for o, _ in runs) / sum(s for _, s in runs),
                     "identical": [o for o, _ in runs] == reference})
        print(rows[-1], flush=True)
    best = max(rows, key=lambda r: r["tok_s"])
    return {"what": "HF prompt lookup sweep on the tuning input-grounded prompts (one run per setting)",
            "prompt_set": "tuning-input-grounded", "max_new_tokens": args.max_new_tokens, "rows": rows,
            "best": {k: best[k] for k in ("prompt_lookup_num_tokens", "max_matching_ngram_size")}}


def curve(args, target, tokenizer) -> dict:
    prompts = eval_prompts(args.prompt_set)[: args.prompts]
    inputs = [chat_prompt(tokenizer, p) for p in prompts]
    eos = tokenizer.eos_token_id
    drafters = {f: SuffixDrafter(embedded_corpus(fraction=f)) for f in args.fractions}
    sizes = {f: int((d.corpus.tokens >= 0).sum()) for f, d in drafters.items()}
    times = {name: [] for name in ["target_only", *map(str, args.fractions)]}
    stats = {f: [] for f in args.fractions}
    for ids in inputs:  # interleaved: every method on this prompt before the next prompt
        _, s = timed(lambda ids=ids: autoregressive_generate(target, ids, max_new_tokens=args.max_new_tokens,
                                                             eos_token_id=eos), target.device)
        times["target_only"].append(s)
        for f, d in drafters.items():
            r, s = timed(lambda ids=ids, d=d: speculative_generate(target, d, ids, max_new_tokens=args.max_new_tokens,
                                                                   gamma=args.gamma, eos_token_id=eos), target.device)
            times[str(f)].append(s)
            stats[f].append(r.stats)
    base = sum(times["target_only"])
    rows = []
    for f in args.fractions:
        pooled = GenerationStats.pooled(stats[f])
        rows.append({"fraction": f, "corpus_tokens": sizes[f], "speedup": base / sum(times[str(f)]),
                     "speedup_median_per_prompt": statistics.median(b / s for b, s in zip(times["target_only"], times[str(f)])),
                     "alpha": pooled.alpha, "tau": pooled.tau})
        print(rows[-1], flush=True)
    return {"what": "suffix drafter speedup over target-only vs corpus size (fractions of assets/feature_data's answers)",
            "prompt_set": args.prompt_set, "prompts": len(inputs), "gamma": args.gamma,
            "max_new_tokens": args.max_new_tokens, "rows": rows}


def tune(args, target, tokenizer) -> dict:
    """The suffix drafter's own knobs on the tuning prompts (input-grounded and open chat), interleaved per prompt."""
    eos = tokenizer.eos_token_id
    prompts = eval_prompts("tuning-input-grounded") + eval_prompts("tuning-open-chat")
    settings = [dict(zip(("gamma", "min_prob", "spec_factor"), map(float, s.split("/")))) for s in args.settings]
    corpus = embedded_corpus()
    times = {"target_only": [], **{s: [] for s in args.settings}}
    stats = {s: [] for s in args.settings}
    for ids in (chat_prompt(tokenizer, p) for p in prompts):
        times["target_only"].append(timed(lambda ids=ids: autoregressive_generate(
            target, ids, max_new_tokens=args.max_new_tokens, eos_token_id=eos), target.device)[1])
        for name, st in zip(args.settings, settings):
            d = SuffixDrafter(corpus, min_prob=st["min_prob"], spec_factor=st["spec_factor"])
            r, sec = timed(lambda ids=ids, d=d, g=int(st["gamma"]): speculative_generate(
                target, d, ids, max_new_tokens=args.max_new_tokens, gamma=g, eos_token_id=eos), target.device)
            times[name].append(sec)
            stats[name].append(r.stats)
    half = len(eval_prompts("tuning-input-grounded"))
    rows = []
    for name, st in zip(args.settings, settings):
        row = {**st, "setting": name}
        for part, sl in (("input_grounded", slice(0, half)), ("open_chat", slice(half, None))):
            pooled = GenerationStats.pooled(stats[name][sl])
            row[f"speedup_{part}"] = sum(times["target_only"][sl]) / sum(times[name][sl])
            row[f"alpha_{part}"], row[f"tau_{part}"] = pooled.alpha, pooled.tau
        rows.append(row)
        print(row, flush=True)
    return {"what": "suffix drafter settings (gamma/min_prob/spec_factor) on the tuning prompts, vs target-only",
            "max_new_tokens": args.max_new_tokens, "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=("sweep", "curve", "tune"))
    ap.add_argument("--settings", type=lambda s: s.split(","), default=["8/0.1/1", "4/0.1/1", "4/0.3/1", "8/0.3/1",
                                                                           "8/0.5/2", "4/0.5/2"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-new-tokens", type=positive_int, default=64)
    ap.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[2, 4, 6, 8, 10])
    ap.add_argument("--ngrams", type=lambda s: [int(x) for x in s.split(",")], default=[2, 3, 4])
    ap.add_argument("--fractions", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.25, 0.5, 1.0])
    ap.add_argument("--prompt-set", default="open-chat")
    ap.add_argument("--prompts", type=positive_int, default=8)
    ap.add_argument("--gamma", type=positive_int, default=8)
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    import transformers

    transformers.utils.logging.set_verbosity_error()
    target, _, tokenizer = load_embedded_pair(device="cpu")
    _hf_generate(target, chat_prompt(tokenizer, "Hello!"), 8, tokenizer.eos_token_id)  # warm-up
    result = {"sweep": sweep, "curve": curve, "tune": tune}[args.what](args, target, tokenizer)
    result.update(provenance(" ".join(["python scripts/suffix_eval.py", *argv])))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
