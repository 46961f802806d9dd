"""Speed and memory measurements, as ratios taken in one run: ``python scripts/bench.py``.

Absolute timings on shared machines are noisy; each section compares two ways of doing
the same work back to back, on the same process and model, and reports the ratio.

1. attention: the fused SDPA causal path vs the explicit-softmax reference (forward).
2. generation: decoding with the KV cache vs a full forward per new token.
3. eval memory: peak resident memory of one forward at long lengths for every encoding,
   each in a fresh process, including ALiBi with and without query chunking.
Model shape: the CPU WikiText-2 preset (d_model 256, 4 layers, 4 heads, vocab 8192).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from model.config import ModelConfig, PosConfig  # noqa: E402
from model.generate import generate  # noqa: E402
from model.transformer import Transformer  # noqa: E402

KINDS = ["rope", "sinusoidal", "learned", "alibi", "none"]


def build(kind: str = "rope", max_len: int = 128) -> Transformer:
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=8192, d_model=256, n_layers=4, n_heads=4,
                      pos=PosConfig(kind=kind, max_len=max_len if kind == "learned" else None))
    return Transformer(cfg).eval()


def best_of(fn, repeats: int) -> float:
    """Fastest of ``repeats`` timed calls (after one warm-up), seconds."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def bench_attention(length: int, repeats: int) -> dict:
    model = build()
    x = torch.randint(0, 8192, (4, length))
    fused = best_of(lambda: model(x), repeats)
    model.set_attention_impl("reference")
    reference = best_of(lambda: model(x), repeats)
    return {"length": length, "fused_tok_s": 4 * length / fused, "reference_tok_s": 4 * length / reference,
            "speedup": reference / fused}


def bench_generation(prompt: int, new: int, repeats: int) -> dict:
    model = build()
    ids = torch.randint(0, 8192, (1, prompt))
    cached = best_of(lambda: generate(model, ids, new, temperature=0), repeats)
    uncached = best_of(lambda: generate(model, ids, new, temperature=0, use_cache=False), repeats)
    return {"prompt": prompt, "new_tokens": new, "cached_tok_s": new / cached,
            "uncached_tok_s": new / uncached, "speedup": uncached / cached}


@torch.inference_mode()
def memory_worker(kind: str, length: int, chunk: int) -> None:
    """Run in a subprocess: print peak RSS growth (MB) of one forward at ``length``."""
    model = build(kind, max_len=length)
    for block in model.blocks:
        block.attn.query_chunk = chunk
    x = torch.randint(0, 8192, (1, length))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    logits = model(x)
    assert torch.isfinite(logits).all()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"peak_mb": after / 1024, "growth_mb": (after - before) / 1024}))


def bench_memory(lengths: list[int]) -> list[dict]:
    rows = []
    for length in lengths:
        for kind, chunk in [(k, 1024) for k in KINDS] + [("alibi", length)]:
            out = subprocess.run([sys.executable, __file__, "--memory-worker", kind, str(length), str(chunk)],
                                 capture_output=True, text=True, timeout=1200)
            if out.returncode != 0:
                rows.append({"kind": kind, "length": length, "chunk": chunk, "error": out.stderr.strip()[-200:]})
                continue
            rows.append({"kind": kind, "length": length, "chunk": chunk, **json.loads(out.stdout)})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="ropelab speed/memory ratios")
    p.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    p.add_argument("--memory-worker", nargs=3, metavar=("KIND", "LENGTH", "CHUNK"), help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = p.parse_args(argv)
    if args.memory_worker:
        kind, length, chunk = args.memory_worker
        memory_worker(kind, int(length), int(chunk))
        return 0
    repeats = 2 if args.quick else 5
    results = {"threads": torch.get_num_threads(), "torch": torch.__version__}
    results["attention"] = bench_attention(256 if args.quick else 512, repeats)
    a = results["attention"]
    print(f"attention (T={a['length']}): fused {a['fused_tok_s']:.0f} tok/s, reference "
          f"{a['reference_tok_s']:.0f} tok/s → fused is {a['speedup']:.2f}× faster")
    results["generation"] = bench_generation(32, 64 if args.quick else 256, max(1, repeats // 2))
    g = results["generation"]
    print(f"generation ({g['new_tokens']} new tokens): cached {g['cached_tok_s']:.1f} tok/s, uncached "
          f"{g['uncached_tok_s']:.1f} tok/s → cache is {g['speedup']:.2f}× faster")
    results["memory"] = bench_memory([2048] if args.quick else [2048, 8192])
    print("eval memory, one sequence, one forward (peak RSS, growth over the loaded model):")
    for r in results["memory"]:
        label = f"{r['kind']}{' (no query chunking)' if r['chunk'] == r['length'] else ''}"
        if "error" in r:
            print(f"  {label:<28} L={r['length']:<6} error: {r['error']}")
        else:
            print(f"  {label:<28} L={r['length']:<6} peak {r['peak_mb']:7.0f} MB, growth {r['growth_mb']:7.0f} MB")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
