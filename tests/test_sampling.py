import pytest
import torch
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from specdec_edu import logits_to_probs


@pytest.mark.parametrize(
    "temperature, top_k, top_p",
    [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.9), (0.8, 10, 0.8), (2.0, 1, 0.5), (1.0, 500, 0.999)],
)
def test_matches_transformers_warpers(temperature, top_k, top_p):
    """Same semantics and order as HF generate(): temperature -> top-k -> top-p."""
    logits = torch.randn(6, 100, generator=torch.Generator().manual_seed(0)) * 3
    warped = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k > 0:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1.0:
        warped = TopPLogitsWarper(top_p)(None, warped)
    torch.testing.assert_close(logits_to_probs(logits, temperature, top_k, top_p), warped.softmax(-1), rtol=0, atol=1e-7)


def test_temperature_zero_is_one_hot_argmax():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(1))
    probs = logits_to_probs(logits, temperature=0)
    assert torch.equal(probs.argmax(-1), logits.argmax(-1))
    assert torch.equal(probs.sum(-1), torch.ones(4)) and set(probs.unique().tolist()) == {0.0, 1.0}


def test_float64_is_kept():
    assert logits_to_probs(torch.zeros(3, dtype=torch.float64)).dtype == torch.float64


@pytest.mark.parametrize(
    "kwargs, fix",
    [
        (dict(temperature=-1.0), "temperature=0"),
        (dict(top_k=-1), "top_k=0"),
        (dict(top_p=0.0), "top_p=1.0"),
        (dict(top_p=1.5), "top_p=1.0"),
    ],
)
def test_bad_sampling_args_name_the_fix(kwargs, fix):
    with pytest.raises(ValueError, match=fix):
        logits_to_probs(torch.zeros(5), **kwargs)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logits_are_refused(bad):
    logits = torch.zeros(5)
    logits[2] = bad
    with pytest.raises(ValueError, match="float32"):
        logits_to_probs(logits)
