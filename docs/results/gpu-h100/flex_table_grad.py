"""Can FlexAttention train learned bias tables (the gradient into the table score_mod captures)?

Run on a CUDA machine from the repository root: ``PYTHONPATH=. python docs/results/gpu-h100/flex_table_grad.py``.
For T5, KERPLE, FIRE and ALiBi (2 layers, d 512, 8 heads, B 4, T 512) it prints the loss and
every gradient's relative difference between the SDPA path and the FlexAttention path, in
fp32 and under bf16 autocast, and the bf16 forward + backward time of each. Its output on
one H100 is flex_table_grad.txt.
"""
import time
import torch
import ropelab.model.attention as A
from ropelab.model.config import ModelConfig, PosConfig
from ropelab.model.transformer import Transformer

torch.set_float32_matmul_precision("highest")
orig = A.usable_for_flex
def run(model, idx, tgt, flex, dtype):
    A.usable_for_flex = (lambda q, t, d: q.is_cuda and q.shape[-1] >= 16 and d == 0.0) if flex else (lambda q, t, d: False)
    model.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        loss = model(idx, targets=tgt)
    loss.backward()
    return loss.item(), {n: p.grad.float().clone() for n, p in model.named_parameters() if p.grad is not None}
def timed(model, idx, tgt, flex, dtype, n=8):
    for _ in range(2): run(model, idx, tgt, flex, dtype)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): run(model, idx, tgt, flex, dtype)
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n
for kind in ["t5", "kerple", "fire", "alibi"]:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=2000, d_model=512, n_layers=2, n_heads=8, n_kv_heads=8, pos=PosConfig(kind=kind, max_len=1024))
    m = Transformer(cfg).cuda().train()
    idx = torch.randint(0, 2000, (4, 512), device="cuda"); tgt = torch.randint(0, 2000, (4, 512), device="cuda")
    try:
        for dtype in (torch.float32, torch.bfloat16):
            l0, g0 = run(m, idx, tgt, False, dtype)
            l1, g1 = run(m, idx, tgt, True, dtype)
            pos = {n: float((g1[n] - g0[n]).norm() / g0[n].norm().clamp_min(1e-12)) for n in g0 if n.startswith("pos.")}
            worst = max(float((g1[n] - g0[n]).norm() / g0[n].norm().clamp_min(1e-12)) for n in g0)
            print(kind, str(dtype), "loss", l0, l1, "pos grads rel err", pos, "worst any", worst, "same keys", g0.keys() == g1.keys(), flush=True)
        t0 = timed(m, idx, tgt, False, torch.bfloat16); t1 = timed(m, idx, tgt, True, torch.bfloat16)
        print(kind, "bf16 fwd+bwd ms sdpa", round(t0 * 1e3, 2), "flex", round(t1 * 1e3, 2), "speedup", round(t0 / t1, 2), flush=True)
    except Exception as e:
        print(kind, "FAILED", type(e).__name__, str(e)[:400], flush=True)
