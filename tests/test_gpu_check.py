"""scripts/gpu_check.py at toy size on the CPU: every step runs and the JSON holds what the README table needs.

No timing assertions: on a CPU at this size Python overhead dominates and speedups are < 1.
"""

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_at_tiny_size(gpu_check, tmp_path, capsys):
    path = tmp_path / "gpu.json"
    out = gpu_check.main(["--size", "tiny", "--device", "cpu", "--max-new-tokens", "15", "--repeats", "1",
                          "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(out))
    assert list(out["latency_ms"]) == ["1", "2", "4", "8", "16", "32", "64", "128", "256"]
    assert out["dtype"] == "float32" and out["size"] == "tiny"
    assert (out["target_params"], out["draft_params"]) == (106_816, 25_696)  # the "tiny" shapes, untied (hand count)
    assert [r["noise"] for r in out["dial"]] == list(gpu_check.NOISES)
    for row in out["dial"]:
        # fp32 greedy: whatever the dial, the output is the target's own greedy output, token for token
        assert row["divergence"] is None and row["identical_to_target"], row
    # noise 0: every draft accepted, so the 15 new tokens come in 3 rounds of γ + 1 = 5
    assert out["dial"][0]["alpha"] == 1.0 and out["dial"][0]["tau"] == 5.0
    assert out["dial"][-1]["alpha"] < 1.0  # noise 0.6 rejects some (the dial is not ignored)
    same = out["same_draft"]
    assert same["identical_to_hf"] and same["divergence"] is None and same["hf_divergence"] is None
    assert set(out["round_ms"]) == {"draft", "verify_forward", "accept_resample", "cache_crop", "draft_per_token"}
    printed = capsys.readouterr().out
    assert "ours / HF" in printed and "5. one round" in printed
    assert "differs at" not in printed


def test_a_divergence_is_reported_with_its_position_and_margin(gpu_check):
    report = {"position": 7, "reference_token": 11, "candidate_token": 12, "top2_margin": 0.0625, "candidate_margin": 0.0625}
    assert gpu_check.describe(None) == "identical"
    assert gpu_check.describe(report) == "differs at token 7 (11 → 12; target's top-2 margin 0.0625)"


@pytest.mark.parametrize("role, params", [("target", 1_711_376_384), ("draft", 134_515_008)])
def test_smollm2_size_has_the_real_models_shapes(gpu_check, role, params):
    """SmolLM2-1.7B and SmolLM2-135M parameter counts (tied embeddings), built on the meta device (no memory)."""
    spec = gpu_check.SIZES["smollm2"]
    model = gpu_check.make_model(spec[role], spec["vocab"], "meta", gpu_check.torch.bfloat16, seed=0, tied=spec["tied"])
    assert sum(p.numel() for p in model.parameters()) == params
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_cuda_without_a_gpu_is_a_clear_error(gpu_check, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_check.main(["--size", "tiny", "--device", "cuda"])
