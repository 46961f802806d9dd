"""What the export and import tests (transformers' Llama) share."""

from __future__ import annotations

import torch

TRAIN_LEN = 32
TOL = 1e-4
TEXTS = ["the cat sat on the mat, héllo wörld ☕\n", "naïve café data and more data " * 5]


def max_diff(model, hf_model, x) -> float:
    """The largest difference between our logits and transformers' for the tokens ``x``."""
    with torch.no_grad():
        return float((model(x) - hf_model(x).logits).abs().max())
