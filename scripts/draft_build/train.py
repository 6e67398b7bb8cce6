"""Stage 2 (train) and stage 3 (save): distil the target into the tiny draft, then write ``assets/draft/``.

The draft is a ``LlamaForCausalLM`` with the target's full vocabulary and tied embeddings,
initialised from the target (``--init``). Loss: soft cross-entropy to the teacher's top-k
probabilities (ids < K_train) + cross-entropy on the teacher's argmax + a regression of the
draft's final hidden state on the target's. Training is resumable (a checkpoint every
``--ckpt-every`` steps; the batch order is fixed by the seed) and capped by ``--train-minutes``.
Saving writes fp16 weights (loaded as float32), the target's tokenizer and
``"draft_vocab_size": K`` in config.json: the reduced head that ``specdec_edu.ModelDrafter`` uses.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .data import EOS_ID, load_data


def hidden_basis(exs, width, seed, max_rows=80000):
    """Top-``width`` principal directions (uncentred) of the target's final hidden states.

    The target's logits are ``h @ E.T``; projecting h on these directions keeps most of what
    decides its argmax (much more than a PCA of the embeddings E). Returns V [576, width], ev [width].
    """
    rows = [e["hid"] for e in exs if "hid" in e]
    if not rows:
        return None
    H = np.concatenate(rows)
    if len(H) > max_rows:
        H = H[np.random.default_rng(seed).choice(len(H), max_rows, replace=False)]
    H = torch.from_numpy(H).float()
    ev, V = torch.linalg.eigh(H.T @ H / len(H))
    return V.flip(1)[:, :width].contiguous(), ev.flip(0)[:width].clamp(min=1e-6).contiguous()


def make_draft(args, target_embed: torch.Tensor | None, basis=None):
    """A LlamaForCausalLM with the target's vocabulary; embeddings initialised from the target's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(args.seed)
    cfg = LlamaConfig(
        vocab_size=49152, hidden_size=args.width, intermediate_size=args.ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.width // args.heads,
        max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True,
        bos_token_id=1, eos_token_id=2, pad_token_id=2, hidden_act="silu",
    )
    model = LlamaForCausalLM(cfg)
    if target_embed is None or args.init == "random":
        return model
    E = target_embed.float()
    with torch.no_grad():
        if args.init == "hidden-pca" and basis is not None:
            # E @ V: the draft's (tied) head then scores a predicted V-projected target hidden state
            # like the target would; the final norm's gains start at the target's per-direction scale.
            V, ev = basis
            model.get_input_embeddings().weight.copy_(E @ V)
            model.get_decoder().norm.weight.copy_(ev.sqrt() * args.norm_init_scale)
        else:  # PCA of the target's embeddings, rescaled (large tied embeddings make it echo its input)
            Ec = E - E.mean(0, keepdim=True)
            V = torch.linalg.eigh(Ec.T @ Ec)[1][:, -args.width:].flip(1)
            P = Ec @ V
            model.get_input_embeddings().weight.copy_(P * (args.embed_std / P.std()))
    return model


def distill_loss(model, batch, K, w_soft, w_hard, w_mse=0.0, basis=None, head_sample=0, gen=None):
    """Distillation loss on the answer positions; also returns the top-1 agreement (over the scored ids).

    soft: cross-entropy to the teacher's top-k probabilities (ids < K, renormalised);
    hard: cross-entropy on the teacher's argmax where it is < K, averaged over all M answer positions
          (one whose argmax is >= K adds 0, as in ``soft``: both terms weigh every position alike);
    mse:  the draft's final (normed) hidden state vs the target's, projected on ``basis``
          (normalised by the mean variance, so predicting zeros costs 1).
    ``head_sample`` > 0 scores only the batch's teacher candidates plus that many random ids
    (a sampled softmax: cheaper, for training only).
    """
    x, lm, tk_ids, tk_lp = batch["x"], batch["lm"], batch["tk_ids"], batch["tk_lp"]
    hs = model.get_decoder()(input_ids=x).last_hidden_state[lm]  # [M, d]
    W = model.get_output_embeddings().weight[:K]
    inK = tk_ids < K
    if head_sample:
        cand = torch.unique(torch.cat([tk_ids[inK], torch.randint(0, K, (head_sample,), generator=gen)]))
        table = torch.zeros(K, dtype=torch.long)
        table[cand] = torch.arange(len(cand))
        logits = F.linear(hs, W[cand])
        col = table[tk_ids.clamp(max=K - 1)]
    else:
        logits = F.linear(hs, W)
        col = tk_ids.clamp(max=K - 1)
    logq = torch.log_softmax(logits.float(), -1)
    p = tk_lp.exp() * inK
    soft = (-(p * logq.gather(1, col)).sum(1) / p.sum(1).clamp(min=1e-6)).mean()
    ok = inK[:, 0]
    hard = F.nll_loss(logq[ok], col[ok, 0], reduction="sum") / max(1, len(ok))
    loss = w_soft * soft + w_hard * hard
    if w_mse and basis is not None and "hid" in batch:
        V, ev = basis
        z = batch["hid"] @ V
        loss = loss + w_mse * ((hs - z) ** 2).mean() / ev.mean()
    agree = ((logits.argmax(-1) == col[:, 0]) & ok).float()
    return loss, agree


