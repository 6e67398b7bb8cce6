"""Suffix decoding: drafting from what the model already wrote, with no draft model.

After Oliaro et al., "SuffixDecoding: Extreme Speculative Decoding for Emerging AI Applications"
(arXiv 2411.04975), and its retrieval ancestor REST (He et al., arXiv 2311.08252). Written from the
papers; the data structures here are plain numpy arrays, not a suffix tree of Python objects.

Two indexes answer one question, "where did the last m tokens occur before, and what came next?":

* :class:`RequestIndex`: the current request (prompt + tokens generated so far). A dict from each
  n-gram (n = 1 … ``max_match``) to the positions where it ended, grown by O(max_match) dict updates
  (O(max_match²) token copies, to build their keys) per new token. It subsumes prompt lookup's matching.
* :class:`CorpusIndex`: earlier outputs of the target (for the embedded target, its own answers in
  ``assets/feature_data``). A suffix array of the *reversed* token stream, so that the context's
  suffix, read backwards, is a prefix to look up: each extra matched token narrows one contiguous
  range of the array (a binary search), and the longest match comes out of one pass. ``add(tokens)``
  appends a new small chunk (log-structured: chunks of similar size are merged, never the whole
  corpus at once), and ``save``/``load`` write one ``.npz``.

:class:`SuffixDrafter` takes the longest match in either index and walks forward from all its
occurrences at once: the most frequent next token, then the most frequent one after it among the
occurrences that agreed, and so on (a suffix tree's greedy path). It stops when the path's empirical
probability (the product of the per-step frequencies f_j) falls below ``min_prob``, or when the
budget ``spec_factor · m`` (m the match length) or γ is spent. Of the two indexes' drafts it keeps
the one with the larger expected accepted length Σ_i Π_{j≤i} f_j. (The SuffixDecoding paper calls
min_prob τ, spec_factor α and m p: there α, p and τ are not the course's acceptance rate, target
distribution and tokens per round.) The draft is deterministic, so q is one-hot on each proposed token and the
accept rule stays exact.
"""

from __future__ import annotations

import zipfile
from bisect import bisect_left, bisect_right
from pathlib import Path

import numpy as np
import torch

from .drafters import check_propose_args

__all__ = ["RequestIndex", "CorpusIndex", "SuffixDrafter", "greedy_continuation", "corpus_answers"]

SEPARATOR = -1  # ends every document in a token stream: never part of a match, stops every continuation
VECTOR_RANGE = 64  # ranges of the suffix array up to this size are searched with numpy; larger ones by bisection


def greedy_continuation(tokens: np.ndarray, ends: np.ndarray, budget: int, min_prob: float,
                        ) -> tuple[list[int], list[float]]:
    """Walk forward from every occurrence at once, taking the most frequent next token each step.

    Args:
        tokens: ``[N]`` int32 token stream (``SEPARATOR`` between documents).
        ends: ``[k]`` positions in ``tokens`` where the matched pattern ended (its last token).
        budget: at most this many tokens.
        min_prob: stop before a token that would bring the path's probability below this.

    Returns:
        the tokens (``budget`` or fewer) and, for each, the path's probability so far: Π of the
        per-step frequencies count(chosen next token) / count(occurrences that have a next token).
        Ties go to the token seen last (the most recent occurrence, as prompt lookup would choose).
    """
    draft, probs, path = [], [], 1.0
    n = len(tokens)
    while len(draft) < budget:
        if len(ends) == 1:  # one occurrence: copy what followed it, up to a separator (probability stays)
            start = int(ends[0]) + 1
            follow = tokens[start: start + budget - len(draft)]
            stop = np.flatnonzero(follow == SEPARATOR)
            follow = follow[: stop[0]] if len(stop) else follow
            return draft + follow.tolist(), probs + [path] * len(follow)
        ends = ends[ends + 1 < n]
        nxt = tokens[ends + 1]
        keep = nxt != SEPARATOR
        ends, nxt = ends[keep], nxt[keep]
        if not len(nxt):
            break
        token, best = most_frequent(nxt, ends)
        path *= best / len(nxt)
        if path < min_prob:
            break
        draft.append(token)
        probs.append(path)
        ends = ends[nxt == token] + 1
    return draft, probs


