"""The dtype rule, the compile fallback and the fp16 reload: what keeps the course running on every GPU generation.

No GPU here: the CUDA device is faked (``torch.cuda.get_device_capability`` patched), a compiler failure is
forced with a backend that raises, and fp16 overflow with a model whose logits are inf in fp16.
"""

import platform
import sys
from pathlib import Path

import pytest
import torch
from conftest import perturbed_copy, tiny_llama

from specdec_edu import autoregressive_generate, speculative_generate
from specdec_edu.models import devices, embedded
from specdec_edu.models.devices import default_dtype, dtype_reason, native_bf16

PROMPT = torch.tensor([[7, 8, 9, 10, 11]])


@pytest.fixture
def gpu(monkeypatch):
    """A fake CUDA device: ``gpu(7, 5)`` makes ``get_device_capability`` answer a T4's capability."""
    monkeypatch.delenv("SPECDEC_EDU_DTYPE", raising=False)

    def fake(major, minor):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (major, minor))
        # the trap: this answers True on a T4 (emulation counts); the rule must not ask it
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
        return torch.device("cuda")

    return fake


@pytest.mark.parametrize("capability, want", [((7, 5), torch.float16), ((7, 0), torch.float16),
                                              ((8, 0), torch.bfloat16), ((8, 9), torch.bfloat16),
                                              ((9, 0), torch.bfloat16)])
def test_bf16_only_where_the_gpu_has_it_natively(gpu, capability, want):
    """T4 (7.5) and V100 (7.0): fp16; A100 (8.0), L4 (8.9), H100/H200 (9.0): bf16."""
    device = gpu(*capability)
    assert default_dtype(device) == want
    assert native_bf16(device) == (want == torch.bfloat16)
    assert default_dtype(device, reduced=False) == torch.float32  # the embedded pair stays exact
    assert ("no native bf16" in dtype_reason(device, want)) == (want == torch.float16)


def test_fp32_on_the_cpu_and_mps(monkeypatch):
    monkeypatch.delenv("SPECDEC_EDU_DTYPE", raising=False)
    assert default_dtype("cpu") == default_dtype("mps") == torch.float32
    assert "fp32" in dtype_reason("cpu", torch.float32) and "off a GPU" in dtype_reason("cpu", torch.float32)
    assert "off CUDA" in dtype_reason("mps", torch.float32)  # Apple's GPU: not "off a GPU"


@pytest.mark.parametrize("value, want", [("fp32", torch.float32), ("FP16", torch.float16), (" bf16", torch.bfloat16)])
def test_the_variable_overrides_every_device(gpu, monkeypatch, value, want):
    device = gpu(7, 5)
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", value)
    assert default_dtype(device) == default_dtype("cpu", reduced=False) == want
    assert dtype_reason(device, want).endswith("(set by SPECDEC_EDU_DTYPE)")


def test_a_pair_loaded_in_another_dtype_is_not_credited_to_the_variable(monkeypatch):
    """Notebook 05 loads its pair in fp32 even under SPECDEC_EDU_DTYPE=fp16: its line must not say the variable set it."""
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", "fp16")
    assert dtype_reason("cpu", torch.float32) == ("fp32 (chosen here, over SPECDEC_EDU_DTYPE=fp16: the code loaded it "
                                                   "so, or fp16 overflowed and the pair was loaded again (a warning says))")
    assert dtype_reason("cpu", torch.float16) == "fp16 (set by SPECDEC_EDU_DTYPE)"
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", "bf16")  # no fp16 to overflow: the code's choice alone
    assert dtype_reason("cpu", torch.float32) == "fp32 (chosen here, over SPECDEC_EDU_DTYPE=bf16: the code loaded it so)"


def test_a_bad_value_names_the_fix(monkeypatch):
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", "half")
    with pytest.raises(ValueError, match=r"SPECDEC_EDU_DTYPE='half'.*\['bf16', 'fp16', 'fp32'\]"):
        default_dtype("cpu")


