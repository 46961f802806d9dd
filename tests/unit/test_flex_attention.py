"""The CUDA FlexAttention path for distance-only biases equals attention written out (run eagerly on CPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers.models import tiny_config
from helpers.reference import attention_written_out
from ropelab.model.flex_attention import (flex_causal_attention, kernel_options, torch_version, trains_tables,
                                  usable_for_flex)
from ropelab.model.transformer import Transformer


@pytest.mark.parametrize("kind", ["alibi", "t5", "kerple", "fire"])
@pytest.mark.parametrize("per_sequence", [False, True])
def test_flex_equals_attention_written_out(kind, per_sequence):
    model = Transformer(tiny_config(kind, n_kv_heads=2)).eval()
    attn, T = model.blocks[0].attn, 40
    if per_sequence:  # randomized training positions: ascending, one row per sequence
        positions = torch.stack([torch.randperm(200)[:T].sort().values for _ in range(2)])
    else:
        positions = torch.arange(T)
    x = torch.randn(2, T, 32)
    with torch.no_grad():  # as in evaluation: learned tables need no gradient there
        ctx = model.pos.context(positions, int(positions.max()) + 1)
        q, k, v = attn.wqkv(x)
        q, k = ctx.rotate(q, k)
        expected = attention_written_out(attn, q, k, v, ctx, positions)
        table = ctx.distance_table
        assert table is not None and not table.requires_grad
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # eager FlexAttention warns that it is a debug path
            got = flex_causal_attention(q, k, v, positions, table)
    assert torch.allclose(got, expected, atol=1e-5), (got - expected).abs().max()


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
    table = torch.zeros(1, 2)
    assert not usable_for_flex(q, table, 0.0)  # a CPU tensor: the SDPA path
    if torch.cuda.is_available():
        q, table = q.cuda(), table.cuda()
        assert usable_for_flex(q, table, 0.0)
        trained = table.clone().requires_grad_()  # a learned table in training
        assert usable_for_flex(q, trained, 0.0) == trains_tables()
        assert not usable_for_flex(q, table, 0.1)  # attention dropout
        assert not usable_for_flex(q[..., :8], table, 0.0)  # below the kernel's 16
