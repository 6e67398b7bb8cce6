"""The exercise checkers used at the end of the notebooks.

``check_answer(name, answer, expected)`` says clearly whether an answer is right, and
treats an exercise left as ``...`` as "not attempted yet" rather than an error, so that
running a whole notebook never stops at an untouched exercise cell.

``check_alpha_for_speedup(a, gamma, c, verify_cost, speedup)`` checks "which α gives this speedup?" (the
break-even of notebook 06, the 1.5× of notebook 08) on the learner's own measured costs, including the two
ends where the answer is not a root.

``check_speculative_round(round_fn, target, draft, prompt_ids)`` runs a learner's greedy
speculative round (notebook 06, "build it yourself") until the answer is long enough and
compares it, token by token, with the target's own greedy output.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

__all__ = ["check_answer", "check_alpha_for_speedup", "check_speculative_round"]


def _one_number(x: Any) -> Any:
    """``x``'s number if it is a tensor or array of one element (``tensor([0.5])``), else ``x`` as it is."""
    if isinstance(x, (torch.Tensor, np.ndarray, np.generic)) and torch.as_tensor(x).numel() == 1:
        return x.item()
    return x


def _matches(answer: Any, expected: Any, tol: float) -> bool:
    """Numbers within ``tol``, strings without case or surrounding spaces, sequences element by element. A bool
    matches only a bool and a number only a number: ``False`` is not the answer 0, nor ``"0.4"`` the answer 0.4."""
    answer, expected = (x.item() if isinstance(x, (torch.Tensor, np.ndarray, np.generic)) and np.ndim(x) == 0 else x
                        for x in (answer, expected))  # a 0-d tensor or numpy scalar is its Python number or bool
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        answer = _one_number(answer)  # tensor([0.5]) where a number is expected: that number, whatever its shape
    if isinstance(expected, str):
        return isinstance(answer, str) and answer.strip().lower() == expected.strip().lower()
    if isinstance(expected, bool) or isinstance(answer, bool):
        return isinstance(answer, bool) and isinstance(expected, bool) and answer == expected
    if isinstance(expected, (int, float)):
        return isinstance(answer, (int, float)) and math.isclose(answer, expected, rel_tol=tol, abs_tol=tol)
    # Tensors and arrays are compared as (nested) lists, so [0.75, 0, 0.25] matches a tensor.
    if isinstance(expected, (torch.Tensor, np.ndarray)):
        expected = expected.tolist()
    if isinstance(answer, (torch.Tensor, np.ndarray)):
        answer = answer.tolist()
    if isinstance(expected, (list, tuple)):
        return (
            isinstance(answer, (list, tuple))
            and len(answer) == len(expected)
            and all(_matches(a, e, tol) for a, e in zip(answer, expected))
        )
    return answer == expected


def check_answer(name: str, answer: Any, expected: Any, *, tol: float = 1e-6, hint: str = "") -> bool:
    """Check an exercise answer and say so clearly.

    ``answer`` left as ``...`` or ``None`` means "not attempted yet": a note is printed and
    ``False`` returned (so an untouched exercise cell never stops the notebook). A wrong
    answer raises ``AssertionError`` with ``hint``; a right one prints a confirmation.
    Numbers are compared with absolute/relative tolerance ``tol``, strings without case or
    surrounding spaces, sequences element by element.
    """
    if answer is None or answer is Ellipsis:
        print(f"{name}: not answered yet. Replace the ... with your answer and run the cell again.")
        return False
    if not _matches(answer, expected, tol):
        message = f"{name}: {answer!r} is not right."
        if isinstance(expected, (list, tuple, torch.Tensor, np.ndarray)) and isinstance(answer, (torch.Tensor, np.ndarray)):
            want, got = np.shape(np.asarray(expected, dtype=object)), tuple(answer.shape)
            if want not in ((), got):  # the values may be right: say what is wrong first
                message = f"{name}: expected {int(np.prod(want))} values (shape {want}), got shape {got}."
        raise AssertionError(message + (f" Hint: {hint}" if hint else ""))
    print(f"{name}: correct!")
    return True


