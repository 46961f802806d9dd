"""One benchmark measurement in a fresh process: ``python bench/worker.py SPEC SECTION ROW``.

The measurement code of scripts/bench.py (see its docstring for what is measured). This
file imports nothing from ``scripts``, only the project's own packages, so
``ropelab bench --compare REV`` can run this very file, by its path, against another commit's
code (bench/trees.py puts that commit's tree first on the import path): both sides then
share the timing code exactly. Names that moved since are found where an older commit had them.
SPEC is JSON: the config file, overrides, vocabulary size and the repeat counts.
"""

from __future__ import annotations

import importlib
import dataclasses
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import numpy as np
import torch

from ropelab.configs import load_config
from ropelab.common.errors import ConfigError, UserError
from ropelab.model.generate import generate
from ropelab.model.transformer import Transformer
from ropelab.common.cli import entry_point
from ropelab.training.runtime import measure_matmul_peak, setup_runtime, synchronize, time_calls

try:
    from ropelab.common.logs import setup_logging
except ImportError:  # --compare against a commit whose messages were prints
    setup_logging = None
try:
    from ropelab.eval.lm.perplexity import perplexity
except ImportError:  # --compare against a commit before eval/ had sub-packages (fb1bb84)
    from ropelab.eval.perplexity import perplexity
try:  # synthetic tasks; --compare against a commit without them measures text configs only
    from ropelab.data.tasks import TaskData, task_tokenizer
except ImportError:
    TaskData = task_tokenizer = None
try:
    from ropelab.training.data import TaskTraining, TextData
    from ropelab.training.trainer import Trainer
except ImportError:  # --compare against a commit whose trainer was train.py's and read data.split(name):
    # that tree's train.py, by name (this tree's train.py sits above the benchmark's layer)
    Trainer = importlib.import_module("ropelab.train").Trainer
    TaskTraining = TextData = None

PROMPT = 16  # prompt tokens before decoding
LATENCY_WINDOW = 64  # decode steps averaged for the start/end latency
# A char vocabulary depends on its corpus; the benchmark takes Tiny Shakespeare's 65
# characters, the vocabulary of nanoGPT's CPU recipe (configs/bench-small.yaml).
CHAR_VOCAB = 65
# Windows per forward: eval/lm/perplexity.py's default batch_size (bench/run.py sizes its memory check by it).
EVAL_WINDOWS = 8
MAX_BATCH_TOKENS = 16384  # and its max_batch_tokens


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



# --- the model under test ----------------------------------------------------------------
def variant_name(attention: str, kind: str) -> str:
    """The row of one (attention kind, encoding) pair: ``rope`` (softmax), ``linear+rope``."""
    return kind if attention == "softmax" else f"{attention}+{kind}"


PLAN_PREFIX = "plan:"  # a row ``plan:NAME`` measures the layer plan of configs/pe/NAME.yaml


def plan_preset(name: str) -> Path:
    """configs/pe/NAME.yaml, the preset of a ``plan:NAME`` row."""
    return Path(importlib.import_module("ropelab.configs").__file__).parent / "pe" / f"{name}.yaml"


def bench_config(spec, variant: str, compile_: bool = False):
    """The run config for one row (``variant_name``); vocab from the tokenizer settings (no data
    needed). Without an attention prefix the config's own ``model.attention`` is kept. A row
    ``plan:NAME`` is the config with the preset configs/pe/NAME.yaml merged over it (its layer
    plan and encoding, as a run given both files would have them)."""
    attention, _, kind = variant.rpartition("+")
    plan = kind[len(PLAN_PREFIX):] if kind.startswith(PLAN_PREFIX) else None
    paths = [spec.config, plan_preset(plan)] if plan else spec.config
    cfg = load_config(paths, spec.set + ([f"model.attention={attention}"] if attention else []))
    tok = cfg.data.tokenizer
    if tok.kind == "file":
        raise ConfigError("the benchmark needs a vocabulary size without data: use a bpe, byte or "
                          "char tokenizer in data.tokenizer")
    if cfg.data.source == "synthetic":  # the task alphabet, fixed
        vocab = task_tokenizer().vocab_size
    else:
        vocab = {"bpe": tok.vocab_size, "byte": 257, "char": CHAR_VOCAB}[tok.kind]
    longest = max(cfg.train.seq_len * max(spec.eval_multipliers), PROMPT + max(spec.decode_lengths))
    # pos.max_len sizes a learned table and is ignored by every other encoding, so it is set
    # whatever the kind: no kind is named here, and this file still runs against older trees.
    pos = dataclasses.replace(cfg.model.pos, kind=cfg.model.pos.kind if plan else kind, max_len=longest)
    train = dataclasses.replace(cfg.train, compile=compile_, max_steps=10**6, max_tokens=None,
                                warmup_steps=10)
    cfg = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, pos=pos), train=train,
                              out_dir=tempfile.mkdtemp(prefix="ropelab-bench-"))
    return cfg.with_vocab_size(vocab)


