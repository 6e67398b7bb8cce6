"""Draft of notebook 11, "Drafting from the target's own features" (issue 11): writes it, unexecuted.

    python scripts/notebook_11_draft.py
    jupyter nbconvert --to notebook --execute --inplace notebooks/11_drafting_from_features.ipynb

Kept out of ``notebooks/`` until the trained feature drafters pay on the CPU (see ``assets/eagle/CARD.md``): the
markdown cells marked ANALYSIS_n are to be written against the executed outputs, as every notebook's prose is.
"""
import json
import sys

import nbformat

NAME = "11_drafting_from_features.ipynb"
md = nbformat.v4.new_markdown_cell
code = nbformat.v4.new_code_cell

colab_src = json.load(open("notebooks/08_drafting_without_a_draft_model.ipynb"))["cells"][1]["source"]
colab = code("".join(colab_src) if isinstance(colab_src, list) else colab_src)
colab.metadata["tags"] = ["colab"]

cells = [
    md(f"""# 11 · Drafting from the target's own features

[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/specdec-edu/specdec-edu/blob/main/notebooks/{NAME})

**In this notebook you will**

- see how Medusa and EAGLE draft from the target's last hidden state instead of running a second model;
- watch the target's features reach a drafter, round by round, through one small hook in the loop;
- measure acceptance per draft position for the standalone draft, Medusa and EAGLE side by side;
- measure their speed next to Leviathan's prediction, on this machine;
- train a Medusa head yourself for a minute and watch its acceptance rise;
- check that the output is still exactly the target's: greedy token for token, and a χ² test with a negative control."""),
    colab,
    md("## Setup"),
    code('''import time

import matplotlib.pyplot as plt
import numpy as np
import torch
import transformers
from scipy.stats import chi2, chisquare, ncx2

from specdec_edu import (GenerationStats, MedusaDrafter, autoregressive_generate, chat_prompt, default_pair,
                         expected_speedup, load_drafter, load_pair, logits_to_probs, speculative_generate)
from specdec_edu.controls import accept_always
from specdec_edu.experiments import interleaved_benchmark
from specdec_edu.feature_drafters import asset_dir
from specdec_edu.feature_training import collect_features, evaluate_teacher_forced, load_token_data, medusa_loss, train
from specdec_edu.viz import draw_feature_drafters

transformers.utils.logging.set_verbosity_error()
transformers.utils.logging.disable_progress_bar()

SEED = 0
torch.manual_seed(SEED)
PAIR = default_pair()
if PAIR != "embedded":  # the trained Medusa and EAGLE weights in assets/ belong to the embedded target
    print(f"{PAIR!r} has no trained feature drafters: this notebook uses the embedded pair, also on a GPU.")
    PAIR = "embedded"
target, draft, tok = load_pair(PAIR)
medusa, eagle = load_drafter("medusa", target), load_drafter("eagle", target)
eos = tok.convert_tokens_to_ids("<|im_end|>")
millions = lambda module: sum(p.numel() for p in module.parameters()) / 1e6
print(f"target {millions(target):.1f} M parameters · standalone draft {millions(draft):.1f} M · "
      f"Medusa heads {millions(medusa.net):.2f} M · EAGLE layer {millions(eagle.net):.2f} M (new weights only)")'''),
    md("""## 1. Two drafters that reuse the target's work

Every verify pass computes, at every position t, the target's last hidden state f_t: the vector its LM head
turns into the next-token distribution p_t. A standalone draft model recomputes a (worse) version of that from
scratch. The two best-known alternatives read f_t instead:

- **Medusa** (Cai et al. 2024, [arXiv:2401.10774](https://arxiv.org/abs/2401.10774)) puts K small heads on
  f_t; head k guesses the token k + 1 positions ahead. All heads guess at once, so a round's drafts cost almost
  nothing, but head k must guess without knowing the tokens before its own.
- **EAGLE** (Li et al. 2024, [arXiv:2401.15077](https://arxiv.org/abs/2401.15077)) runs one small decoder layer
  on the pair (f_t, x_{t+1}) to predict the next *feature* f̂_{t+1}, reads it with the target's own LM head, and
  repeats on its own prediction. The paper calls f_t the "second-to-top-layer feature": the LM head counts as
  the top layer, so it is the same vector, the input of the LM head. Knowing x_{t+1}, the token actually sampled,
  is what makes EAGLE's guesses sharper than Medusa's. EAGLE-2 ([arXiv:2406.16858](https://arxiv.org/abs/2406.16858))
  adds dynamic draft trees, EAGLE-3 ([arXiv:2503.01840](https://arxiv.org/abs/2503.01840)) trains with its own
  predictions fed back ("training-time test"), the remedy we use below.

Both reuse the target's embedding and LM head; only the new layers are stored (see the setup cell's counts)."""),
    code('''draw_feature_drafters()
plt.show()'''),
    md("""## 2. The features reach the drafter

The loop needs one addition: a drafter that has an `observe(features)` method is shown the target's last hidden
states for every position the target's KV cache keeps, first the prompt (prefill), then after each round
`[last token] + accepted drafts`. The wrapper below prints what EAGLE is shown during a short generation."""),
    code('''class ShowFeatures:
    """Passes everything to ``inner`` and records the shape of every observation."""

    def __init__(self, inner):
        self.inner, self.shapes = inner, []

    def reset(self):
        self.inner.reset()

    def observe(self, features):
        self.shapes.append(tuple(features.shape))
        self.inner.observe(features)

    def propose(self, context, gamma, to_probs, generator=None):
        return self.inner.propose(context, gamma, to_probs, generator)


question = chat_prompt(tok, "Give three tips for writing clear emails.")
shown = ShowFeatures(eagle)
out = speculative_generate(target, shown, question, max_new_tokens=16, gamma=4, eos_token_id=eos)
print(f"prompt: {question.shape[1]} tokens")
print("observed feature blocks:", shown.shapes[:6], "…")
print("accepted drafts per round:", out.stats.accepted_per_round[:5], "…")'''),
    md("""The first block covers the prompt minus its last token (that token has not been through the target yet);
every later block has one row more than the round's accepted drafts: `[last] + accepted`. Rejected drafts are
never shown, so EAGLE's own KV cache can roll back to real features only."""),
    md("""## 3. Acceptance per draft position

Greedy decoding, γ = 5, three open chat prompts that no training data contained. α at position i is
"accepted / judged" there: draft i is judged only when drafts 1 … i − 1 were all accepted. A drafter whose
guesses drift as it feeds on its own output shows it here, as α falling with the position."""),
    code('''HELD_OUT = ["Why do leaves change colour in autumn? Answer in a short paragraph.",
            "Give three tips for writing clear emails.",
            "Explain what a hash table is to a new programmer."]
prompts = [chat_prompt(tok, p) for p in HELD_OUT]
N_NEW, GAMMA5 = 48, 5
drafters = {"standalone draft": draft, "Medusa (4 heads)": medusa, "EAGLE": eagle}
reference = [autoregressive_generate(target, ids, max_new_tokens=N_NEW, eos_token_id=eos).row(0).tolist() for ids in prompts]
per_position, identical = {}, {}
for name, d in drafters.items():
    runs = [speculative_generate(target, d, ids, max_new_tokens=N_NEW, gamma=GAMMA5, eos_token_id=eos) for ids in prompts]
    pooled = GenerationStats.pooled([r.stats for r in runs])
    per_position[name] = pooled.alpha_per_position(GAMMA5)
    identical[name] = [r.row(0).tolist() for r in runs] == reference
    print(f"{name:18s} α = {pooled.alpha:.2f}, τ = {pooled.tau:.2f} tokens/round, per position "
          + " ".join(f"{a:.2f}" for a in per_position[name]) + f", identical to target-only: {identical[name]}")

fig, ax = plt.subplots(figsize=(7.5, 3.4))
for k, (name, alphas) in enumerate(per_position.items()):
    ax.bar(np.arange(1, GAMMA5 + 1) + (k - 1) * 0.27, np.nan_to_num(alphas), width=0.27, label=name)
ax.set_xlabel("draft position")
ax.set_ylabel("α (accepted / judged)")
ax.set_ylim(0, 1)
ax.legend()
ax.set_title("Greedy acceptance per draft position, held-out prompts")
plt.show()'''),
    md("""**What the numbers say** (this cell is checked against the output above after every run):
ANALYSIS_3"""),
    md("""## 4. Speed, measured next to the prediction

Target-only and each drafter at a fixed γ, interleaved (A B C … in turn, so that a noisy machine hits all alike),
on the same prompts. c is the drafter's time per drafted token over one target-only decoding step; the verify
cost is a (γ + 1)-token forward over a one-token one (Leviathan's formula assumes 1: true on a GPU while
decoding is memory-bound, not on this CPU)."""),
    code('''GAMMAS = {"standalone draft": 4, "Medusa (4 heads)": 3, "EAGLE": 3}
fns = {"target only": lambda: [autoregressive_generate(target, ids, max_new_tokens=N_NEW, eos_token_id=eos) for ids in prompts]}
for name, d in drafters.items():
    fns[name] = lambda d=d, g=GAMMAS[name]: [speculative_generate(target, d, ids, max_new_tokens=N_NEW, gamma=g, eos_token_id=eos)
                                             for ids in prompts]
runs = interleaved_benchmark(fns, repeats=2, warmup=1)
tok_s = {name: np.median([sum(r.stats.new_tokens for r in rep) / sum(r.stats.seconds for r in rep) for rep in reps])
         for name, reps in runs.items()}
base = GenerationStats.pooled([r.stats for r in runs["target only"][-1]])
step = base.target_seconds_per_forward
verify_cost = {}
rows = []
for name in drafters:
    s = GenerationStats.pooled([r.stats for r in runs[name][-1]])
    g = GAMMAS[name]
    c = s.draft_seconds_per_token / step
    verify_cost[name] = (s.verify_seconds / s.rounds) / step
    rows.append((name, g, s.alpha, s.tau, c, verify_cost[name], expected_speedup(min(s.alpha, 0.999), g, c),
                 expected_speedup(min(s.alpha, 0.999), g, c, verify_cost[name]), tok_s[name] / tok_s["target only"]))
print(f"target only: {tok_s['target only']:.1f} tokens/s ({1000 * step:.0f} ms per decoding step)")
print(f"{'drafter':18s} {'γ':>2s} {'α':>5s} {'τ':>5s} {'c':>6s} {'verify':>6s} "
      f"{'Leviathan':>9s} {'+verify':>8s} {'measured':>8s}")
for name, g, a, tau, c, vc, pred, pred_v, measured in rows:
    print(f"{name:18s} {g:2d} {a:5.2f} {tau:5.2f} {c:6.3f} {vc:6.2f} {pred:8.2f}x {pred_v:7.2f}x {measured:7.2f}x")
speedup = {name: measured for name, *_, measured in rows}'''),
    md("""ANALYSIS_4"""),
    md("""## 5. Train a Medusa head yourself

The heads in `assets/medusa/` were trained by `scripts/train_feature_drafters.py` for minutes. Here you train
one head from scratch for about a minute, on features the target computes right now over 64 of the training
sequences (the target's own answers and documentation text, `assets/feature_data/`), and watch its greedy
agreement with the target rise on 16 held-out sequences. A fresh head is zero-initialised, so it starts as the
target's own LM head applied to f_t: a guess of x_{t+1} where x_{t+2} is wanted."""),
    code('''TRAIN_SECONDS = 60
rows = load_token_data(asset_dir("feature_data"))
pick = np.random.default_rng(SEED).permutation(len(rows))
corpus = collect_features(target, [rows[i] for i in pick[:80]])
train_part, held = corpus.subset(torch.arange(64)), corpus.subset(torch.arange(64, 80))

head = MedusaDrafter(target, n_heads=1, draft_vocab_size=16384)
curve = []  # (seconds, held-out agreement of head 1)
start = time.time()

def record(step, loss):
    if step % 10 == 0:
        curve.append((time.time() - start, evaluate_teacher_forced(head, lambda idx: medusa_loss(head, held, idx), held)[0]))

record(0, None)
train(head, lambda idx: medusa_loss(head, train_part, idx), train_part, minutes=TRAIN_SECONDS / 60, lr=3e-3, batch_size=8,
      generator=torch.Generator().manual_seed(SEED), desc="medusa head", callback=lambda step, loss: record(step + 1, loss))
trained_head1 = evaluate_teacher_forced(medusa, lambda idx: medusa_loss(medusa, held, idx), held)[0]
seconds, agreement = zip(*curve)
fig, ax = plt.subplots(figsize=(6.5, 3))
ax.plot(seconds, agreement, marker="o", label="your head (from zero)")
ax.axhline(trained_head1, color="gray", ls="--", label="assets/medusa head 1 (trained longer)")
ax.set_xlabel("seconds of training")
ax.set_ylabel("greedy agreement, held out")
ax.set_ylim(0, 1)
ax.legend()
plt.show()
print(f"held-out agreement: {agreement[0]:.2f} at the start → {agreement[-1]:.2f} after {seconds[-1]:.0f} s "
      f"(the committed head: {trained_head1:.2f})")'''),
    md("""ANALYSIS_5"""),
    md("""## 6. Still exact

A feature drafter changes how often drafts are accepted, never what comes out. Greedy: section 3 already
compared every drafter's output with target-only decoding, token for token. Sampling: below, the first two
tokens after a short prompt are sampled 200 times at temperature 1 with top-k = 8, speculatively with EAGLE
(γ = 2), and the first token's counts are tested against the target's exact distribution with a χ² test
(level 0.001). The same test runs on `accept_always`, a broken rule that keeps every draft. Because a well
trained draft's q is close to p, a broken rule can be hard to catch: we print the test's power, the
probability that it rejects the broken rule at this sample size."""),
    code('''SETTINGS = dict(do_sample=True, temperature=1.0, top_k=8)
N_SAMPLES, LEVEL = 200, 1e-3
short = tok("The best way to learn", return_tensors="pt").input_ids
warp = lambda logits: logits_to_probs(logits, temperature=1.0, top_k=8)
with torch.no_grad():
    p = warp(target(short).logits[0, -1]).double()  # the target's exact next-token distribution
    # EAGLE's q for its first draft: show it the prompt's features as the loop would, and ask for one token.
    eagle.reset()
    eagle.observe(target.get_decoder()(input_ids=short[:, :-1]).last_hidden_state[0])
    q = eagle.propose(short[0], 1, warp, torch.Generator().manual_seed(SEED))[1][0].double()
    q = torch.nn.functional.pad(q, (0, len(p) - len(q)))
support = (p > 0).nonzero().flatten()


def first_tokens(rule, seed):
    gen = torch.Generator().manual_seed(seed)
    return [int(speculative_generate(target, eagle, short, max_new_tokens=2, gamma=2, generator=gen, accept_fn=rule,
                                     **SETTINGS).row(0)[0]) for _ in range(N_SAMPLES)]


def chi2_pvalue(tokens):
    counts = np.array([tokens.count(int(t)) for t in support])
    if len(tokens) > counts.sum():  # a token the target can never emit here
        return 0.0
    return chisquare(counts, N_SAMPLES * p[support].numpy()).pvalue


def power(dist):
    """P(the χ² test rejects) when samples come from ``dist``: noncentral χ² with λ = n Σ (dist − p)² / p."""
    if float(dist[p == 0].sum()) > 0:
        return 1 - (1 - float(dist[p == 0].sum())) ** N_SAMPLES
    lam = N_SAMPLES * float((((dist - p) ** 2)[support] / p[support]).sum())
    return float(ncx2.sf(chi2.ppf(1 - LEVEL, len(support) - 1), len(support) - 1, lam))


for name, rule, dist in (("accept_and_resample (correct)", None, p), ("accept_always (broken)", accept_always, q)):
    pv = chi2_pvalue(first_tokens(rule, SEED))
    print(f"{name:30s} p-value {pv:.3g} → {'rejected' if pv < LEVEL else 'consistent with p'} "
          f"(power against this rule at n = {N_SAMPLES}: {power(dist):.2f})")'''),
    md("""ANALYSIS_6"""),
    md("""## What you learned

- A drafter can read the target's own last hidden state: one `observe(features)` hook in the loop, no second model.
- Medusa guesses several positions at once from one feature; EAGLE predicts the next feature, token by token, and
  needs the sampled token x_{t+1} to do it well. Both reuse the target's embedding and LM head.
- Acceptance per draft position exposes drift: a feature drafter is best at position 1 and degrades as it feeds on
  its own predictions; training on its own predictions (EAGLE-3's training-time test) is the remedy.
- Whatever the drafter, the accept/resample rule keeps the output exactly the target's.

References: Leviathan et al. 2023 ([arXiv:2211.17192](https://arxiv.org/abs/2211.17192)), Chen et al. 2023
([arXiv:2302.01318](https://arxiv.org/abs/2302.01318)), Medusa, EAGLE, EAGLE-2, EAGLE-3 (linked above).

**Next:** back to [00 · Start here](00_start_here.ipynb), or the README's cheat-sheet."""),
]

nb = nbformat.v4.new_notebook(cells=cells)
meta = json.load(open("notebooks/08_drafting_without_a_draft_model.ipynb"))["metadata"]
nb.metadata = {k: v for k, v in meta.items() if k != "widgets"}
nbformat.write(nb, "notebooks/" + NAME)
print("wrote", NAME, file=sys.stderr)