def most_frequent(nxt: np.ndarray, ends: np.ndarray) -> tuple[int, int]:
    """(token, count): the most frequent of the next tokens ``nxt`` ``[k]``; a tie goes to the token whose
    occurrence is the latest (the largest of ``ends`` ``[k]``), as prompt lookup would choose."""
    if len(nxt) == 1:
        return int(nxt[0]), 1
    values, counts = np.unique(nxt, return_counts=True)
    best = int(counts.max())
    tied = np.isin(nxt, values[counts == best])
    return int(nxt[tied][np.argmax(ends[tied])]), best


def check_max_match(max_match: int) -> None:
    """An index matches suffixes of 1 … ``max_match`` tokens: 0 or fewer would never match, in silence."""
    if max_match < 1:
        raise ValueError(f"max_match={max_match}: an index matches suffixes of 1 to max_match tokens; pass 1 or more.")


class RequestIndex:
    """n-grams of the current request (n = 1 … ``max_match``) → the positions where they ended.

    ``extend(new_tokens)`` costs O(max_match) dict updates per token, whatever the length so far.
    ``tokens`` is a growing int32 buffer (capacity doubles), so the continuation walk can read it with numpy.
    Memory grows with the request, about 6.5 KB per token at ``max_match`` 24 (up to 24 dict entries each: 33 MB at
    5k tokens of varied text), and occurrences are not capped as the corpus's are: in a looping output every round
    walks all the loop's earlier ends (0.8 ms at 32k tokens of a period-10 loop, 3.9 ms at 128k, on a 2-core CPU).
    Fine for chat-length requests; for book-length ones, a sliding window of the request would be the next step.
    """

    def __init__(self, max_match: int):
        check_max_match(max_match)
        self.max_match = max_match
        self.reset()

    def reset(self) -> None:
        self.grams: dict[tuple[int, ...], list[int]] = {}
        self._buf = np.empty(256, dtype=np.int32)
        self._list: list[int] = []  # the same tokens as Python ints: slicing them into dict keys is cheap

    def __len__(self) -> int:
        return len(self._list)

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[: len(self._list)]

    def extend(self, new_tokens: list[int]) -> None:
        """Append ``new_tokens`` and index every n-gram that ends at one of them."""
        start = len(self._list)
        if start + len(new_tokens) > len(self._buf):
            grown = np.empty(max(2 * len(self._buf), start + len(new_tokens)), dtype=np.int32)
            grown[:start] = self._buf[:start]
            self._buf = grown
        self._buf[start: start + len(new_tokens)] = new_tokens
        self._list.extend(new_tokens)
        seq = self._list
        for i in range(start, len(seq)):
            for n in range(1, min(self.max_match, i + 1) + 1):
                self.grams.setdefault(tuple(seq[i - n + 1: i + 1]), []).append(i)

    def longest_match(self) -> tuple[int, np.ndarray]:
        """(m, ends): the longest suffix of the request (m ≤ max_match tokens) that also ended earlier, and where.

        The suffix's own occurrence (ending at the last position) is left out; m = 0 if nothing matches.
        """
        seq = self._list
        for n in range(min(self.max_match, len(seq) - 1), 0, -1):
            ends = self.grams.get(tuple(seq[-n:]))
            if ends is not None and len(ends) > 1:  # the last entry is the suffix itself
                return n, np.asarray(ends[:-1], dtype=np.int64)
        return 0, np.empty(0, dtype=np.int64)