def test_load_pair_honours_the_variable(monkeypatch):
    """load_pair asks the rule for its dtype (hub pairs reduced, the embedded pair not) and passes it on."""
    seen = []
    monkeypatch.setattr(embedded, "_load_named_pair", lambda name, device, dtype: seen.append((name, dtype)) or
                        (tiny_llama(0), tiny_llama(1), None))
    monkeypatch.delenv("SPECDEC_EDU_DTYPE", raising=False)
    embedded.load_pair("embedded", "cpu")
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", "bf16")
    embedded.load_pair("smollm2", "cpu")
    assert seen == [("embedded", torch.float32), ("smollm2", torch.bfloat16)]


def overflows_in_fp16(model):
    """``model``, patched so that its logits are +inf whenever its weights are fp16 (as fp16 overflow would)."""
    def hook(module, args, output):
        if module.dtype == torch.float16:
            output.logits = torch.full_like(output.logits, float("inf"))
        return output

    model.register_forward_hook(hook)
    return model


def test_fp16_logits_that_overflow_reload_the_pair_in_fp32_once(monkeypatch):
    loads = []

    def load(name, device, dtype):
        loads.append(dtype)
        return overflows_in_fp16(tiny_llama(0).to(dtype)), tiny_llama(1).to(dtype), None

    monkeypatch.setattr(embedded, "_load_named_pair", load)
    with pytest.warns(UserWarning, match="fp16 logits are not finite.*float32"):
        target, draft, _ = embedded.load_pair("smollm2", "cpu", torch.float16)
    assert loads == [torch.float16, torch.float32] and target.dtype == draft.dtype == torch.float32
    assert embedded.finite_logits(target)


def test_the_fp16_pair_is_freed_before_the_fp32_load(monkeypatch):
    """On a 15 GB T4 the fp16 pair (3.7 GB) and the fp32 one (7.4 GB) held at once would need 11 GB: the fp16 models
    must be unreferenced when the second load starts (the first version kept them until it returned)."""
    import gc
    import weakref

    first = []

    def load(name, device, dtype):
        if dtype == torch.float32:
            gc.collect()
            assert all(ref() is None for ref in first), "the fp16 pair is still alive during the fp32 load"
        models = overflows_in_fp16(tiny_llama(0).to(dtype)), tiny_llama(1).to(dtype)
        if dtype == torch.float16:
            first.extend(weakref.ref(m) for m in models)
        return (*models, None)

    monkeypatch.setattr(embedded, "_load_named_pair", load)
    with pytest.warns(UserWarning, match="fp16 logits are not finite"):
        target, _, _ = embedded.load_pair("smollm2", "cpu", torch.float16)
    assert target.dtype == torch.float32 and len(first) == 2


def test_finite_fp16_logits_keep_fp16(monkeypatch, recwarn):
    monkeypatch.setattr(embedded, "_load_named_pair", lambda name, device, dtype:
                        (tiny_llama(0).to(dtype), tiny_llama(1).to(dtype), None))
    target, _, _ = embedded.load_pair("smollm2", "cpu", torch.float16)
    assert target.dtype == torch.float16 and not recwarn.list


# Pinned where hand mutations of embedded.py went unseen by the suite.
def test_load_pair_keeps_the_embedded_pair_in_float32_on_a_gpu(gpu, monkeypatch):
    """On a GPU with native bf16 (a fake A100), a hub pair defaults to bf16 but the embedded pair stays float32: the
    concept notebooks check identities that need exact arithmetic, on every device."""
    monkeypatch.delenv("SPECDEC_EDU_DTYPE", raising=False)
    seen = []
    monkeypatch.setattr(embedded, "_load_named_pair", lambda name, device, dtype: seen.append((name, dtype)) or
                        (tiny_llama(0), tiny_llama(1), None))
    device = gpu(8, 0)
    embedded.load_pair("embedded", device)
    embedded.load_pair("smollm2", device)
    assert seen == [("embedded", torch.float32), ("smollm2", torch.bfloat16)]


def one_logit_overflows_in_fp16(model):
    """``model``, patched so that one logit of each position is +inf when its weights are fp16: fp16 overflow hits
    the few largest logits, not all of them."""
    def hook(module, args, output):
        if module.dtype == torch.float16:
            output.logits[..., 0] = float("inf")
        return output

    model.register_forward_hook(hook)
    return model


@pytest.mark.parametrize("which", ["target, one logit", "draft, every logit"])
def test_any_overflowing_fp16_logit_of_either_model_reloads_the_pair_in_fp32(monkeypatch, which):
    """The fp16 check looks at both models and at every logit: one inf among the vocabulary's logits (the usual
    overflow) breaks sampling as surely as all of them, and an overflowing draft breaks its q."""
    loads = []

    def load(name, device, dtype):
        loads.append(dtype)
        target, draft = tiny_llama(0).to(dtype), tiny_llama(1).to(dtype)
        if which.startswith("target"):
            return one_logit_overflows_in_fp16(target), draft, None
        return target, overflows_in_fp16(draft), None

    monkeypatch.setattr(embedded, "_load_named_pair", load)
    with pytest.warns(UserWarning, match="fp16 logits are not finite.*float32"):
        target, draft, _ = embedded.load_pair("smollm2", "cpu", torch.float16)
    assert loads == [torch.float16, torch.float32] and target.dtype == draft.dtype == torch.float32


def test_the_embedded_pair_is_float32_on_a_gpu_too(tmp_path, gpu, monkeypatch):
    """The embedded pair defaults to float32 on every device (the concept notebooks' identity checks need exact
    arithmetic), also on a GPU that has bf16: it is not a reduced hub pair. (Fake A100; the move is recorded.)"""
    from test_embedded import save_checkpoint

    device = gpu(8, 0)
    monkeypatch.setenv("SPECDEC_EDU_CACHE", str(tmp_path))
    save_checkpoint(tmp_path / embedded.weights.CACHE_SUBDIR)
    moved = []
    monkeypatch.setattr(embedded, "for_inference", lambda model, device, dtype: moved.append((device, dtype)) or model)
    embedded.load_embedded_target(device)
    embedded.load_embedded_draft(device)
    assert moved == [(device, torch.float32)] * 2


def failing_backend(graph, example_inputs):
    raise RuntimeError("Feature '.bf16' requires .target sm_80 or higher\nsecond line")


def test_a_compiler_failure_runs_eager_and_says_why():
    """A backend that raises when the caches compile (as Triton's bf16 did below sm_80): each model falls back to
    eager with one warning naming the cause, and the tokens are the eager run's."""
    target = tiny_llama(seed=0)
    draft = perturbed_copy(target, noise=0.3, seed=2)
    eager = speculative_generate(target, draft, PROMPT, max_new_tokens=12, gamma=3, compile=False)
    with pytest.warns(UserWarning) as caught:
        out = speculative_generate(target, draft, PROMPT, max_new_tokens=12, gamma=3, compile=True,
                                   compile_options={"backend": failing_backend})
    messages = [str(w.message) for w in caught]
    for role in ("draft", "target"):
        assert any(f"compiling the {role} failed" in m and "requires .target sm_80" in m and "second line" not in m
                   and f"the {role} runs eager" in m for m in messages), messages
    assert out.sequences.tolist() == eager.sequences.tolist() and not out.stats.compiled
    with pytest.warns(UserWarning, match="compiling the target failed"):
        base = autoregressive_generate(target, PROMPT, max_new_tokens=12, compile=True,
                                       compile_options={"backend": failing_backend})
    assert base.sequences.tolist() == eager.sequences.tolist() and not base.stats.compiled


def test_a_compiler_failure_frees_the_half_built_cache():
    """After the fallback, no compiled cache of the failed compile is alive: the remembered failure and the warning
    keep no frames. Before: the stored exception's traceback held the half-built ``StaticKV`` and its K/V (on a GPU,
    memory held for as long as the model lived)."""
    import gc
    import warnings

    from specdec_edu import kv

    def alive():
        gc.collect()
        with warnings.catch_warnings():  # isinstance on every object touches torch's deprecated aliases
            warnings.simplefilter("ignore", FutureWarning)
            return sum(isinstance(o, kv.StaticKV) for o in gc.get_objects())

    before, target = alive(), tiny_llama(seed=0)
    with pytest.warns(UserWarning, match="compiling the target failed"):
        out = autoregressive_generate(target, PROMPT, max_new_tokens=4, compile=True,
                                      compile_options={"backend": failing_backend})
    assert not out.stats.compiled and alive() == before
    with pytest.warns(UserWarning, match="compiling the target failed.*requires .target sm_80"):  # the remembered one
        autoregressive_generate(target, PROMPT, max_new_tokens=4, compile=True, compile_options={"backend": failing_backend})
    assert alive() == before


def test_a_torch_older_than_the_floor_is_named_with_its_fix(monkeypatch):
    """torch 2.6 cannot compile transformers 5.25's models (dynamo stops at their output wrapper), and every compiled
    cache then fell back to eager. pyproject.toml's floor keeps pip from installing it; an environment that skipped
    the floor gets the fix in the fallback's warning. With the torch installed here (≥ the floor) there is none."""
    from specdec_edu.generate import OLDEST_TORCH, old_torch_hint

    assert old_torch_hint() == "" and old_torch_hint(OLDEST_TORCH + ".0") == ""
    assert old_torch_hint("2.10.0") == "" and old_torch_hint("2.15.0+cu130") == ""  # not a string comparison
    assert old_torch_hint("a custom build") == ""  # unreadable: no hint, and no error inside the fallback
    target = tiny_llama(seed=0)
    with pytest.warns(UserWarning) as caught:
        autoregressive_generate(target, PROMPT, max_new_tokens=4, compile=True,
                                compile_options={"backend": failing_backend})
    assert not any("pip install -U torch" in str(w.message) for w in caught)
    monkeypatch.setattr(torch, "__version__", "2.6.0+cu124")
    with pytest.warns(UserWarning, match=r"runs eager; torch 2\.6\.0\+cu124 is older than 2\.7, .*pip install -U torch"):
        out = autoregressive_generate(target, PROMPT, max_new_tokens=4, compile=True,
                                      compile_options={"backend": failing_backend})
    assert not out.stats.compiled


def test_a_compiler_failure_is_not_retried_and_the_measurements_fall_back_too():
    """Notebook 07 times forwards (``forward_seconds``, ``VerifyCost``) on the compiled path before it generates:
    a failing compiler must not stop it there, and a failure is remembered, so later calls do not pay the
    compile time again before falling back."""
    from specdec_edu.course.measure import forward_seconds

    calls = []

    def counting_failure(graph, example_inputs):
        calls.append(1)
        return failing_backend(graph, example_inputs)

    target = tiny_llama(seed=0)
    options = {"backend": counting_failure}
    with pytest.warns(UserWarning, match="compiling the target failed.*requires .target sm_80.*runs eager"):
        assert forward_seconds(target, 4, context_length=8, repeats=2, compile=True, compile_options=options) > 0
    tried = len(calls)
    assert tried >= 1
    eager = autoregressive_generate(target, PROMPT, max_new_tokens=6, compile=False)
    with pytest.warns(UserWarning, match="compiling the target failed.*requires .target sm_80"):
        again = autoregressive_generate(target, PROMPT, max_new_tokens=6, compile=True, compile_options=options)
    assert len(calls) == tried  # not compiled again
    assert again.sequences.tolist() == eager.sequences.tolist() and not again.stats.compiled


@pytest.mark.parametrize("value", ["bfloat16", "float16", "half"])
def test_the_dtype_line_refuses_a_value_the_rule_refuses(monkeypatch, value):
    """Notebook 05 loads fp32 on purpose, so ``default_dtype`` (which refuses ``bfloat16``) never ran, and its
    setup line said "chosen here, over SPECDEC_EDU_DTYPE=bfloat16" as if that were a setting."""
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", value)
    for ask in (lambda: default_dtype("cpu", reduced=True), lambda: dtype_reason("cpu", torch.float32)):
        with pytest.raises(ValueError, match=f"SPECDEC_EDU_DTYPE='{value}' is not a dtype: set it to one of"):
            ask()


@pytest.mark.parametrize("value", ["true", "yes", "on"])
def test_a_random_target_value_other_than_0_or_1_is_refused(monkeypatch, value):
    """``SPECDEC_EDU_RANDOM_TARGET=true`` meant off, silently; on a machine without internet the load then failed
    on the wheel's download, naming nothing about the variable."""
    monkeypatch.setenv("SPECDEC_EDU_RANDOM_TARGET", value)
    with pytest.raises(ValueError, match=f"SPECDEC_EDU_RANDOM_TARGET='{value}': set it to 1"):
        embedded.random_target()
    for off in ("", "0", " 0 "):
        monkeypatch.setenv("SPECDEC_EDU_RANDOM_TARGET", off)
        assert embedded.random_target() is False


def test_the_module_exports_the_rule():
    assert {"default_dtype", "native_bf16", "dtype_reason", "device_name", "thread_share"} <= set(devices.__all__)


def test_a_random_target_needs_no_download(monkeypatch):
    """``SPECDEC_EDU_RANDOM_TARGET=1`` (a GPU machine without internet): the embedded target's shape, random weights,
    the tokenizer from the draft's folder; nothing is fetched."""
    monkeypatch.setenv("SPECDEC_EDU_RANDOM_TARGET", "1")
    monkeypatch.setattr(embedded.weights, "ensure_embedded_target", lambda: pytest.fail("no download"))
    with pytest.warns(UserWarning, match="random weights"):
        target, draft, tok = embedded.load_embedded_pair("cpu")
    c = target.config
    assert (c.num_hidden_layers, c.hidden_size, c.vocab_size, target.dtype) == (30, 576, 49152, torch.float32)
    assert len(tok) == c.vocab_size == draft.config.vocab_size and tok.chat_template


@pytest.mark.parametrize("capability, dtype, says", [
    ((7, 5), torch.bfloat16, "no native bf16: emulated, slower than fp16"),  # asked for bf16 on a T4
    ((9, 0), torch.float16, "has bf16 in hardware, but fp16 was chosen"),
    ((8, 0), torch.float16, "has bf16 in hardware, but fp16 was chosen"),  # an A100 or L4: 8.x has it too
    ((7, 5), torch.float32, "full precision"),  # an fp16 pair reloaded in fp32 after an overflow, or the embedded one
])
def test_the_dtype_line_explains_the_dtype_in_use(gpu, monkeypatch, capability, dtype, says):
    """The line used to say "so fp16" for bf16 on a T4, and "this pair computes exactly in fp32 on every device" for a
    hub pair reloaded in fp32, whose dtype elsewhere is bf16."""
    monkeypatch.delenv("SPECDEC_EDU_DTYPE", raising=False)
    line = dtype_reason(gpu(*capability), dtype)
    assert says in line and "so fp16" not in line.replace("but fp16 was chosen", "")


def test_compiling_on_a_gpu_says_so_when_it_starts_and_ends(monkeypatch, capsys):
    """Compiling the widths takes minutes on Colab's two CPUs: off the CPU a line says it started (the model, its
    size, the widths) and one says how long it took, on stderr. Before: minutes of silence in the first cell that
    generated. On the CPU (tests only compile there) nothing is printed."""
    from specdec_edu import kv

    assert kv.announces_compiling(torch.device("cuda")) and not kv.announces_compiling(torch.device("cpu"))
    kv.new_static_cache(tiny_llama(seed=0), 32, compile=True, compile_options={"backend": "aot_eager"})
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(kv, "announces_compiling", lambda device: True)
    kv.new_static_cache(tiny_llama(seed=0), 32, compile=True, compile_options={"backend": "aot_eager"})
    err = capsys.readouterr().err
    assert "compiling LlamaForCausalLM (0 M parameters) for input widths 1, 8, 16" in err and "compiled in" in err


@pytest.mark.parametrize("best, expected", [("cuda", "cuda"), ("mps", "cpu"), ("cpu", "cpu")])
def test_float64_device_is_the_best_device_except_apples(monkeypatch, best, expected):
    """Apple's MPS has no float64 (``.double()`` raises there), so the exactness lessons, which compute p and q in
    float64, load the embedded pair on the CPU of a Mac; everywhere else on the best device."""
    from specdec_edu.models import devices

    monkeypatch.setattr(devices, "default_device", lambda: torch.device(best))
    assert devices.float64_device() == torch.device(expected)


def test_notebooks_make_float64_only_where_the_device_has_it():
    """A notebook line that makes float64 from a model's output (``.double()``) stopped notebooks 03, 04, 05 and 11 on
    a Mac. Each such line either moves to the host first (``.cpu().double()``), or is in a notebook whose pair is
    loaded on ``float64_device()``."""
    import json
    from pathlib import Path

    unsafe = []
    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb")):
        code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        on_float64_device = any("load_pair(" in c and "device=float64_device()" in c for c in code)
        unsafe += [(path.name, line.strip()) for c in code for line in c.splitlines()
                   if ".double()" in line and ".cpu().double()" not in line and not on_float64_device]
    assert unsafe == []


# ---- device_name: what a recorded measurement ran on ------------------------------------------------------------------
def test_the_cpu_is_named_by_its_model_not_its_architecture(tmp_path, monkeypatch):
    """/proc/cpuinfo's model name, and the cores this process may use. The control: with no such file (macOS,
    Windows) the name falls back to ``platform``, and with that the architecture is what a record would say."""
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n")
    assert devices.cpu_model(str(info)) == "AMD EPYC 7B13"
    monkeypatch.setattr(devices.sys, "platform", "linux")  # no sysctl
    monkeypatch.setattr(devices.platform, "processor", lambda: "")
    monkeypatch.setattr(devices.platform, "machine", lambda: "x86_64")
    assert devices.cpu_model(str(tmp_path / "missing")) == "x86_64"

    monkeypatch.setattr(devices, "cpu_model", lambda: "AMD EPYC 7B13")
    monkeypatch.setattr(devices, "usable_cores", lambda: 2)
    assert devices.device_name("cpu") == "AMD EPYC 7B13, 2 cores"
    monkeypatch.setattr(devices, "usable_cores", lambda: 1)
    assert devices.device_name(torch.device("cpu")) == "AMD EPYC 7B13, 1 core"
    assert devices.device_name("mps") == "Apple GPU (MPS) of AMD EPYC 7B13"


def test_a_gpu_is_named_by_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    assert devices.device_name("cuda") == "Tesla T4"


def test_this_machines_name_is_more_than_its_architecture():
    """On x86 Linux (CI, the GPU machine) the record names the CPU's model."""
    info = Path("/proc/cpuinfo")
    if not sys.platform.startswith("linux") or "model name" not in info.read_text().lower():
        pytest.skip("no model name in /proc/cpuinfo (not Linux, or an ARM kernel that leaves it out)")
    name = devices.device_name("cpu")
    assert not name.startswith(platform.machine() + ","), name
    assert name.endswith(f" {devices.usable_cores()} cores") or name.endswith(" 1 core"), name