def make_batches(exs, batch_tokens, rng):
    """Length-bucketed batches of example indices, at most ``batch_tokens`` padded tokens each."""
    order = sorted(range(len(exs)), key=lambda i: exs[i]["len"])
    batches, cur, cur_max = [], [], 0
    for i in order:
        L = exs[i]["len"]
        if cur and max(cur_max, L) * (len(cur) + 1) > batch_tokens:
            batches.append(cur)
            cur, cur_max = [], 0
        cur.append(i)
        cur_max = max(cur_max, L)
    if cur:
        batches.append(cur)
    rng.shuffle(batches)
    return batches


def collate(exs, idx, topk):
    T = max(exs[i]["len"] for i in idx)
    x = torch.full((len(idx), T), EOS_ID, dtype=torch.long)
    lm = torch.zeros((len(idx), T), dtype=torch.bool)
    tids, tlp, hid = [], [], []
    for j, i in enumerate(idx):
        e = exs[i]
        seq = np.concatenate([e["prompt"], e["gen"][:-1]])
        x[j, : len(seq)] = torch.from_numpy(seq.astype(np.int64))
        n_p, n_g = len(e["prompt"]), len(e["gen"])
        lm[j, n_p - 1: n_p - 1 + n_g] = True
        tids.append(torch.from_numpy(e["tk_ids"][:, :topk].astype(np.int64)))
        tlp.append(torch.from_numpy(e["tk_val"][:, :topk].astype(np.float32)) - torch.from_numpy(e["lse"])[:, None])
        if "hid" in e:
            hid.append(torch.from_numpy(e["hid"]))
    batch = {"x": x, "lm": lm, "tk_ids": torch.cat(tids), "tk_lp": torch.cat(tlp)}
    if len(hid) == len(idx):
        batch["hid"] = torch.cat(hid).float()
    return batch