def reversed_suffix_array(tokens: np.ndarray, depth: int) -> np.ndarray:
    """Start positions of the suffixes of ``tokens[::-1]``, sorted on their first ``depth`` tokens.

    Prefix doubling with ``np.argsort``: after the round with step k every suffix has a rank that
    orders its first 2k tokens, so ⌈log2(depth)⌉ rounds suffice (ties beyond ``depth`` are left in
    position order, harmless: no match is longer than ``depth``). ``tokens`` ``[n]`` int32 (≥ 0 or
    ``SEPARATOR``); returns int32 ``[n]``. Memory: a few int64 arrays of n during the build.
    """
    rev = tokens[::-1].astype(np.int64)
    n = len(rev)
    # dense ranks 1, 2, … of the first token (SEPARATOR first; 0 pads past the end): the loop's test "the largest
    # rank is n" means "all distinct" only for dense ranks. Raw ids would pass it whenever an id is ≥ n (a small
    # chunk of a 49k vocabulary) and leave the array sorted on one token.
    rank, k = np.unique(rev, return_inverse=True)[1].reshape(-1) + 1, 1
    order = np.argsort(rank, kind="stable")
    while k < depth and int(rank.max()) < n:  # all ranks distinct: the order is final
        shifted = np.zeros(n, dtype=np.int64)
        shifted[: max(0, n - k)] = rank[k:]
        key = rank * (int(rank.max()) + 2) + shifted  # (rank of the first k tokens, rank of the next k): < 2^62
        order = np.argsort(key, kind="stable")
        ordered = key[order]
        new_rank = np.empty(n, dtype=np.int64)
        new_rank[order] = np.concatenate([[1], 1 + np.cumsum(ordered[1:] != ordered[:-1])])
        rank, k = new_rank, 2 * k
    return order.astype(np.int32)


