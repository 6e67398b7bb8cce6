"""scripts/cold_start.py at toy shapes: a fresh process reports its four parts, cold then warm (no timing checked)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "cold_start.py"


def load_cold_start():
    """The script as a module (scripts/ is no package), for the tests that call its functions."""
    if str(SCRIPT.parent) not in sys.path:
        sys.path.insert(0, str(SCRIPT.parent))
    import cold_start

    return cold_start


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
    cold_start = load_cold_start()
    row = {"path": "default", "cache": "cold", "cpus": "0,1", "error": "boom"}
    assert "proxy for Colab's 2 vCPUs" in cold_start.format_row(row) and "FAILED: boom" in cold_start.format_row(row)
    done = subprocess.run([sys.executable, str(SCRIPT), "--paths", "fast"], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "unknown path 'fast'" in done.stderr


def test_a_run_cut_by_its_time_limit_keeps_the_rows_it_measured(tmp_path, monkeypatch):
    """The GPU stage runs the script under `timeout`: the JSON (with its date and command) is on disk before the first
    process and rewritten after every row, so a cut run keeps what it measured (it was written only at the end)."""
    cold_start = load_cold_start()
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


# ---- the numbers a row saves, from fake clocks and fake generations (fast: no process, no timing measured) -----------
from types import SimpleNamespace  # noqa: E402


class FakeClock:
    """``time`` for the script: ``perf_counter`` advances by the next step on each call, ``time()`` is fixed."""

    def __init__(self, steps, now=1000.0):
        self.steps, self.t, self.now = iter(steps), 0.0, now

    def perf_counter(self):
        self.t += next(self.steps)
        return self.t

    def time(self):
        return self.now


def test_the_child_derives_each_part_from_its_clock_and_the_generations_stats(monkeypatch):
    """import, build and compile are the clock's laps; the first token is what ran before the generation's clock
    (the lap less ``stats.seconds``), the prefill and round 1 of each phase (not the last round); total runs from
    the parent's spawn time to that first token (it ran to the end of the generation, the later rounds included,
    as the mutation audit found); the step is (seconds − prefill) / STEPS of a STEPS + 1 token target-only run; a
    compiled path makes caches of prompt + γ + 1 + γ positions; ``compiled`` is what the run reports (a
    compiler failure falls back to eager), not what was asked."""
    import specdec_edu
    import specdec_edu.drafters
    from specdec_edu import kv

    cold_start = load_cold_start()
    asked = {}

    def fake_speculative(target, draft, prompt, max_new_tokens, gamma, compile, compile_options, profile):
        asked["speculative"] = (max_new_tokens, gamma, compile, profile)
        return SimpleNamespace(stats=SimpleNamespace(
            seconds=0.5, prefill_seconds=0.1, compiled=False, drafted_per_round=[4, 1],
            phase_seconds={"draft": [0.02, 0.9], "verify_forward": [0.03, 0.8]}))

    def fake_autoregressive(target, prompt, max_new_tokens, compile, compile_options):
        asked["autoregressive"] = max_new_tokens
        return SimpleNamespace(stats=SimpleNamespace(seconds=0.4, prefill_seconds=0.08))

    monkeypatch.setattr(specdec_edu, "speculative_generate", fake_speculative)
    monkeypatch.setattr(specdec_edu, "autoregressive_generate", fake_autoregressive)
    monkeypatch.setattr(kv, "shared_static_cache", lambda target, positions, options: asked.setdefault("cache", positions))
    monkeypatch.setattr(specdec_edu.drafters, "ModelDrafter",
                        lambda draft, max_cache_len, compile, compile_options: asked.setdefault("draft_cache", max_cache_len))
    # laps: start; import 2.0; build 3.0; compile 4.0; then 1.5 from the compile's end to the generation's return
    monkeypatch.setattr(cold_start, "time", FakeClock([10.0, 2.0, 0.0, 3.0, 0.0, 4.0, 0.0, 1.5]))
    monkeypatch.setenv("COLD_START_SPAWNED", "990.0")
    args = SimpleNamespace(device="cpu", tiny=True, path="inductor", prompt_length=8)
    row = cold_start.child(args)
    seconds = row["seconds"]
    assert (seconds["import"], seconds["build"], seconds["compile"]) == (2.0, 3.0, 4.0)
    assert seconds["first_token"] == pytest.approx((1.5 - 0.5) + 0.1 + 0.02 + 0.03)
    # spawned at 990.0, 1000.0 when the generation returned: 10 s, less what ran after the first token (the later
    # rounds: the lap's 1.5 s less the first token's 1.15 s)
    assert seconds["total"] == pytest.approx(10.0 - (1.5 - seconds["first_token"])) == pytest.approx(9.65)
    assert row["target_step_ms"] == pytest.approx(1000 * (0.4 - 0.08) / cold_start.STEPS)
    assert asked["speculative"] == (cold_start.GAMMA + 1, cold_start.GAMMA, True, True)
    assert asked["autoregressive"] == cold_start.STEPS + 1
    assert asked["cache"] == asked["draft_cache"] == 8 + 2 * cold_start.GAMMA + 1
    assert row["compiled"] is False  # what the run reports: it fell back to eager
    assert row["first_round_drafted"] == 4 and row["path"] == "inductor"
    # provenance in the row: the device by name, the versions, and the backend the path resolved to in this version
    # ("default" meant inductor on 2026-12-04's lease and recorded CUDA graphs after)
    import torch
    import transformers

    assert (row["torch"], row["transformers"]) == (torch.__version__, transformers.__version__)
    assert row["device_name"] and row["backend"] == "inductor"


def test_cold_and_warm_share_one_fresh_cache_folder_per_path_and_cpu_set(monkeypatch, tmp_path):
    """A cold row and its warm row run in the same compile cache folder (the warm one finds it filled), and every
    (path, CPU set) starts from a fresh folder: a warm row in a fresh folder would record a cold start as warm, a
    cold row in a used one a warm start as cold. The CPU sets are ";"-separated; a failed row makes the exit 1
    (the stage then knows a row is missing)."""
    cold_start = load_cold_start()
    calls = []

    def fake_run_child(args, path, cpus, cache_dir):
        calls.append((path, cpus, cache_dir, sorted(p.name for p in Path(cache_dir).iterdir())))
        (Path(cache_dir) / f"filled by {path} {cpus} {len(calls)}").touch()
        parts = ("import", "build", "compile", "first_token", "total")
        return {"path": path, "compiled": False, "seconds": dict.fromkeys(parts, 1.0)}

    monkeypatch.setattr(cold_start, "run_child", fake_run_child)
    monkeypatch.setattr(cold_start.shutil, "which", lambda name: "/usr/bin/taskset")
    monkeypatch.setattr(cold_start.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert cold_start.cpu_sets("all;0,1") == ["all", "0,1"]
    args = SimpleNamespace(paths="inductor,eager", cpus="all;0,1")
    rows = cold_start.measure(args)
    assert [(r["path"], r["cpus"], r["cache"]) for r in rows] == [
        (p, c, cache) for p in ("inductor", "eager") for c in ("all", "0,1") for cache in ("cold", "warm")]
    for cold, warm in zip(calls[::2], calls[1::2]):
        assert cold[2] == warm[2] and cold[3] == []  # the cold row's folder is empty, the warm row's is the same one
        assert warm[3] == [f"filled by {cold[0]} {cold[1]} {calls.index(cold) + 1}"]
    monkeypatch.setattr(cold_start, "run_child", lambda args, path, cpus, cache_dir: {"path": path, "error": "boom"})
    assert cold_start.main(["--paths", "eager", "--cpus", "all", "--json", str(tmp_path / "c.json")]) == 1


def test_a_child_process_gets_its_cache_folder_its_cpus_and_its_spawn_time(monkeypatch):
    """The child's compile caches (inductor's and Triton's) are under the row's folder, so that cold is cold; a CPU set
    other than "all" runs it under taskset; its spawn time is the parent's clock when it starts it; the row is the
    last line of its output (warnings may come before)."""
    cold_start = load_cold_start()
    started = []

    def fake_run(command, env, capture_output, text, timeout):
        started.append((command, env))
        return SimpleNamespace(returncode=0, stdout='a warning\n{"path": "eager", "seconds": {}}\n', stderr="")

    monkeypatch.setattr(cold_start.subprocess, "run", fake_run)
    monkeypatch.setattr(cold_start, "time", FakeClock([], now=1234.5))
    args = SimpleNamespace(prompt_length=8, tiny=True, device=None, timeout=60)
    assert cold_start.run_child(args, "eager", "all", "/tmp/the_rows_cache") == {"path": "eager", "seconds": {}}
    assert cold_start.run_child(args, "eager", "0,1", "/tmp/the_rows_cache") == {"path": "eager", "seconds": {}}
    (all_cpus, env), (two_cpus, _) = started
    assert all_cpus[0] == sys.executable and two_cpus[:3] == ["taskset", "-c", "0,1"] and two_cpus[3:] == all_cpus
    assert env["TORCHINDUCTOR_CACHE_DIR"] == "/tmp/the_rows_cache"
    assert env["TRITON_CACHE_DIR"].startswith("/tmp/the_rows_cache/")
    assert float(env["COLD_START_SPAWNED"]) == 1234.5


def test_a_cpu_set_this_process_may_not_use_is_skipped_with_the_cpus_it_may(monkeypatch, capsys):
    """A container given CPUs 4 and 5 refuses ``taskset -c 0,1``: that set is skipped, and the note names 4 and 5;
    "4,5" and a range within them are kept."""
    cold_start = load_cold_start()
    monkeypatch.setattr(cold_start.shutil, "which", lambda name: "/usr/bin/taskset")
    monkeypatch.setattr(cold_start.os, "sched_getaffinity", lambda pid: {4, 5}, raising=False)
    assert cold_start.cpu_sets("all;0,1;4,5;4-5") == ["all", "4,5", "4-5"]
    assert "skipped cpus 0,1: this process may run on CPUs [4, 5] only" in capsys.readouterr().err
    assert cold_start.taskset_cpus("0-3,8") == {0, 1, 2, 3, 8}
    monkeypatch.setattr(cold_start.shutil, "which", lambda name: None)
    assert cold_start.cpu_sets("all;4,5") == ["all"]
