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
    out = gpu_check.main(["--size", "tiny", "--device", "cpu", "--max-new-tokens", "16", "--repeats", "1",
                          "--json", str(path)])
    assert json.loads(path.read_text()) == json.loads(json.dumps(out))
    assert set(out["latency_ms"]) == {"1", "2", "4", "8", "16", "32", "64", "128", "256"}
    assert out["c"] > 0 and out["verify_cost"] > 0 and out["dtype"] == "float32"
    assert [r["noise"] for r in out["dial"]] == list(gpu_check.NOISES)
    for row in out["dial"]:
        # fp32 greedy: whatever the dial, the output is the target's own greedy output, token for token
        assert row["identical_to_target"], row
        assert 0 < row["predicted_speedup"] and row["speedup"] > 0
    assert out["dial"][0]["alpha"] == 1.0  # noise 0 drafts exactly the target's tokens
    assert out["same_draft"]["identical_to_hf"]
    assert "ours / HF" in capsys.readouterr().out


def test_cuda_without_a_gpu_is_a_clear_error(gpu_check, monkeypatch):
    monkeypatch.setattr(gpu_check.torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_check.main(["--size", "tiny", "--device", "cuda"])
