"""Stage 1 (data): the target answers the training prompts; its top-k logits are the teacher signal.

Batched generation with a shared system-prompt KV cache and middle padding; 2/3 greedy, 1/3
sampled at T = 0.8 (one torch.Generator per batch, seeded from the batch index). Runs in
``--gen-workers`` single-thread processes (robust when other jobs share the CPU: multi-thread
OpenMP collapses under oversubscription). Each batch lands in its own shard file under
``WORKDIR/data``, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from specdec_edu.kv import forward_cached
from specdec_edu.models.weights import load_causal_lm, load_tokenizer  # own layers; a tokenizer 4.x and 5 both read

from .prompts import build_prompts

EOS_ID = 2  # SmolLM2's <|im_end|>: ends every answer


def chat_ids(tok, text: str) -> list[int]:
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(s, add_special_tokens=False).input_ids


def shared_prefix(tok) -> list[int]:
    """Token ids shared by every chat prompt (system message + user header)."""
    a, b = chat_ids(tok, "Hello there."), chat_ids(tok, "What is 2 + 2?")
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def load_target(path):
    tok = load_tokenizer(path)
    model = load_causal_lm(path, torch.float32).eval()
    model.requires_grad_(False)
    return model, tok


@torch.inference_mode()
def generate_batch(model, prefix_cache, n_prefix, suffixes, greedy, max_new, temperature, topk, seed, hidden=None):
    """Answer a batch of prompts (each = shared prefix + suffix), recording the target's top-k.

    The shared prefix's keys/values are computed once and repeated; suffixes are padded on
    the *left of the suffix* (middle of the sequence), masked out, with contiguous positions.
    Finished rows are dropped from the batch (and its cache) as they end.
    Returns one dict per row: gen (N,), topk ids (N, k), topk logits (N, k), log-normaliser (N,),
    and, if ``hidden`` is a dict filled by a forward hook on the final norm, the target's final
    (normed) hidden state at each position (N, 576) in fp16.
    """
    B, S = len(suffixes), max(len(s) for s in suffixes)
    ids = torch.full((B, S), EOS_ID, dtype=torch.long)
    smask = torch.zeros((B, S), dtype=torch.long)
    for i, s in enumerate(suffixes):
        ids[i, S - len(s):] = torch.tensor(s)
        smask[i, S - len(s):] = 1
    am = torch.cat([torch.ones((B, n_prefix), dtype=torch.long), smask], 1)
    pos = (n_prefix + smask.cumsum(1) - 1).clamp(min=n_prefix)
    cache = copy.deepcopy(prefix_cache)
    cache.batch_repeat_interleave(B)
    # forward_cached passes the cache under the keyword this transformers takes (cache= on 5.x, past_key_values= on 4.x)
    logits = forward_cached(model, ids, cache, attention_mask=am, position_ids=pos, logits_to_keep=1).logits[:, -1]
    cur_pos = pos[:, -1].clone()
    rows = torch.arange(B)
    greedy_t = torch.tensor(greedy, dtype=torch.bool)
    g = torch.Generator().manual_seed(seed)
    recs = [{"gen": [], "ids": [], "val": [], "lse": [], "hid": []} for _ in range(B)]
    for step in range(max_new):
        logits = logits.float()
        lse = torch.logsumexp(logits, -1)
        tv, ti = logits.topk(topk, -1)
        hid = hidden["h"][:, -1].to(torch.float16).numpy() if hidden is not None else None
        nxt = ti[:, 0].clone()
        samp = ~greedy_t[rows]
        if samp.any():
            p = torch.softmax(logits[samp] / temperature, -1)
            nxt[samp] = torch.multinomial(p, 1, generator=g).squeeze(1)
        for j, r in enumerate(rows.tolist()):
            rec = recs[r]
            rec["gen"].append(int(nxt[j]))
            rec["ids"].append(ti[j].numpy().astype(np.uint16))
            rec["val"].append(tv[j].numpy().astype(np.float16))
            rec["lse"].append(float(lse[j]))
            if hid is not None:
                rec["hid"].append(hid[j])
        if step == max_new - 1:
            break
        keep = nxt != EOS_ID
        if not keep.all():
            if not keep.any():
                break
            idx = keep.nonzero().squeeze(1)
            cache.batch_select_indices(idx)
            am, cur_pos, nxt, rows = am[idx], cur_pos[idx], nxt[idx], rows[idx]
        am = torch.cat([am, torch.ones((len(rows), 1), dtype=am.dtype)], 1)
        cur_pos = cur_pos + 1
        logits = forward_cached(model, nxt[:, None], cache, attention_mask=am, position_ids=cur_pos[:, None]).logits[:, -1]
    out = []
    for r in recs:
        out.append({
            "gen": np.array(r["gen"], dtype=np.int32), "tk_ids": np.stack(r["ids"]),
            "tk_val": np.stack(r["val"]), "lse": np.array(r["lse"], dtype=np.float32),
            **({"hid": np.stack(r["hid"])} if r["hid"] else {}),
        })
    return out


def gen_worker(wid, batches, cfg):
    """One generation process (1 thread): answers its share of the batches, one shard file each."""
    torch.set_num_threads(cfg["threads"])
    from transformers import DynamicCache

    model, tok = load_target(cfg["target"])
    prefix = cfg["prefix"]
    prefix_cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([prefix]), cache=prefix_cache, use_cache=True, logits_to_keep=1)
    hidden = {}
    model.model.norm.register_forward_hook(lambda mod, inp, out: hidden.__setitem__("h", out))
    deadline = cfg["deadline"]
    n_tok, last_dt = 0, 0.0
    bar = tqdm(batches, desc=f"gen worker {wid}", position=wid, dynamic_ncols=True, mininterval=5)
    for b in bar:
        shard = Path(cfg["datadir"]) / f"batch_{b['index']:05d}.pt"
        if shard.exists():
            continue
        if time.time() + last_dt > deadline:  # would not finish in time (batches run largest first)
            bar.write(f"gen worker {wid}: --gen-minutes cap reached, stopping early")
            (Path(cfg["datadir"]) / f"CAPPED_{wid}").touch()
            break
        t_b = time.time()
        res = generate_batch(model, prefix_cache, len(prefix), b["suffixes"], b["greedy"], cfg["max_new"],
                             cfg["temperature"], cfg["topk"], cfg["seed"] * 100003 + b["index"], hidden)
        for r, p, gr in zip(res, b["prompt_idx"], b["greedy"]):
            r["prompt_idx"], r["greedy"] = p, gr
        n_tok += sum(len(r["gen"]) for r in res)
        torch.save(res, str(shard) + ".tmp")
        os.replace(str(shard) + ".tmp", shard)
        last_dt = time.time() - t_b
        bar.set_postfix(tokens=n_tok, refresh=False)
    bar.close()


def stage_data(args, log):
    datadir = Path(args.workdir) / "data"
    tok = load_tokenizer(args.target)
    prompts = build_prompts(args.n_prompts, args.seed)
    prefix = shared_prefix(tok)
    meta = {"n_prompts": args.n_prompts, "seed": args.seed, "max_new": args.max_new, "topk": args.topk,
            "greedy_frac": args.greedy_frac, "temperature": args.temperature, "batch": args.gen_batch,
            "target": str(args.target), "hidden": True}
    if datadir.exists():
        old = json.loads((datadir / "meta.json").read_text()) if (datadir / "meta.json").exists() else None
        if old is not None and old.get("meta") == meta:
            log(f"data: resuming/reusing {datadir}")
        else:
            shutil.rmtree(datadir)
    datadir.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed + 1)
    greedy = [rng.random() < args.greedy_frac for _ in prompts]
    suffixes = []
    for p in prompts:
        ids = chat_ids(tok, p)
        assert ids[: len(prefix)] == prefix
        suffixes.append(ids[len(prefix):])
    (datadir / "meta.json").write_text(json.dumps({"meta": meta, "prompts": prompts, "greedy": greedy,
                                                   "prefix": prefix}, indent=0))
    order = sorted(range(len(prompts)), key=lambda i: (len(suffixes[i]), i))  # similar lengths together
    batches = []
    for bi, s in enumerate(range(0, len(order), args.gen_batch)):
        idx = order[s: s + args.gen_batch]
        batches.append({"index": bi, "prompt_idx": idx, "suffixes": [suffixes[i] for i in idx],
                        "greedy": [greedy[i] for i in idx]})
    log(f"data: {len(prompts)} prompts ({sum(greedy)} greedy) in {len(batches)} batches of {args.gen_batch}, "
        f"max {args.max_new} new tokens, top-{args.topk}, {args.gen_workers} worker(s)")
    cfg = {"target": str(args.target), "prefix": prefix, "max_new": args.max_new, "temperature": args.temperature,
           "topk": args.topk, "seed": args.seed, "datadir": str(datadir), "threads": 1,
           "deadline": time.time() + 60 * args.gen_minutes}
    # Round-robin from the largest batches down so that the workers finish together.
    big_first = sorted(batches, key=lambda b: -sum(map(len, b["suffixes"])))
    shares = [big_first[w:: args.gen_workers] for w in range(args.gen_workers)]
    if args.gen_workers == 1:
        gen_worker(0, shares[0], cfg)
    else:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=gen_worker, args=(w, shares[w], cfg)) for w in range(args.gen_workers)]
        for p in procs:
            p.start()
        for p in procs:
            p.join()
            if p.exitcode != 0:
                raise RuntimeError(f"generation worker failed with exit code {p.exitcode}")
    capped = any(datadir.glob("CAPPED_*"))
    n_done = len(list(datadir.glob("batch_*.pt")))
    log(f"data: {n_done}/{len(batches)} batches done" + (" (gen-minutes cap fired)" if capped else ""))
    return {"capped": capped, "batches_done": n_done, "batches": len(batches)}


def load_data(args):
    datadir = Path(args.workdir) / "data"
    meta = json.loads((datadir / "meta.json").read_text())
    prefix = meta["prefix"]
    tok = load_tokenizer(args.target)
    exs = []
    for f in sorted(datadir.glob("batch_*.pt")):
        for r in torch.load(f, weights_only=False):
            prompt = prefix + chat_ids(tok, meta["prompts"][r["prompt_idx"]])[len(prefix):]
            r["prompt"] = np.array(prompt, dtype=np.int32)
            exs.append(r)
    exs.sort(key=lambda r: r["prompt_idx"])
    return exs, meta
