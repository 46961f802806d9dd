"""AdamW with decay on matrices only, and the warmup + cosine learning-rate schedule.

``train.pos_lr_multiplier`` gives the positional encoding's own parameters (those under
``pos.`` and ``layer_pos.``: a learned table, T5's bucket biases, KERPLE's r₁ and r₂, FIRE's
MLP, FoX's gates, DAPE's MLPs) a learning
rate of lr × multiplier. Adam moves each parameter by at most about lr per step, so a
bias table initialised near 0 can move only about Σ lr ≈ 0.55 logits over a 1,000-step
warmup + cosine run at lr 1e-3: the multiplier shows whether such a row is lr-bound. At 1
(the default) the groups and the saved optimizer state are exactly the two-group layout.

``upgrade_optimizer_state`` converts the AdamW state of a checkpoint written before the
q/k/v and gate/up projections were fused (model/layers.py), so such a run still resumes:
a fused weight's moments are its parts' moments stacked the same way as the weights.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ropelab.model.layers import fused_parts


# The model's positional modules (model/transformer.py): the default layer's encoding and
# those of a layer plan's other types.
POSITIONAL_PREFIX = ("pos.", "layer_pos.")


def _groups(model: nn.Module, pos_lr_multiplier: float) -> list[tuple[bool, bool, list[tuple[str, nn.Parameter]]]]:
    """(decayed, positional, its (name, parameter)s) per AdamW group, in model order: ≥2-D
    weights (decayed), then the rest; with a positional multiplier other than 1, the same two
    again for the ``pos.`` parameters (at 1 nothing is split by it: positional is False)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    split = pos_lr_multiplier != 1.0
    return [(decayed, positional, [(n, p) for n, p in named if (p.dim() >= 2) == decayed
                                   and (not split or n.startswith(POSITIONAL_PREFIX) == positional)])
            for positional in ((False, True) if split else (False,)) for decayed in (True, False)]


def parameter_groups(model: nn.Module,
                     pos_lr_multiplier: float = 1.0) -> list[list[tuple[str, nn.Parameter]]]:
    """(name, parameter) per AdamW group, in the optimizer's order (see ``_groups``)."""
    return [members for _, _, members in _groups(model, pos_lr_multiplier)]


def build_optimizer(model: nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                    device_type: str, pos_lr_multiplier: float = 1.0) -> torch.optim.AdamW:
    """AdamW; weight decay only on ≥2-D weights (matmuls, embeddings), never on norms.

    Each group carries ``lr_scale``, the factor ``lr_at``'s value is multiplied by for it.
    The fused kernel is used where torch has one for the device (CUDA; CPU in recent
    releases), otherwise the multi-tensor ``foreach`` path.
    """
    groups = [{"params": [p for _, p in members], "weight_decay": weight_decay if decayed else 0.0,
               "lr_scale": pos_lr_multiplier if positional else 1.0}
              for decayed, positional, members in _groups(model, pos_lr_multiplier)]
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


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """``lr`` (the schedule's value) times each group's ``lr_scale`` (1 in states saved before it)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)


def upgrade_optimizer_state(state: dict, model: nn.Module, pos_lr_multiplier: float = 1.0) -> dict:
    """An AdamW state dict saved with separate q/k/v and gate/up weights, for the fused model.

    Returned unchanged when its groups already have the model's sizes.
    """
    groups = parameter_groups(model, pos_lr_multiplier)
    if [len(g["params"]) for g in state["param_groups"]] == [len(g) for g in groups]:
        return state
    old_names = [[part for name, _ in group for part in fused_parts(name)] for group in groups]
    if [len(g["params"]) for g in state["param_groups"]] != [len(g) for g in old_names]:
        return state  # not the older layout either: loading reports the mismatch
    by_name = {name: state["state"].get(index) for group, names in zip(state["param_groups"], old_names)
               for index, name in zip(group["params"], names)}
    new_state, new_groups, index = {}, [], 0
    for group, saved in zip(groups, state["param_groups"]):
        params = []
        for name, _ in group:
            parts = [by_name[part] for part in fused_parts(name)]
            if all(p is not None for p in parts):
                new_state[index] = {k: (torch.cat([p[k] for p in parts]) if parts[0][k].dim() else parts[0][k])
                                    for k in parts[0]}
            params.append(index)
            index += 1
        new_groups.append({**saved, "params": params})
    return {"state": new_state, "param_groups": new_groups}
