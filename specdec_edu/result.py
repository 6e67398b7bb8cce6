"""What a generation returns, and the small helpers every generator shares.

One result type for every generator (speculative or target-only, one prompt or a
batch): ``sequences`` is always ``[B, prompt + longest output]``, so code written
for one prompt works for many.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from dataclasses import dataclass, field

import torch


def warn_caller(message: str) -> None:
    """``warnings.warn(message)``, pointed at the caller's line: the first frame outside this package, torch (its
    ``no_grad`` wraps the generators, so a fixed ``stacklevel`` named torch's ``_contextlib.py``) and a dataclass's
    generated ``__init__``; the outermost frame if every one is inside (``python -m specdec_edu``)."""
    package = os.path.dirname(os.path.abspath(__file__))
    level, frame = 1, sys._getframe(0)  # stacklevel 1 is this function's frame
    while frame.f_back is not None and (frame.f_code.co_filename.startswith(package)
                                        or frame.f_code.co_filename == "<string>"
                                        or f"{os.sep}torch{os.sep}" in frame.f_code.co_filename):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, stacklevel=level)


# Why a generation stopped (GenerationStats.stopped_by).
EOS, MAX_NEW_TOKENS, MAX_POSITIONS = "eos", "max_new_tokens", "max_positions"


@dataclass
class GenerationStats:
    """What happened during one generation. Times are wall-clock seconds.

    Counters count what was *emitted*: drafts accepted but cut off after an EOS
    are not counted as accepted, so ``token_sources.count("accepted") == accepted``.

    Times (the same meaning in the single-prompt and the batched loop):

    - ``seconds``: wall time of the whole generation, from the start of the prompt pass to
      the end of the last round (for a batch row: the last round it took part in);
    - ``prefill_seconds``: the target's pass over the prompt (and showing its features to a
      feature drafter; target-only: and sampling the first token, which that pass predicts);
    - ``draft_seconds``: drafting, i.e. the drafter's ``propose`` and its checks (batched:
      the draft model's forwards, including catching up on the last round's tokens);
    - ``verify_seconds``: the target's verify forward, the accept rule, and the round's one
      device→host read (target-only: the forward, the sampling and the read of each token);
    - ``bookkeeping_seconds``: the rest: rolling the caches back, showing features to the
      drafter, recording the round, stop checks.

    On a GPU without ``profile=True`` a phase's clock is read without waiting for the device,
    so queued work is counted where the next wait happens (the round's read, in verify).
    """

    new_tokens: int = 0
    rounds: int = 0  # target forward passes after the prefill (one per round / per token)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted and emitted
    rejected_rounds: int = 0  # rounds whose rejection (and corrected token) was emitted
    stopped_by: str = ""  # EOS, MAX_NEW_TOKENS or MAX_POSITIONS
    compiled: bool = False  # did the target run compiled code? (a draft model's compile can fail on its own: own warning)
    draft_compiled: bool = False  # did a draft model (a ModelDrafter) run compiled code? False for model-free drafters
    seconds: float = 0.0  # wall time of the whole generation, prefill included
    prefill_seconds: float = 0.0  # the target's pass over the prompt
    draft_seconds: float = 0.0  # the drafter's work
    verify_seconds: float = 0.0  # target verify forwards + accept rule + the one read per round
    # Per round (for a batch: one entry per row per round, as in ``pooled``).
    drafted_per_round: list[int] = field(default_factory=list)
    accepted_per_round: list[int] = field(default_factory=list)
    rejected_per_round: list[bool] = field(default_factory=list)  # was the round's rejection emitted?
    tokens_per_round: list[int] = field(default_factory=list)
    draft_seconds_per_round: list[float] = field(default_factory=list)
    verify_seconds_per_round: list[float] = field(default_factory=list)
    # Filled with profile=True only: {"draft", "verify_forward", "accept_resample", "cache_crop"} → seconds per round.
    phase_seconds: dict[str, list[float]] = field(default_factory=dict)

    COUNTERS = ("new_tokens", "rounds", "drafted", "accepted", "rejected_rounds")
    TIMES = ("seconds", "prefill_seconds", "draft_seconds", "verify_seconds")
    PER_ROUND = ("drafted_per_round", "accepted_per_round", "rejected_per_round", "tokens_per_round")
    TIMES_PER_ROUND = ("draft_seconds_per_round", "verify_seconds_per_round")

    @classmethod
    def pooled(cls, many: list[GenerationStats]) -> GenerationStats:
        """Add up the counters and times of several generations (e.g. one per prompt), so that
        α, τ and c are computed once, from totals, the same way everywhere."""
        total = cls()
        for s in many:
            for name in cls.COUNTERS + cls.TIMES:
                setattr(total, name, getattr(total, name) + getattr(s, name))
            for name in cls.PER_ROUND + cls.TIMES_PER_ROUND:
                getattr(total, name).extend(getattr(s, name))
            for phase, times in s.phase_seconds.items():
                total.phase_seconds.setdefault(phase, []).extend(times)
        reasons = {s.stopped_by for s in many}
        total.stopped_by = reasons.pop() if len(reasons) == 1 else "mixed"
        return total

    @classmethod
    def of_batch(cls, rows: list[GenerationStats], batch_clock: GenerationStats) -> GenerationStats:
        """A batch's stats: what its rows drafted, accepted and emitted (``pooled``: the per-round lists
        hold one entry per row per round), with the batch's own rounds (target forwards) and times."""
        total = cls.pooled(rows)
        for name in ("rounds",) + cls.TIMES + cls.TIMES_PER_ROUND + ("phase_seconds",):
            setattr(total, name, getattr(batch_clock, name))
        return total

    def record_round(self, *, drafted: int, accepted: int, emitted: int, rejected: bool) -> None:
        """Count one round: ``drafted`` drafts proposed, ``accepted`` of them emitted, ``emitted`` new tokens
        in all, and whether the round ended in an (emitted) rejection."""
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejected_rounds += rejected
        self.new_tokens += emitted
        self.drafted_per_round.append(drafted)
        self.accepted_per_round.append(accepted)
        self.rejected_per_round.append(rejected)
        self.tokens_per_round.append(emitted)

    def record_times(self, phases: dict[str, float], profile: bool) -> None:
        """Add one round's seconds: ``phases`` = "draft", "verify_forward", "accept_resample" (the rule and
        the read), "cache_crop" (bookkeeping: counted in ``seconds`` only)."""
        verify = phases["verify_forward"] + phases["accept_resample"]
        self.draft_seconds += phases["draft"]
        self.verify_seconds += verify
        self.draft_seconds_per_round.append(phases["draft"])
        self.verify_seconds_per_round.append(verify)
        if profile:  # per-phase times are only trustworthy on a GPU when the clock waited for the device
            for phase, seconds in phases.items():
                self.phase_seconds.setdefault(phase, []).append(seconds)

    @property
    def bookkeeping_seconds(self) -> float:
        """Wall time outside the prefill, drafting and verifying: cache rollbacks, recording, stop checks."""
        return self.seconds - self.prefill_seconds - self.draft_seconds - self.verify_seconds

    @property
    def alpha(self) -> float:
        """Per-token acceptance rate α: of the drafts the target *judged*, the fraction accepted.

        Drafts after the first rejection in a round are never judged, so
        accepted / drafted (``accepted_per_drafted``) underestimates α; this is the
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
        # A round's drafts 1..n were accepted; draft n+1 was judged (and rejected) only if the round's
        # rejection was emitted: drafts cut off by an EOS were never judged, as in ``alpha``.
        rejected = self.rejected_per_round or [n < d for d, n in zip(self.drafted_per_round, self.accepted_per_round)]
        judged, accepted = [0] * gamma, [0] * gamma
        for n, was_rejected in zip(self.accepted_per_round, rejected):
            for i in range(min(n + was_rejected, gamma)):
                judged[i] += 1
                accepted[i] += i < n
        return judged, accepted

    def judged_per_position(self, gamma: int) -> list[int]:
        """How many drafts were judged at positions 1..γ: the denominators of :meth:`alpha_per_position`.
        A rate judged a handful of times is noise (its standard error is about sqrt(α(1 − α)/judged))."""
        return self._judged_and_accepted(gamma)[0]

    def accepted_per_position(self, gamma: int) -> list[int]:
        """How many drafts were accepted at positions 1..γ: the numerators of :meth:`alpha_per_position` (counts
        add up over runs, where rates do not)."""
        return self._judged_and_accepted(gamma)[1]

    @property
    def row_rounds(self) -> int:
        """Rounds counted per sequence, the denominator of τ: ``rounds`` for one prompt. A batch's ``rounds`` counts its
        batched forwards, each serving every row still generating; here its rows' rounds are added up (one entry
        per row per round in ``tokens_per_round``), so that a batch's τ is a row's tokens per round, not B times it."""
        return len(self.tokens_per_round) or self.rounds  # target-only decoding of one prompt records no per-round list

    @property
    def drafts_per_round(self) -> float:
        """drafted / rounds (per row, for a batch): γ where every round drafts γ (but the last, cut to fit); less for a
        drafter that drafts only what it finds (prompt lookup, suffix), whose rounds Leviathan's formula does not
        describe (``theory.drafts_short_of_gamma``)."""
        return self.drafted / self.row_rounds if self.row_rounds else float("nan")

    @property
    def accepted_per_drafted(self) -> float:
        """accepted / drafted: the share of all proposed draft tokens that were kept. Not α: the drafts after a
        round's first rejection are never judged, so this is lower than :attr:`alpha`."""
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def acceptance_rate(self) -> float:
        # The course calls α the acceptance rate, and this name once meant accepted / drafted: refuse it, naming both.
        raise AttributeError("stats.acceptance_rate is ambiguous and was removed: the acceptance rate α of "
                             "Leviathan's formula (accepted / judged) is stats.alpha; accepted / drafted is "
                             "stats.accepted_per_drafted")

    @property
    def tau(self) -> float:
        """New tokens per round (``new_tokens / rounds``; rounds are the target's forwards after the prefill).

        Speculative decoding's prefill emits no token, so this is the mean tokens per verify pass, Leviathan's
        (1 − α^(γ+1)) / (1 − α). Target-only decoding's prefill emits the first token, so there it is
        n / (n − 1) for n new tokens, a little above 1. For a batch, per row (:attr:`row_rounds`)."""
        return self.new_tokens / self.row_rounds if self.row_rounds else float("nan")

    @property
    def tokens_per_second(self) -> float:
        """New tokens over the run's wall time (prefill included); for a batch, all rows' tokens."""
        return self.new_tokens / self.seconds if self.seconds else float("nan")

    @property
    def draft_seconds_per_token(self) -> float:
        """``draft_seconds / drafted``: what one drafted token cost (exact on a GPU only in a ``profile=True`` run)."""
        return self.draft_seconds / self.drafted if self.drafted else float("nan")

    @property
    def target_seconds_per_forward(self) -> float:
        """``verify_seconds / rounds``: one target forward after the prefill, with the rule and the round's read. In a
        target-only run, one decoding step (the unit of c); in a speculative run, a verify pass of γ + 1 tokens; in a
        batch, one batched forward."""
        return self.verify_seconds / self.rounds if self.rounds else float("nan")