def stage_train(args, log):
    torch.set_num_threads(args.train_threads)
    exs, meta = load_data(args)
    for e in exs:
        e["len"] = len(e["prompt"]) + len(e["gen"]) - 1
    n_pos = sum(len(e["gen"]) for e in exs)
    rng = random.Random(args.seed + 2)
    val_idx = set(rng.sample(range(len(exs)), max(2, int(0.03 * len(exs)))))
    train = [e for i, e in enumerate(exs) if i not in val_idx]
    val = [e for i, e in enumerate(exs) if i in val_idx and e["greedy"]]
    log(f"train: {len(exs)} answers, {n_pos} teacher positions ({sum(len(e['gen']) for e in train)} for training, "
        f"{sum(len(e['gen']) for e in val)} greedy positions for validation)")

    from safetensors.torch import load_file

    tw = load_file(str(Path(args.target) / "model.safetensors"))
    emb = tw.get("model.embed_tokens.weight")
    del tw
    basis = hidden_basis(train, args.width, args.seed) if args.init == "hidden-pca" or args.w_mse else None
    if basis is None and args.init == "hidden-pca":
        log("train: no hidden states in the data: falling back to the embedding-PCA initialisation")
    model = make_draft(args, emb, basis)
    gen = torch.Generator().manual_seed(args.seed + 3)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"train: draft {n_params / 1e6:.2f} M parameters (embeddings {model.get_input_embeddings().weight.numel() / 1e6:.2f} M)")
    decay, no_decay, embed = [], [], []
    for n, p in model.named_parameters():
        (embed if "embed" in n else no_decay if p.dim() < 2 else decay).append(p)
    lr_embed = args.lr_embed or args.lr
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01, "scale": 1.0},
                             {"params": no_decay, "weight_decay": 0.0, "scale": 1.0},
                             {"params": embed, "weight_decay": 0.0, "scale": lr_embed / args.lr}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    epoch_batches = [make_batches(train, args.batch_tokens, rng) for _ in range(args.epochs)]
    total = sum(len(b) for b in epoch_batches)
    warm = max(1, int(0.04 * total))

    def lr_at(s):
        if s < warm:
            return args.lr * (s + 1) / warm
        return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, total - warm))))

    def validate():
        model.eval()
        hits, n = 0.0, 0
        with torch.no_grad():
            for s in range(0, len(val), 16):
                idx = list(range(s, min(s + 16, len(val))))
                _, agree = distill_loss(model, collate(val, idx, args.topk), args.k_train, 1, 1)
                hits += agree.sum().item()
                n += len(agree)
        model.train()
        return hits / max(1, n)

    log(f"train: {args.epochs} epochs, {total} steps of <= {args.batch_tokens} tokens, lr {args.lr}, K_train {args.k_train}")
    # Resumable: a checkpoint every --ckpt-every steps (the batch order is fixed by the seed).
    ckpt_path = Path(args.workdir) / "train_ckpt.pt"
    sig = json.dumps({k: v for k, v in sorted(vars(args).items()) if k not in ("stages", "train_minutes", "out")},
                     default=str) + f"|{len(exs)}"
    step, capped, hist, spent = 0, False, [], 0.0
    if ckpt_path.exists():
        ck = torch.load(ckpt_path, weights_only=False)
        if ck.get("sig") == sig:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["opt"])
            gen.set_state(ck["gen"])
            step, hist, spent = ck["step"], ck["hist"], ck["spent"]
            log(f"train: resuming from step {step} ({spent / 60:.1f} min already spent)")
    t0 = time.time() - spent
    deadline = t0 + 60 * args.train_minutes

    def save_ckpt():
        torch.save({"sig": sig, "model": model.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                    "step": step, "hist": hist, "spent": time.time() - t0}, str(ckpt_path) + ".tmp")
        os.replace(str(ckpt_path) + ".tmp", ckpt_path)

    model.train()
    bar = tqdm(total=total, initial=step, desc="train", dynamic_ncols=True, mininterval=5)
    ema_loss = ema_acc = None
    i_global = 0
    for ep, batches in enumerate(epoch_batches):
        for idx in batches:
            i_global += 1
            if i_global <= step:
                continue
            if time.time() > deadline:
                capped = True
                break
            batch = collate(train, idx, args.topk)
            for gparam in opt.param_groups:
                gparam["lr"] = lr_at(step) * gparam["scale"]
            loss, agree = distill_loss(model, batch, args.k_train, args.w_soft, args.w_hard, args.w_mse, basis,
                                       args.head_sample, gen)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            step += 1
            a = agree.mean().item()
            ema_loss = loss.item() if ema_loss is None else 0.95 * ema_loss + 0.05 * loss.item()
            ema_acc = a if ema_acc is None else 0.95 * ema_acc + 0.05 * a
            bar.update(1)
            bar.set_postfix(loss=f"{ema_loss:.3f}", top1=f"{ema_acc:.3f}", ep=ep, refresh=False)
            if args.ckpt_every and step % args.ckpt_every == 0:
                save_ckpt()
        if capped:
            bar.write("train: --train-minutes cap reached, stopping early")
            break
        if i_global <= step and any(h["epoch"] == ep + 1 for h in hist):
            continue
        v = validate()
        hist.append({"epoch": ep + 1, "step": step, "val_top1": round(v, 4), "minutes": round((time.time() - t0) / 60, 2)})
        bar.write(f"train: epoch {ep + 1}: validation top-1 agreement (greedy answers, K={args.k_train}) {v:.3f}")
        save_ckpt()
    bar.close()
    train_min = (time.time() - t0) / 60
    ckpt = Path(args.workdir) / "draft_fp32.pt"
    torch.save({"state": model.state_dict(), "config": model.config.to_dict()}, ckpt)
    return {"steps": step, "capped": capped, "minutes": round(train_min, 2), "history": hist,
            "n_answers": len(exs), "n_positions": n_pos, "n_params": n_params,
            "n_greedy_answers": sum(1 for e in exs if e["greedy"])}


# --------------------------------------------------------------------------------------
# Stage 3: save
# --------------------------------------------------------------------------------------


def stage_save(args, log, k_final):
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_edu.models.weights import load_tokenizer

    ck = torch.load(Path(args.workdir) / "draft_fp32.pt", weights_only=False)
    cfg = LlamaConfig.from_dict(ck["config"])
    model = LlamaForCausalLM(cfg)
    model.load_state_dict(ck["state"])
    out = Path(args.out)
    if out.exists():
        for f in out.iterdir():
            if f.is_file():
                f.unlink()
    out.mkdir(parents=True, exist_ok=True)
    model.config.draft_vocab_size = int(k_final)
    model.half().save_pretrained(out)
    # fp16 on disk; ask loaders for float32 by default
    c = json.loads((out / "config.json").read_text())
    c["dtype"] = "float32"
    c["draft_vocab_size"] = int(k_final)
    (out / "config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
    tok = load_tokenizer(args.target)
    tok.save_pretrained(out)
    # transformers 5 records its own backend class ("TokenizersBackend"), which 4.x cannot resolve; SmolLM2's
    # original class name reads the same tokenizer.json in both (SPECDEC_EDU_RANDOM_TARGET loads it from here)
    t = json.loads((out / "tokenizer_config.json").read_text())
    t["tokenizer_class"] = "GPT2Tokenizer"
    (out / "tokenizer_config.json").write_text(json.dumps(t, indent=2) + "\n")
    gc = Path(args.target) / "generation_config.json"
    if gc.exists():
        shutil.copy(gc, out / "generation_config.json")
    size = (out / "model.safetensors").stat().st_size
    log(f"save: {out} (model.safetensors {size / 1e6:.1f} MB, draft_vocab_size {k_final})")
    return size


def set_k(out: Path, k: int):
    c = json.loads((out / "config.json").read_text())
    c["draft_vocab_size"] = int(k)
    (out / "config.json").write_text(json.dumps(c, indent=2, sort_keys=True) + "\n")
