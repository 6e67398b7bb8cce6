#!/usr/bin/env python
"""The suffix drafter's budgets (issue 26), measured, not asserted: memory and build time of the global index
over 1M tokens, the cost of ``add``, ``save``/``load``, and of one ``propose`` against one target step (c).

    python scripts/suffix_budget.py --out assets/results/suffix_budget_cpu.json

**How the 1M tokens are made.** The target's own answers in ``assets/feature_data`` (246k tokens) are repeated
until 1,000,000 tokens, copy k with every id shifted by k · 7919 (mod the vocabulary): the copies keep the
answers' statistics (token frequencies, document lengths, repeats within a document), but do not repeat each
other verbatim, which would give the suffix array unrealistically long shared prefixes to sort.

Budgets: index ≤ 100 MB, build ≤ 10 s, propose ≤ 1 % of a target step (c ≤ 0.01).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the package, from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # suffix_eval, beside this script, however it is run

from specdec_edu.commands.args import positive_int  # noqa: E402
from specdec_edu.suffix import EMBEDDED_VOCAB, CorpusIndex, SuffixDrafter, corpus_answers  # noqa: E402
from suffix_eval import provenance  # noqa: E402  (imported before any measuring: a failed import loses nothing)

SHIFT = 7919  # a prime: copy k maps token t to (t + k · SHIFT) mod V


def million_tokens(answers: list[np.ndarray], total: int = 1_000_000) -> list[np.ndarray]:
    """Documents of the answers, copied with shifted ids, until ``total`` tokens."""
    docs, n, k = [], 0, 0
    while n < total:
        for a in answers:
            docs.append(((a.astype(np.int64) + k * SHIFT) % EMBEDDED_VOCAB).astype(np.int32))
            n += len(a)
            if n >= total:
                break
        k += 1
    return docs


def time_propose(drafter: SuffixDrafter, contexts: list[list[int]], gamma: int = 8) -> list[float]:
    """Seconds of each ``propose`` as a generation would call it: the context grows token by token."""
    times = []
    for context in contexts:
        drafter.reset()
        ctx = torch.tensor(context)
        for n in range(len(context) // 2, len(context)):
            start = time.perf_counter()
            drafter.propose(ctx[:n], gamma)
            times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=positive_int, default=1_000_000)
    ap.add_argument("--threads", type=positive_int, default=1,
                    help="torch threads for the target step (1: steadier on a shared CPU)")
    argv = sys.argv[1:] if argv is None else argv
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    answers = corpus_answers(Path(__file__).resolve().parent.parent / "assets" / "feature_data")
    docs = million_tokens(answers, args.tokens)
    n_tokens = sum(map(len, docs))

    tracemalloc.start()
    start = time.perf_counter()
    index = CorpusIndex()
    index.add_many(docs)
    build_s = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()

    start = time.perf_counter()
    for a in answers[:200]:  # 200 new answers, one add each: what a server adding every finished request does
        index.add(a)
    add_ms = 1000 * (time.perf_counter() - start) / 200

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index.npz")
        start = time.perf_counter()
        index.save(path)
        save_s, file_mb = time.perf_counter() - start, os.path.getsize(path) / 1e6
        start = time.perf_counter()
        CorpusIndex.load(path)
        load_s = time.perf_counter() - start

    from specdec_edu.course.measure import forward_seconds
    from specdec_edu.models.embedded import load_embedded_target, load_embedded_tokenizer

    target = load_embedded_target("cpu")
    step_s = forward_seconds(target, 1, context_length=128, repeats=9)
    tokenizer = load_embedded_tokenizer()
    drafter = SuffixDrafter(index)
    seen = [a.tolist()[:96] for a in answers[:6]]  # contexts the corpus holds (long matches, long drafts)
    novel = [tokenizer(t, add_special_tokens=False).input_ids[:96] for t in (
        "Quantum tunnelling lets particles cross barriers they classically could not, which makes flash memory and "
        "scanning tunnelling microscopes possible; the probability falls off exponentially with the barrier width.",
        "Dear committee, I am writing to support the application of my former student, who showed remarkable care in "
        "the laboratory and a rare patience with the younger members of the group during two long winters.")]
    time_propose(drafter, seen[:1])  # warm-up
    t_seen, t_novel = time_propose(drafter, seen), time_propose(drafter, novel)
    result = {
        "corpus": "assets/feature_data answers repeated with ids shifted by k*7919 mod 49152 per copy k",
        "tokens": n_tokens, "documents": len(docs), "chunks": len(index.chunks),
        "index_mb": index.nbytes / 1e6, "build_peak_traced_mb": peak / 1e6, "build_s": build_s,
        "build_tokens_per_s": n_tokens / build_s, "add_one_answer_ms": add_ms, "save_s": save_s, "file_mb": file_mb,
        "load_s": load_s, "target_step_ms": 1000 * step_s,
        "propose_us_median_seen": 1e6 * statistics.median(t_seen), "propose_us_median_novel": 1e6 * statistics.median(t_novel),
        "propose_us_p90_all": 1e6 * float(np.percentile(t_seen + t_novel, 90)),
        "c_propose_median": statistics.median(t_seen + t_novel) / step_s,
        "budgets": {"index_mb <= 100": index.nbytes / 1e6 <= 100, "build_s <= 10": build_s <= 10,
                    "c <= 0.01": statistics.median(t_seen + t_novel) / step_s <= 0.01},
    }
    result.update(provenance(" ".join(["python scripts/suffix_budget.py", *argv])))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
