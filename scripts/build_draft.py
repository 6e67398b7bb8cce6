#!/usr/bin/env python
"""Build the embedded draft model in ``assets/draft/`` by distilling the embedded target.

Target: SmolLM2-135M-Instruct, Q4_1 GGUF dequantized to float32 (the package's embedded
target, cached as a plain Hugging Face directory by ``specdec_edu.models.weights``).
Draft: a tiny ``LlamaForCausalLM`` (default: width 256, 2 layers, GQA 4/2 heads, tied
embeddings initialised from the top principal directions of the target's final hidden states,
``--init hidden-pca``; ``--init embed-pca`` takes a PCA of the target's embeddings) with the target's tokenizer
and its full 49,152-token vocabulary, but a **reduced head**: only the first K token ids
get logits (``"draft_vocab_size": K`` in config.json; q = 0 elsewhere keeps speculative
decoding exact). K is chosen at the end of the build among ``--k-candidates`` by the
measured speed-up prediction.

Stages (everything is seeded; no Hugging Face Hub access at any point), one module each
in ``scripts/draft_build/``:

1. **data**   (``prompts.py``, ``data.py``) a programmatic set of diverse chat prompts
   (topics x question templates, code / maths / rewriting / advice tasks); the target
   answers them (batched, shared system-prompt KV cache, middle padding; 2/3 greedy, 1/3
   sampled at T = 0.8), recording its top-k logits and log-normaliser at every generated
   position. Runs in ``--gen-workers`` single-thread processes (robust when other jobs
   share the CPU: multi-thread OpenMP collapses under oversubscription on this machine).
   Stored under ``--workdir`` (default /tmp/draftwork), never in the repository.
2. **train**  (``train.py``) distillation: soft cross-entropy to the teacher's top-k
   probabilities (restricted to the first K_train ids) + cross-entropy on the teacher's argmax
   + (``--w-mse``, default 1) a regression of the draft's final hidden state on the target's.
3. **save**   (``train.py``) ``assets/draft/``: config.json, model.safetensors (fp16
   storage, loads as fp32), the target's tokenizer files, generation_config.json.
4. **eval**   (``evaluate.py``) on held-out chat prompts (none of them in the training
   prompt set): greedy α per head size K (teacher-forced agreement of the draft's argmax
   with the target's greedy token along the target's own greedy output), decode ms/token
   of the draft (``specdec_edu.ModelDrafter`` with ``head_size=K``) and the target, the
   target's verify cost t_verify(n), ``specdec_edu.theory.expected_speedup`` with verify
   cost 1 (Leviathan) and with the measured one, and a measured end-to-end greedy run of
   ``specdec_edu.speculative_generate``. ``card.py`` writes ``assets/draft/DRAFT_CARD.md``;
   ``assets/draft/draft_metrics.json`` holds every number.

Reproducibility: seeds ``--seed`` (default 1234) for the prompt set, the greedy/sampled
split, sampling (one torch.Generator per generation batch, seeded from the batch index),
model initialisation and data order. Generation uses 1 thread per worker, so greedy
outputs do not depend on the thread count. Two safety caps (``--gen-minutes``,
``--train-minutes``) stop a stage early if the machine is much slower than expected; the
card records whether a cap fired (then the result depends on timing).

Reference build (default flags): 2-core AMD EPYC (AVX2), 24 GiB RAM, no GPU, torch 2.13
CPU, transformers 5.24, while other jobs shared the CPU. Total time and the per-stage
times are written into DRAFT_CARD.md (see there; budget: <= 45 min wall).

Usage::

    python scripts/build_draft.py            # full build (~40 min on 2 cores)
    python scripts/build_draft.py --quick    # smoke run (< 2 min), writes to /tmp/draftwork/quick/quick_out
    python scripts/build_draft.py --stages train,save,eval   # reuse generated data
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tqdm.auto import tqdm

from draft_build.card import write_card
from draft_build.data import stage_data
from draft_build.evaluate import stage_eval
from draft_build.train import set_k, stage_save, stage_train
from specdec_edu.models.devices import device_name, memory_gib
from specdec_edu.models.weights import embedded_target_dir

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TARGET = embedded_target_dir()  # where the package caches the converted target ($SPECDEC_EDU_CACHE)


def _subprocess_entry(fn, args, result_path):
    def log(msg):
        tqdm.write(msg)
        with open(Path(args.workdir) / "build_log.txt", "a") as f:
            f.write(msg + "\n")

    Path(result_path).write_text(json.dumps(fn(args, log)))


def run_in_subprocess(fn, args, env: dict):
    """Run ``fn(args, log)`` in a fresh (spawned) interpreter with extra environment variables."""
    import multiprocessing as mp

    result = Path(args.workdir) / f"result_{fn.__name__}.json"
    result.unlink(missing_ok=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        p = mp.get_context("spawn").Process(target=_subprocess_entry, args=(fn, args, str(result)))
        p.start()
        p.join()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    if p.exitcode != 0:
        raise RuntimeError(f"{fn.__name__} failed (exit code {p.exitcode})")
    return json.loads(result.read_text())


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smoke run (< 2 min); writes to WORKDIR/quick_out unless --out")
    ap.add_argument("--target", default=str(DEFAULT_TARGET), help="plain HF directory of the embedded target")
    ap.add_argument("--out", default=None, help="output directory (default: assets/draft)")
    ap.add_argument("--workdir", default="/tmp/draftwork", help="intermediate data (not in the repository)")
    ap.add_argument("--stages", default="data,train,save,eval", help="comma-separated subset of data,train,save,eval")
    ap.add_argument("--seed", type=int, default=1234)
    # data
    ap.add_argument("--n-prompts", type=int, default=3200)
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--topk", type=int, default=32)
    ap.add_argument("--greedy-frac", type=float, default=2 / 3)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--gen-batch", type=int, default=48)
    ap.add_argument("--gen-workers", type=int, default=2)
    ap.add_argument("--gen-minutes", type=float, default=24.0, help="safety cap on data generation")
    # model
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--init", choices=["hidden-pca", "embed-pca", "random"], default="hidden-pca",
                    help="embedding initialisation (hidden-pca: target embeddings projected on the principal "
                         "directions of the target's final hidden states)")
    # training
    ap.add_argument("--k-train", type=int, default=16384)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-embed", type=float, default=None, help="learning rate of the embeddings (default: --lr)")
    ap.add_argument("--embed-std", type=float, default=0.03, help="std of the embedding-PCA initialisation")
    ap.add_argument("--norm-init-scale", type=float, default=1.0,
                    help="hidden-pca init: final-norm gains = this x the target's per-direction scale")
    ap.add_argument("--w-soft", type=float, default=1.0)
    ap.add_argument("--w-hard", type=float, default=1.0)
    ap.add_argument("--w-mse", type=float, default=1.0, help="weight of the hidden-state regression loss")
    ap.add_argument("--head-sample", type=int, default=0,
                    help="sampled softmax in training: teacher candidates + this many random ids (0: all K_train)")
    ap.add_argument("--train-threads", type=int, default=2)
    ap.add_argument("--ckpt-every", type=int, default=25, help="training checkpoint interval (steps); 0: never")
    ap.add_argument("--train-minutes", type=float, default=14.0, help="safety cap on training")
    # eval
    ap.add_argument("--k-candidates", type=int, nargs="+", default=[8192, 12288, 16384])
    ap.add_argument("--eval-prompts", type=int, default=12)
    ap.add_argument("--eval-tokens", type=int, default=64)
    ap.add_argument("--timing-threads", default="2,1", help="thread counts for timing; the first one is reported")
    ap.add_argument("--verify-reps", type=int, default=7)
    ap.add_argument("--timing-prompts", type=int, default=4, help="prompts used for the ms/token timings")
    ap.add_argument("--e2e-gammas", type=int, nargs="*", default=[4, 5])
    ap.add_argument("--e2e-prompts", type=int, default=6)
    args = ap.parse_args(argv)
    if args.quick:
        args.n_prompts, args.max_new, args.gen_batch = 48, 24, 24
        args.epochs, args.batch_tokens = 1, 2048
        args.eval_prompts, args.eval_tokens, args.verify_reps, args.timing_prompts = 3, 16, 1, 1
        args.e2e_gammas, args.e2e_prompts, args.timing_threads = [4], 1, "2"
        args.workdir = str(Path(args.workdir) / "quick")
        if args.out is None:
            args.out = str(Path(args.workdir) / "quick_out")
    if args.out is None:
        args.out = str(REPO / "assets" / "draft")
    args.k_candidates = sorted(k for k in args.k_candidates if k <= args.k_train)
    return args


def main(argv=None):
    args = parse_args(argv)
    t_start = time.time()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    logf = open(Path(args.workdir) / "build_log.txt", "a")

    def log(msg):
        line = f"[{(time.time() - t_start) / 60:5.1f} min] {msg}"
        tqdm.write(line)
        logf.write(line + "\n")
        logf.flush()

    stages = args.stages.split(",")
    info_path = Path(args.workdir) / "build_info.json"
    info = json.loads(info_path.read_text()) if info_path.exists() and "data" not in stages else {}
    import transformers

    info.update({"command": "python scripts/build_draft.py " + " ".join(sys.argv[1:] if argv is None else argv),
                 "hardware": f"{device_name('cpu')}, {memory_gib():.0f} GiB RAM, no GPU",
                 "transformers": transformers.__version__})
    log(f"build_draft: stages {stages}, out {args.out}, workdir {args.workdir}")
    if "data" in stages:
        t = time.time()
        info["data"] = stage_data(args, log)
        info["data_min"] = (time.time() - t) / 60
    if "train" in stages:
        t = time.time()
        # Own process with passive OpenMP waiting: 2 spinning threads collapse when other jobs share the cores.
        info["train"] = run_in_subprocess(stage_train, args, {"OMP_WAIT_POLICY": "PASSIVE"})
        info["train_min"] = (time.time() - t) / 60
    info_path.write_text(json.dumps(info, indent=1))
    if "save" in stages:
        info["size_bytes"] = stage_save(args, log, max(args.k_candidates))
    if "eval" in stages:
        t = time.time()
        info["eval"] = stage_eval(args, log)
        info["eval_min"] = (time.time() - t) / 60
        set_k(Path(args.out), info["eval"]["k_final"])
    info["total_min"] = (time.time() - t_start) / 60 + (0 if "data" in stages else info.get("data_min", 0)
                                                         + (0 if "train" in stages else info.get("train_min", 0)))
    info_path.write_text(json.dumps(info, indent=1))
    out = Path(args.out)
    if out.exists():
        (out / "draft_metrics.json").write_text(json.dumps(info, indent=1) + "\n")
        write_card(args, out, info)
    log(f"build_draft: done in {(time.time() - t_start) / 60:.1f} min -> {out}")


if __name__ == "__main__":
    main()
