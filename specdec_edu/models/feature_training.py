"""Training feature drafters (Medusa heads, an EAGLE layer) on the target's own features.

The functions ``scripts/train_feature_drafters.py`` runs for hours and notebook 11 runs for a minute:
teacher-forced features, the losses, and a time-boxed training loop. Shift conventions (the classic
replication bug is an off-by-one here), for a sequence x_0 … x_{n−1}:

* ``features[:, t]`` = f_t, the target's last hidden state after reading x_0 … x_t;
* ``top_ids/top_logp[:, t]`` = the target's next-token distribution p_t over x_{t+1} (= softmax(lm_head(f_t)));
* Medusa head k on f_t guesses x_{t+k+1}: its target is p_{t+k};
* EAGLE reads (f_t, x_{t+1}) and predicts f̂_{t+1}: targets f_{t+1} (regression) and p_{t+1} (distillation).

Losses count only positions whose predicted token lies in the *answer* (the prompt and the chat
template are easy and would inflate every number).
"""

from __future__ import annotations

import glob
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .feature_drafters import EagleDrafter, MedusaDrafter


@dataclass
class Corpus:
    """Teacher-forced target outputs for S right-padded sequences of at most n tokens (on the host).

    features ``[S, n, d]`` (fp16): f_t; tokens ``[S, n]``: x_t; top_ids / top_logp ``[S, n, k]``:
    the k likeliest next tokens under p_t and their log-probabilities; lengths / prompt_lengths ``[S]``.
    """

    features: torch.Tensor
    tokens: torch.Tensor
    top_ids: torch.Tensor
    top_logp: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def answer_mask(self, idx: torch.Tensor, shift: int) -> torch.Tensor:
        """``[b, n − shift]``: True where position t + shift predicts an answer token (x_{t+shift+1} is
        in the answer: t + shift + 1 >= prompt length) that exists (t + shift + 1 < length)."""
        n = self.tokens.shape[1]
        t = torch.arange(n - shift) + shift  # the position whose p is the target
        nxt = (t + 1)[None]
        return (nxt >= self.prompt_lengths[idx, None]) & (nxt < self.lengths[idx, None])

    def subset(self, idx: torch.Tensor) -> Corpus:
        return Corpus(*(getattr(self, name)[idx] for name in
                        ("features", "tokens", "top_ids", "top_logp", "lengths", "prompt_lengths")))


def load_token_data(data_dir) -> list[tuple[list[int], int]]:
    """``(token ids, prompt length)`` per sequence of ``scripts/feature_data.py``'s shards in ``data_dir``
    (the target's answers, then documentation text), in a fixed order."""
    rows = []
    shards = sorted(glob.glob(str(Path(data_dir) / "answers_*.npz"))) + sorted(glob.glob(str(Path(data_dir) / "text_*.npz")))
    for shard in shards:
        d = np.load(shard)
        starts = np.concatenate([[0], np.cumsum(d["lengths"])[:-1]])
        for s, n, p in zip(starts, d["lengths"], d["prompt_lengths"]):
            rows.append((d["tokens"][s: s + n].astype(np.int64).tolist(), int(p)))
    return rows


