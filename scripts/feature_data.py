#!/usr/bin/env python
"""Self-distillation data for the feature drafters: the embedded target's own answers to chat prompts.

    python scripts/feature_data.py --out assets/feature_data --minutes 30     # resumable; adds to what is there
    python scripts/feature_data.py --out assets/feature_data --text 2000      # + 2,000 documentation answers

The prompts are ``build_prompts`` from ``scripts/draft_build/prompts.py`` (programmatic, varied chat
messages; the course's and the evaluation prompts are excluded, so they stay held out). Every batch is
answered by the target with HF ``generate`` (left padding), greedily for two batches in three and sampled
at T = 0.7 for the third, and saved as one compact shard of token ids (``uint16``: the vocabulary has 49,152
ids) holding each row's prompt and answer. A shard that exists is skipped, so a later run with more
``--minutes`` or ``--n-prompts`` adds to the data instead of starting over.

``--text N`` adds N teacher-forcing sequences that need no generation at all (a forward over text runs ~10×
faster than generating it): docstrings of Python's standard library, which every machine with Python has,
each written as the assistant's answer to "Explain what `name` does." The target's features and next-token
distributions on them are as valid a training signal for a feature drafter as on its own answers (EAGLE was
trained on a fixed chat corpus); the target's own answers keep the data in-domain.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent))  # scripts/draft_build
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, from a checkout

from draft_build.prompts import build_prompts  # noqa: E402
from specdec_edu.models.embedded import load_embedded_target, load_embedded_tokenizer  # noqa: E402


def chat_ids(tokenizer, text: str) -> list[int]:
    """The chat-formatted prompt's token ids (system message + user turn + assistant header)."""
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                         tokenize=True, return_dict=False)


def batches_of(prompts: list[list[int]], batch_size: int) -> list[list[int]]:
    """Prompt indices grouped into batches of similar length (less padding), in a fixed order."""
    order = sorted(range(len(prompts)), key=lambda i: (len(prompts[i]), i))
    return [order[s: s + batch_size] for s in range(0, len(order), batch_size)]


@torch.no_grad()
def answer_batch(target, prompts: list[list[int]], *, pad_id: int, eos_id: int, max_new: int, sample: bool,
                 temperature: float, seed: int) -> list[list[int]]:
    """The target's answers (token ids, up to and including EOS) to a batch of prompts."""
    n = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), n), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding: every row's last column is real
        ids[i, n - len(p):], mask[i, n - len(p):] = torch.tensor(p), 1
    torch.manual_seed(seed)  # HF generate samples from the global generator
    out = target.generate(ids, attention_mask=mask, max_new_tokens=max_new, do_sample=sample,
                          temperature=temperature if sample else None, top_k=None, top_p=None,
                          eos_token_id=eos_id, pad_token_id=pad_id)[:, n:].tolist()
    answers = []
    for row in out:
        end = row.index(eos_id) + 1 if eos_id in row else len(row)
        answers.append(row[:end])
    return answers


def stdlib_docstrings(n: int, seed: int, min_chars: int = 300) -> list[tuple[str, str]]:
    """``n`` (qualified name, docstring) pairs from the standard library's modules, classes and functions,
    in a seeded order (test and private modules skipped)."""
    import ast
    import os
    import random

    root = Path(os.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part.startswith(("_", "test", "idlelib", "site-packages", "lib2to3")) for part in rel.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = ".".join(rel.with_suffix("").parts)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars and not getattr(node, "name", "x").startswith("_"):
                    found.append((module if isinstance(node, ast.Module) else f"{module}.{node.name}", doc))
    random.Random(seed).shuffle(found)
    return found[:n]


def text_shards(tokenizer, out: Path, n: int, seed: int, max_answer: int, per_shard: int = 250) -> None:
    """Docstrings as chat answers, ``per_shard`` sequences a shard (``text_XXXX.npz``), answers cut at ``max_answer`` tokens."""
    pairs = stdlib_docstrings(n, seed)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    for s in range(0, len(pairs), per_shard):
        shard = out / f"text_{s // per_shard:04d}.npz"
        if shard.exists():
            continue
        rows, prompt_lengths = [], []
        for name, doc in pairs[s: s + per_shard]:
            prompt = chat_ids(tokenizer, f"Explain what `{name}` does.")
            answer = tokenizer(" ".join(doc.split()), add_special_tokens=False).input_ids[:max_answer] + [eos]
            rows.append(np.array(prompt + answer, dtype=np.uint16))
            prompt_lengths.append(len(prompt))
        np.savez_compressed(str(shard) + ".tmp.npz", tokens=np.concatenate(rows),
                            lengths=np.array([len(r) for r in rows], dtype=np.int32),
                            prompt_lengths=np.array(prompt_lengths, dtype=np.int32),
                            prompt_index=np.arange(s, s + len(rows), dtype=np.int32), sampled=np.array(False))
        Path(str(shard) + ".tmp.npz").replace(shard)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="assets/feature_data")
    ap.add_argument("--n-prompts", type=int, default=4000)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--minutes", type=float, default=30.0, help="stop starting new batches after this long")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--text", type=int, default=0, help="add this many documentation sequences (no generation)")
    args = ap.parse_args(argv)
    if args.text:
        text_shards(load_embedded_tokenizer(), Path(args.out), args.text, args.seed, args.max_new)
        return

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = load_embedded_tokenizer()
    target = load_embedded_target(device="cpu")
    texts = build_prompts(args.n_prompts, args.seed)
    prompts = [chat_ids(tokenizer, t) for t in texts]
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    (out / "meta.json").write_text(json.dumps({"n_prompts": args.n_prompts, "seed": args.seed, "max_new": args.max_new,
                                               "batch_size": args.batch_size, "temperature": args.temperature,
                                               "eos_id": eos_id}, indent=1))
    deadline = time.time() + 60 * args.minutes
    batches = batches_of(prompts, args.batch_size)
    # Interleave short and long batches so that a run cut by --minutes still covers all lengths.
    order = [b for pair in zip(range(len(batches)), reversed(range(len(batches)))) for b in pair][: len(batches)]
    order = list(dict.fromkeys(order))
    done = 0
    for b in (bar := tqdm(order, desc="answer batches")):
        shard = out / f"answers_{b:04d}.npz"
        if shard.exists():
            done += 1
            continue
        if time.time() > deadline:
            bar.write(f"--minutes reached: {done} of {len(batches)} batches done; run again to add more")
            break
        idx = batches[b]
        sample = b % 3 == 2
        answers = answer_batch(target, [prompts[i] for i in idx], pad_id=pad_id, eos_id=eos_id, max_new=args.max_new,
                               sample=sample, temperature=args.temperature, seed=args.seed * 1000 + b)
        rows = [np.array(prompts[i] + a, dtype=np.uint16) for i, a in zip(idx, answers)]
        np.savez_compressed(str(shard) + ".tmp.npz", tokens=np.concatenate(rows),
                            lengths=np.array([len(r) for r in rows], dtype=np.int32),
                            prompt_lengths=np.array([len(prompts[i]) for i in idx], dtype=np.int32),
                            prompt_index=np.array(idx, dtype=np.int32), sampled=np.array(sample))
        Path(str(shard) + ".tmp.npz").replace(shard)
        done += 1
        bar.set_postfix(answer_tokens=sum(len(a) for a in answers))


if __name__ == "__main__":
    main()
