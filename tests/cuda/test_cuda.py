"""The CUDA paths, where a GPU is present: every encoding's forward, FlexAttention, the KV
cache, bf16 autocast, torch.compile and the training command line on the device.

Skipped without a GPU (the default suite runs on CPU); run with ``pytest tests/cuda/test_cuda.py``
on a machine that has one. The CPU model in fp32 is the reference throughout.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch

import ropelab.model.attention as attention_module
from helpers.models import ALL_KINDS, PLANS, plan_config, tiny_config
from helpers.reference import attention_written_out

from helpers.reference import cached_logits
from helpers.runs import write_run_config
from ropelab.model.config import POS_KINDS
from ropelab.model.encodings import kinds_where
from ropelab.model.flex_attention import flex_attention_layer, trains_tables
from ropelab.model.generate import generate
from ropelab.model.transformer import Transformer
from helpers import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

FLEX_KINDS = list(kinds_where("score_bias"))  # distance-only biases: FlexAttention adds them in place
LINEAR_KINDS = [k for k in POS_KINDS if k not in kinds_where("forms_scores")]


@pytest.fixture(autouse=True)
def _exact_float32():
    """fp32 comparisons against the CPU need full-precision matmuls (no TF32)."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def pair(kind: str, **overrides) -> tuple[Transformer, Transformer]:
    """The same weights on the CPU and on the GPU, in eval mode."""
    cpu = Transformer(tiny_config(kind, max_len=256, **overrides)).eval()
    return cpu, copy.deepcopy(cpu).cuda()


def tokens(B: int = 2, T: int = 48) -> torch.Tensor:
    return torch.randint(0, 97, (B, T))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_forward_on_cuda_equals_cpu(kind):
    cpu, gpu = pair(kind)
    idx = tokens()
    with torch.no_grad():
        want, got = cpu(idx), gpu(idx.cuda()).cpu()
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("kind", LINEAR_KINDS)
def test_linear_attention_on_cuda_equals_cpu(kind):
    cpu, gpu = pair(kind, attention="linear")
    idx = tokens()
    with torch.no_grad():
        want, got = cpu(idx), gpu(idx.cuda()).cpu()
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


def count_flex_calls(monkeypatch) -> list:
    calls = []

    def counted(*args):
        calls.append(1)
        return flex_attention_layer(*args)

    monkeypatch.setattr(attention_module, "flex_attention_layer", counted)
    return calls


@pytest.mark.parametrize("kind", FLEX_KINDS)
@pytest.mark.parametrize("head_dim", [16, 24, 64])
def test_evaluation_forward_takes_the_flex_path(kind, head_dim, monkeypatch):
    """Without gradients, a distance-only bias on CUDA goes through FlexAttention, and the
    model's output equals the CPU's (which takes the SDPA path)."""
    calls = count_flex_calls(monkeypatch)
    cpu, gpu = pair(kind, d_model=4 * head_dim)
    idx = tokens(T=200)
    with torch.no_grad():
        want, got = cpu(idx), gpu(idx.cuda()).cpu()
    assert len(calls) == cpu.cfg.n_layers
    assert torch.allclose(got, want, atol=5e-5, rtol=1e-4), (got - want).abs().max()


def test_heads_below_flex_minimum_take_the_sdpa_path(monkeypatch):
    calls = count_flex_calls(monkeypatch)
    cpu, gpu = pair("alibi")  # head_dim 8
    idx = tokens()
    with torch.no_grad():
        want, got = cpu(idx), gpu(idx.cuda()).cpu()
    assert not calls
    assert torch.allclose(got, want, atol=2e-5, rtol=1e-4), (got - want).abs().max()


@pytest.mark.parametrize("kind", ["t5", "kerple", "fire"])
def test_training_learned_tables_through_flex_equals_the_sdpa_path(kind, monkeypatch):
    """From torch FLEX_TABLE_GRAD_TORCH on, training a learned table goes through FlexAttention,
    with the gradient into the captured table; every gradient equals the SDPA path's."""
    if not trains_tables():
        pytest.skip(f"torch {torch.__version__} trains tables on the SDPA path")
    model = Transformer(tiny_config(kind, d_model=64, max_len=256)).cuda().train()
    idx, targets = tokens(T=128).cuda(), tokens(T=128).cuda()
    calls = count_flex_calls(monkeypatch)
    loss, grads = loss_and_grads(model, idx, targets)
    assert len(calls) == model.cfg.n_layers
    monkeypatch.setattr(attention_module, "usable_for_flex", lambda *args: False)
    want_loss, want = loss_and_grads(model, idx, targets)
    assert len(calls) == model.cfg.n_layers
    assert torch.allclose(loss, want_loss, atol=1e-5)
    assert grads.keys() == want.keys() and any(name.startswith("pos.") for name in grads)
    scale = torch.cat([g.flatten() for g in want.values()]).norm()
    for name, g in grads.items():
        # FIRE's output bias shifts all of a head's scores alike: its true gradient is 0, and
        # both paths give rounding noise there.
        if name != "pos.mlp.2.bias" and want[name].norm() > 1e-6 * scale:
            assert relative(g, want[name]) < 1e-4, (name, relative(g, want[name]))


