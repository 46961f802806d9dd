"""The CUDA FlexAttention path equals the chunked SDPA path (run eagerly on CPU): distance
biases, sliding windows, attention sinks and FoX's decay, alone and together."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers.models import plan_config, tiny_config
from ropelab.model.flex_attention import (COMPILE_OPTIONS, block_mask, cached_block_mask, flex_attention_layer,
                                          kernel_options, torch_version, trains_tables, usable_for_flex)
from torch.nn.attention.flex_attention import flex_attention
from ropelab.model.positional import PositionContext
from ropelab.model.positional.base import DistanceBias
from ropelab.model.transformer import Transformer

CASES = {  # name -> (model config, window)
    **{kind: (tiny_config(kind, n_kv_heads=2), None) for kind in ("alibi", "t5", "kerple", "fire")},
    "alibi-window-sinks": (plan_config("alibi-window-sinks"), 8),
    "rope-window-sinks": (plan_config("gpt-oss"), 8),
    "fox": (tiny_config("fox", n_kv_heads=2), None),
    "fox-window": (plan_config("fox-window"), 8),
}


def _layer(model: Transformer, window):
    """The first layer whose span is ``window``."""
    return next(i for i, block in enumerate(model.blocks) if block.layer.window == window)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("per_sequence", [False, True])
def test_flex_equals_the_chunked_sdpa_path(name, per_sequence):
    cfg, window = CASES[name]
    model = Transformer(cfg).eval()
    layer = _layer(model, window)
    attn, T = model.blocks[layer].attn, 40
    if attn.sinks is not None:
        with torch.no_grad():
            attn.sinks.normal_(0.0, 1.0)
    if per_sequence:  # randomized training positions: ascending, one row per sequence
        positions = torch.stack([torch.randperm(200)[:T].sort().values for _ in range(2)])
    else:
        positions = torch.arange(T)
    x = torch.randn(2, T, cfg.d_model)
    with torch.no_grad():  # as in evaluation: learned tables need no gradient there
        ctx = model.encoding(layer).context(positions, int(positions.max()) + 1).for_layer(layer, window)
        q, k, v = attn.wqkv(x)
        q, k = ctx.rotate(q, k)
        decay = ctx.log_forget(x).cumsum(-1) if ctx.decays else None
        expected = attn._chunked(q, k, v, ctx, positions, decay, decay, same_tokens=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention warns that it is a debug path
            got = flex_attention_layer(q, k, v, ctx, decay, attn.sinks)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


def test_block_masks_of_sequences_from_zero_are_built_once():
    """A length and window from position 0 (training, evaluation) reuse one block mask; a
    window over per-sequence positions needs its own."""
    cached_block_mask.cache_clear()
    ctx = PositionContext(torch.arange(64), window=8)
    first = block_mask(ctx, 64, torch.device("cpu"))
    assert block_mask(PositionContext(torch.arange(64), window=8), 64, torch.device("cpu")) is first
    assert block_mask(PositionContext(torch.arange(64)), 64, torch.device("cpu")) is not first
    per_sequence = PositionContext(torch.arange(64).expand(2, 64), window=8)
    assert block_mask(per_sequence, 64, torch.device("cpu")) is not first
    assert cached_block_mask.cache_info().misses == 2


def _compilations(options: dict, lengths, batch_sizes) -> int:
    """How many graphs Dynamo compiles for FlexAttention (compiled as the CUDA path compiles it,
    with a backend that only counts) over an evaluation's lengths and batch sizes."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    compiled = torch.compile(flex_attention, backend=counting, **options)
    table = torch.randn(2, 4 * max(lengths))
    for B in batch_sizes:
        for T in lengths:
            q, k, v = torch.randn(B, 2, T, 16), torch.randn(B, 1, T, 16), torch.randn(B, 1, T, 16)
            positions = torch.arange(T)

            def score_mod(score, b, h, qi, ki):
                return score + table[h, torch.clamp(positions[qi] - positions[ki], min=0)]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled(q, k, v, score_mod=score_mod, block_mask=cached_block_mask(T, None, "cpu"), enable_gqa=True)
    return len(graphs)


def test_an_evaluations_lengths_and_batch_sizes_stay_within_the_recompile_limit():
    """The core study's seven lengths (1, 1.25, 1.5, 2, 4, 8, 16 × L, L = 128) at two batch
    sizes: a handful of compilations, below Dynamo's limit; compiled for static shapes, each
    (length, batch size) would be one more, past the limit."""
    import torch._dynamo
    lengths, batch_sizes = [128, 160, 192, 256, 512, 1024, 2048], [2, 1]
    limit = torch._dynamo.config.recompile_limit
    compiled = _compilations(COMPILE_OPTIONS, lengths, batch_sizes)
    assert compiled <= limit - 2, f"{compiled} compilations against a limit of {limit}"
    assert _compilations({"dynamic": False}, lengths[:5], [3, 2]) >= limit  # the test can fail


def test_small_heads_ask_for_tiles_that_fit_in_shared_memory():
    """64-dim heads in bf16 overflowed an H100/H200's shared memory with inductor's default
    128 x 128 forward tiles (tests/cuda/test_cuda.py checks the compiled step on a GPU); they ask
    for 64 x 64, which divide the 128-token blocks of the causal block mask."""
    for head_dim in (16, 32, 64):
        options = kernel_options(head_dim)
        assert options == {"BLOCK_M": 64, "BLOCK_N": 64}
        assert 128 % options["BLOCK_M"] == 0 and 128 % options["BLOCK_N"] == 0
    options["BLOCK_M"] = 32
    assert kernel_options(64)["BLOCK_M"] == 64  # each call gets its own copy
    assert kernel_options(128) is None and kernel_options(256) is None


def test_trained_tables_use_flex_from_the_checked_torch_version_on():
    assert torch_version("2.11.0+cu130") == (2, 11) and torch_version("2.5.1") == (2, 5)
    assert torch_version("2.13.0.dev20261101") == (2, 13)
    assert trains_tables((2, 11)) and trains_tables((3, 0)) and not trains_tables((2, 10))


def test_flex_serves_cuda_calls_it_can_serve():

    q = torch.zeros(1, 1, 2, 16)
    ctx = PositionContext(torch.arange(2), bias_fn=DistanceBias(torch.zeros(1, 2)))
    assert not usable_for_flex(q, ctx, 0.0)  # a CPU tensor: the SDPA path
    if torch.cuda.is_available():
        q = q.cuda()
        ctx = PositionContext(torch.arange(2).cuda(), bias_fn=DistanceBias(torch.zeros(1, 2).cuda()))
        assert usable_for_flex(q, ctx, 0.0)
        trained = PositionContext(ctx.positions, bias_fn=DistanceBias(torch.zeros(1, 2).cuda().requires_grad_()))
        assert usable_for_flex(q, trained, 0.0) == trains_tables()
        assert not usable_for_flex(q, ctx, 0.1)  # attention dropout
        assert not usable_for_flex(q[..., :8], ctx, 0.0)  # below the kernel's 16
        assert usable_for_flex(q, PositionContext(ctx.positions, window=8), 0.0)  # a window alone