def step_data(cfg):
    """What the training step draws from: random tokens of the config's vocabulary, or for a
    synthetic config the real instances, made as training makes them."""
    if cfg.data.source == "synthetic":
        return TaskTraining(cfg.data.synthetic) if TaskTraining else TaskData(cfg.data.synthetic)
    tokens = np.random.default_rng(0).integers(0, cfg.model.vocab_size, size=1_000_000, dtype=np.int64)
    # A stand-in with what the trainer asks of a tokenizer: its size, and its file's text
    # (fingerprinted in every checkpoint).
    tokenizer = SimpleNamespace(vocab_size=cfg.model.vocab_size,
                                to_json=lambda: json.dumps({"random_tokens": cfg.model.vocab_size}))
    if TextData is None:  # an older tree's trainer read the splits itself
        return SimpleNamespace(tokenizer=tokenizer, split=lambda name: tokens)
    return TextData(tokenizer, train=tokens, valid=tokens)


def eval_model(cfg, device: torch.device) -> Transformer:
    torch.manual_seed(0)
    return Transformer(cfg.model).to(device).eval()


# --- sections (each runs in its own process) ---------------------------------------------
def section_train(spec, kind: str, compile_: bool) -> dict:
    cfg = bench_config(spec, kind, compile_)
    rt = setup_runtime(cfg.train)
    # The run's peak, measured once at its start (bench/run.py: run_peak), so every row's MFU is
    # against the same number; measured here only when the worker runs on its own.
    peak = getattr(spec, "peak", None)
    if not peak:
        # training/runtime.py's GPU_PEAK_SIZES, restated: with --compare this file runs against
        # older trees, which lack it. A GPU reaches its limit only on large matmuls.
        sizes = (2048, 4096, 8192) if rt.device.type == "cuda" else (512, 1024, 2048)
        peak = measure_matmul_peak(rt.device, rt.dtype, sizes=sizes, repeats=10)
    data = step_data(cfg)
    trainer = Trainer(cfg, rt, data=data)
    memory = PeakMemory(rt.device)
    memory.reset()
    started = time.perf_counter()
    trainer.train_step()  # the first step pays for compilation, allocation and warm-up
    first = time.perf_counter() - started
    times = time_calls(trainer.train_step, spec.repeats, spec.warmup, rt.device)
    step = statistics.median(times)
    profile = top_ops(trainer.train_step, spec.profile) if spec.profile else None
    tokens_per_step = cfg.train.tokens_per_step()
    tok_s = tokens_per_step / step
    flops = trainer.model.flops_per_token(cfg.train.seq_len) * tok_s
    result = {"tok_s": tok_s, "step_ms": step * 1e3, "step_ms_all": [t * 1e3 for t in times],
              "first_step_s": first, "achieved_flops": flops, "peak": peak, "mfu": flops / peak["flops"],
              "params": trainer.model.num_params(), "tokens_per_step": tokens_per_step,
              "device": str(rt.device), "dtype": str(rt.dtype).replace("torch.", ""), "profile": profile,
              **memory.read()}
    if compile_:
        result.update(paired_speedup(spec, kind, trainer, data, rt))
    return result


def paired_speedup(spec, kind: str, compiled: Trainer, data, rt) -> dict:
    """The compiled step against the eager one in this same process, steps alternating.

    Two processes running the same code differ by up to 1.5× on a shared machine (README,
    Benchmarks), which swamps a speed-up measured across them. Here an eager trainer of the
    same config takes turns with the compiled one, one step each, ``spec.repeats`` times;
    the speed-up is the ratio of their median steps. (Built after the compiled run's memory
    was read, so its peak RSS is the compiled run's alone.)
    """
    eager = Trainer(bench_config(spec, kind, compile_=False), rt, data=data)
    time_calls(eager.train_step, 0, spec.warmup + 1, rt.device)
    eager_times, compiled_times = [], []
    for _ in range(spec.repeats):
        eager_times += time_calls(eager.train_step, 1, 0, rt.device)
        compiled_times += time_calls(compiled.train_step, 1, 0, rt.device)
    eager_ms, compiled_ms = statistics.median(eager_times) * 1e3, statistics.median(compiled_times) * 1e3
    return {"paired": {"eager_step_ms": eager_ms, "compiled_step_ms": compiled_ms,
                       "speedup": eager_ms / compiled_ms, "steps": spec.repeats}}