@torch.no_grad()
def collect_features(target, rows: list[tuple[list[int], int]], top_k: int = 32, batch_size: int = 16) -> Corpus:
    """Run the target's decoder over every sequence (right-padded batches; causal attention keeps the
    padding out of the real positions) and keep f_t and the top-k of p_t at every position."""
    n = max(len(ids) for ids, _ in rows)
    d = target.config.hidden_size
    S = len(rows)
    corpus = Corpus(torch.zeros(S, n, d, dtype=torch.float16), torch.zeros(S, n, dtype=torch.long),
                    torch.zeros(S, n, top_k, dtype=torch.int32), torch.full((S, n, top_k), -30.0, dtype=torch.float16),
                    torch.tensor([len(ids) for ids, _ in rows]), torch.tensor([p for _, p in rows]))
    order = sorted(range(S), key=lambda i: len(rows[i][0]))  # similar lengths together: less padding
    for start in tqdm(range(0, S, batch_size), desc="teacher-forced features"):
        idx = order[start: start + batch_size]
        m = max(len(rows[i][0]) for i in idx)
        ids = torch.zeros(len(idx), m, dtype=torch.long)
        for j, i in enumerate(idx):
            ids[j, : len(rows[i][0])] = torch.tensor(rows[i][0])
        features = target.get_decoder()(input_ids=ids.to(target.device), use_cache=False).last_hidden_state  # [b, m, d]
        logp = target.get_output_embeddings()(features).float().log_softmax(-1)  # [b, m, V]: p_t over x_{t+1}
        top = logp.topk(top_k, -1)
        for j, i in enumerate(idx):
            L = len(rows[i][0])
            corpus.features[i, :L] = features[j, :L].half().cpu()
            corpus.tokens[i, :L] = ids[j, :L]
            corpus.top_ids[i, :L] = top.indices[j, :L].int().cpu()
            corpus.top_logp[i, :L] = top.values[j, :L].half().cpu()
    return corpus


def distill_loss(logits: torch.Tensor, top_ids: torch.Tensor, top_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the draft's ``logits`` ``[..., V']`` against the target's top-k, over ``mask``ed positions.

    The target's top-k is renormalised over the ids the draft can propose (< V'); rows with none
    of them carry no signal and are skipped. Same gradient as KL(p ‖ q) on those ids.
    """
    inside = top_ids < logits.shape[-1]
    p = torch.nan_to_num(top_logp.float().masked_fill(~inside, float("-inf")).softmax(-1))
    log_q = logits.float().log_softmax(-1).gather(-1, top_ids.long().clamp(max=logits.shape[-1] - 1))
    rows = inside.any(-1) & mask
    return -(p * log_q).sum(-1)[rows].mean()


def top1_agreement(logits: torch.Tensor, top_ids: torch.Tensor, mask: torch.Tensor) -> float:
    """Share of masked positions where the draft's argmax equals the target's (greedy α, teacher-forced)."""
    return float((logits.argmax(-1) == top_ids[..., 0].long())[mask].float().mean())


def batch_of(data: Corpus, idx: torch.Tensor, device, dtype):
    """Sequences ``idx`` ``[b]``, cut to the longest of them (n): features ``[b, n, d]`` (in ``dtype``), tokens
    ``[b, n]``, top_ids / top_logp ``[b, n, k]``, all on ``device``; and n."""
    n = int(data.lengths[idx].max())
    return (data.features[idx, :n].to(device, dtype), data.tokens[idx, :n].to(device),
            data.top_ids[idx, :n].to(device), data.top_logp[idx, :n].to(device), n)


def medusa_loss(drafter: MedusaDrafter, data: Corpus, idx: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Sum over heads k of the distillation loss of head k on f_t against p_{t+k}; and each head's top-1 agreement."""
    f, _, top_ids, top_logp, n = batch_of(data, idx, drafter.target.device, drafter.target.dtype)
    heads = drafter.net(f)  # [b, n, K, d]
    loss, agree = 0.0, []
    for k in range(1, drafter.n_heads + 1):  # head k: inputs f_0 … f_{n−k−1}, targets p_k … p_{n−1}
        mask = data.answer_mask(idx, k)[:, : n - k].to(f.device)
        logits = drafter.head(heads[:, : n - k, k - 1])
        loss = loss + distill_loss(logits, top_ids[:, k:], top_logp[:, k:], mask)
        agree.append(top1_agreement(logits.detach(), top_ids[:, k:], mask))
    return loss, agree