class _Chunk:
    """One suffix array over ``tokens[start:stop]`` of a :class:`CorpusIndex` (whole documents)."""

    def __init__(self, stream: np.ndarray, start: int, stop: int, depth: int, sa: np.ndarray | None = None):
        self.start, self.stop = start, stop
        rev = stream[start:stop][::-1].astype(np.int32)
        self.sa = reversed_suffix_array(stream[start:stop], depth) if sa is None else sa
        # rev, padded with `depth + 1` separators so that sa[j] + k never runs off the end
        self.rev = np.concatenate([rev, np.full(depth + 1, SEPARATOR, np.int32)])
        self._sa_view, self._rev_view = memoryview(self.sa), memoryview(self.rev)  # fast scalar reads for bisection

    def __len__(self) -> int:
        return self.stop - self.start

    def narrow(self, lo: int, hi: int, k: int, token: int) -> tuple[int, int]:
        """The part of the range [lo, hi) whose suffixes have ``token`` at offset k (they agree on the first k)."""
        if hi - lo <= VECTOR_RANGE:
            column = self.rev[self.sa[lo:hi] + k]
            return lo + int(np.searchsorted(column, token, "left")), lo + int(np.searchsorted(column, token, "right"))
        sa, rev = self._sa_view, self._rev_view
        key = lambda j: rev[sa[j] + k]  # noqa: E731
        return bisect_left(range(len(sa)), token, lo, hi, key=key), bisect_right(range(len(sa)), token, lo, hi, key=key)

    def ranges(self, pattern_backwards: list[int]) -> list[tuple[int, int]]:
        """``ranges[m]``: the suffix-array range of the occurrences of the pattern's last m + 1 tokens."""
        out, lo, hi = [], 0, len(self.sa)
        for k, token in enumerate(pattern_backwards):
            if hi - lo == 1:  # one occurrence left: compare the rest of the pattern with it in one go
                start = int(self.sa[lo]) + k
                rest = np.asarray(pattern_backwards[k:], dtype=np.int32)
                same = self.rev[start: start + len(rest)] == rest
                agree = len(rest) if same.all() else int(np.argmin(same))
                return out + [(lo, hi)] * agree
            lo, hi = self.narrow(lo, hi, k, token)
            if lo == hi:
                break
            out.append((lo, hi))
        return out

    def ends(self, lo: int, hi: int, limit: int) -> np.ndarray:
        """Positions in the whole stream where the occurrences in [lo, hi) ended (at most ``limit``, evenly spread)."""
        step = max(1, -(-(hi - lo) // limit))  # ⌈count / limit⌉: a floor would keep up to 2 · limit − 1
        return self.stop - 1 - self.sa[lo:hi:step].astype(np.int64)


class CorpusIndex:
    """A global index over earlier outputs: one int32 token stream + suffix arrays of its chunks.

    ``add(tokens)`` appends one document as a new chunk; whenever the newest chunk is at least half
    as long as the one before it, the two are merged (rebuilt together), so a corpus of N tokens has
    O(log N) chunks and every token is re-sorted O(log N) times in all: amortised, never a full rebuild
    per add. A lookup searches every chunk.

    Args:
        max_match: the longest suffix matched (tokens); the arrays are sorted to this depth.
        max_occurrences: at most this many occurrences (per chunk) feed the continuation counts.
    """

    def __init__(self, max_match: int = 24, max_occurrences: int = 256):
        check_max_match(max_match)
        if max_occurrences < 1:
            raise ValueError(f"max_occurrences={max_occurrences}: a match's continuation needs at least 1 occurrence.")
        self.max_match, self.max_occurrences = max_match, max_occurrences
        self._buf = np.empty(0, dtype=np.int32)
        self.size = 0  # tokens in the stream, separators included
        self.chunks: list[_Chunk] = []

    @property
    def tokens(self) -> np.ndarray:
        return self._buf[: self.size]

    @property
    def nbytes(self) -> int:
        """Bytes held: the stream, and per chunk its suffix array and reversed copy."""
        return self._buf.nbytes + sum(c.sa.nbytes + c.rev.nbytes for c in self.chunks)

    def _append(self, tokens: np.ndarray) -> tuple[int, int]:
        start, stop = self.size, self.size + len(tokens)
        if stop > len(self._buf):
            grown = np.empty(max(2 * len(self._buf), stop, 1024), dtype=np.int32)
            grown[: self.size] = self._buf[: self.size]
            self._buf = grown
        self._buf[start:stop] = tokens
        self.size = stop
        return start, stop

    def add(self, tokens, *, merge: bool = True) -> None:
        """Append one document (token ids: list, array or 1-D tensor) and index it. O(k log k) for k new
        tokens, plus the amortised merges (``merge=False`` leaves them to the caller: see ``add_many``)."""
        doc = np.asarray(torch.as_tensor(tokens).cpu().numpy() if isinstance(tokens, torch.Tensor) else tokens,
                         dtype=np.int32)
        if len(doc) == 0:
            return
        if (doc < 0).any():
            raise ValueError("token ids must be >= 0 (negative ids are reserved for document separators)")
        start, stop = self._append(np.concatenate([doc, [SEPARATOR]]).astype(np.int32))
        if merge:
            self.chunks.append(_Chunk(self._buf, start, stop, self._depth))
            self._merge()

    def add_many(self, documents) -> None:
        """Append many documents and index them as ONE new chunk (one sort instead of one per document)."""
        start = self.size
        for doc in documents:
            self.add(doc, merge=False)
        if self.size > start:
            self.chunks.append(_Chunk(self._buf, start, self.size, self._depth))
            self._merge()

    @property
    def _depth(self) -> int:
        return self.max_match

    def _merge(self) -> None:
        while len(self.chunks) > 1 and 2 * len(self.chunks[-1]) >= len(self.chunks[-2]):
            b, a = self.chunks.pop(), self.chunks.pop()
            self.chunks.append(_Chunk(self._buf, a.start, b.stop, self._depth))

    def longest_match(self, context: list[int]) -> tuple[int, np.ndarray]:
        """(m, ends): the longest suffix of ``context`` (≤ max_match tokens) found in the corpus, and where
        its occurrences ended in ``tokens`` (every chunk that holds it, ``max_occurrences`` per chunk)."""
        backwards = context[-self.max_match:][::-1]  # the last max_match tokens only (no copy of the whole context)
        per_chunk = [c.ranges(backwards) for c in self.chunks]
        m = max((len(r) for r in per_chunk), default=0)
        if m == 0:
            return 0, np.empty(0, dtype=np.int64)
        ends = [c.ends(*r[m - 1], self.max_occurrences) for c, r in zip(self.chunks, per_chunk) if len(r) == m]
        return m, np.concatenate(ends)

    def count(self, pattern) -> int:
        """How many times ``pattern`` (token ids, ≤ max_match) occurs in the corpus."""
        pattern = list(pattern)
        if not pattern:
            raise ValueError("an empty pattern: count patterns of 1 to max_match tokens (index.size counts the tokens).")
        if len(pattern) > self.max_match:  # the suffix arrays are sorted only that deep: longer ones would miscount
            raise ValueError(f"a pattern of {len(pattern)} tokens: this index counts patterns of at most max_match = "
                             f"{self.max_match}; build it with CorpusIndex(max_match={len(pattern)}) to count longer ones.")
        total = 0
        for c in self.chunks:
            r = c.ranges(pattern[::-1])
            if len(r) == len(pattern):
                total += r[-1][1] - r[-1][0]
        return total

    def save(self, path) -> None:
        """One ``.npz`` file at exactly ``path`` (the name is kept as given, so ``load(path)`` finds it): the stream,
        each chunk's bounds and suffix array (load does no sorting)."""
        arrays = {"tokens": self.tokens, "bounds": np.array([[c.start, c.stop] for c in self.chunks], dtype=np.int64)
                  .reshape(-1, 2), "max_match": np.array(self.max_match), "max_occurrences": np.array(self.max_occurrences)}
        arrays.update({f"sa_{i}": c.sa for i, c in enumerate(self.chunks)})
        with open(path, "wb") as f:  # given a file name, np.savez would append ".npz" to one that lacks it
            np.savez(f, **arrays)

    @classmethod
    def load(cls, path) -> CorpusIndex:
        """The index that :meth:`save` wrote at ``path``; any other file raises ``ValueError``, naming how to rebuild it."""
        try:
            with np.load(path) as f:
                index = cls(int(f["max_match"]), int(f["max_occurrences"]))
                index._append(f["tokens"].astype(np.int32))
                index.chunks = [_Chunk(index._buf, int(a), int(b), index._depth, f[f"sa_{i}"])
                                for i, (a, b) in enumerate(f["bounds"])]
        except (KeyError, ValueError, TypeError, zipfile.BadZipFile) as e:  # another .npz, a .npy, not numpy's at all
            raise ValueError(f"{path} is not an index written by CorpusIndex.save ({type(e).__name__}: {e}). Rebuild "
                             "it: index = CorpusIndex(); index.add_many(documents); index.save(path) (for the embedded "
                             "target's answers: embedded_corpus().save(path)).") from e
        return index


ANSWER_SHARDS = "answers_*.npz"  # scripts/feature_data.py's shards of the embedded target's answers


def corpus_answers(folder) -> list[np.ndarray]:
    """The answers (token ids after each prompt, EOS included) in ``folder``'s ``answers_*.npz`` shards.

    Only the target's own answers: the prompts are left out (the target did not write them), and so are
    the ``text_*`` shards (documentation written by people, used to train the feature drafters)."""
    answers = []
    for shard in sorted(Path(folder).glob(ANSWER_SHARDS)):
        with np.load(shard) as f:
            tokens, lengths, prompt_lengths = f["tokens"].astype(np.int32), f["lengths"], f["prompt_lengths"]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        answers += [tokens[s + p: s + n] for s, n, p in zip(starts, lengths, prompt_lengths)]
    return answers


class SuffixDrafter:
    """Draft the continuation of the longest earlier match, in the request or in a corpus.

    Args:
        corpus: a :class:`CorpusIndex` of the target's earlier outputs (``None``: an empty one).
            ``add(tokens)`` extends it, e.g. with each finished answer.
        max_match: the longest suffix matched (m ≤ max_match, in the request and in the corpus; a corpus built with a
            smaller ``max_match`` matches at most that).
        spec_factor: the budget per round is ``spec_factor · m`` tokens (the paper's MAX_SPEC),
            plus ``spec_offset``, and never more than γ.
        min_prob: stop drafting before the path's empirical probability falls below it (the paper's threshold).
        min_corpus_match: corpus matches shorter than this are ignored (one common token says little).

    ``last`` keeps the last round's choice (``{"source", "match", "probs"}``) for the curious;
    ``rounds`` counts per generation which index drafted.
    """

    def __init__(self, corpus: CorpusIndex | None = None, *, max_match: int = 24, spec_factor: float = 1.0,
                 spec_offset: int = 0, min_prob: float = 0.3, min_corpus_match: int = 2):
        if not spec_factor > 0 or not 0 <= min_prob <= 1 or min_corpus_match < 1:  # each would never draft, in silence
            raise ValueError(f"need spec_factor > 0, 0 <= min_prob <= 1 and min_corpus_match >= 1; got spec_factor="
                             f"{spec_factor}, min_prob={min_prob}, min_corpus_match={min_corpus_match}.")
        self.corpus = corpus if corpus is not None else CorpusIndex(max_match)
        self.max_match = max_match
        self.spec_factor, self.spec_offset, self.min_prob = spec_factor, spec_offset, min_prob
        self.min_corpus_match = min_corpus_match
        self.request = RequestIndex(max_match)
        self.reset()

    def reset(self) -> None:
        """A new generation: forget the request (the corpus stays)."""
        self.request.reset()
        self.rounds = {"request": 0, "corpus": 0, "none": 0}
        self.last: dict = {}

    def add(self, tokens) -> None:
        """Add one finished output (token ids) to the global index."""
        self.corpus.add(tokens)

    def check_target(self, target) -> None:
        """The corpus holds token ids of one tokenizer: refuse a target whose vocabulary cannot hold them."""
        vocab = target.config.vocab_size
        if self.corpus.size and int(self.corpus.tokens.max()) >= vocab:
            raise ValueError(f"the suffix drafter's corpus holds token ids up to {int(self.corpus.tokens.max())}, but the "
                             f"target's vocabulary has {vocab}: build the corpus from this target's outputs, or use "
                             "SuffixDrafter() with an empty corpus.")

    def _sync(self, context: torch.Tensor) -> None:
        """Bring the request index up to ``context`` ``[n]``: O(new tokens) of indexing when it extends the last one.

        "Extends" is checked on the whole indexed prefix (one array comparison, microseconds), not on its last token:
        an unrelated prompt that happens to share the token at that position must not inherit the old request."""
        n_seen = len(self.request)
        if n_seen and (len(context) < n_seen or not np.array_equal(context[:n_seen].numpy(), self.request.tokens)):
            self.request.reset()  # not an extension (a new prompt without reset()): index it from scratch
            n_seen = 0
        self.request.extend(context[n_seen:].tolist())

    def draft(self, gamma: int) -> tuple[list[int], str, int, list[float]]:
        """(tokens, source, m, path probabilities) for the request indexed so far."""
        best = ([], "none", 0, [])
        best_score = 0.0
        m, ends = self.request.longest_match()
        candidates = [("request", m, ends, self.request.tokens)]
        if self.corpus.chunks:
            m, ends = self.corpus.longest_match(self.request._list[-self.max_match:])  # m ≤ max_match here too
            if m >= self.min_corpus_match:
                candidates.append(("corpus", m, ends, self.corpus.tokens))
        for source, m, ends, stream in candidates:
            if m == 0:
                continue
            budget = min(gamma, int(self.spec_factor * m) + self.spec_offset)
            tokens, probs = greedy_continuation(stream, ends, budget, self.min_prob)
            score = sum(probs)  # expected accepted drafts if the frequencies were the target's probabilities
            if score > best_score:
                best, best_score = (tokens, source, m, probs), score
        return best

    def propose(self, context, gamma, to_probs=None, generator=None):
        """Tokens ``[γ']`` (γ' ≤ γ, maybe 0) after ``context`` ``[n]`` (host) and their one-hot q ``[γ', V']``."""
        check_propose_args(context, gamma)
        self._sync(context.cpu())
        tokens, source, m, probs = self.draft(gamma)
        self.rounds[source] += 1
        self.last = {"source": source, "match": m, "probs": probs}
        return tokens_and_one_hot(tokens)


def tokens_and_one_hot(tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids → (tokens ``[γ']``, one-hot q ``[γ', V']``), V' = the largest id + 1 (``speculative_generate``
    pads q with zeros to the full vocabulary). Written into zeros: ``F.one_hot(...).float()`` builds an int64
    copy first, several times slower for ids in the tens of thousands."""
    ids = torch.tensor(tokens, dtype=torch.long)
    q = torch.zeros(len(tokens), max(tokens, default=0) + 1)
    q[torch.arange(len(tokens)), ids] = 1.0
    return ids, q


def embedded_corpus(folder=None, fraction: float = 1.0, **index_kwargs) -> CorpusIndex:
    """A :class:`CorpusIndex` over the embedded target's own answers (``assets/feature_data``, answers only),
    or over the first ``fraction`` of them (for a curve of speedup against corpus size)."""
    from .models.assets import asset_dir  # lazy: the models package imports this one

    answers = corpus_answers(asset_dir("feature_data") if folder is None else folder)
    index = CorpusIndex(**index_kwargs)
    index.add_many(answers[: round(fraction * len(answers))])
    return index


def suffix_drafter_for(target, folder=None, **drafter_kwargs) -> SuffixDrafter:
    """``load_drafter("suffix", target, folder)``: a SuffixDrafter whose global index holds the embedded target's
    answers (``folder``'s ``answers_*.npz`` shards, default ``assets/feature_data``) when ``target`` has the embedded
    tokenizer's vocabulary (SmolLM2: 49,152 ids), else an empty one (the corpus's token ids would mean other words:
    request matching only). With the default folder both fall back quietly (an empty index also where the assets
    are missing); a ``folder`` given that cannot be used raises ``ValueError`` (:func:`check_corpus_folder`)."""
    vocab_size = getattr(target.config, "vocab_size", None)
    same_vocabulary = vocab_size == EMBEDDED_VOCAB
    if folder is not None:
        check_corpus_folder(folder, vocab_size)
    corpus = embedded_corpus(folder, max_match=drafter_kwargs.get("max_match", 24)) if same_vocabulary else None
    return SuffixDrafter(corpus, **drafter_kwargs)


EMBEDDED_VOCAB = 49152  # the embedded pair's tokenizer (SmolLM2's): the corpus's ids mean its words


def check_corpus_folder(folder, vocab_size: int | None) -> None:
    """Refuse a corpus ``folder`` given by name that the suffix drafter could not use, rather than draft without it in
    silence: one for a target of another vocabulary, one that does not exist, one without ``answers_*.npz`` shards."""
    folder = Path(folder)
    if vocab_size != EMBEDDED_VOCAB:  # the shards are scripts/feature_data.py's: the embedded target's answers
        raise ValueError(f"path={str(folder)!r}: the answers_*.npz shards hold the embedded target's token ids "
                         f"({EMBEDDED_VOCAB} of them), this target has {vocab_size}: they would mean other words. Leave "
                         "path out (the request alone is matched), or index your target's own outputs: "
                         "SuffixDrafter(corpus) with corpus = CorpusIndex(); corpus.add_many(answers).")
    if not folder.is_dir():
        saved = " (a saved CorpusIndex? SuffixDrafter(CorpusIndex.load(path)))" if folder.is_file() else ""
        raise ValueError(f"path={str(folder)!r} is not a folder{saved}: give the folder of answers_*.npz shards "
                         "(scripts/feature_data.py --out), or leave path out for assets/feature_data.")
    if not any(folder.glob(ANSWER_SHARDS)):
        raise ValueError(f"path={str(folder)!r} holds no answers_*.npz shard: give the folder that "
                         "scripts/feature_data.py --out wrote, or leave path out for assets/feature_data.")