def check_alpha_for_speedup(a, gamma: int, c: float, verify_cost: float, speedup: float, tol: float = 0.005) -> float:
    """Is ``a`` the acceptance rate at which ``expected_speedup`` reaches ``speedup``, within ``tol``?

    Returns the right answer if it is, else raises ``AssertionError`` saying why (the notebooks print their own
    "correct" line). The right answer moves with the verify cost each device measures, and has two ends that are
    not a root: ``nan`` when even α = 1 falls short, and 0 when even α = 0 gets there (a verify pass measured
    cheaper than a step, as on a busy CPU: every drafter then does).
    """
    from ..theory import alpha_for_speedup, expected_speedup

    a = _one_number(a)
    assert a is None or (isinstance(a, (int, float)) and not isinstance(a, bool)), \
        f"α = {a!r} is not a number: give the acceptance rate as a float, e.g. 0.42 (or nan)"
    try:
        right = alpha_for_speedup(speedup, gamma, c, verify_cost)
    except ValueError:  # out of reach
        best = float(expected_speedup(1.0, gamma, c, verify_cost=verify_cost))
        assert a is not None and a != a, f"even α = 1 only gives {best:.2f}x here: set nan"
        return float("nan")
    assert a is not None and a == a, f"α = {a} does not give {speedup}x"
    assert 0 <= a <= 1, f"α = {a} is not an acceptance rate: a probability lies in [0, 1]"
    if right == 0:
        worst = float(expected_speedup(0.0, gamma, c, verify_cost=verify_cost))
        assert abs(a) <= tol, f"even α = 0 gives {worst:.2f}x here (verify pass {verify_cost:.2f} steps): the answer is 0"
    assert abs(a - right) <= tol, (f"at α = {a:.3f} the predicted speedup is "
                                   f"{float(expected_speedup(a, gamma, c, verify_cost=verify_cost)):.3f}, not {speedup}")
    return right


