"""KV cache and generation: cached decoding equals the full forward for every encoding."""

from __future__ import annotations

import pytest
import torch

from helpers.models import ALL_KINDS, PLANS, plan_config, sharp_model, tiny_config
from ropelab.model.config import RopeScalingConfig, XposConfig
from ropelab.common.errors import LengthError
from ropelab.model.generate import generate, sample_next
from ropelab.model.transformer import Transformer
from helpers.reference import cached_logits

VARIANTS = {kind: tiny_config(kind) for kind in ALL_KINDS}
VARIANTS.update({
    "rope-interleaved-partial": tiny_config(pairing="interleaved", rotary_fraction=0.5),
    "rope-mha": tiny_config(n_kv_heads=4),
    "rope-mqa": tiny_config(n_kv_heads=1),
    "alibi-6-heads": tiny_config("alibi", d_model=48, n_heads=6, n_kv_heads=3),
    "rope-dynamic": tiny_config(scaling=RopeScalingConfig(type="dynamic", factor=4, original_max_len=8)),
    "rope-yarn": tiny_config(scaling=RopeScalingConfig(type="yarn", factor=4, original_max_len=8)),
    "p-rope-dynamic": tiny_config(frequency_fraction=0.5,
                                  scaling=RopeScalingConfig(type="dynamic", factor=4, original_max_len=8)),
    "xpos-interleaved-strong-decay": tiny_config("xpos", pairing="interleaved"),
    # xPos takes a RoPE scaling (model/encodings.py): dynamic NTK fits the frequencies and
    # xPos's centre to the same length, so cached keys stay consistent.
    "xpos-dynamic": tiny_config("xpos", scaling=RopeScalingConfig(type="dynamic", factor=4, original_max_len=8)),
    "xpos-yarn": tiny_config("xpos", scaling=RopeScalingConfig(type="yarn", factor=4, original_max_len=8)),
    "t5-6-heads": tiny_config("t5", d_model=48, n_heads=6, n_kv_heads=3),
})
VARIANTS["xpos-interleaved-strong-decay"].pos.xpos = XposConfig(scale_base=8.0)
# Every layer plan of the 2025 designs: windows of 8 keys against 29-token prompts.
VARIANTS.update({f"plan-{name}": plan_config(name) for name in PLANS})


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_cached_decoding_equals_full_forward(name, chunk):
    model = sharp_model(VARIANTS[name])
    x = torch.randint(0, 97, (2, 29))
    with torch.no_grad():
        full = model(x)
        cached = cached_logits(model, x, chunk)
    assert torch.allclose(cached, full, atol=1e-5), (cached - full).abs().max()


@pytest.mark.parametrize("name", list(VARIANTS))
def test_greedy_identical_with_and_without_cache(name):
    model = sharp_model(VARIANTS[name])
    prompt = torch.randint(0, 97, (2, 7))
    with_cache = generate(model, prompt, 20, temperature=0)
    without = generate(model, prompt, 20, temperature=0, use_cache=False)
    chunked = generate(model, prompt, 20, temperature=0, prefill_chunk=3)
    assert with_cache.shape == (2, 27)
    assert torch.equal(with_cache, without) and torch.equal(with_cache, chunked)
    assert torch.equal(with_cache[:, :7], prompt)
    assert model.blocks[0].attn.cache is None  # the cache is gone afterwards


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = sharp_model(VARIANTS["rope"])
    prompt = [1, 2, 3]
    a = generate(model, prompt, 15, temperature=1.0, seed=7)
    b = generate(model, prompt, 15, temperature=1.0, seed=7)
    c = generate(model, prompt, 15, temperature=1.0, seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    greedy = generate(model, prompt, 15, temperature=0)
    assert torch.equal(generate(model, prompt, 15, temperature=1.5, top_k=1, seed=3), greedy)
    assert torch.equal(generate(model, prompt, 15, temperature=1.0, top_p=1e-6, seed=3), greedy)


def test_top_k_and_top_p_restrict_the_support():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    gen = torch.Generator().manual_seed(0)
    draws = lambda **kw: {int(sample_next(logits, generator=gen, **kw)) for _ in range(300)}  # noqa: E731
    assert draws(top_k=2) == {0, 1}
    assert draws(top_p=0.7) == {0, 1}  # 0.5 < 0.7 ≤ 0.8: the smallest set reaching top_p
    assert draws(top_p=0.5) == {0}
    assert draws(top_p=0.85) == {0, 1, 2}
    assert draws() == {0, 1, 2, 3}


def test_eos_stops_and_pads():
    model = sharp_model(VARIANTS["rope"])
    prompt = torch.randint(0, 97, (2, 4))
    free = generate(model, prompt, 12, temperature=0)
    eos = int(free[0, 6])  # the first sequence emits this at step 3
    out = generate(model, prompt, 12, temperature=0, eos_id=eos)
    first_eos = (out[0, 4:] == eos).nonzero()[0].item() + 4
    assert torch.all(out[0, first_eos:] == eos)
    if not (free[1, 4:] == eos).any():  # the other sequence runs to the end
        assert out.shape[1] == 16 and torch.equal(out[1], free[1])


def test_length_errors_before_any_work():
    learned = Transformer(tiny_config("learned", max_len=16)).eval()
    with pytest.raises(LengthError, match="16 positions"):
        generate(learned, list(range(10)), 7)
    assert generate(learned, list(range(10)), 6, temperature=0).shape == (1, 16)
    model = Transformer(tiny_config()).eval()
    with pytest.raises(LengthError, match="exceeds max_len=12"):
        generate(model, list(range(10)), 3, max_len=12)
    with pytest.raises(LengthError, match="KV cache holds 8"):
        model.setup_cache(1, 8)
        try:
            model(torch.zeros(1, 9, dtype=torch.long), torch.arange(9))
        finally:
            model.clear_cache()
    with pytest.raises(ValueError, match="empty"):
        generate(model, [], 3)
    with pytest.raises(ValueError, match="top_p"):
        generate(model, [1], 3, top_p=1.5)


def test_decoding_reads_nothing_back_per_layer(monkeypatch):
    """The cache is written at positions the host chose (``start``): a decoded token's reads
    (the sampler's finiteness check) do not grow with the layers."""
    counts = {}
    for n_layers in (2, 6):
        model = Transformer(tiny_config(n_layers=n_layers)).eval()
        counter = {"n": 0}
        with monkeypatch.context() as m:
            for name in ("item", "tolist", "__float__", "__bool__", "__int__", "__index__"):
                original = getattr(torch.Tensor, name)

                def counted(self, *args, _original=original, **kwargs):
                    counter["n"] += 1
                    return _original(self, *args, **kwargs)
                m.setattr(torch.Tensor, name, counted)
            generate(model, [1, 2, 3], 10, temperature=0)
        counts[n_layers] = counter["n"]
    assert counts[2] == counts[6] and counts[2] <= 2 * 10
