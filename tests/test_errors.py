"""Bad input raises ValueError/TypeError whose message names the fix."""

from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_llama

from specdec_edu import autoregressive_generate, speculative_generate

IDS = torch.tensor([[1, 2, 3]])


def spec(target, draft, ids=IDS, **kw):
    kw.setdefault("max_new_tokens", 4)
    return speculative_generate(target, draft, ids, **kw)


def test_vocabulary_mismatch(target):
    other = tiny_llama(seed=3, vocab_size=100)
    with pytest.raises(ValueError, match="share a tokenizer"):
        spec(target, other)


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        (dict(gamma=0), "at least 1 token per round"),
        (dict(max_new_tokens=0), "at least 1 new token"),
        (dict(do_sample=True, top_p=0.0), "top_p=1.0"),
        (dict(do_sample=True, top_p=1.2), "top_p=1.0"),
        (dict(do_sample=True, temperature=-0.5), "temperature=0"),
        (dict(do_sample=True, top_k=-3), "top_k=0"),
    ],
)
def test_bad_arguments(target, draft, kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        spec(target, draft, **kwargs)


def test_empty_prompt(target, draft):
    with pytest.raises(ValueError, match="non-empty"):
        spec(target, draft, ids=torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="non-empty"):
        autoregressive_generate(target, torch.zeros(1, 0, dtype=torch.long), max_new_tokens=3)


def test_batch_needs_a_draft_model_and_left_padding(target, draft):
    from specdec_edu import PromptLookupDrafter

    with pytest.raises(ValueError, match="one prompt at a time"):
        spec(target, PromptLookupDrafter(), ids=torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="padding_side='left'"):
        spec(target, draft, ids=torch.tensor([[1, 2], [3, 4]]), attention_mask=torch.tensor([[1, 1], [1, 0]]))


def test_prompt_longer_than_max_positions(target, draft):
    with pytest.raises(ValueError, match="shorten the prompt"):
        spec(target, draft, ids=torch.ones(1, 256, dtype=torch.long))


def test_nan_logits(draft):
    broken = tiny_llama(seed=0)
    with torch.no_grad():
        broken.lm_head.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match="float32"):
        spec(broken, draft)


def test_generator_on_wrong_device(target, draft):
    """A CUDA generator with CPU models (faked: this machine has no GPU to make a real one)."""
    cuda_generator = SimpleNamespace(device=torch.device("cuda"))
    with pytest.raises(ValueError, match="torch.Generator\\(device='cpu'\\)"):
        spec(target, draft, do_sample=True, generator=cuda_generator)


def test_draft_without_propose(target):
    with pytest.raises(TypeError, match="propose"):
        spec(target, object())


def test_one_dimensional_prompt_is_accepted(target, draft):
    assert spec(target, draft, ids=IDS[0]).sequences.shape == (1, 7)
