"""scripts/cold_start.py at toy shapes: a fresh process reports its four parts, cold then warm (no timing checked)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cold_start.py"


def test_the_tiny_smoke_reports_every_part_cold_and_warm(tmp_path):
    out = tmp_path / "cold.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--paths", "eager", "--cpus", "all", "--json", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(out.read_text())["rows"]
    assert [(r["path"], r["cache"], r["cpus"]) for r in rows] == [("eager", "cold", "all"), ("eager", "warm", "all")]
    for row in rows:
        assert set(row["seconds"]) == {"import", "build", "compile", "first_token", "total"}
        assert row["seconds"]["compile"] < row["seconds"]["total"] and not row["compiled"]
        assert row["dtype"] == "torch.float32"  # a CPU computes in fp32
        assert row["first_round_drafted"] == 4  # the first token is timed through a round that drafts γ = 4
        assert row["target_step_ms"] > 0  # what the start buys: the path's step, weighed beside its start
    assert "eager      cold all CPUs" in done.stdout and "ms per target step" in done.stdout


def test_two_cpus_are_labelled_a_colab_proxy_and_an_unknown_path_is_an_error():
    sys.path.insert(0, str(SCRIPT.parent))
    import cold_start

    row = {"path": "default", "cache": "cold", "cpus": "0,1", "error": "boom"}
    assert "proxy for Colab's 2 vCPUs" in cold_start.format_row(row) and "FAILED: boom" in cold_start.format_row(row)
    done = subprocess.run([sys.executable, str(SCRIPT), "--paths", "fast"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown path 'fast'" in done.stderr


def test_a_run_cut_by_its_time_limit_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """The GPU stage runs the script under `timeout`: the JSON (with its date and command) is on disk before the first
    process and rewritten after every row, so a cut run keeps what it measured (it was written only at the end)."""
    sys.path.insert(0, str(SCRIPT.parent))
    import cold_start

    out, calls = tmp_path / "cold.json", []

    def one_row_then_cut(args, path, cpus, cache_dir):
        if calls:
            raise TimeoutError("the stage's time limit")
        calls.append(path)
        parts = ("import", "build", "compile", "first_token", "total")
        return {"path": path, "compiled": False, "seconds": dict.fromkeys(parts, 1.0)}

    monkeypatch.setattr(cold_start, "run_child", one_row_then_cut)
    with pytest.raises(TimeoutError):
        cold_start.main(["--paths", "eager", "--cpus", "all", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert [r["cache"] for r in saved["rows"]] == ["cold"] and "--json" in saved["command"] and saved["date"]