def section_decode(spec, kind: str) -> dict:
    cfg = bench_config(spec, kind)
    device = setup_runtime(cfg.train).device
    model = eval_model(cfg, device)
    prompt = torch.randint(0, cfg.model.vocab_size, (1, PROMPT), generator=torch.Generator().manual_seed(0))
    memory = PeakMemory(device)
    rows = []
    for n in spec.decode_lengths:
        row = {"new_tokens": n}
        for use_cache in (True, False):
            memory.reset()
            times = time_calls(lambda: generate(model, prompt, n, temperature=0, use_cache=use_cache),
                          spec.decode_repeats, 1 if n <= 256 else 0, device)
            label = "cached" if use_cache else "uncached"
            row[f"{label}_tok_s"] = n / statistics.median(times)
            row[f"{label}_peak_rss_mb"] = memory.read()["peak_rss_mb"]
        row["speedup"] = row["cached_tok_s"] / row["uncached_tok_s"]
        rows.append(row)
    # Per-token latency: the time between successive forward calls of one cached generation.
    n = max(spec.decode_lengths)
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


def section_eval(spec, kind: str) -> dict:
    """Perplexity throughput at each multiple of L, and its FLOP/s as a ratio of the bare
    forward's at the same shape.

    ``flops_ratio`` divides the evaluation's matmul FLOP/s (scored tokens × the forward's
    FLOPs per token at that length, Transformer.flops_per_token) by those of the forward a
    training step takes (``model(x, targets=y)``, no backward) on random tokens at the same
    length and windows per forward, over as many tokens. The two are timed in turn, one of
    each per repeat, and the ratio is the median of the repeats' ratios: drift in the
    machine's speed falls on both alike, so the figure says what the evaluation's driver
    (window layout, scoring, sums, the LM head only where a target is scored) costs or
    saves, independent of how fast the machine is.
    """
    cfg = bench_config(spec, kind)
    device = setup_runtime(cfg.train).device
    model = eval_model(cfg, device)
    memory = PeakMemory(device)
    rows = []
    for mult in spec.eval_multipliers:
        length = cfg.train.seq_len * mult
        n_tokens = max(spec.eval_tokens, length)
        tokens = np.random.default_rng(mult).integers(0, cfg.model.vocab_size, size=n_tokens + 1)
        memory.reset()
        result = {}
        evaluate = lambda: result.update(ppl=perplexity(model, tokens, length))  # noqa: E731
        times = time_calls(evaluate, spec.eval_repeats, 1, device)
        peak = memory.read()
        scored = result["ppl"].tokens
        forward, batch, calls = bare_forward(model, cfg, length, scored, device)
        forward()  # warm-up
        ratios = []
        for _ in range(max(spec.eval_repeats, 3)):
            eval_s, forward_s = time_calls(evaluate, 1, 0, device)[0], time_calls(forward, 1, 0, device)[0]
            ratios.append(forward_s * scored / (eval_s * batch * length * calls))
            times.append(eval_s)
        rows.append({"multiplier": mult, "length": length, "tokens": scored,
                     "tok_s": scored / statistics.median(times), **peak,
                     "flops_ratio": statistics.median(ratios), "flops_ratios": ratios,
                     "eval_flops": model.flops_per_token(length, training=False) * scored / statistics.median(times),
                     "forward_batch": batch})
    return {"rows": rows}


def bare_forward(model: Transformer, cfg, length: int, tokens: int, device: torch.device):
    """A callable running the training step's forward over about ``tokens`` tokens in batches of
    the evaluation's windows per forward (section_eval), with the batch size and call count."""
    batch = max(1, min(EVAL_WINDOWS, MAX_BATCH_TOKENS // length))  # training/validation.py: windows_per_batch
    calls = max(1, round(tokens / (batch * length)))
    xy = torch.randint(0, cfg.model.vocab_size, (batch, length + 1), generator=torch.Generator().manual_seed(length))
    x, y = xy[:, :-1].to(device), xy[:, 1:].to(device)

    def forward() -> None:
        for _ in range(calls):
            model(x, targets=y)
    return forward, batch, calls


def run_section(spec, section: str, row: str) -> dict:
    with torch.inference_mode(section in ("decode", "eval")):
        if section == "train":
            return section_train(spec, row, compile_=False)
        if section == "compile":
            return section_train(spec, row, compile_=True)
        if section == "decode":
            return section_decode(spec, row)
        return section_eval(spec, row)


@entry_point
def main(argv: list[str]) -> int:
    if setup_logging is not None:
        setup_logging(info_to="stderr")  # stdout is the result, for the parent
    spec, section, row = SimpleNamespace(**json.loads(argv[0])), argv[1], argv[2]
    try:
        result = run_section(spec, section, row)
    except (UserError, RuntimeError) as e:
        result = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