class RoundRecorder:
    """One row's output as it grows (its tokens, where each came from, its stats), round by round.

    Both loops (one prompt; a batch, one recorder per row) hand every round to :meth:`add`,
    so a round is counted the same way everywhere.
    """

    def __init__(self, prompt_length: int, *, max_new_tokens: int, eos: frozenset[int], max_pos: int | None,
                 clock: PhaseClock):
        self.tokens: list[int] = []
        self.sources: list[str] = []  # one label per token (see GenerationResult.token_sources)
        self.stats = GenerationStats()
        self.length = prompt_length  # prompt + output: the positions the target must be able to read
        self.max_new_tokens, self.eos, self.max_pos, self.clock = max_new_tokens, eos, max_pos, clock

    def add(self, drafts: list[int], n: int, next_token: int, phases: dict[str, float], *,
            from_prefill: bool = False) -> list[int]:
        """Emit the round's accepted drafts ``drafts[:n]`` and the target's ``next_token``, up to an EOS.

        ``phases``: the round's seconds (see ``GenerationStats.record_times``). Returns the emitted tokens.
        ``from_prefill``: the token came out of the pass over the prompt (target-only decoding), which is not a
        round: ``stats.rounds`` counts the target's passes after the prefill, as for one prompt.
        """
        new, hit_eos = cut_at_eos(drafts[:n] + [next_token], self.eos)
        accepted = min(n, len(new))  # drafts cut off after an EOS were never emitted (nor judged)
        final_label = "target" if not drafts else "bonus" if n == len(drafts) else "corrected"
        self.tokens += new
        self.sources += ["accepted"] * accepted + [final_label] * (len(new) - accepted)
        self.length += len(new)
        if from_prefill:
            self.stats.new_tokens += len(new)
        else:
            self.stats.record_round(drafted=len(drafts), accepted=accepted, emitted=len(new),
                                    rejected=final_label == "corrected" and len(new) > n)
            self.stats.record_times(phases, self.clock.profile)
        self.stats.stopped_by = stop_reason(len(self.tokens), self.length, hit_eos, self.max_new_tokens, self.max_pos)
        if self.stats.stopped_by:
            self.stats.seconds = self.clock.elapsed()
        return new


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
    """Wall-clock time of each phase of a round, and of the whole generation (``elapsed``).

    GPUs run queued work asynchronously, so a clock read without waiting measures only
    how long it took to *queue* the work. ``profile=True`` waits for the device at every
    phase boundary (exact everywhere, but the waits slow a GPU down); without it the clock
    is only read (exact on a CPU, where nothing is asynchronous).
    """

    def __init__(self, device: torch.device, profile: bool):
        self.device, self.profile = device, profile
        self.start = self.last = time.perf_counter()

    def elapsed(self) -> float:
        """Seconds since the clock was made (waits for the device under ``profile``)."""
        if self.profile:
            sync(self.device)
        return time.perf_counter() - self.start

    def lap(self) -> float:
        """Seconds since the previous lap."""
        if self.profile:
            sync(self.device)
        now = time.perf_counter()
        elapsed, self.last = now - self.last, now
        return elapsed
