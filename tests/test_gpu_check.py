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
    args = gpu_check.parse_args(["--quick", "--device", "cpu"])
    assert (args.max_new_tokens, args.repeats, args.bandwidth_mib) == (48, 1, 64)


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
