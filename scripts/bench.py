"""Speed and memory against the machine's own limit: ``python scripts/bench.py [--config C]``.

For the benchmark model (configs/bench.yaml: d_model 256, 4 layers, 4 heads, vocab 8192,
16 × 256 tokens per step) and every positional encoding, measures

- training: steady-state tokens/s of ``train.Trainer.train_step`` (the training loop's own
  step: sampler, forward, loss, backward, clipping, AdamW) and model FLOPs utilisation,
  where the peak is the matmul rate this script measures on this machine just before
  (float32 on CPU, the autocast dtype on GPU), so MFU is a ratio to the machine's own limit;
- the same step under ``torch.compile`` (``--compile``), and the speed-up;
- decoding: greedy generation of 64, 256 and 1024 tokens with and without the KV cache, and
  the per-token latency at the start (tokens 1–64) and end (the last 64) of the longest;
- evaluation: perplexity throughput (eval/perplexity.py, non-overlapping windows) at 1×, 4×
  and 16× the training length;
- peak resident memory of each measurement (Linux: the high-water mark is reset before each
  one through /proc/self/clear_refs; on CUDA also the allocator's peak).

Figures are medians over ``--repeats`` timed repeats after warm-up. Each (section, encoding)
runs in a fresh process so one measurement's memory or compiled graphs cannot leak into
the next. The table goes to stdout and everything, with the machine, torch version and
git commit, to ``--out`` (JSON). Timings on a shared machine are noisy: compare ratios
from one run, and see that nothing else is running.

Training steps run on random tokens, except for a synthetic-task config
(``data.source: synthetic``), whose step draws its task's instances as training does.

``learned`` needs a table as long as the longest sequence measured; the benchmark gives
it one (its speed, not its quality, is measured here) and says so in the JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import numpy as np
import torch

import configs
from configs import load_config
from data.tasks import TaskData, task_tokenizer
from eval.perplexity import perplexity
from model.config import POS_KINDS
from model.errors import ConfigError, UserError
from model.generate import generate
from model.transformer import Transformer
from train import Trainer
from training.cli import entry_point
from training.provenance import git_commit
from training.runtime import measure_matmul_peak, setup_runtime, synchronize, time_calls

SECTIONS = ["train", "compile", "decode", "eval"]
PROMPT = 16  # prompt tokens before decoding
LATENCY_WINDOW = 64  # decode steps averaged for the start/end latency


# --- measurement helpers ---------------------------------------------------------------
class PeakMemory:
    """Peak resident memory (MB) since the last ``reset``; plus the CUDA allocator's peak."""

    def __init__(self, device: torch.device):
        self.device = device
        self.resettable = Path("/proc/self/clear_refs").exists()

    def reset(self) -> None:
        if self.resettable:
            try:  # "5" resets the VmHWM high-water mark (Linux >= 4.0, proc(5))
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.resettable = False
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def read(self) -> dict:
        out = {"peak_rss_mb": None, "rss_scope": "since reset" if self.resettable else "process lifetime"}
        status = Path("/proc/self/status")
        if self.resettable and status.exists():
            for line in status.read_text().splitlines():
                if line.startswith("VmHWM:"):
                    out["peak_rss_mb"] = int(line.split()[1]) / 1024
        if out["peak_rss_mb"] is None:
            scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
            out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20
        if self.device.type == "cuda":
            out["cuda_peak_mb"] = torch.cuda.max_memory_allocated(self.device) / 2**20
        return out


