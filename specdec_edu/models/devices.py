"""Where the course runs: the best device here, and whether "here" is a Google Colab runtime."""

from __future__ import annotations

import sys

import torch

__all__ = ["default_device", "on_colab"]


def default_device() -> torch.device:
    """The best available device: CUDA, then Apple's MPS, then the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def on_colab() -> bool:
    """True inside a Google Colab runtime (its ``google.colab`` module is already imported there)."""
    return "google.colab" in sys.modules