@pytest.mark.parametrize("kind", FLEX_KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_flex_kernel_equals_attention_written_out(kind, dtype):
    """The compiled kernel itself, with per-sequence (randomized) positions, in fp32 and bf16."""
    model = Transformer(tiny_config(kind, d_model=64, n_kv_heads=2, max_len=1024)).eval().cuda()
    attn, T = model.blocks[0].attn, 300
    # Below 512, FIRE's threshold L, its bias is distance-only (a table) too.
    positions = torch.stack([torch.randperm(500)[:T].sort().values for _ in range(2)]).cuda()
    x = torch.randn(2, T, 64, device="cuda")
    with torch.no_grad():
        ctx = model.pos.context(positions, int(positions.max()) + 1)
        assert ctx.distance_table is not None
        q, k, v = attn.wqkv(x)
        q, k = ctx.rotate(q, k)
        q, k, v = (t.to(dtype) for t in (q, k, v))
        want = attention_written_out(attn, q.float(), k.float(), v.float(), ctx, positions)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = flex_attention_layer(q, k, v, ctx, None, None).float()
    atol = 1e-5 if dtype == torch.float32 else 3e-2
    assert torch.allclose(got, want, atol=atol), (got - want).abs().max()


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_cached_decoding_on_cuda_equals_full_forward(kind):
    _, gpu = pair(kind)
    idx = tokens(B=2, T=40).cuda()
    with torch.no_grad():
        full = gpu(idx)
        gpu.setup_cache(2, 40)
        steps = [gpu(idx[:, :16], torch.arange(16, device="cuda"))]
        for t in range(16, 40):
            steps.append(gpu(idx[:, t:t + 1], torch.tensor([t], device="cuda")))
        gpu.clear_cache()
    got = torch.cat(steps, dim=1)
    assert torch.allclose(got, full, atol=5e-5, rtol=1e-4), (got - full).abs().max()


@pytest.mark.parametrize("kind", ["rope", "alibi", "cope"])
def test_greedy_generation_on_cuda_with_and_without_cache(kind):
    _, gpu = pair(kind)
    prompt = tokens(B=1, T=8)[0].tolist()
    a = generate(gpu, prompt, 24, temperature=0.0, use_cache=True)
    b = generate(gpu, prompt, 24, temperature=0.0, use_cache=False)
    assert torch.equal(a, b)


def loss_and_grads(model: Transformer, idx: torch.Tensor, targets: torch.Tensor, dtype=None, call=None):
    """The loss and every parameter's gradient; ``call``: what runs the forward (e.g. the
    compiled wrapper of ``model``), the model itself by default."""
    model.zero_grad(set_to_none=True)
    if dtype is None:
        loss = (call or model)(idx, targets=targets)
    else:
        with torch.autocast("cuda", dtype=dtype):
            loss = (call or model)(idx, targets=targets)
    loss.backward()
    return loss.detach().float(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
                                   if p.grad is not None}


def flat(grads: dict) -> torch.Tensor:
    """Every gradient in one vector, in name order."""
    return torch.cat([g.flatten() for _, g in sorted(grads.items())])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_bf16_autocast_training_step_tracks_float32(kind):
    """Training (gradients on: learned tables take the SDPA path) under bf16 autocast gives
    the fp32 loss to bf16 precision and every gradient in its direction."""
    _, gpu = pair(kind)
    gpu.train()
    idx, targets = tokens(T=64).cuda(), tokens(T=64).cuda()
    ref_loss, ref_grads = loss_and_grads(gpu, idx, targets)
    loss, grads = loss_and_grads(gpu, idx, targets, torch.bfloat16)
    assert math.isfinite(loss.item()) and abs(loss.item() - ref_loss.item()) < 0.02 * ref_loss.item()
    assert grads.keys() == ref_grads.keys()
    assert relative(flat(grads), flat(ref_grads)) < 0.05
    scale = flat(ref_grads).norm()
    for name, g in grads.items():  # gradients too small to matter at bf16's precision are skipped
        if ref_grads[name].norm() > 1e-4 * scale:
            assert relative(g, ref_grads[name]) < 0.1, (name, relative(g, ref_grads[name]))


@pytest.mark.parametrize("kind", ["rope", "alibi", "t5", "xpos", "cope"])
def test_compiled_training_step_equals_eager(kind):
    _, eager = pair(kind)
    eager.train()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model)
    idx, targets = tokens(T=64).cuda(), tokens(T=64).cuda()
    want_loss, want = loss_and_grads(eager, idx, targets)
    compiled_model.zero_grad(set_to_none=True)
    loss = compiled(idx, targets=targets)
    loss.backward()
    assert torch.allclose(loss.detach(), want_loss, atol=1e-5), (loss.item(), want_loss.item())
    for name, p in compiled_model.named_parameters():
        if name in want and want[name].norm() > 1e-8:
            assert relative(p.grad, want[name]) < 1e-4, (name, relative(p.grad, want[name]))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("kind", FLEX_KINDS)
