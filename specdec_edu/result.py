"""What a generation returns, and the small helpers every generator shares.

One result type for every generator (speculative or target-only, one prompt or a
batch): ``sequences`` is always ``[B, prompt + longest output]``, so code written
for one prompt works for many.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

# Why a generation stopped (GenerationStats.stopped_by).
EOS, MAX_NEW_TOKENS, MAX_POSITIONS = "eos", "max_new_tokens", "max_positions"


@dataclass
class GenerationStats:
    """What happened during one generation. Times are wall-clock seconds.

    Counters count what was *emitted*: drafts accepted but cut off after an EOS
    are not counted as accepted, so ``token_sources.count("accepted") == accepted``.
    """

    new_tokens: int = 0
    rounds: int = 0  # target forward passes after the prefill (one per round / per token)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted and emitted
    rejected_rounds: int = 0  # rounds whose rejection (and corrected token) was emitted
    stopped_by: str = ""  # EOS, MAX_NEW_TOKENS or MAX_POSITIONS
    seconds: float = 0.0  # everything, prefill included
    prefill_seconds: float = 0.0  # the target's pass over the prompt
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target forwards after the prefill (+ accept/resample)
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    tokens_per_round: list[int] = field(default_factory=list)
    draft_seconds_per_round: list[float] = field(default_factory=list)
    verify_seconds_per_round: list[float] = field(default_factory=list)
    # Filled with profile=True only: {"draft", "verify_forward", "accept_resample", "cache_crop"} → seconds per round.
    phase_seconds: dict[str, list[float]] = field(default_factory=dict)

    @classmethod
    def pooled(cls, many: list[GenerationStats]) -> GenerationStats:
        """Add up the counters and times of several generations (e.g. one per prompt), so that
        α, τ and c are computed once, from totals, the same way everywhere."""
        total = cls()
        for s in many:
            for name in ("new_tokens", "rounds", "drafted", "accepted", "rejected_rounds",
                         "seconds", "prefill_seconds", "draft_seconds", "verify_seconds"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            for name in ("drafted_per_round", "accepted_per_round", "tokens_per_round",
                         "draft_seconds_per_round", "verify_seconds_per_round"):
                getattr(total, name).extend(getattr(s, name))
            for phase, times in s.phase_seconds.items():
                total.phase_seconds.setdefault(phase, []).extend(times)
        reasons = {s.stopped_by for s in many}
        total.stopped_by = reasons.pop() if len(reasons) == 1 else "mixed"
        return total

    def record_round(self, *, drafted: int, accepted: int, emitted: int, rejected: bool,
                     phases: dict[str, float], profile: bool) -> None:
        """Add one round: ``phases`` = seconds of "draft", "verify_forward", "accept_resample", "cache_crop"."""
        verify = phases["verify_forward"] + phases["accept_resample"] + phases["cache_crop"]
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejected_rounds += rejected
        self.new_tokens += emitted
        self.draft_seconds += phases["draft"]
        self.verify_seconds += verify
        self.drafted_per_round.append(drafted)
        self.accepted_per_round.append(accepted)
        self.tokens_per_round.append(emitted)
        self.draft_seconds_per_round.append(phases["draft"])
        self.verify_seconds_per_round.append(verify)
        if profile:  # per-phase times are only trustworthy on a GPU when the clock waited for the device
            for phase, seconds in phases.items():
                self.phase_seconds.setdefault(phase, []).append(seconds)

    @property
    def alpha(self) -> float:
        """Per-token acceptance rate α: of the drafts the target *judged*, the fraction accepted.

        Drafts after the first rejection in a round are never judged, so
        accepted / drafted (``acceptance_rate``) underestimates α; this is the
        estimate that Leviathan's formula (1 − α^(γ+1)) / (1 − α) expects.
        """
        judged = self.accepted + self.rejected_rounds
        return self.accepted / judged if judged else float("nan")

    def alpha_per_position(self, gamma: int) -> list[float]:
        """α at draft positions 1..γ: accepted / judged at each position (draft i is judged only when
        drafts 1..i−1 were all accepted). A drafter that drifts shows it here: α falls with the position."""
        judged, accepted = self._judged_and_accepted(gamma)
        return [a / j if j else float("nan") for a, j in zip(accepted, judged)]

    def _judged_and_accepted(self, gamma: int) -> tuple[list[int], list[int]]:
        judged, accepted = [0] * gamma, [0] * gamma
        for drafted, n in zip(self.drafted_per_round, self.accepted_per_round):
            for i in range(min(drafted, n + 1, gamma)):  # positions 1..n were accepted, n+1 rejected (if drafted)
                judged[i] += 1
                accepted[i] += i < n
        return judged, accepted

    def judged_per_position(self, gamma: int) -> list[int]:
        """How many drafts were judged at positions 1..γ: the denominators of :meth:`alpha_per_position`.
        A rate judged a handful of times is noise (its standard error is about sqrt(α(1 − α)/judged))."""
        return self._judged_and_accepted(gamma)[0]

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted: the share of all proposed draft tokens that were kept."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tau(self) -> float:
        """New tokens per target forward (after the prefill)."""
        return self.new_tokens / self.rounds if self.rounds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else float("nan")

    @property
    def draft_seconds_per_token(self) -> float:
        return self.draft_seconds / self.drafted if self.drafted else float("nan")

    @property
    def target_seconds_per_forward(self) -> float:
        return self.verify_seconds / self.rounds if self.rounds else float("nan")


class GenerationResult:
    """The output of any generator in this package, for one prompt or a batch of B.

    Attributes:
        sequences: ``[B, prompt + longest output]``: the prompts as given (left padding
            kept), then each row's new tokens, right-padded with ``pad_token_id``.
        prompt_length: columns of ``sequences`` that belong to the prompt.
        lengths: how many new tokens each row made.
        token_sources: one list per row, one label per new token: "accepted" (a draft
            token the target kept), "corrected" (sampled from the residual after a
            rejection), "bonus" (the free token after all drafts were accepted) or
            "target" (decoded by the target alone).
        stats: ``GenerationStats`` of the whole call; ``row_stats``: one per row.
    """

    def __init__(self, prompts: torch.Tensor, outputs: list[list[int]], *, pad_token_id: int,
                 stats: GenerationStats, row_stats: list[GenerationStats], token_sources: list[list[str]]):
        longest = max(len(o) for o in outputs)
        new = torch.full((len(outputs), longest), pad_token_id, dtype=torch.long)
        for i, o in enumerate(outputs):
            new[i, : len(o)] = torch.tensor(o, dtype=torch.long)
        self.sequences = torch.cat([prompts, new.to(prompts.device)], 1)
        self.prompt_length = prompts.shape[1]
        self.lengths = [len(o) for o in outputs]
        self.stats, self.row_stats, self.token_sources = stats, row_stats, token_sources

    @property
    def new_tokens(self) -> torch.Tensor:
        """``[B, longest]`` the generated token ids (rows right-padded; see ``row``)."""
        return self.sequences[:, self.prompt_length :]

    def row(self, i: int = 0) -> torch.Tensor:
        """``[lengths[i]]`` row i's generated token ids, without padding."""
        return self.sequences[i, self.prompt_length : self.prompt_length + self.lengths[i]]

    def __repr__(self) -> str:
        return (f"GenerationResult(batch={len(self.lengths)}, prompt_length={self.prompt_length}, "
                f"lengths={self.lengths}, stopped_by={self.stats.stopped_by!r})")