def eagle_loss(drafter: EagleDrafter, data: Corpus, idx: torch.Tensor, *, noise: float = 0.0, unroll: int = 1,
               w_distill: float = 0.1, generator: torch.Generator | None = None) -> tuple[torch.Tensor, list[float]]:
    """EAGLE's loss on sequences ``idx``, summed over ``unroll`` passes; and top-1 agreement per pass.

    Pass 1: inputs (f_t, x_{t+1}) for t = 0 … n−2 → f̂_{t+1}; targets f_{t+1} (smooth L1) and p_{t+1}.
    Pass j > 1 (training-time test): the inputs' features are the previous pass's predictions, shifted
    to the positions they predict (f̂_t in place of f_t), as at draft step j where the layer reads its
    own output. ``noise``: uniform noise U(−a, a) on pass 1's input features (EAGLE-1's remedy), drawn from
    ``generator`` (required with noise: the training run's draws come from its own seed, not torch's global RNG).
    """
    if noise and generator is None:
        raise ValueError(f"noise={noise} needs a generator: pass generator=torch.Generator().manual_seed(seed), so the "
                         "noise is drawn from the training run's own seed, not from torch's global RNG.")
    f, tokens, top_ids, top_logp, n = batch_of(data, idx, drafter.target.device, drafter.target.dtype)
    mask = data.answer_mask(idx, 1)[:, : n - 1].to(f.device)  # position t+1's p predicts an answer token
    embeds = drafter.embed(tokens[:, 1:])  # e_{t+1}
    inputs = f[:, :-1]  # f_t
    if noise:
        u = torch.rand(inputs.shape, generator=generator).to(inputs.device, inputs.dtype)
        inputs = inputs + noise * (2 * u - 1)
    loss, agree = 0.0, []
    for _ in range(unroll):
        f_hat = drafter.net(inputs, embeds)  # [b, n−1, d]: f̂_{t+1}
        regression = F.smooth_l1_loss(f_hat.float()[mask], f[:, 1:].float()[mask])
        logits = drafter.head(f_hat)
        loss = loss + regression + w_distill * distill_loss(logits, top_ids[:, 1:], top_logp[:, 1:], mask)
        agree.append(top1_agreement(logits.detach(), top_ids[:, 1:], mask))
        # Next pass: position t reads f̂_t (predicted from (f_{t−1}, x_t)) instead of the real f_t.
        inputs = torch.cat([f[:, :1], f_hat[:, :-1]], 1)
    return loss, agree


def train(drafter, loss_fn, data: Corpus, *, minutes: float, lr: float, batch_size: int, generator, desc: str,
          max_steps: int | None = None, callback=None) -> list[float]:
    """AdamW (cosine decay) on ``drafter.net`` only, for ``minutes`` or ``max_steps``; the target stays frozen.
    ``callback(step, loss)`` runs after every step (in eval mode)."""
    drafter.target.requires_grad_(False)  # gradients flow through the shared head/embedding, never into them
    net = drafter.net.train().requires_grad_(True)
    optimizer = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.0)
    losses, start, step = [], time.time(), 0
    bar = tqdm(desc=desc, total=max_steps)
    while (max_steps is None or step < max_steps) and time.time() - start < 60 * minutes:
        progress = (time.time() - start) / (60 * minutes) if max_steps is None else step / max_steps
        for group in optimizer.param_groups:  # cosine decay over the time (or step) budget
            group["lr"] = lr * 0.5 * (1 + np.cos(np.pi * min(progress, 1.0)))
        idx = torch.randint(len(data), (batch_size,), generator=generator)
        loss, agree = loss_fn(idx)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        step += 1
        bar.update()
        bar.set_postfix(loss=f"{losses[-1]:.3f}", top1=" ".join(f"{a:.2f}" for a in agree), refresh=False)
        if callback is not None:  # e.g. a notebook recording validation agreement as training goes
            net.eval()
            callback(step, losses[-1])
            net.train()
    bar.close()
    net.eval().requires_grad_(False)
    return losses


@torch.no_grad()
def evaluate_teacher_forced(drafter, loss_fn, data: Corpus, batch_size: int = 16) -> list[float]:
    """Top-1 agreement per head / pass on held-out sequences (answer tokens only), averaged over batches."""
    scores = []
    for start in range(0, len(data), batch_size):
        idx = torch.arange(start, min(start + batch_size, len(data)))
        scores.append(loss_fn(idx)[1])
    return [float(np.mean(col)) for col in zip(*scores)]