def test_compiled_bf16_training_step_at_study_head_sizes(kind, head_dim):
    """Whole-model torch.compile under bf16 autocast with the GPU studies' head sizes (64:
    configs/gpu/core-25m.yaml; 128: the ALiBi-paper config) at T 512. With inductor's default
    FlexAttention tiles, 64-dim heads needed more shared memory than an H100/H200 has and
    every ALiBi run of the GPU core grid stopped at its first step."""
    eager = Transformer(tiny_config(kind, max_len=1024, d_model=4 * head_dim, n_heads=4, n_kv_heads=4)).cuda().train()
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model)
    idx, targets = tokens(B=2, T=512).cuda(), tokens(B=2, T=512).cuda()
    want_loss, want = loss_and_grads(eager, idx, targets, torch.bfloat16)
    loss, grads = loss_and_grads(compiled_model, idx, targets, torch.bfloat16, call=compiled)
    assert math.isfinite(loss.item()) and abs(loss.item() - want_loss.item()) < 0.01 * want_loss.item()
    assert grads.keys() == want.keys()
    assert relative(flat(grads), flat(want)) < 0.05


def run_cli(script: str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("kind", ["rope", "alibi"])
def test_train_command_on_cuda_with_bf16_and_compile(tmp_path, corpus, kind):
    """The command line on the GPU: bf16 autocast and torch.compile; the loss falls, every
    logged value is finite, and the saved run samples on the GPU."""
    cfg = write_run_config(tmp_path, corpus)
    res = run_cli("train.py", str(cfg), f"model.pos.kind={kind}", "train.device=cuda", "train.dtype=bfloat16",
                  "train.compile=true", "train.max_steps=60")
    assert res.returncode == 0, res.stderr[-3000:]
    run_dir = tmp_path / "runs" / "tiny"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = {r["step"]: r["loss"] for r in rows if "loss" in r}
    assert sorted(losses) == list(range(1, 61))
    assert all(math.isfinite(v) for v in losses.values())
    assert all(r["peak_mem_gib"] > 0 for r in rows if "loss" in r)  # the allocator's peak, per log line
    assert sum(losses[s] for s in (58, 59, 60)) < sum(losses[s] for s in (1, 2, 3)) - 3.0
    sample = run_cli("scripts/sample.py", str(run_dir), "--device", "cuda", "--temperature", "0",
                     "--max-new-tokens", "20", "--prompt", "the cat")
    assert sample.returncode == 0, sample.stderr[-3000:]
    assert sample.stdout.strip()


@pytest.mark.parametrize("plan", list(PLANS))
def test_layer_plans_on_cuda_equal_cpu_and_their_cache(plan, monkeypatch):
    """Windows, sinks, temperatures and FoX's decay on CUDA (FlexAttention where it serves:
    block masks that skip what a window excludes) equal the CPU's paths, and cached decoding
    equals the full forward with prompts longer than a window."""
    calls = count_flex_calls(monkeypatch)
    cfg = plan_config(plan, d_model=64)
    cpu = Transformer(cfg).eval()
    with torch.no_grad():
        for block in cpu.blocks:
            if block.attn.sinks is not None:
                block.attn.sinks.normal_(0.0, 1.0)
    gpu = Transformer(cfg).cuda().eval()
    gpu.load_state_dict(cpu.state_dict())
    idx = tokens(T=200)
    with torch.no_grad():
        want, got = cpu(idx), gpu(idx.cuda()).cpu()
        cached = cached_logits(gpu, idx[:, :40].cuda(), 7).cpu()
        full = gpu(idx[:, :40].cuda()).cpu()
    special = [b for b in cpu.blocks if b.layer.window or b.attn.sinks is not None or b.attn.temperature is not None]
    assert calls or not special  # a plan with windows or sinks takes FlexAttention on CUDA
    assert torch.allclose(got, want, atol=5e-5, rtol=1e-4), (got - want).abs().max()
    assert torch.allclose(cached, full, atol=1e-5, rtol=1e-4), (cached - full).abs().max()


@pytest.mark.parametrize("plan", ["gpt-oss", "alibi-window-sinks", "fox-window"])
def test_training_windows_sinks_and_decays_through_flex_equals_the_explicit_path(plan, monkeypatch):
    """The gradients of a training step through FlexAttention (the sinks through σ(lse − sink),
    FoX's decay through a captured tensor) equal those of the explicit path."""
    if not trains_tables():
        pytest.skip(f"torch {torch.__version__} trains captured tensors on the SDPA path")
    model = Transformer(plan_config(plan, d_model=64, max_len=256)).cuda().train()
    idx, targets = tokens(T=128).cuda(), tokens(T=128).cuda()
    calls = count_flex_calls(monkeypatch)
    loss, grads = loss_and_grads(model, idx, targets)
    assert calls
    monkeypatch.setattr(attention_module, "usable_for_flex", lambda *args: False)
    want_loss, want = loss_and_grads(model, idx, targets)
    assert torch.allclose(loss, want_loss, atol=1e-5)
    scale = torch.cat([g.flatten() for g in want.values()]).norm()
    for name, g in grads.items():
        if want[name].norm() > 1e-6 * scale:
            assert relative(g, want[name]) < 1e-4, (name, relative(g, want[name]))
