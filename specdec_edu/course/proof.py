"""A χ² harness for verification rules: does one round emit what speculative sampling must emit?

A verification rule has the signature of :func:`specdec_edu.verify.accept_and_resample`::

    rule(p [γ+1, V], q [γ, V], draft_tokens [γ], generator) -> (n_accepted, next_token)

:func:`chi2_check` runs it for ``n`` rounds on fixed toy distributions (by default :data:`TOY_P` and
:data:`TOY_Q`: γ = 2 drafts over V = 4 tokens): each round the draft tokens are sampled from the rows
of q, the rule decides, and we record what the round *emits*: the kept drafts plus the token the
target adds, ``(x_0, …, x_{k−1}, t)``. Speculative sampling must emit that tuple with probability

* ``min(p_0, q_0)(x_0) ··· min(p_{k−1}, q_{k−1})(x_{k−1}) · max(0, p_k − q_k)(t)`` if draft k was
  rejected (k < γ; each kept draft was proposed *and* accepted, then the correction was drawn), and
* ``min(p_0, q_0)(x_0) ··· min(p_{γ−1}, q_{γ−1})(x_{γ−1}) · p_γ(t)`` if all γ drafts were kept (t is
  the bonus token),

which is notebook 05's proof, one term per line (:func:`emitted_distribution`). Indices here count from 0, as
the tensor rows do: p_0 is row ``p[0]`` and the bonus row p_γ is ``p[γ]`` (``verify.py`` counts positions from 1,
as the papers do, and calls the same rows p_1 … p_{γ+1}). The harness
compares the counts with these probabilities in a χ² goodness-of-fit test. An outcome of
probability 0 (say, a correction the residual excludes) cannot come from the correct rule at all,
so a single one gives p-value 0.

The defaults are fixed so that a result can be quoted: ``n = 1,000`` rounds, seed 0, level 10⁻³.
At these settings the real rule passes and every rule in ``specdec_edu.course.controls.BROKEN_RULES`` fails
(``tests/test_proof.py``). A correct rule still fails with probability 10⁻³ at another seed: that is
what the level means.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["TOY_P", "TOY_Q", "N_ROUNDS", "SEED", "LEVEL", "ChiSquareResult", "emitted_distribution", "chi2_check",
           "token_chi2", "token_chi2_power"]

# Toy rows for γ = 2 drafts over V = 4 tokens. Each draft is accepted with probability
# Σ min(p_i, q_i) = 0.7, so rounds end by a rejection at draft 0 (30 %), at draft 1 (21 %) or with
# every draft kept (49 %); the two residuals differ, and the bonus row p_2 differs from p_1, so a
# rule that confuses any of these rows emits visibly wrong tuples.
TOY_P = torch.tensor([[0.5, 0.3, 0.1, 0.1],   # p_0: the target at draft 0
                      [0.1, 0.2, 0.3, 0.4],   # p_1: the target at draft 1
                      [0.4, 0.4, 0.1, 0.1]],  # p_2: the target at the bonus position
                     dtype=torch.float64)
TOY_Q = torch.tensor([[0.2, 0.3, 0.4, 0.1],   # q_0: the draft at draft 0
                      [0.1, 0.5, 0.1, 0.3]],  # q_1: the draft at draft 1
                     dtype=torch.float64)
N_ROUNDS = 1_000  # rounds per check
SEED = 0
LEVEL = 1e-3  # a correct rule fails with this probability
MIN_EXPECTED = 5  # outcomes expected fewer times than this are pooled into one cell (the χ² approximation needs it)


@dataclass
class ChiSquareResult:
    """The verdict of :func:`chi2_check`. ``passed`` means "consistent with speculative sampling" at ``level``."""

    p_value: float
    statistic: float
    df: int
    n: int
    impossible: int  # rounds that emitted an outcome of probability 0
    level: float

    @property
    def passed(self) -> bool:
        return self.p_value >= self.level

    def __str__(self) -> str:
        if self.impossible:
            return f"FAIL: {self.impossible} of {self.n:,} rounds emitted an outcome the correct rule never emits (p-value 0)"
        if self.df == 0:
            return (f"PASS, but empty: at n = {self.n:,} every outcome falls in one cell, so χ² has nothing to test "
                    "(raise n)")
        verdict = "PASS" if self.passed else "FAIL"
        sign = "≥" if self.passed else "<"
        return (f"{verdict}: χ² = {self.statistic:.1f} (df {self.df}), p-value = {self.p_value:.2e} {sign} {self.level:g}, "
                f"n = {self.n:,} rounds")


def check_distribution(x: torch.Tensor, name: str) -> torch.Tensor:
    """``x`` ``[..., V]`` if each row is a distribution (no negative entry, sums to 1 within 1e-4: a float32 softmax
    over the embedded target's 49,152 ids is off by up to 5e-5), else a ValueError: the exact probabilities would not
    sum to 1, and the test would compare counts with a wrong expectation."""
    sums = x.double().sum(-1)
    if bool((x < 0).any()) or not torch.allclose(sums, torch.ones_like(sums), rtol=0, atol=1e-4):
        raise ValueError(f"{name} must hold distributions (rows >= 0 that sum to 1); its rows sum to "
                         f"{[round(v, 6) for v in sums.flatten().tolist()[:4]]}: normalise it (x / x.sum(-1, keepdim=True))")
    return x


def emitted_distribution(p: torch.Tensor, q: torch.Tensor) -> dict[tuple[int, ...], float]:
    """The exact probability of every tuple one round can emit, ``(kept drafts…, added token)``.

    ``p`` is ``[γ+1, V]`` and ``q`` is ``[γ, V]`` (rows that sum to 1). The formula is written out
    with ``torch.minimum`` and ``clamp`` on purpose, not with the functions of ``verify.py``: the
    harness must not share code with the rules it judges. Tuples of probability 0 are left out.
    """
    p, q = p.double(), q.double()
    gamma, vocab = q.shape
    accepted = torch.minimum(p[:gamma], q)  # P(draft i is x and is kept) = min(p_i(x), q_i(x))
    corrected = (p[:gamma] - q).clamp(min=0)  # P(draft k is rejected and t is drawn) = max(0, p_k(t) − q_k(t))
    out: dict[tuple[int, ...], float] = {}
    prefixes = {(): 1.0}
    for k in range(gamma + 1):
        last = corrected[k] if k < gamma else p[gamma]
        for prefix, mass in prefixes.items():
            for t in range(vocab):
                if mass * float(last[t]) > 0:
                    out[prefix + (t,)] = mass * float(last[t])
        if k < gamma:
            prefixes = {prefix + (x,): mass * float(accepted[k, x])
                        for prefix, mass in prefixes.items() for x in range(vocab) if accepted[k, x] > 0}
    return out


def chi2_check(
    rule: Callable,
    p: torch.Tensor = TOY_P,
    q: torch.Tensor = TOY_Q,
    n: int = N_ROUNDS,
    generator: torch.Generator | None = None,
    level: float = LEVEL,
) -> ChiSquareResult:
    """Run ``rule`` for ``n`` rounds on ``p`` ``[γ+1, V]`` and ``q`` ``[γ, V]``; χ²-test what it emits.

    ``generator`` (a CPU ``torch.Generator``) draws the drafts and is passed to the rule; by default a
    fresh one seeded with :data:`SEED`, so the same rule gives the same p-value every time.
    """
    # Private copies: a rule that writes into p or q in place (a residual built on a row of p, say) must not change
    # the distributions it is judged against, nor the caller's (TOY_P is shared by every cell of a notebook)
    p, q = check_distribution(p, "p").clone(), check_distribution(q, "q").clone()
    if p.dim() != 2 or q.dim() != 2 or p.shape != (q.shape[0] + 1, q.shape[1]) or n < 1:
        raise ValueError(f"need p [γ+1, V], q [γ, V] and n >= 1 rounds; got p {tuple(p.shape)}, q {tuple(q.shape)}, n = {n}")
    if generator is None:
        generator = torch.Generator().manual_seed(SEED)
    gamma = q.shape[0]
    exact = emitted_distribution(p, q)  # before the rule runs
    drafts = torch.multinomial(q.float(), n, replacement=True, generator=generator).T  # [n, γ]: row i = round i's drafts
    emitted = []
    for tokens in drafts:
        result = rule(p.clone(), q.clone(), tokens, generator)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError(f"a rule returns (n_accepted, next_token), got {result!r}")
        k, t = int(result[0]), int(result[1])
        if not 0 <= k <= gamma:
            raise ValueError(f"n_accepted must lie in 0..γ = 0..{gamma}, got {k}")
        emitted.append(tuple(tokens[:k].tolist()) + (t,))

    counts = Counter(emitted)
    impossible = sum(c for outcome, c in counts.items() if outcome not in exact)
    probs = torch.tensor(list(exact.values()), dtype=torch.float64)
    ids = _cell_ids(probs, n)
    if impossible:  # one impossible outcome is proof enough; no χ² needed
        return ChiSquareResult(0.0, float("inf"), int(ids.max()), n, impossible, level)
    observed = torch.tensor([float(counts[o]) for o in exact], dtype=torch.float64)
    return _goodness_of_fit(_cells(observed, ids).numpy(), (n * _cells(probs, ids)).numpy(), n, level)


def _goodness_of_fit(observed, expected, n: int, level: float) -> ChiSquareResult:
    """χ² of the counts ``observed`` against ``expected``, cell by cell (no impossible outcome among them).
    One cell leaves nothing to test (df 0): p-value 1, and ``ChiSquareResult`` says the test was empty."""
    from scipy.stats import chisquare  # imported here: scipy comes with the [notebooks] extra

    observed, expected = np.asarray(observed, float), np.asarray(expected, float)
    if len(observed) < 2:
        return ChiSquareResult(1.0, 0.0, 0, n, 0, level)
    expected = expected * (observed.sum() / expected.sum())  # chisquare wants equal totals (float rounding aside, they are)
    test = chisquare(observed, expected)
    return ChiSquareResult(float(test.pvalue), float(test.statistic), len(observed) - 1, n, 0, level)


def _cell_ids(p: torch.Tensor, n: int) -> torch.Tensor:
    """The χ² cell of each outcome of ``p`` ``[K]`` (probabilities) at ``n`` samples, or −1 where p = 0 (no cell:
    impossible). An outcome expected at least MIN_EXPECTED times has a cell of its own; the others share one; and
    if that shared cell is itself expected fewer than MIN_EXPECTED times, it joins the least expected own cell.
    (The χ² approximation needs every cell's expected count ≥ 5: a shared cell expecting 0.01 made one sample
    count as χ² ≈ 100, and a correct rule failed ten times more often than ``level``.)"""
    expected, ids = n * p, torch.full(p.shape, -1, dtype=torch.long)
    big, small = expected >= MIN_EXPECTED, (p > 0) & (expected < MIN_EXPECTED)
    ids[big] = torch.arange(int(big.sum()))
    if small.any():
        alone = expected[small].sum() >= MIN_EXPECTED or not big.any()
        ids[small] = int(big.sum()) if alone else int(expected[big].argmin())  # ids[big] are 0, 1, … in order
    return ids


def _cells(x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Probabilities or counts ``[K]`` summed into the cells of ``_cell_ids`` (entries with id −1 left out)."""
    keep = ids >= 0
    return torch.zeros(int(ids.max()) + 1, dtype=x.dtype).index_add_(0, ids[keep], x[keep])


# ---- one position of a real model: sampled tokens against the target's exact p ------------------------------


def token_chi2(tokens, p: torch.Tensor, level: float = LEVEL) -> ChiSquareResult:
    """χ²-test sampled token ids (a list or ``[n]``) against an exact next-token distribution ``p`` ``[V]``.

    For a real model: ``p`` is the target's warped distribution at one position, ``tokens`` what a decoder
    emitted there in n independent runs. A token with p = 0 cannot come from p: p-value 0 at once.
    """
    # the test is host arithmetic; p may come from a model on a GPU (to the host first: MPS has no float64)
    p = check_distribution(p.cpu().double(), "p")
    tokens = torch.as_tensor(tokens).flatten().cpu()
    if len(tokens) and int(tokens.max()) >= len(p):
        raise ValueError(f"token id {int(tokens.max())} is outside p's {len(p)} ids: test tokens against the "
                         "distribution of the vocabulary they came from")
    counts = torch.bincount(tokens, minlength=len(p)).double()
    n, ids = int(counts.sum()), _cell_ids(p, int(counts.sum()))
    impossible = int(counts[p == 0].sum())
    observed, expected = _cells(counts, ids).numpy(), (n * _cells(p, ids)).numpy()
    if impossible:
        return ChiSquareResult(0.0, float("inf"), len(observed) - 1, n, impossible, level)
    return _goodness_of_fit(observed, expected, n, level)


def token_chi2_power(dist: torch.Tensor, p: torch.Tensor, n: int, level: float = LEVEL) -> float:
    """P(:func:`token_chi2` rejects at ``level``) when the n tokens really come from ``dist`` ``[V]``.

    Either one of them falls outside p's support (probability 1 − (1 − mass outside)^n), or the χ²
    statistic exceeds its critical value: approximately a noncentral χ² with λ = n Σ (dist − p)² / p over
    the cells. Compute it *before* sampling: a test with little power proves nothing when it passes.
    """
    from scipy.stats import chi2, ncx2

    p, dist = p.cpu().double(), dist.cpu().double()  # host arithmetic, as in token_chi2: they may come from a GPU
    outside = float(dist[p == 0].sum())
    ids = _cell_ids(p, n)
    cp, cd = _cells(p, ids), _cells(dist, ids)
    df = len(cp) - 1
    lam = n * float(((cd - cp) ** 2 / cp).sum())
    rejects = float(ncx2.sf(chi2.ppf(1 - level, df), df, lam)) if df else 0.0  # one cell: χ² never rejects
    return 1 - (1 - outside) ** n * (1 - rejects)