def top_ops(step: Callable[[], object], n: int, steps: int = 2) -> list[dict]:
    """The ``n`` operators with the most self time over ``steps`` profiled steps (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0 or getattr(e, "self_device_time_total", 0)]
    total = sum(e.self_cpu_time_total for e in events) or 1.0
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return [{"op": e.key, "self_cpu_ms_per_step": e.self_cpu_time_total / 1e3 / steps,
             "share": e.self_cpu_time_total / total, "calls_per_step": e.count / steps} for e in events[:n]]


def machine() -> dict:
    cpu = platform.processor() or platform.machine()
    info = Path("/proc/cpuinfo")
    if info.exists():
        cpu = next((line.split(":", 1)[1].strip() for line in info.read_text().splitlines()
                    if line.startswith("model name")), cpu)
    mem = None
    if hasattr(os, "sysconf") and "SC_PHYS_PAGES" in os.sysconf_names:
        mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    return {"cpu": cpu, "logical_cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "ram_gb": mem, "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
            "git_commit": git_commit(),
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


# --- the model under test ----------------------------------------------------------------
def bench_config(args: argparse.Namespace, kind: str, compile_: bool = False):
    """The run config for one encoding; vocab from the tokenizer settings (no data needed)."""
    cfg = load_config(args.config, args.set)
    tok = cfg.data.tokenizer
    if cfg.data.source == "synthetic":  # the task alphabet, fixed
        vocab = task_tokenizer().vocab_size
    elif tok.kind == "char":
        raise ConfigError("the benchmark needs a known vocabulary size: use a bpe or byte tokenizer "
                          "in data.tokenizer (char vocabularies depend on the corpus)")
    else:
        vocab = tok.vocab_size if tok.kind == "bpe" else 257
    longest = max(cfg.train.seq_len * max(args.eval_multipliers), PROMPT + max(args.decode_lengths))
    pos = dataclasses.replace(cfg.model.pos, kind=kind, max_len=longest if kind == "learned" else None)
    train = dataclasses.replace(cfg.train, compile=compile_, max_steps=10**6, max_tokens=None,
                                warmup_steps=10)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pos=pos), train=train,
                              out_dir=tempfile.mkdtemp(prefix="ropelab-bench-"))
    return cfg.with_vocab_size(vocab)


def eval_model(cfg, device: torch.device) -> Transformer:
    torch.manual_seed(0)
    return Transformer(cfg.model).to(device).eval()


# --- sections (each runs in its own process) ---------------------------------------------
def section_train(args, kind: str, compile_: bool) -> dict:
    cfg = bench_config(args, kind, compile_)
    rt = setup_runtime(cfg.train)
    peak = measure_matmul_peak(rt.device, rt.dtype, sizes=(512, 1024, 2048), repeats=10)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, cfg.model.vocab_size, size=1_000_000, dtype=np.int64)
    data = SimpleNamespace(tokenizer=SimpleNamespace(vocab_size=cfg.model.vocab_size),
                           split=lambda name: tokens)
    if cfg.data.source == "synthetic":  # the real step: instances are made as training makes them
        data = TaskData(cfg.data.synthetic)
    trainer = Trainer(cfg, rt, data=data)
    memory = PeakMemory(rt.device)
    memory.reset()
    started = time.perf_counter()
    trainer.train_step()  # the first step pays for compilation, allocation and warm-up
    first = time.perf_counter() - started
    times = time_calls(trainer.train_step, args.repeats, args.warmup, rt.device)
    step = statistics.median(times)
    profile = top_ops(trainer.train_step, args.profile) if args.profile else None
    tokens_per_step = cfg.train.tokens_per_step()
    tok_s = tokens_per_step / step
    flops = trainer.model.flops_per_token(cfg.train.seq_len) * tok_s
    return {"tok_s": tok_s, "step_ms": step * 1e3, "step_ms_all": [t * 1e3 for t in times],
            "first_step_s": first, "achieved_flops": flops, "peak": peak, "mfu": flops / peak["flops"],
            "params": trainer.model.num_params(), "tokens_per_step": tokens_per_step,
            "device": str(rt.device), "dtype": str(rt.dtype).replace("torch.", ""), "profile": profile,
            **memory.read()}


def section_decode(args, kind: str) -> dict:
    cfg = bench_config(args, kind)
    device = setup_runtime(cfg.train).device
    model = eval_model(cfg, device)
    prompt = torch.randint(0, cfg.model.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    memory = PeakMemory(device)
    rows = []
    for n in args.decode_lengths:
        row = {"new_tokens": n}
        for use_cache in (True, False):
            memory.reset()
            times = time_calls(lambda: generate(model, prompt, n, temperature=0, use_cache=use_cache),
                          args.decode_repeats, 1 if n <= 256 else 0, device)
            label = "cached" if use_cache else "uncached"
            row[f"{label}_tok_s"] = n / statistics.median(times)
            row[f"{label}_peak_rss_mb"] = memory.read()["peak_rss_mb"]
        row["speedup"] = row["cached_tok_s"] / row["uncached_tok_s"]
        rows.append(row)
    # Per-token latency: the time between successive forward calls of one cached generation.
    n = max(args.decode_lengths)
    stamps: list[float] = []

    def stamp(*_) -> None:  # a forward hook must return None, or it replaces the output
        synchronize(device)
        stamps.append(time.perf_counter())

    hook = model.register_forward_hook(stamp)
    generate(model, prompt, n, temperature=0)
    hook.remove()
    gaps = np.diff(stamps) * 1e3  # gaps[i]: producing token i + 2 (token 1 comes from the prefill)
    window = min(LATENCY_WINDOW, max(1, len(gaps) // 2))
    start_ms, end_ms = float(np.median(gaps[:window])), float(np.median(gaps[-window:]))
    return {"rows": rows, "latency": {"new_tokens": n, "window": window, "start_ms": start_ms,
                                      "end_ms": end_ms, "end_over_start": end_ms / start_ms}}


def section_eval(args, kind: str) -> dict:
    cfg = bench_config(args, kind)
    device = setup_runtime(cfg.train).device
    model = eval_model(cfg, device)
    memory = PeakMemory(device)
    rows = []
    for mult in args.eval_multipliers:
        length = cfg.train.seq_len * mult
        n_tokens = max(args.eval_tokens, length)
        tokens = np.random.default_rng(mult).integers(0, cfg.model.vocab_size, size=n_tokens + 1)
        memory.reset()
        result = {}
        times = time_calls(lambda: result.update(ppl=perplexity(model, tokens, length)),
                      args.eval_repeats, 1, device)
        scored = result["ppl"].tokens
        rows.append({"multiplier": mult, "length": length, "tokens": scored,
                     "tok_s": scored / statistics.median(times), **memory.read()})
    return {"rows": rows}


def run_section(args, section: str, kind: str) -> dict:
    with torch.inference_mode(section in ("decode", "eval")):
        if section == "train":
            return section_train(args, kind, compile_=False)
        if section == "compile":
            return section_train(args, kind, compile_=True)
        if section == "decode":
            return section_decode(args, kind)
        return section_eval(args, kind)


def worker_result(args, section: str, kind: str) -> dict:
    """Run one section for one encoding, in a fresh process unless --in-process."""
    if args.in_process:
        try:
            return run_section(args, section, kind)
        except (UserError, RuntimeError) as e:
            return {"error": f"{type(e).__name__}: {e}"}
    cmd = [sys.executable, "-m", "scripts.bench", "--worker", section, kind, *args.argv]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    return json.loads(lines[-1])


# --- report --------------------------------------------------------------------------------
def fmt(value: Optional[float], spec: str = ",.0f") -> str:
    return "—" if value is None else format(value, spec)


def print_report(results: dict) -> None:
    m = results["machine"]
    print(f"\n{m['cpu']} · {m['torch_threads']} threads · torch {m['torch']} · commit {m['git_commit']}")
    kinds = results["kinds"]
    train, comp = results.get("train", {}), results.get("compile", {})
    if train or comp:
        any_ok = next((r for r in [*train.values(), *comp.values()] if "error" not in r), None)
        if any_ok:
            print(f"\ntraining, {any_ok['tokens_per_step']} tokens/step, {any_ok['dtype']}, "
                  f"{any_ok['params'] / 1e6:.2f}M params; MFU against the measured matmul peak")
        print(f"{'encoding':<11} {'tok/s':>8} {'peak GF/s':>9} {'MFU':>6} {'vs rope':>7} {'RSS MB':>7} │ "
              f"{'compiled':>8} {'MFU':>6} {'speed-up':>8} {'RSS MB':>7}")
        base = train.get("rope", {}).get("tok_s")
        for kind in kinds:
            r, c = train.get(kind, {}), comp.get(kind, {})
            if "error" in r:
                print(f"{kind:<11} error: {r['error']}")
                continue
            rel = r.get("tok_s") / base if base and r.get("tok_s") else None
            speed = c.get("tok_s") / r["tok_s"] if c.get("tok_s") and r.get("tok_s") else None
            c_err = f"  compile error: {c['error']}" if "error" in c else ""
            peak = r.get("peak", {}).get("flops")
            print(f"{kind:<11} {fmt(r.get('tok_s')):>8} {fmt(peak and peak / 1e9):>9} "
                  f"{fmt(r.get('mfu') and 100 * r['mfu'], '.1f'):>5}% {fmt(rel, '.2f'):>7} "
                  f"{fmt(r.get('peak_rss_mb')):>7} │ {fmt(c.get('tok_s')):>8} "
                  f"{fmt(c.get('mfu') and 100 * c['mfu'], '.1f'):>5}% {fmt(speed, '.2f'):>7}× "
                  f"{fmt(c.get('peak_rss_mb')):>7}{c_err}")
    for kind in kinds:
        for label, section in (("eager", train), ("compiled", comp)):
            ops = section.get(kind, {}).get("profile")
            if ops:
                print(f"\nwhere one {label} {kind} training step spends its time (self CPU, torch.profiler):")
                for op in ops:
                    print(f"  {op['share']:6.1%} {op['self_cpu_ms_per_step']:8.1f} ms "
                          f"{op['calls_per_step']:6.0f}×  {op['op'][:70]}")
    def decode_line(d: dict) -> str:
        cells = "  ".join(f"{r['new_tokens']:>5}: {r['cached_tok_s']:6.0f} vs {r['uncached_tok_s']:6.1f} "
                          f"({r['speedup']:5.1f}×)" for r in d["rows"])
        lat = d["latency"]
        return f"{cells}   latency {lat['start_ms']:.2f} → {lat['end_ms']:.2f} ms ({lat['end_over_start']:.2f}×)"

    per_kind("\ndecoding, greedy, batch 1, prompt 16 (tokens/s; cached vs a full forward per token)",
             results.get("decode"), kinds, decode_line)
    per_kind("\nevaluation (perplexity, non-overlapping windows): tokens/s and peak RSS",
             results.get("eval"), kinds,
             lambda e: "  ".join(f"{r['multiplier']:>2}× L={r['length']:<5} {r['tok_s']:7.0f} tok/s "
                                 f"{r['peak_rss_mb']:6.0f} MB" for r in e["rows"]))


def per_kind(title: str, section: Optional[dict], kinds: list[str], line: Callable[[dict], str]) -> None:
    """A titled block with one line per encoding (or its error)."""
    if not section:
        return
    print(title)
    for kind in kinds:
        r = section.get(kind, {})
        print(f"{kind:<11} " + (f"error: {r['error']}" if "error" in r else line(r)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ropelab speed and memory benchmark",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--config", type=Path, default=Path(configs.__file__).parent / "bench.yaml",
                   help="run config whose model/train settings are measured")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. --set model.n_kv_heads=2 train.batch_size=8")
    p.add_argument("--kinds", nargs="+", default=list(POS_KINDS), choices=POS_KINDS)
    p.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    p.add_argument("--repeats", type=int, default=10, help="timed training steps")
    p.add_argument("--warmup", type=int, default=3, help="untimed training steps after the first")
    p.add_argument("--decode-lengths", type=int, nargs="+", default=[64, 256, 1024])
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--eval-multipliers", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--eval-tokens", type=int, default=32768, help="tokens scored per length")
    p.add_argument("--eval-repeats", type=int, default=3)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also profile training steps and report the N operators with the most self time")
    p.add_argument("--out", type=Path, default=Path("reports") / "bench.json", help="JSON output")
    p.add_argument("--in-process", action="store_true", help="no worker processes (debugging, tests)")
    p.add_argument("--worker", nargs=2, metavar=("SECTION", "KIND"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("repeats", "decode_repeats", "eval_repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if min(args.decode_lengths) < 1 or min(args.eval_multipliers) < 1 or args.warmup < 0 or args.profile < 0:
        p.error("decode lengths and eval multipliers must be positive, --warmup and --profile >= 0")
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--worker" in raw:  # the worker re-parses the parent's arguments
        i = raw.index("--worker")
        raw = raw[:i] + raw[i + 3:]
    args.argv = raw
    return args


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.worker:
        print(json.dumps(run_section(args, *args.worker)))
        return 0
    bench_config(args, args.kinds[0])  # a bad config fails here, before any measurement
    results = {"machine": machine(), "config": str(args.config), "overrides": args.set,
               "kinds": args.kinds, "learned_table": "sized to the longest sequence measured"}
    for section in args.sections:
        results[section] = {}
        for kind in args.kinds:
            print(f"{section:<8} {kind} …", file=sys.stderr, flush=True)
            results[section][kind] = worker_result(args, section, kind)
    print_report(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