def sync(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock timings mean something (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def cut_at_eos(tokens: list[int], eos: set[int]) -> tuple[list[int], bool]:
    """``tokens`` up to and including the first EOS token, and whether there was one."""
    for i, token in enumerate(tokens):
        if token in eos:
            return tokens[: i + 1], True
    return tokens, False


def stop_reason(n_new: int, length: int, hit_eos: bool, max_new_tokens: int, max_pos: int | None) -> str:
    """Why generation must stop now ("" if it need not)."""
    if hit_eos:
        return EOS
    if n_new >= max_new_tokens:
        return MAX_NEW_TOKENS
    if max_pos is not None and length >= max_pos:
        return MAX_POSITIONS  # every token in the result must be one the target could read back
    return ""


class PhaseClock:
    """Wall-clock time of each phase of a round.

    GPUs run queued work asynchronously, so a clock read without waiting measures only
    how long it took to *queue* the work. ``profile=True`` waits for the device at every
    phase boundary (exact everywhere, but the waits slow a GPU down); without it the clock
    is only read (exact on a CPU, where nothing is asynchronous).
    """

    def __init__(self, device: torch.device, profile: bool):
        self.device, self.profile = device, profile
        self.last = time.perf_counter()

    def lap(self) -> float:
        """Seconds since the previous lap."""
        if self.profile:
            sync(self.device)
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed
