"""scripts/gpu_check.py at toy size on the CPU: every section runs and the JSON holds what the README table needs.

No timing assertions: on a CPU at this size Python overhead dominates and speedups are < 1. What is checked:
the rows exist for every mode, draft and dial point, and each says which path its run took; fp32 greedy output is
the target's, token for token; every derived number (tokens/s, speedup, c, verify cost, bandwidth fraction,
prediction, fraction reached) follows from the tokens the run counted and the times it reported.
"""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from specdec_edu.theory import expected_speedup

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"
TINY = ["--size", "tiny", "--device", "cpu", "--max-new-tokens", "15", "--repeats", "1", "--prompt-length", "16",
        "--bandwidth-mib", "4"]


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_rows(out, gpu_check, modes):
    """The rows of a run: one target-only row per mode, one speculative row per (mode, draft, dial point); every
    number in them follows from the run's counted tokens and reported times."""
    n_new = out["max_new_tokens"]
    assert [r["mode"] for r in out["target_only"]] == modes == out["compile"]["modes"]
    # the path each run took (its stats.compiled), not the one asked for: only the last mode compiles the target
    targets = ["compiled" if "target" in m else "eager" for m in modes]
    assert [r["target"] for r in out["target_only"]] == targets
    read = out["read_bandwidth"]["bytes_per_s"]
    base = {}
    for row in out["target_only"]:
        base[row["mode"]] = row
        assert row["new_tokens"] == n_new  # random weights, no EOS: every run makes max_new_tokens
        assert row["tok_s"] == pytest.approx(n_new / row["seconds"])
        assert row["weight_bytes"] == 4 * out["target_params"]  # fp32, every parameter once
        steps_per_s = 1e3 / row["step_ms"]
        assert row["effective_GB_s"] == pytest.approx(row["weight_bytes"] * steps_per_s / 1e9)
        assert row["fraction_of_read_bandwidth"] == pytest.approx(row["weight_bytes"] * steps_per_s / read)
    points = gpu_check.dial_points(4, quick=False)
    assert points == [(0.2, 4), (0.0, 4), (0.2, 2), (0.2, 6)]
    expected = [(m, d, p) for m in modes for d in ("1x32", "3x32") for p in points]
    assert [(r["mode"], r["draft"], (r["noise"], r["gamma"])) for r in out["speculative"]] == expected
    for row in out["speculative"]:
        target_only = base[row["mode"]]
        assert row["target"] == target_only["target"]
        # fp32 greedy: whatever the dial and the mode, the output is the target's own greedy output
        assert row["divergence"] is None and row["identical_to_target"], row
        assert row["new_tokens"] == n_new
        # speedup = target-only seconds / speculative seconds (same tokens); not their inverse
        assert row["speedup"] == pytest.approx(target_only["seconds"] / row["seconds"])
        # c = draft time per token / the target's decode step; the verify cost = verify forward / decode step
        assert row["c"] == pytest.approx(row["draft_ms_per_token"] / target_only["step_ms"])
        assert row["verify_cost"] == pytest.approx(row["round_ms"]["verify_forward"] / target_only["step_ms"])
        assert row["predicted_speedup"] == pytest.approx(
            expected_speedup(min(row["alpha"], 0.999999), row["gamma"], row["c"], row["verify_cost"]))
        assert row["fraction_of_prediction"] == pytest.approx(row["speedup"] / row["predicted_speedup"])
        if row["noise"] == 0.0:  # every draft accepted: 15 new tokens in 3 rounds of γ + 1 = 5
            assert row["alpha"] == 1.0 and row["tau"] == 5.0
    assert min(r["alpha"] for r in out["speculative"] if r["noise"] == 0.2) < 1.0  # the dial is not ignored


