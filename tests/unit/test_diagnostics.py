"""Attention diagnostics: the probabilities are the model's own and the measures are what they
say on attention computed by hand (the command: tests/integration/test_diagnose_command.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from helpers.models import ALL_KINDS, PLANS, plan_config, tiny_config
from ropelab.data.tasks import Passkey, eval_instance, task_tokenizer
from ropelab.eval.diagnostics import attention_stats
from ropelab.eval.diagnostics.attention_probe import (LayerAttention, attention_inputs, attention_probabilities, rotary_pair_norms,
                                  rotated_vectors)
from ropelab.eval.diagnostics.attention_stats import bin_edges, head_stats, log2_bin, needle_mass
from ropelab.eval.diagnostics.tables import uniform_distance, uniform_entropy
from ropelab.eval.diagnostics.measure import Window, diagnose_window
from ropelab.eval.lm.plots import encoding_color
from ropelab.model.config import POS_KINDS
from ropelab.model.positional.rope import PAIRINGS
from ropelab.model.transformer import Transformer


@torch.no_grad()
def layer_outputs(model, idx):
    """(what attention_inputs says each attention layer received, what each returned in a
    whole forward), after checking the inputs against that forward's."""
    seen = []
    handles = [b.attn.register_forward_hook(lambda m, args, out: seen.append((args[0], out))) for b in model.blocks]
    try:
        model(idx)
    finally:
        for h in handles:
            h.remove()
    inputs = attention_inputs(model, idx)
    assert len(inputs) == len(seen) == len(model.blocks)
    assert all(torch.equal(inp.x, x) for inp, (x, _) in zip(inputs, seen))
    return inputs, [out for _, out in seen]


@pytest.mark.parametrize("kind", ALL_KINDS + [f"plan-{name}" for name in PLANS])
@pytest.mark.parametrize("kv_heads", [4, 1])
def test_probabilities_times_v_through_wo_are_the_layers_output(kind, kv_heads):
    cfg = plan_config(kind[5:], n_kv_heads=kv_heads) if kind.startswith("plan-") else tiny_config(kind, n_kv_heads=kv_heads)
    model = Transformer(cfg).eval()
    with torch.no_grad():  # sinks away from 0 so that a probe without them would fail
        for block in model.blocks:
            if block.attn.sinks is not None:
                block.attn.sinks.normal_(0.0, 1.0)
    idx = torch.randint(0, 97, (2, 40))
    inputs, outputs = layer_outputs(model, idx)
    assert len(inputs) == len(outputs) == cfg.n_layers
    for block, inp, out in zip(model.blocks, inputs, outputs):
        attn = block.attn
        p = attention_probabilities(attn, inp)  # (B, H, T, T)
        total = torch.ones(()) if attn.sinks is None else p.sum(-1)  # a sink takes the rest
        assert torch.allclose(p.sum(-1), total, atol=1e-5) and torch.all(p.triu(1) == 0)
        assert torch.all(p.sum(-1) <= 1 + 1e-5)
        if block.layer.window is not None:  # nothing outside the window
            distance = torch.arange(40)[:, None] - torch.arange(40)[None, :]
            assert torch.all(p[..., distance >= block.layer.window] == 0)
        _, _, v = attn.wqkv(inp.x)
        v = v.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1).float()
        y = attn.wo((p @ v).transpose(1, 2).reshape(2, 40, -1))
        torch.testing.assert_close(y, out, rtol=1e-4, atol=1e-5 * float(out.abs().max()))
        # Rows read in chunks are the same rows, without the keys no row of the chunk sees.
        att = LayerAttention(attn, inp)
        torch.testing.assert_close(att.probabilities(torch.arange(13, 29)), p[:, :, 13:29, :29])
        assert torch.all(p[:, :, 13:29, 29:] == 0)


