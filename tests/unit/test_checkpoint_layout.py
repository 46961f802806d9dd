"""Checkpoints from before the q/k/v and gate/up fusion load and resume (model/layers.py)."""

from __future__ import annotations

import torch
from safetensors.torch import save_file

from helpers.models import tiny_config
from ropelab.model.layers import fuse_projections, split_projections
from ropelab.model.transformer import Transformer
from ropelab.training.checkpoint import load_weights
from ropelab.training.optim import build_optimizer, parameter_groups, set_learning_rate, upgrade_optimizer_state


def legacy_state(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights as the older layout names them: wq, wk, wv, w1, w3 apart."""
    cfg, out = model.cfg, {}
    for key, w in model.state_dict().items():
        if key.endswith("attn.wqkv.weight"):
            q, k, v = w.split([cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim])
            out.update({key.replace("wqkv", "wq"): q, key.replace("wqkv", "wk"): k, key.replace("wqkv", "wv"): v})
        elif key.endswith("mlp.w13.weight"):
            gate, up = w.chunk(2)
            out.update({key.replace("w13", "w1"): gate, key.replace("w13", "w3"): up})
        else:
            out[key] = w
    return out


def test_fuse_and_split_are_inverse_and_match_the_old_names():
    model = Transformer(tiny_config(n_kv_heads=1))
    old = legacy_state(model)
    assert "blocks.0.attn.wk.weight" in old and old["blocks.0.attn.wk.weight"].shape == (8, 32)
    assert {k: v.tolist() for k, v in split_projections(model.state_dict(), model.cfg).items()} == \
        {k: v.tolist() for k, v in old.items()}
    fused = fuse_projections(old)
    assert fused.keys() == model.state_dict().keys()
    assert all(torch.equal(fused[k], v) for k, v in model.state_dict().items())


def test_an_older_weights_file_loads_into_the_fused_model(tmp_path):
    model = Transformer(tiny_config()).eval()
    old = {k: v.clone() for k, v in legacy_state(model).items() if k != "head.weight"}  # tied: stored once
    save_file(old, str(tmp_path / "model.safetensors"))
    fresh = Transformer(tiny_config()).eval()
    load_weights(fresh, tmp_path)
    x = torch.randint(0, 97, (1, 20))
    with torch.no_grad():
        assert torch.equal(fresh(x), model(x))


def test_an_older_optimizer_state_resumes_with_the_same_moments():
    torch.manual_seed(0)
    model = Transformer(tiny_config())
    opt = build_optimizer(model, 1e-3, 0.1, (0.9, 0.95), "cpu")
    for _ in range(2):
        model(torch.randint(0, 97, (2, 16)), targets=torch.randint(0, 97, (2, 16))).backward()
        opt.step()
        opt.zero_grad()
    state = opt.state_dict()
    # The same state as the older layout saved it: one entry per separate weight.
    cfg, old_state, old_groups, index = model.cfg, {}, [], 0
    for group, saved in zip(parameter_groups(model), state["param_groups"]):
        params = []
        for (name, _), new_index in zip(group, saved["params"]):
            entry = state["state"][new_index]
            if name.endswith("attn.wqkv.weight"):
                sizes = [cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
            elif name.endswith("mlp.w13.weight"):
                sizes = [cfg.hidden_dim, cfg.hidden_dim]
            else:
                sizes = None
            pieces = [entry] if sizes is None else [
                {k: (v.split(sizes)[i] if v.dim() else v) for k, v in entry.items()} for i in range(len(sizes))]
            for piece in pieces:
                old_state[index] = piece
                params.append(index)
                index += 1
        old_groups.append({**saved, "params": params})
    legacy = {"state": old_state, "param_groups": old_groups}
    assert [len(g["params"]) for g in legacy["param_groups"]] != [len(g["params"]) for g in state["param_groups"]]
    upgraded = upgrade_optimizer_state(legacy, model)
    assert upgraded["param_groups"] == state["param_groups"]
    for i, entry in state["state"].items():
        assert all(torch.equal(upgraded["state"][i][k], v) for k, v in entry.items())
    assert upgrade_optimizer_state(state, model) is state  # the current layout passes through


def test_positional_lr_multiplier_moves_only_the_positional_parameters():
    """Adam's first step moves every parameter by ≈ its group's lr (g/√g² = ±1), so the step
    sizes show each group's rate: ×10 for ``pos.`` (T5's table), ×1 for the rest."""
    torch.manual_seed(0)
    model = Transformer(tiny_config("t5"))
    two = build_optimizer(model, 1e-3, 0.0, (0.9, 0.95), "cpu")
    assert [g["lr_scale"] for g in two.param_groups] == [1.0, 1.0]  # multiplier 1: the two-group layout
    assert [[n for n, _ in g] for g in parameter_groups(model)] == \
        [[n for n, p in model.named_parameters() if p.dim() >= 2], [n for n, p in model.named_parameters() if p.dim() < 2]]
    opt = build_optimizer(model, 1e-3, 0.0, (0.9, 0.95), "cpu", pos_lr_multiplier=10.0)
    groups = parameter_groups(model, 10.0)
    assert [[n for n, _ in g] for g in groups][2:] == [["pos.weight"], []]
    assert [g["lr_scale"] for g in opt.param_groups] == [1.0, 1.0, 10.0, 10.0]
    set_learning_rate(opt, 2e-3)
    assert [g["lr"] for g in opt.param_groups] == [2e-3, 2e-3, 2e-2, 2e-2]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.full_like(p, 0.5)
    opt.step()
    for name, p in model.named_parameters():
        moved = (p.detach() - before[name]).abs()
        expected = 2e-2 if name.startswith("pos.") else 2e-3
        assert torch.allclose(moved, torch.full_like(moved, expected), rtol=1e-4), name
    # A state saved before lr_scale existed keeps the schedule's lr in every group.
    old = build_optimizer(model, 1e-3, 0.0, (0.9, 0.95), "cpu")
    state = old.state_dict()
    for group in state["param_groups"]:
        del group["lr_scale"]
    old.load_state_dict(state)
    set_learning_rate(old, 5e-4)
    assert [g["lr"] for g in old.param_groups] == [5e-4, 5e-4]