def test_gpu_check_runs_at_tiny_size_on_every_path(gpu_check, tmp_path, capsys):
    """``--compile`` with the aot_eager backend (the CPU's inductor would compile C++ for minutes): the eager,
    compiled-draft and compiled draft + target rows, HF's assisted generation beside ours, and the compiled peers."""
    path = tmp_path / "gpu.json"
    out = gpu_check.main(TINY + ["--compile", "--compile-backend", "aot_eager", "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(out))
    # provenance: the command that made the file and when (the versions are under "versions")
    assert out["command"] == " ".join(["python scripts/gpu_check.py", *TINY, "--compile", "--compile-backend",
                                       "aot_eager", "--json", str(path)])
    assert re.fullmatch(r"20\d\d-\d\d-\d\d \d\d:\d\d UTC", out["date"]) and out["versions"]["torch"]
    assert out["compile"]["options"] == {"backend": "aot_eager"}  # no mode: CUDA graphs need inductor on CUDA
    assert list(out["latency_ms"]) == ["1", "2", "4", "8", "16", "32", "64", "128", "256"]
    assert out["dtype"] == "float32" and out["size"] == "tiny" and out["head_scale"] == 20.0
    assert out["target_params"] == 106_816  # the "tiny" shapes, untied (hand count)
    # a 32-wide layer: q, o 32·32; k, v 32·16 (one kv head of 16); MLP 3·32·64; two norms of 32: 9,280
    assert out["draft_params"] == {"1x32": 25_696, "3x32": 25_696 + 2 * 9_280}
    assert out["read_bandwidth"]["buffer_bytes"] == 4 * 2**20
    assert out["memory_floor_ms"] == pytest.approx(1e3 * 4 * 106_816 / out["read_bandwidth"]["bytes_per_s"])
    check_rows(out, gpu_check, list(gpu_check.MODES))
    same = out["same_draft"]
    assert same["identical_to_hf"] and same["divergence"] is None and same["hf_divergence"] is None
    assert same["ours_over_hf"] == pytest.approx(same["speculative_tok_s"] / same["hf_assisted_tok_s"])
    peers = out["peers"]  # HF's compiled static-cache generate and its assisted generation, beside ours compiled
    assert set(peers["tok_s"]) == {"ours target-only", "HF target-only", "ours speculative", "HF assisted"}
    assert peers["hf_compiled_forward"] and all(d is None for d in peers["divergence"].values())
    assert peers["target_only_ours_over_hf"] == pytest.approx(
        peers["tok_s"]["ours target-only"] / peers["tok_s"]["HF target-only"])
    assert list(out["section_seconds"])[0].startswith("1. read bandwidth")
    assert len(out["section_seconds"]) == 3 + len(gpu_check.MODES) + 2  # bandwidth, latency, c; each mode; HF; peers
    printed = capsys.readouterr().out
    assert "ours / HF" in printed and "% of the read bandwidth" in printed and "memory floor" in printed
    assert "(goal ≥ 1.0×)" in printed and "(goal ≥ 1.5×)" in printed
    assert "differs at" not in printed


def test_quick_runs_one_point(gpu_check):
    assert gpu_check.dial_points(4, quick=True) == [(0.2, 4)]
    assert gpu_check.dial_points(2, quick=False) == [(0.2, 2), (0.0, 2), (0.2, 4)]  # γ − 2 = 0 is left out
    assert gpu_check.dial_points(3, quick=False) == [(0.2, 3), (0.0, 3), (0.2, 1), (0.2, 5)]  # γ − 2 = 1 is kept
    args = gpu_check.parse_args(["--quick", "--device", "cpu"])
    assert (args.max_new_tokens, args.repeats, args.bandwidth_mib) == (48, 1, 64)


@pytest.mark.parametrize("flag", ["--gamma", "--repeats", "--max-new-tokens", "--prompt-length", "--bandwidth-mib"])
@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_count_below_1_is_refused_before_any_model_is_built(gpu_check, flag, value, capsys):
    """The GPU lease's script refuses a count below 1 as it parses. Before: ``--repeats 0`` (and 0 for the new tokens
    or the bandwidth buffer) was silently replaced by the default (``x or default``), and ``--gamma 0`` or
    ``--repeats -1`` failed with a traceback minutes later, after the models were built and three sections had run."""
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--device", "cpu", flag, value])
    assert "is not a whole number >= 1" in capsys.readouterr().err
    kept = gpu_check.parse_args(["--device", "cpu", "--quick", flag, "2"])  # the control: an explicit value is kept
    assert getattr(kept, flag[2:].replace("-", "_")) == 2


def test_one_new_token_is_refused_as_it_times_no_decode_step(gpu_check, capsys):
    """The first token comes from the prefill: ``--max-new-tokens 1`` divided by zero decode rounds (a
    ZeroDivisionError after the models were built). The control: 2 is kept."""
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--device", "cpu", "--max-new-tokens", "1"])
    assert "give at least 2 new tokens" in capsys.readouterr().err
    assert gpu_check.parse_args(["--device", "cpu", "--max-new-tokens", "2"]).max_new_tokens == 2


def test_an_unknown_device_is_a_usage_error_not_a_traceback(gpu_check, capsys):
    """Before: ``torch.device("foo")`` ran ahead of the friendly check, so ``--device foo`` raised a RuntimeError."""
    with pytest.raises(SystemExit):
        gpu_check.parse_args(["--device", "foo"])
    assert "not a device torch knows" in capsys.readouterr().err


def test_a_divergence_is_reported_with_its_position_and_margin(gpu_check):
    report = {"position": 7, "reference_token": 11, "candidate_token": 12, "top2_margin": 0.0625, "candidate_margin": 0.0625}
    assert gpu_check.describe(None) == "identical"
    assert gpu_check.describe(report) == "differs at token 7 (11 → 12; target's top-2 margin 0.0625)"


@pytest.mark.parametrize("size, role, params", [
    ("smollm2", "target", 1_711_376_384), ("smollm2", "draft", 134_515_008),  # SmolLM2-1.7B, SmolLM2-135M (tied)
    ("7b", "target", 6_738_415_616),  # Llama-2-7B
])
def test_sizes_have_the_real_models_shapes(gpu_check, size, role, params):
    """Parameter counts of the real models, built on the meta device (no memory)."""
    spec = gpu_check.SIZES[size]
    model = gpu_check.make_model(spec[role], spec["vocab"], "meta", torch.bfloat16, seed=0, tied=spec["tied"])
    assert sum(p.numel() for p in model.parameters()) == params
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == spec["tied"]


def test_7b_runs_both_drafts_at_its_vocabulary(gpu_check):
    shapes = gpu_check.draft_shapes(gpu_check.SIZES["7b"])
    assert shapes == {"8x768": (768, 8, 2048, 12, 4), "30x576": (576, 30, 1536, 9, 3)}
    assert gpu_check.SIZES["7b"]["vocab"] == 32_000


def test_sharpen_scales_embedding_and_head_once(gpu_check):
    for tied in (False, True):
        model = gpu_check.make_model((8, 1, 16, 2, 1), 32, "cpu", torch.float32, seed=0, tied=tied)
        embedding, head = model.model.embed_tokens.weight.clone(), model.lm_head.weight.clone()
        gpu_check.sharpen(model, 20.0)
        assert torch.equal(model.model.embed_tokens.weight, 20 * embedding)
        assert torch.equal(model.lm_head.weight, 20 * head)  # tied: one tensor, scaled once (not 400×)


def test_cuda_without_a_gpu_is_a_clear_error(gpu_check, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_check.main(["--size", "tiny", "--device", "cuda"])
    assert re.search(r"--device cuda: torch .* sees no CUDA device here; leave --device out .*\(with --size tiny\)",
                     capsys.readouterr().err)


def test_a_run_cut_off_keeps_what_it_measured(gpu_check, tmp_path, monkeypatch):
    """--json is rewritten after every section: a time limit that stops the run in a late section (the GPU stage
    runs under `timeout`) leaves the earlier sections' numbers on disk."""
    def cut_off(*args, **kwargs):
        raise TimeoutError("the run's time limit")

    monkeypatch.setattr(gpu_check, "hf_comparison", cut_off)
    path = tmp_path / "gpu.json"
    with pytest.raises(TimeoutError):
        gpu_check.main(TINY + ["--quick", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["c_eager"] and saved["target_only"] and saved["speculative"] and "same_draft" not in saved
    assert saved["versions"]["torch"] and len(saved["section_seconds"]) == 4  # bandwidth, latency, c, eager decoding


def test_a_run_cut_in_a_decoding_section_keeps_the_rows_it_made(gpu_check, tmp_path, monkeypatch):
    """At 7b the one decoding section (compiling three models, then a profiled run per row: ≈ 210 s) can be cut by
    the stage's BUDGET; the JSON was written only when the section ended, so a cut lost every row of it. Each row is
    now saved as it is made: cut while making the second speculative row, the target-only row and the first
    speculative row are on disk."""
    real, made = gpu_check.speculative_row, []

    def cut_at_the_second(*args, **kwargs):
        if made:
            raise TimeoutError("the run's time limit")
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(gpu_check, "speculative_row", cut_at_the_second)
    path = tmp_path / "gpu.json"
    with pytest.raises(TimeoutError):
        gpu_check.main(TINY + ["--quick", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert [r["mode"] for r in saved["target_only"]] == ["eager"]
    assert saved["speculative"] == json.loads(json.dumps(made)) and made[0]["draft"] == "1x32"
    assert len(saved["section_seconds"]) == 3  # bandwidth, latency, c: the decoding section did not end


def test_the_eager_section_pays_an_eager_draft_where_generation_compiles_by_default(gpu_check, tmp_path, monkeypatch):
    """Section 4 ("decoding, eager") hands the dial bare draft models; on CUDA a bare model's default is compiled, so
    the eager rows paid a compiled draft (c ≈ 0.18 where run 4 measured 1.35 eager). $SPECDEC_EDU_COMPILE=1 stands in
    for CUDA; the spy records what the dial asked for, then builds it eager (no inductor on this CPU)."""
    import specdec_edu.generate as generate

    asked, real = [], generate.as_drafter

    def spy(draft, target, compile=False, compile_options=None, positions=0):
        asked.append(compile)
        return real(draft, target, False, compile_options, positions)

    def cut_off(*args, **kwargs):
        raise TimeoutError("stop after the eager decoding section")

    monkeypatch.setenv("SPECDEC_EDU_COMPILE", "1")
    monkeypatch.setattr(generate, "as_drafter", spy)
    monkeypatch.setattr(gpu_check, "hf_comparison", cut_off)
    with pytest.raises(TimeoutError):
        gpu_check.main(TINY + ["--quick", "--json", str(tmp_path / "gpu.json")])
    assert asked and not any(asked), asked


def test_a_compiler_failure_runs_the_drafts_eager_and_the_dtype_follows_the_course_rule(gpu_check, monkeypatch, tmp_path):
    """On a T4 the check took bf16 (emulated there; Triton cannot compile it), and a draft that failed to compile
    ended the run. Now the dtype is the course's (here: $SPECDEC_EDU_DTYPE=fp16), and a failing compiler leaves
    every draft eager, with a warning, and the JSON says so (the run is stopped after its decoding sections)."""
    def stop(*args, **kwargs):
        raise TimeoutError("stop after the decoding sections")

    from torch._dynamo.backends.registry import _BACKENDS, register_backend

    if "specdec_test_failing" not in _BACKENDS:  # a backend by name, as --compile-backend takes one
        @register_backend(name="specdec_test_failing")
        def failing(graph, inputs):
            raise RuntimeError("forced failure")

    monkeypatch.setattr(gpu_check, "hf_comparison", stop)
    monkeypatch.setenv("SPECDEC_EDU_DTYPE", "fp16")
    path = tmp_path / "gpu.json"
    with pytest.warns(UserWarning, match="runs eager"), pytest.raises(TimeoutError):
        gpu_check.main(TINY + ["--quick", "--compile", "--compile-backend", "specdec_test_failing", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert saved["dtype"] == "float16" and saved["compile"]["drafts_compiled"] == {"1x32": False, "3x32": False}
    assert len(saved["target_only"]) == len(gpu_check.MODES)  # every decoding section ran to its end


def test_goals_runs_only_the_compiled_rows_and_the_peers(gpu_check, tmp_path):
    """--goals (the 7b lease: its compiled section did not finish in run 4 after the eager ones): one decoding section,
    compiled draft + target, then the compiled peers, and no eager HF comparison; without --compile it is refused."""
    out = gpu_check.main(TINY + ["--quick", "--compile", "--compile-backend", "aot_eager", "--goals",
                                 "--json", str(tmp_path / "g.json")])
    assert [r["mode"] for r in out["target_only"]] == ["compiled draft + target"] == out["compile"]["modes"]
    assert {r["mode"] for r in out["speculative"]} == {"compiled draft + target"}
    assert "same_draft" not in out and out["peers"]["tok_s"]
    assert all(r["identical_to_target"] for r in out["speculative"])
    with pytest.raises(SystemExit):
        gpu_check.main(TINY + ["--goals"])


def test_the_dial_replays_the_measured_paths_own_target_output(gpu_check, tmp_path, monkeypatch):
    """On the H200 the compiled 7b target broke a bf16 near-tie at new token 7 otherwise than the eager reference;
    the dial, replaying the eager one, then proposed nothing and the rows measured target-only decoding (τ 1.12 at
    α 0.8). Here the eager reference is made wrong at new token 3 instead: the compiled rows must not notice (the
    dial follows the compiled target-only output), and the base row names where the eager one parts from it."""
    class WrongEagerReference(gpu_check.Check):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            k = self.prompt.shape[1] + 3
            self.reference_new = self.reference_new.clone()
            self.reference_new[3] = (self.reference_new[3] + 1) % self.vocab
            self.reference = self.reference.clone()
            self.reference[k] = self.reference_new[3]

    monkeypatch.setattr(gpu_check, "Check", WrongEagerReference)
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*left the reference")
        out = gpu_check.main(TINY + ["--quick", "--compile", "--compile-backend", "aot_eager", "--goals",
                                     "--json", str(tmp_path / "g.json")])
    assert out["target_only"][0]["divergence_from_eager"]["position"] == 3
    assert all(r["identical_to_target"] and r["tau"] > 1.5 for r in out["speculative"]), out["speculative"]


def test_the_dial_replays_the_output_the_verify_pass_keeps(gpu_check, tmp_path, monkeypatch):
    """The target's verify forwards (more than one token) pick the runner-up at new token 5, as a bf16 verify pass can
    at a near-tie that one-token steps broke the other way (``flip_wide_forwards``). The dial replays the reference its
    run keeps (``settled_reference``, two runs or more), so the α 0.8 row keeps drafting (τ > 1.5) and no "left the
    reference" warning is given; its output parts from the target-only one at new token 5, and the row and the base
    row say so. The control: with the reference unsettled (the code before), the same run warns that the dial left
    it at that token."""
    from conftest import flip_wide_forwards

    class FlippedVerify(gpu_check.Check):
        def __init__(self, args, target, device):
            flip_wide_forwards(target, [args.prompt_length + 5 - 1])  # the row that predicts new token 5
            super().__init__(args, target, device)

    monkeypatch.setattr(gpu_check, "Check", FlippedVerify)
    import warnings

    args = TINY + ["--quick", "--json", str(tmp_path / "g.json")]
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*left the reference")
        out = gpu_check.main(args)
    settled, = out["target_only"][0]["dial_reference"]
    assert settled["replays"] >= 2 and settled["divergence_from_target_only"]["position"] == 5
    row = out["speculative"][0]
    assert row["tau"] > 1.5 and row["divergence"]["position"] == 5, row

    monkeypatch.setattr(gpu_check, "settled_reference", lambda target, reference, *args, **kwargs: (reference, 1))
    with pytest.warns(UserWarning, match="left the reference at token 21"):  # 16 prompt tokens + new token 5
        gpu_check.main(args)


# ---- the derived numbers from fake timings: what a mutant that saves a wrong number must change -----------------------
# The end-to-end runs above check each row against its own saved numbers (one timed round, every output identical);
# these call the script's functions with fakes whose timings differ round to round, so that a median taken from the
# wrong list, a γ or reference from the wrong row, or a unit off by a factor changes what is saved.

from types import SimpleNamespace  # noqa: E402


def fake_result(new, **stats):
    """A generation's result: ``row(0)`` gives ``new``, ``stats`` its counts and times."""
    return SimpleNamespace(row=lambda i: new, stats=SimpleNamespace(**stats))


def fake_divergence(target, prompt, reference, candidate):
    """``first_divergence`` without a model: None where equal, else the first position that differs."""
    if torch.equal(torch.as_tensor(reference), torch.as_tensor(candidate)):
        return None
    return {"position": int((torch.as_tensor(reference) != torch.as_tensor(candidate)).nonzero()[0, 0])}


def test_read_bandwidth_counts_every_sum_and_every_byte_over_the_median(gpu_check, monkeypatch):
    """bytes/s = buffer bytes × sums per timing / the median timing: the sums between two syncs are all counted (one
    dropped divides the record by 10), a float32 buffer of ``n_bytes`` holds n_bytes / 4 elements of 4 bytes each."""
    times, sums_done = iter([0.5, 0.1, 0.2]), []  # the median is 0.2, neither the first nor the last

    def fake_timed(fn, device):
        sums_done.append(len(fn()))
        return None, next(times)

    def fake_benchmark(fns, repeats, warmup, progress):
        return {name: [fn() for _ in range(repeats)] for name, fn in fns.items()}

    monkeypatch.setattr(gpu_check, "timed", fake_timed)
    monkeypatch.setattr(gpu_check, "interleaved_benchmark", fake_benchmark)
    read = gpu_check.read_bandwidth(torch.device("cpu"), 4096, torch.float32, sums=10, repeats=3)
    assert sums_done == [10, 10, 10]
    assert read == pytest.approx(4096 * 10 / 0.2)


def test_target_only_row_takes_the_decode_step_and_the_medians(gpu_check, monkeypatch):
    """The decode step is the median of verify seconds per round (prefill excluded: ``stats.seconds`` includes it; a
    round is a target forward after the prefill, one fewer than the new tokens); seconds are the median over the
    rounds, not the last; the effective bandwidth is weight bytes per step, as a fraction of the read bandwidth."""
    monkeypatch.setattr(gpu_check, "parameter_bytes", lambda model: 8e6)
    check = SimpleNamespace(target=None)
    new = torch.arange(10)
    runs = [(fake_result(new, verify_seconds=v, rounds=9, new_tokens=10, seconds=s, compiled=False), s)
            for v, s in ((0.36, 0.9), (0.18, 0.5), (0.09, 0.3))]  # steps 40, 20, 10 ms; seconds: the median 0.5, last 0.3
    row = gpu_check.target_only_row(check, "eager", runs, read_bytes_per_s=1e9)
    assert row["step_ms"] == pytest.approx(20.0)
    assert row["seconds"] == 0.5 and row["tok_s"] == pytest.approx(10 / 0.5) and row["new_tokens"] == 10
    assert row["effective_GB_s"] == pytest.approx(8e6 / 0.020 / 1e9)
    assert row["fraction_of_read_bandwidth"] == pytest.approx(8e6 / 0.020 / 1e9)
    assert row["target"] == "eager" and row["weight_bytes"] == 8e6


class FakeCheck:
    """What ``speculative_row`` and ``decoding_rows`` use of a ``Check``, with a profiled run whose times depend on
    the γ it was asked for (so that a row profiled at the wrong γ saves other numbers)."""
    DIAL_SEED = 0

    def __init__(self, gamma=4, n_new=10):
        self.args = SimpleNamespace(gamma=gamma)
        self.target, self.prompt, self.vocab, self.n_new = None, torch.zeros(1, 3, dtype=torch.long), 50, n_new
        self.reference_new = torch.arange(n_new)
        self.asked = []  # (dial, γ, mode, profile) of every speculative run

    def target_kwargs(self, mode):
        return {"compile": mode != "eager"}

    def speculative(self, dial, gamma, mode, max_new_tokens=None, profile=False):
        self.asked.append((dial, gamma, mode, profile))
        return fake_result(dial.reference[3:], alpha=0.5, tau=2.0, compiled=False, dial=dial,
                           draft_seconds_per_token=0.001 * gamma,
                           phase_seconds={"draft": [0.004 * gamma] * 3, "verify_forward": [0.01, 0.03, 0.02 * gamma],
                                          "accept_resample": [0.002] * 3, "cache_crop": [0.001] * 3})

    def benchmark(self, fns):
        return {name: [(fn(), s) for s in (0.3, 0.9, 0.2)] for name, fn in fns.items()}  # median 0.3, last 0.2


def test_speculative_row_measures_its_own_gamma_and_compares_with_its_modes_reference(gpu_check, monkeypatch):
    """A γ = 2 row (the default run adds γ ∓ 2) is profiled at γ = 2 and predicted at γ = 2, not at the main γ;
    seconds and phase times are medians; c and the verify cost are over the base row's step (in seconds);
    ``alpha_dial`` is the dial's α (1 − noise + noise/V), not 1 − noise; the output is compared with the reference
    handed in (this mode's target-only output), and ``identical_to_target`` is false where it differs."""
    monkeypatch.setattr(gpu_check, "first_divergence", fake_divergence)
    check = FakeCheck(gamma=4)
    check.reference_new = torch.arange(10) + 1  # the eager reference: another mode's, not this row's
    dial = SimpleNamespace(alpha=0.8 + 0.2 / 50, reference=torch.cat([check.prompt[0], torch.arange(10)]))
    new = torch.arange(10)
    runs = [(fake_result(new, alpha=0.75, tau=2.5, compiled=False), s) for s in (0.4, 0.2, 0.1)]  # median 0.2, last 0.1
    base = {"step_ms": 10.0, "seconds": 0.5, "new_tokens": 10}
    row = gpu_check.speculative_row(check, "eager", "1x32", (0.2, 2), dial, runs, base, torch.arange(10))
    assert check.asked == [(dial, 2, "eager", True)]  # the profiled run at the row's γ
    assert row["gamma"] == 2 and row["noise"] == 0.2 and row["alpha_dial"] == pytest.approx(0.8 + 0.2 / 50)
    assert row["seconds"] == 0.2 and row["speedup"] == pytest.approx((0.5 / 10) / (0.2 / 10))
    assert row["alpha"] == 0.75 and row["tau"] == 2.5
    assert row["draft_ms_per_token"] == pytest.approx(2.0) and row["c"] == pytest.approx(0.002 / 0.010)
    assert row["round_ms"] == pytest.approx({"draft": 8.0, "verify_forward": 30.0, "accept_resample": 2.0,
                                             "cache_crop": 1.0})  # medians of the three rounds
    assert row["verify_cost"] == pytest.approx(0.030 / 0.010)
    predicted = expected_speedup(0.75, 2, 0.2, 3.0)
    assert row["predicted_speedup"] == pytest.approx(predicted)
    assert row["fraction_of_prediction"] == pytest.approx(row["speedup"] / predicted)
    # all of the round but the drafting: verify forward + accept rule + crop (30 + 2 + 1 ms) over the 10 ms step
    assert row["verify_cost_with_rule"] == pytest.approx(0.033 / 0.010)
    with_rule = expected_speedup(0.75, 2, 0.2, 3.3)
    assert row["predicted_speedup_with_rule"] == pytest.approx(with_rule) and with_rule < predicted
    assert row["fraction_of_prediction_with_rule"] == pytest.approx(row["speedup"] / with_rule)
    assert row["identical_to_target"] and row["divergence"] is None  # the reference handed in, not the eager one

    other = torch.arange(10)
    other[6] = 49
    runs = [(fake_result(other, alpha=1.0, tau=3.0, compiled=True), s) for s in (0.4, 0.2, 0.1)]
    row = gpu_check.speculative_row(check, "eager", "1x32", (0.0, 2), dial, runs, base, torch.arange(10))
    assert row["divergence"] == {"position": 6} and row["identical_to_target"] is False
    assert row["target"] == "compiled"  # the path the run took
    assert row["predicted_speedup"] == pytest.approx(expected_speedup(0.999999, 2, 0.2, 3.0))  # α = 1: finite


def test_decoding_rows_give_each_point_its_own_gamma_noise_runs_and_reference(gpu_check, monkeypatch):
    """Every (draft, point) is timed at its own γ, with a dial at its own noise replaying the reference settled at
    that point with the seed the timed runs use; each row is made from its own runs; in a compiled mode the dial and
    the rows follow that mode's target-only output, and the base row says where it parts from the eager one."""
    settled_calls, dials, rows_made = [], [], []
    compiled_reference = torch.arange(10)
    compiled_reference[4] = 33  # this mode's target-only output parts from the eager one at new token 4

    def fake_autoregressive(target, prompt, max_new_tokens, **kw):
        return fake_result(compiled_reference if kw.get("compile") else torch.arange(10), verify_seconds=0.09, rounds=9,
                           new_tokens=max_new_tokens, seconds=0.1, compiled=bool(kw.get("compile")))

    def fake_settled(target, reference, prompt_length, gamma, noise, seed, **kw):
        settled_calls.append((gamma, noise, seed))
        return reference.clone(), 1

    class FakeDial:
        def __init__(self, reference, noise, vocab, cost_model, compile):
            self.reference, self.noise, self.alpha = reference, noise, 1 - noise + noise / vocab
            dials.append(self)

    def fake_row(check, mode, label, point, dial, runs, base, reference_new):
        rows_made.append((label, point, dial, runs, reference_new))
        return {"label": label, "point": point}

    monkeypatch.setattr(gpu_check, "autoregressive_generate", fake_autoregressive)
    monkeypatch.setattr(gpu_check, "settled_reference", fake_settled)
    monkeypatch.setattr(gpu_check, "ReplayDrafter", FakeDial)
    monkeypatch.setattr(gpu_check, "speculative_row", fake_row)
    monkeypatch.setattr(gpu_check, "first_divergence", fake_divergence)
    monkeypatch.setattr(gpu_check, "parameter_bytes", lambda model: 1e6)
    check = FakeCheck(gamma=4)
    check.DIAL_SEED = 7
    points = gpu_check.dial_points(4, quick=False)
    base, rows = gpu_check.decoding_rows(check, "compiled draft + target", {"a": "draft a"}, points, 1e9)
    assert settled_calls == [(g, noise, 7) for noise, g in points]  # the seed check.speculative seeds its runs with
    assert [(d.noise, torch.equal(d.reference[3:], compiled_reference)) for d in dials] == [(n, True) for n, _ in points]
    timed = [(d.noise, g) for d, g, _, profile in check.asked if not profile]
    assert timed == [(noise, g) for noise, g in points for _ in range(3)]  # each point at its own γ, 3 rounds
    for _label, point, dial, runs, reference_new in rows_made:
        assert dial.noise == point[0] and len(runs) == 3 and all(r.stats.dial is dial for r, _ in runs)  # its own runs
        assert torch.equal(reference_new, compiled_reference)
    assert [r["point"] for r in rows] == points
    assert base["divergence_from_eager"] == {"position": 4} and base["target"] == "compiled"
    assert [s["divergence_from_target_only"] for s in base["dial_reference"]] == [None] * len(points)


def test_the_sections_before_decoding_save_what_their_measurements_give(gpu_check, tmp_path, monkeypatch):
    """Sections 1–3 with fake measurements: the read bandwidth saved is that of the buffer measured (its bytes saved
    beside it), latencies in ms, the memory floor = weight bytes / read bandwidth, c = the draft's one-token step
    (its drafter's reduced head: role "draft") / the target's one-token step, and the verify cost of γ + 1 tokens;
    the target is sharpened by --head-scale, as the JSON says."""
    asked = {}

    def fake_read(device, n_bytes, dtype):
        asked["read_bytes"] = n_bytes
        return 2e9

    def fake_forward(model, n, context_length, repeats, role):
        asked.setdefault("roles", []).append(role)
        return 1e-3 * model.config.num_hidden_layers * (2 if role == "target" else 1)

    def fake_verify(target, n, sweeps, context_length):
        asked["verify_tokens"] = n
        return 1.25

    def stop(*args, **kwargs):
        raise TimeoutError("stop before decoding")

    monkeypatch.setattr(gpu_check, "read_bandwidth", fake_read)
    monkeypatch.setattr(gpu_check, "latency_curve", lambda target, ns, **kw: {n: 0.004 + 0.001 * n for n in ns})
    monkeypatch.setattr(gpu_check, "forward_seconds", fake_forward)
    monkeypatch.setattr(gpu_check, "measured_verify_cost", fake_verify)
    monkeypatch.setattr(gpu_check, "sharpen", lambda model, scale: asked.setdefault("sharpened", []).append(scale))
    monkeypatch.setattr(gpu_check, "decoding_rows", stop)
    path = tmp_path / "gpu.json"
    with pytest.raises(TimeoutError):
        gpu_check.main(TINY + ["--quick", "--gamma", "3", "--head-scale", "5", "--json", str(path)])
    saved = json.loads(path.read_text())
    assert asked["read_bytes"] == 4 * 2**20 == saved["read_bandwidth"]["buffer_bytes"]
    assert saved["read_bandwidth"]["bytes_per_s"] == 2e9
    assert saved["latency_ms"] == pytest.approx({"1": 5.0, "4": 8.0, "16": 20.0, "64": 68.0})
    assert saved["memory_floor_ms"] == pytest.approx(1e3 * 4 * 106_816 / 2e9)
    assert asked["roles"] == ["draft", "draft"]
    assert saved["c_eager"] == pytest.approx({"1x32": 0.001 / 0.005, "3x32": 0.003 / 0.005})
    assert asked["verify_tokens"] == 4 and saved["verify_cost_eager"] == 1.25
    assert asked["sharpened"] == [5.0] and saved["head_scale"] == 5.0


def test_the_hf_comparisons_ratios_and_sameness_come_from_the_right_runs(gpu_check, monkeypatch):
    """tokens/s are n_new over the median seconds; ``identical_to_hf`` compares HF's tokens with ours (not with the
    target's), each divergence is that method's own; the peers' ratios are ours over HF's, both of them."""
    monkeypatch.setattr(gpu_check, "first_divergence", fake_divergence)
    monkeypatch.setattr(gpu_check, "configure_hf_assistant", lambda draft, gamma: None)
    target_tokens = torch.arange(8)
    ours_tokens = target_tokens.clone()
    ours_tokens[2] = 40
    seconds = {"target": (0.4, 0.2, 0.1), "ours": (0.8, 0.5, 0.1), "hf": (1.0, 0.25, 0.3)}
    outputs = {"target": target_tokens, "ours": fake_result(ours_tokens, alpha=0.625), "hf": target_tokens}
    check = SimpleNamespace(target=None, prompt=torch.zeros(1, 3, dtype=torch.long),
                            benchmark=lambda fns: {k: [(outputs[k], s) for s in seconds[k]] for k in fns})
    same = gpu_check.hf_comparison(check, None, 4, 8)
    assert (same["target_only_tok_s"], same["speculative_tok_s"], same["hf_assisted_tok_s"]) == pytest.approx(
        (8 / 0.2, 8 / 0.5, 8 / 0.3))
    assert same["ours_over_hf"] == pytest.approx(0.3 / 0.5) and same["alpha"] == 0.625
    assert same["identical_to_hf"] is False
    assert same["divergence"] == {"position": 2} and same["hf_divergence"] is None

    peer_seconds = {"ours target-only": (0.1, 0.2, 0.3), "HF target-only": (0.5, 0.4, 0.1),
                    "ours speculative": (0.05, 0.1, 0.9), "HF assisted": (0.3, 0.6, 0.2)}
    check = SimpleNamespace(target=SimpleNamespace(), prompt=check.prompt, reference_new=torch.arange(20),
                            benchmark=lambda fns: {k: [(torch.arange(8), s) for s in peer_seconds[k]] for k in fns})
    peers = gpu_check.hf_peers(check, None, None, 4, 8, {"backend": "aot_eager"})
    assert peers["tok_s"] == pytest.approx({"ours target-only": 40.0, "HF target-only": 20.0, "ours speculative": 80.0,
                                            "HF assisted": 8 / 0.3})
    assert peers["target_only_ours_over_hf"] == pytest.approx(2.0)
    assert peers["speculative_ours_over_hf_assisted"] == pytest.approx(0.3 / 0.1)
    assert all(d is None for d in peers["divergence"].values())  # compared with the first n_new reference tokens
    assert all(d is None for d in peers["divergence_from_compiled_target_only"].values())

    # our compiled target-only parts from the eager output at token 5 (a near-tie), and the others follow it: against
    # the eager output they all differ there, against the compiled one none does (the line said "vs target-only")
    compiled_tokens = torch.arange(8)
    compiled_tokens[5] = 99
    check.benchmark = lambda fns: {k: [(compiled_tokens, s) for s in peer_seconds[k]] for k in fns}
    peers = gpu_check.hf_peers(check, None, None, 4, 8, {"backend": "aot_eager"})
    assert all(d == {"position": 5} for d in peers["divergence"].values())
    assert set(peers["divergence_from_compiled_target_only"]) == {"HF target-only", "ours speculative", "HF assisted"}
    assert all(d is None for d in peers["divergence_from_compiled_target_only"].values())


def test_compile_mode_and_bandwidth_buffer_defaults_follow_the_device(gpu_check, monkeypatch):
    """On CUDA with inductor the mode is reduce-overhead (CUDA graphs) and the bandwidth buffer 1 GiB; on a CPU no mode
    (CUDA graphs need CUDA) and 64 MiB. ``requested_device`` is stubbed: no GPU is needed to parse the arguments."""
    monkeypatch.setattr(gpu_check, "requested_device", torch.device)
    cuda = gpu_check.parse_args(["--device", "cuda"])
    assert cuda.compile_options == {"backend": "inductor", "mode": "reduce-overhead"} and cuda.bandwidth_mib == 1024
    cpu = gpu_check.parse_args(["--device", "cpu"])
    assert cpu.compile_options == {"backend": "inductor"} and cpu.bandwidth_mib == 64
    assert (cpu.max_new_tokens, cpu.repeats) == (96, 3)


@pytest.mark.parametrize("backend, hf_backend, hf_mode", [("capture", "inductor", "reduce-overhead"),
                                                          ("aot_eager", "aot_eager", None)])
def test_the_peers_run_hf_on_the_compiled_path_it_has(gpu_check, monkeypatch, backend, hf_backend, hf_mode):
    """Where ours records CUDA graphs without a compiler (``capture``), which HF cannot, HF's peer is its own compiled
    path with CUDA graphs (inductor, reduce-overhead), not inductor without graphs; otherwise HF gets our backend and
    mode. Both of ours run compiled with our options, the assisted peer with the draft model."""
    asked = []
    monkeypatch.setattr(gpu_check, "configure_hf_assistant", lambda draft, gamma: None)
    monkeypatch.setattr(gpu_check, "first_divergence", fake_divergence)
    for name in ("autoregressive_generate", "speculative_generate"):
        monkeypatch.setattr(gpu_check, name, lambda *args, name=name, **kw: asked.append((name, kw)) or
                            fake_result(torch.arange(4)))

    def hf_generate(n_new, **kw):
        asked.append(("hf", kw))
        return torch.arange(4)

    check = SimpleNamespace(target=SimpleNamespace(), prompt=torch.zeros(1, 3, dtype=torch.long),
                            reference_new=torch.arange(8), hf_generate=hf_generate,
                            benchmark=lambda fns: {k: [(fn(), 0.1)] for k, fn in fns.items()})
    options = {"backend": backend}
    gpu_check.hf_peers(check, "drafter", "draft model", 4, 4, options)
    (ours_ar, ours_kw), (hf_static, static_kw), (ours_sd, sd_kw), (hf_assisted, assisted_kw) = asked
    assert ours_kw["compile"] and ours_kw["compile_options"] is options and sd_kw["compile_options"] is options
    assert static_kw["cache_implementation"] == "static"
    config = static_kw["compile_config"]
    assert (config.backend, config.mode) == (hf_backend, hf_mode)
    assert assisted_kw == {"assistant_model": "draft model"}


def test_the_hf_sections_get_the_main_draft_and_the_runs_gamma(gpu_check, tmp_path, monkeypatch):
    """The eager HF comparison and the compiled peers measure the main draft (the first of the size's, the one their
    lines name) at the run's γ, the peers with its compiled drafter beside the bare model. Decoding is stubbed (no
    compiling): only what main hands the two sections is checked."""
    asked = {}

    def fake_comparison(check, draft, gamma, n_new):
        asked["same_draft"] = (draft, gamma, n_new)
        return {"alpha": 0.0, "target_only_tok_s": 1.0, "speculative_tok_s": 1.0, "hf_assisted_tok_s": 1.0,
                "ours_over_hf": 1.0, "identical_to_hf": True, "divergence": None, "hf_divergence": None}

    def fake_peers(check, drafter, draft, gamma, n_new, compile_options):
        asked["peers"] = (drafter, draft, gamma, n_new)
        names = ("ours target-only", "HF target-only", "ours speculative", "HF assisted")
        return {"tok_s": dict.fromkeys(names, 1.0), "target_only_ours_over_hf": 1.0,
                "speculative_ours_over_hf_assisted": 1.0, "divergence": {},
                "divergence_from_compiled_target_only": {}}

    monkeypatch.setattr(gpu_check, "compiled_or_eager", lambda make, fallback, label: SimpleNamespace(static=label))
    monkeypatch.setattr(gpu_check, "decoding_rows", lambda *args: ({}, []))
    monkeypatch.setattr(gpu_check, "print_decoding", lambda base, rows: None)
    monkeypatch.setattr(gpu_check, "hf_comparison", fake_comparison)
    monkeypatch.setattr(gpu_check, "hf_peers", fake_peers)
    out = gpu_check.main(TINY + ["--quick", "--gamma", "3", "--compile", "--compile-backend", "aot_eager",
                                 "--json", str(tmp_path / "g.json")])
    draft, gamma, n_new = asked["same_draft"]
    assert draft.config.num_hidden_layers == 1 and (gamma, n_new) == (3, 15)  # the 1x32 draft, not the 3x32 one
    drafter, draft, gamma, n_new = asked["peers"]
    assert drafter.static == "draft 1x32" and draft.config.num_hidden_layers == 1 and (gamma, n_new) == (3, 15)
    assert out["compile"]["drafts_compiled"] == {"1x32": True, "3x32": True}