@torch.no_grad()
def check_speculative_round(round_fn, target, draft, prompt_ids, *, gamma: int = 4, max_new_tokens: int = 24,
                            tokenizer=None) -> bool | None:
    """Run ``round_fn`` round after round from ``prompt_ids`` and compare with the target's greedy output.

    ``round_fn(target, draft, cache, context, gamma) -> list[int]`` is one greedy round: ``context`` ``[n]``
    holds every token so far and ``cache`` (a ``DynamicCache``) the target's keys/values for all of them
    except the last. The round returns the tokens it emits (accepted drafts, then the target's correction or
    bonus token) and must leave ``cache`` holding everything except the newest token.

    Prints PASS, or FAIL with the first divergent position and any round that left the cache at the wrong
    length (or, if the tokens are right, that no round ever fed the target more than one token: one target
    forward per token is plain decoding, with no verify pass), and returns True / False; returns None (printing
    "not written yet") if ``round_fn`` returns ``NotImplemented``. In float32 PASS means identical token for
    token, and up to three more rounds with the target as its own draft emit the target's next γ + 1 tokens each
    (every draft accepted, then the bonus token: a weak draft never tests either). A bf16/fp16 target can flip a
    near-tie between the reference's 1-token forwards and the rounds' (γ + 1)-token ones: such a divergence passes,
    saying so, when ``check_same_output`` finds it within rounding's reach (a forgotten crop is far outside it).
    With ``tokenizer``, a FAIL line shows each token's text beside its id.
    """
    from .. import kv
    from ..generate import autoregressive_generate
    from .diagnostics import OutputMismatch, check_same_output, first_divergence

    prompt = torch.as_tensor(prompt_ids).flatten().to(target.device)
    # eager, like the rounds (DynamicCache): on a GPU a compiled reference would round differently again
    reference = autoregressive_generate(target, prompt, max_new_tokens=max_new_tokens, compile=False).row(0).tolist()
    cache, context, new, wrong_cache, rounds = _prefilled(target, prompt), prompt, [], None, 0
    widths = []  # the input width of every target forward inside the rounds: a verify pass reads γ + 1 tokens at once

    def record_width(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        widths.append(ids.shape[-1] if isinstance(ids, torch.Tensor) else 0)

    watch = target.register_forward_pre_hook(record_width, with_kwargs=True)
    try:
        while len(new) < max_new_tokens:
            emitted, rounds = round_fn(target, draft, cache, context.clone(), gamma), rounds + 1
            if emitted is NotImplemented:
                print("not written yet — see the solution below")
                return None
            if emitted is None:
                print(f"FAIL: round {rounds} returned None: return the list of tokens the round emits (did you forget "
                      "the return?)")
                return False
            emitted = [int(t) for t in torch.as_tensor(emitted).flatten()]
            if not 1 <= len(emitted) <= gamma + 1:
                print(f"FAIL: round {rounds} returned {len(emitted)} tokens; a round emits 1 to γ + 1 = {gamma + 1}")
                return False
            context, new = torch.cat([context, torch.tensor(emitted, device=context.device)]), new + emitted
            if wrong_cache is None and kv.cache_length(cache) != len(context) - 1:
                wrong_cache = (rounds, kv.cache_length(cache), len(context) - 1)
    finally:
        watch.remove()
    if max(widths, default=0) < 2:  # right tokens, but one target forward per token: that is decoding, not verifying
        print(f"FAIL: the target never read more than one token in a forward ({len(widths)} forwards in {rounds} "
              "rounds), so no round verified drafts: feed the last token and all γ drafts to the target in one pass")
        return False
    new = new[:max_new_tokens]
    diverged = first_divergence(target, prompt, torch.tensor(reference), torch.tensor(new))
    if diverged is not None and next(target.parameters()).dtype != torch.float32:
        try:  # 16-bit: a flip within rounding's reach is numerics, not the round's fault
            near_tie = check_same_output(target, prompt, torch.tensor(reference), torch.tensor(new), gamma=gamma)
            if wrong_cache is None:
                print(f"PASS (up to rounding): {near_tie['message']} (γ = {gamma})")
                return True
        except OutputMismatch:
            pass
    if diverged is None and wrong_cache is None:
        # (in float32 only: in 16 bit the draft's 1-token forwards and the verify's γ + 1 may part at a near-tie)
        fp32 = next(target.parameters()).dtype == torch.float32
        agreed, short = _rounds_short_of_gamma(round_fn, target, prompt, gamma, reference) if fp32 else (0, "")
        if short:
            print(f"FAIL: the tokens are right, but with a draft that agrees with the target (the target itself) "
                  f"{short}: every draft is accepted there, and the same verify pass gives the bonus token")
            return False
        agreed = f", and γ + 1 = {gamma + 1} per round where every draft agrees ({agreed} rounds)" if agreed else ""
        print(f"PASS: {len(new)} tokens identical to the target's greedy decoding (γ = {gamma}){agreed}")
        return True
    if diverged is not None:
        def shown(token: int) -> str:
            return f"{token} ({tokenizer.decode([token])!r})" if tokenizer is not None else str(token)
        print(f"FAIL: first divergent position {diverged['position']}: the target's greedy token is "
              f"{shown(diverged['reference_token'])}, your rounds gave {shown(diverged['candidate_token'])}")
    if wrong_cache is not None:
        fix = ("crop the rejected drafts" if wrong_cache[1] > wrong_cache[2] else
               "it lost some: crop only the rejected drafts, and feed the last token with the drafts")
        print(f"FAIL: after round {wrong_cache[0]} the target's cache held {wrong_cache[1]} positions, "
              f"expected {wrong_cache[2]} (all but the newest token): {fix}")
    return False


def _rounds_short_of_gamma(round_fn, target, prompt, gamma: int, reference: list[int], rounds: int = 3,
                           tie: float = 1e-4) -> tuple[int, str]:
    """With the target as its own draft every draft is accepted: each round must emit γ + 1 tokens, the target's
    own. With the course's weak draft a round rarely accepts more than one draft, so a round that threw agreed drafts
    away, or never gave the bonus token, matched the target token for token. Returns (rounds checked, ``""``), or
    what went wrong. A round cut short where the target's top two logits lie within ``tie`` ends the check, passed:
    the draft's forward (the whole context) and the verify's (cached) can round such a near-tie apart, even in fp32."""
    cache, context, new, checked = _prefilled(target, prompt), prompt, [], 0
    for r in range(1, min(rounds, len(reference) // (gamma + 1)) + 1):
        emitted = [int(t) for t in torch.as_tensor(round_fn(target, target, cache, context.clone(), gamma)).flatten()]
        expected = reference[len(new): len(new) + gamma + 1]
        if emitted != expected:
            k = len(emitted) - 1  # where a draft was turned down, if the round stopped early on the target's own token
            if 0 <= k < gamma and emitted == expected[: k + 1]:
                ids = torch.cat([context, torch.tensor(expected[:k], dtype=torch.long, device=context.device)])[None]
                top2 = target(input_ids=ids).logits[0, -1].float().topk(2).values
                if float(top2[0] - top2[1]) < tie:
                    return checked, ""  # a near-tie: the draft and the verify may both be right
            return checked, (f"round {r} emitted {len(emitted)} tokens {emitted}, where the target's next γ + 1 = "
                             f"{gamma + 1} are {expected}")
        context, new, checked = torch.cat([context, torch.tensor(emitted, device=context.device)]), new + emitted, r
    return checked, ""


def _prefilled(target, prompt: torch.Tensor):
    """A new cache holding ``prompt`` ``[n]`` but its last token: what a round starts from."""
    from .. import kv

    cache = kv.new_cache(target)
    if len(prompt) > 1:
        kv.forward_cached(target, prompt[None, :-1], cache)
    return cache
