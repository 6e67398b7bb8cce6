"""The benchmark harness at a tiny size (no timing assertions: only that it runs and agrees)."""

import argparse
import json

import pytest
import torch

from specdec_edu.bench import (
    add_arguments,
    format_batch_table,
    format_table,
    left_padded_batch,
    main,
    plot_result,
    run_batch_sweep,
    run_bench,
    save_json,
)


def test_bench_model_drafter(tmp_path, target, close_draft):
    inputs = [torch.tensor([[1, 2, 3, 4]]), torch.tensor([[9, 8, 7]])]
    result = run_bench(target, close_draft, inputs, drafter="model", gamma=3, max_new_tokens=12, repeats=2, progress=False)
    for key in ["target_only_tok_s", "speculative_tok_s", "hf_assisted_tok_s", "alpha", "tau", "c", "gamma",
                "speedup", "predicted_speedup", "device", "dtype", "versions", "round_profile_ms"]:
        assert key in result, key
    assert all(result["identical_outputs"].values()), result["identical_outputs"]  # greedy: same tokens everywhere
    assert 0 < result["alpha"] <= 1 and len(result["tok_s_per_repeat"]["speculative"]) == 2
    save_json(result, tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text())["gamma"] == 3
    plot_result(result, str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 0
    assert "speculative" in format_table(result)


def test_bench_prompt_lookup(target):
    inputs = [torch.tensor([[5, 6, 7, 5, 6, 7, 5, 6]])]
    # an explicit EOS: HF's prompt lookup in transformers 4.56 fails when eos_token_id is None
    result = run_bench(target, None, inputs, eos_token_id=63, drafter="prompt-lookup", gamma=4, max_new_tokens=10, repeats=1, progress=False)
    assert "hf_prompt_lookup_tok_s" in result and all(result["identical_outputs"].values())


def test_batch_sweep_is_exact_per_row(tiny_pair, char_tokenizer):
    rows = run_batch_sweep(*tiny_pair, char_tokenizer, [1, 3], gamma=3, max_new_tokens=6, progress=False)
    assert [r["batch"] for r in rows] == [1, 3]
    assert all(r["identical_rows"] and r["speculative_tok_s"] > 0 and r["target_only_tok_s"] > 0 for r in rows)
    assert "| 3 |" in format_batch_table(rows)
    ids, mask = left_padded_batch(char_tokenizer, ["a", "a longer prompt"], 2, "cpu")
    assert mask[:, -1].all() and not mask[0, 0]  # left padding: the short prompt is padded at the front


def test_bench_cli_rejects_bad_batch_sizes():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    for bad in (["--batch-sizes", "1,x"], ["--batch-sizes", "0"], ["--batch-sizes", "4", "--drafter", "prompt-lookup"]):
        with pytest.raises(SystemExit, match="batch-sizes"):
            main(parser.parse_args(bad))