def test_probabilities_that_miss_the_bias_are_caught():
    """The equality above can fail: ALiBi's probabilities without its bias do not give its output."""
    model = Transformer(tiny_config("alibi", n_layers=1)).eval()
    inputs, outputs = layer_outputs(model, torch.randint(0, 97, (1, 40)))
    unbiased = Transformer(tiny_config("none", n_layers=1)).eval()
    unbiased.load_state_dict(model.state_dict())
    attn, inp = model.blocks[0].attn, inputs[0]
    p = attention_probabilities(attn, type(inp)(inp.x, unbiased.pos.context(torch.arange(40), 40)))
    _, _, v = attn.wqkv(inp.x)
    y = attn.wo((p @ v.repeat_interleave(2, dim=1)).transpose(1, 2).reshape(1, 40, -1))
    assert not torch.allclose(y, outputs[0], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("kind", ["rope", "alibi"])
@torch.no_grad()
def test_two_heads_against_attention_written_out_by_hand(kind):
    """softmax(q·kᵀ/√d + bias) from the weights, RoPE's rotation as 2 × 2 matrices per pair."""
    model = Transformer(tiny_config(kind, n_layers=1, n_heads=2, n_kv_heads=2, d_model=16)).eval()
    T, D = 9, 8
    inp = attention_inputs(model, torch.randint(0, 97, (1, T)))[0]
    wq, wk, _ = model.blocks[0].attn.wqkv.parts()
    x = inp.x[0].double()
    got = attention_probabilities(model.blocks[0].attn, inp)[0].double()
    for h, slope in enumerate((2.0 ** -4, 2.0 ** -8)):  # ALiBi's slopes for 2 heads: 2^(-8/2 · (h + 1))
        q = x @ wq[h * D:(h + 1) * D].double().T  # (T, D)
        k = x @ wk[h * D:(h + 1) * D].double().T
        if kind == "rope":  # half pairing: dims (i, i + D/2) turn by angle t · 10000^(-2i/D)
            for t in range(T):
                for i in range(D // 2):
                    a = t * 10000.0 ** (-2 * i / D)
                    turn = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]], dtype=torch.double)
                    q[t, [i, i + D // 2]] = turn @ q[t, [i, i + D // 2]]
                    k[t, [i, i + D // 2]] = turn @ k[t, [i, i + D // 2]]
        expected = torch.empty(T, T, dtype=torch.double)
        for i in range(T):
            scores = [float(q[i] @ k[j]) / math.sqrt(D) - (slope * (i - j) if kind == "alibi" else 0.0)
                      for j in range(i + 1)]
            weights = [math.exp(s - max(scores)) for s in scores]
            expected[i] = torch.tensor([w / sum(weights) for w in weights] + [0.0] * (T - i - 1))
        torch.testing.assert_close(got[h], expected, rtol=1e-5, atol=1e-7)


def uniform_model(kind: str = "none") -> Transformer:
    """Queries of zero: every score is 0, so every query attends uniformly to its i + 1 keys."""
    model = Transformer(tiny_config(kind)).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.wqkv.parts()[0].zero_()
    return model


def test_uniform_rows_have_entropy_log_n_and_the_uniform_distances():
    T = 37
    model = uniform_model()
    for block, inp in zip(model.blocks, attention_inputs(model, torch.randint(0, 97, (1, T)))):
        stats = head_stats(LayerAttention(block.attn, inp), sink_tokens=1)
        i = np.arange(T)
        assert np.allclose(stats.entropy, np.log(i + 1).mean(), atol=1e-5)
        assert np.allclose(stats.entropy, uniform_entropy(T), atol=1e-5)
        edges = bin_edges(T)
        assert edges == [0, 1, 2, 4, 8, 16, 32, 37]
        by_bin = [np.log(i[a:b] + 1).mean() for a, b in zip(edges[:-1], edges[1:])]  # row of n keys: log n
        assert np.allclose(stats.entropy_by_position, by_bin, atol=1e-5) and stats.entropy_by_position[0, 1] == \
            pytest.approx(math.log(2), abs=1e-6)
        assert np.allclose(stats.distance, uniform_distance(T), atol=1e-4)  # mean of i/2
        assert np.allclose(stats.sink, (1 / (i + 1)).mean(), atol=1e-6)
        expected = [np.mean([max(0, min(n + 1, b) - a) / (n + 1) for n in i]) for a, b in zip(edges, edges[1:])]
        assert np.allclose(stats.distance_histogram, expected, atol=1e-6)
        assert np.allclose(stats.distance_histogram.sum(-1), 1.0, atol=1e-5)


def forced_sink_model() -> Transformer:
    """Learned positions, no token embedding: position 0 alone has a key, which every query
    matches by ~280 in its score; attention and MLP outputs are zero, so every layer sees the
    same input and puts all its attention on token 0."""
    model = Transformer(tiny_config("learned", n_kv_heads=4)).eval()
    d, D = 32, 8
    with torch.no_grad():
        model.tok_emb.weight.zero_()
        table = model.pos.table.weight
        table.zero_()
        table[0, 0] = 1.0
        table[1:, 1] = 1.0
        for block in model.blocks:
            wq, wk, _ = block.attn.wqkv.parts()
            wq.zero_()
            wk.zero_()
            wq[::D, 0] = wq[::D, 1] = 5.0  # every head's first query dim: 5·√d for every token
            wk[::D, 0] = 5.0  # and its first key dim: 5·√d for token 0 only
            block.attn.wo.weight.zero_()
            block.mlp.w2.weight.zero_()
    assert 25 * d / math.sqrt(D) > 200  # the score margin: e^-200 is 0 in float32
    return model


def test_a_model_forced_to_attend_to_token_0_has_sink_mass_1():
    model = forced_sink_model()
    tokens = np.random.default_rng(0).integers(0, 97, size=30)
    meta = {"rotary": False, "attention": "softmax", "sink_tokens": 1}
    found = diagnose_window(model, Window(tokens), meta, full=True, want_map=True)
    assert found["sink"].shape == (2, 4) and np.allclose(found["sink"], 1.0, atol=1e-6)
    assert np.allclose(found["entropy"], 0.0, atol=1e-5)
    assert np.allclose(found["distance"], np.arange(30).mean(), atol=1e-4)  # query i attends i tokens back
    assert found["map"].shape == (2, 30, 30) and np.allclose(found["map"][:, :, 0], 1.0, atol=1e-6)


def test_the_measures_agree_with_brute_force_on_a_random_model(monkeypatch):
    model = Transformer(tiny_config("alibi")).eval()
    T = 45
    inp = attention_inputs(model, torch.randint(0, 97, (1, T)))[1]
    att = LayerAttention(model.blocks[1].attn, inp)
    whole = head_stats(att, sink_tokens=3)
    monkeypatch.setattr(attention_stats, "CHUNK_ELEMENTS", 4 * 7 * T)  # 7 rows per chunk
    chunked = head_stats(att, sink_tokens=3)
    p = attention_probabilities(model.blocks[1].attn, inp)[0].double().numpy()  # (H, T, T)
    histogram = np.zeros((4, len(bin_edges(T)) - 1))
    for i in range(T):
        for j in range(i + 1):
            histogram[:, int(log2_bin(torch.tensor(i - j)))] += p[:, i, j] / T
    entropy = -(p * np.log(np.where(p > 0, p, 1))).sum(-1)  # (H, T)
    for stats in (whole, chunked):
        assert np.allclose(stats.distance_histogram, histogram, atol=1e-6)
        assert np.allclose(stats.entropy, entropy.mean(-1), atol=1e-5)
        assert np.allclose(stats.distance, (p * (np.arange(T)[:, None] - np.arange(T))).sum(-1).mean(-1), atol=1e-4)
        assert np.allclose(stats.sink, p[:, :, :3].sum(-1).mean(-1), atol=1e-6)
    rows, needle = torch.tensor([40, 44]), torch.zeros(T, dtype=torch.bool)
    needle[[5, 6, 20]] = True
    assert np.allclose(needle_mass(att, rows, needle), p[:, [40, 44]][:, :, [5, 6, 20]].sum(-1).mean(-1), atol=1e-6)


def test_log2_bins():
    assert log2_bin(torch.arange(10)).tolist() == [0, 1, 2, 2, 3, 3, 3, 3, 4, 4]
    assert bin_edges(128) == [0, 1, 2, 4, 8, 16, 32, 64, 128] and bin_edges(1) == [0, 1]


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
@pytest.mark.parametrize("attention", ["softmax", "linear"])
def test_rotary_pairs_are_the_pairs_the_rotation_turns(pairing, attention):
    """Each pair's norm is unchanged by the rotation (a pair taken wrongly would mix dims that turn apart)."""
    model = Transformer(tiny_config("rope", pairing=pairing, attention=attention, rotary_fraction=0.5)).eval()
    inp = attention_inputs(model, torch.randint(0, 97, (1, 30)))[0]
    attn, pos = model.blocks[0].attn, model.pos
    q, k = rotated_vectors(attn, inp)
    expected_q, _, _ = attn.wqkv(inp.x)
    if attention == "linear":  # the features its numerator rotates
        expected_q = attn.feature_map(expected_q)
    torch.testing.assert_close(q, expected_q)
    q_norm, k_norm = rotary_pair_norms(q, k, pos.pairing, pos.rotary_dim)
    assert q_norm.shape == k_norm.shape == (1, 4, pos.rotary_dim // 2)
    rq, _ = inp.ctx.rotate(q, k)
    rotated = pos.pairing.pairs(rq[..., :pos.rotary_dim]).norm(dim=-1).mean(dim=2)
    torch.testing.assert_close(q_norm, rotated)
    other = PAIRINGS["interleaved" if pairing == "half" else "half"]  # dims that do not turn together
    assert not torch.allclose(other.pairs(rq[..., :pos.rotary_dim]).norm(dim=-1),
                              other.pairs(q[..., :pos.rotary_dim]).norm(dim=-1))


def test_passkey_needles_are_the_keys_tokens():
    task = Passkey(task_tokenizer())
    starts = []
    for depth in (0.0, 0.5, 1.0):
        instance = eval_instance(task, 0, 100, depth, 3)
        needle = Passkey.needle(instance)
        assert needle.sum() == 5 and not needle[instance.answer].any()
        assert np.array_equal(instance.tokens[needle], instance.tokens[instance.answer])
        starts.append(int(np.flatnonzero(needle)[0]))
    # "key: " then the key first; last, the key then ". key: " and the 5-digit answer (12 tokens).
    assert starts[0] == 5 and starts[0] < starts[1] < starts[2] == 101 - 12 - 5


def test_every_encoding_has_its_own_colour():
    colours = [encoding_color(kind) for kind in POS_KINDS]
    assert len(set(colours)) == len(POS_KINDS) and "#000000" not in colours
