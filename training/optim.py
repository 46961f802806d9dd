"""AdamW with decay on matrices only, and the warmup + cosine learning-rate schedule."""

from __future__ import annotations

import math

import torch
from torch import nn


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                    device_type: str) -> torch.optim.AdamW:
    """AdamW; weight decay only on ≥2-D weights (matmuls, embeddings), never on norms.

    The fused kernel is used where torch has one for the device (CUDA; CPU in recent
    releases), otherwise the multi-tensor ``foreach`` path.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device_type in ("cuda", "cpu")
    try:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
    except (RuntimeError, TypeError):  # no fused kernel for this device/dtype
        return torch.optim.AdamW(groups, lr=lr, betas=betas, foreach=True)


def lr_at(step: int, lr: float, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """Linear warmup over ``warmup_steps`` to ``lr``, then cosine decay to ``lr·min_lr_ratio``.

    ``step`` is 0-based: the first step uses lr/warmup_steps, step warmup_steps-1 uses lr.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    floor = lr * min_lr_ratio
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return floor + 0.5 * (lr - floor) * (1.0 + math.cos(math.pi * progress))
