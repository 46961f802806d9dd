"""Timed steps of a run's shape: what ``train.compile: auto`` decides from, and what a grid's
time estimate adds up (``ropelab ablate --dry-run``).

A *shape* is what sets the cost of a step: the architecture (with its vocabulary), the
training length, batch and accumulation, the device, dtype, thread count and torch
version. For a shape, a probe times on random tokens, on a fresh model, without touching
any run's state or random numbers:

- a few eager training steps (forward, backward, clipping, AdamW) — the step's wall time;
- optionally the same steps compiled: the first compiled step of a fresh compile (cold:
  torch's inductor and FX graph caches as they were) and of a second model compiled the
  same way (warm: what a run pays once the caches hold this shape), and a compiled step;
- the forward throughput (tokens/s, inference mode) at each evaluation length asked for;
- for a grid that runs several jobs at once on the CPU, the eager step of as many copies
  timed together, each in its own process with its share of the threads: jobs share the
  cores' caches and memory bandwidth (and, on a virtual machine, maybe the cores
  themselves), so a job among others may run slower than alone (on a quiet 2-vCPU machine,
  single-threaded: 1.00-1.12× of the step alone for the task grid's shapes, 1.00-1.27× for
  the retrieval grid's).

Records are JSON files under ``$ROPELAB_PROBE_CACHE`` (default ``~/.cache/ropelab/probes``),
one per shape; torch's inductor cache goes to ``$TORCHINDUCTOR_CACHE_DIR``, set by default
to ``~/.cache/ropelab/inductor`` so compiled kernels outlive a reboot and are shared by every
run of a shape. Timings on a shared machine are noisy: the figures are for planning, and
``compile: auto`` leaves a margin. A record timed while other work shared the CPUs says so
(``busy``); read again on a quiet machine it counts as no record, so the shape is timed again
there rather than planned, or compiled, on slowed steps (a grid's ``--dry-run`` beside a
training job once recorded the retrieval grid's multivalue shapes running 1.5-1.7x slower as
two jobs than alone, where a quiet machine had measured 1.00-1.27x).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import multiprocessing
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ropelab.common.atomic import write_text_atomic
from ropelab.common.devices import machine_busy
from ropelab.common.errors import StorageError
from ropelab.common.storage import describe, is_storage_error
from ropelab.configs.loader import config_to_dict
from ropelab.configs.schema import RunConfig
from ropelab.model.transformer import Transformer
from ropelab.training.optim import build_optimizer
from ropelab.training.runtime import Runtime, cache_dir
from ropelab.training.validation import windows_per_batch

PROBE_STEPS = 3  # timed steps of each kind (after one untimed warm-up step)
COMPILE_MARGIN = 1.25  # compile only when the steps saved exceed the compile time by this factor
FIRST_COMPILE_GUESS_S = 60.0  # before any probe: what a cold compile may cost at these sizes
BEST_SPEEDUP_GUESS = 1.3  # before any probe: the most a compiled step has been seen to gain here
PROBE_ROWS = 8  # windows per timed forward at most (fewer as the length grows), as evaluation batches them
SHARED_WINDOW_S = 3.0  # each job's timed steps last about this long when jobs are timed together
SHARED_TIMEOUT_S = 600.0  # a shared probe that has not finished by then is given up (and not recorded)


def use_compile_cache() -> None:
    """Keep torch's inductor cache where runs share it (unless the user chose a place)."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(Path.home() / ".cache" / "ropelab" / "inductor"))


@dataclass
class ShapeTimes:
    key: str
    eager_step_s: Optional[float] = None
    compiled_step_s: Optional[float] = None
    compile_cold_s: Optional[float] = None  # first compiled step minus a compiled step, caches as they were
    compile_warm_s: Optional[float] = None  # the same for a second model: what a run pays once caches hold it
    eval_tok_s: dict[str, float] = field(default_factory=dict)  # evaluation length -> forward tokens/s
    shared_step_s: dict[str, float] = field(default_factory=dict)  # jobs at once -> one job's eager step
    measured: str = ""
    busy: str = ""  # set when other work shared the CPUs while these were timed (machine_busy)

    def save(self) -> None:
        path = cache_dir() / f"{self.key}.json"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(path, json.dumps(dataclasses.asdict(self), indent=1))
        except OSError as e:
            if not is_storage_error(e):
                raise
            raise StorageError(f"cannot keep the shape's timing in the probe cache ({describe(e, path.parent)}); it "
                               "is $ROPELAB_PROBE_CACHE (default ~/.cache/ropelab/probes): point ROPELAB_PROBE_CACHE "
                               "at a writable directory, or skip the time estimate with --no-estimate") from None


def shape_key(cfg: RunConfig, rt: Runtime) -> str:
    """A hash of what sets a step's cost (see the module docstring)."""
    t = cfg.train
    shape = {"model": config_to_dict(cfg)["model"], "seq_len": t.seq_len, "batch_size": t.batch_size,
             "grad_accum": t.grad_accum, "random_positions": t.random_positions is not None,
             "device": rt.device.type, "dtype": str(rt.dtype), "world_size": rt.world_size,
             "threads": torch.get_num_threads(), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]


def load(key: str) -> ShapeTimes:
    """The shape's record, or an empty one: also where the record was timed while the machine
    was busy and it is quiet now (only CPU timings are ever marked busy), so that it is timed
    again; while the machine stays busy the busy record is as good as a new one would be."""
    path = cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
        times = ShapeTimes(**{k: v for k, v in data.items() if k in {f.name for f in dataclasses.fields(ShapeTimes)}})
    except (OSError, ValueError, TypeError):
        return ShapeTimes(key)
    return ShapeTimes(key) if times.busy and not machine_busy() else times


def _step_fn(model: torch.nn.Module, forward: torch.nn.Module, cfg: RunConfig, rt: Runtime):
    """One training step of ``model`` (called through ``forward``, maybe compiled) on random tokens."""
    t = cfg.train
    optimizer = build_optimizer(model, t.lr, t.weight_decay, (t.beta1, t.beta2), rt.device.type, t.pos_lr_multiplier)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.model.vocab_size, (t.batch_size, t.seq_len), generator=gen).to(rt.device)

    def step() -> None:
        for _ in range(t.grad_accum):
            with rt.autocast():
                loss = forward(x, targets=x) / t.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip if t.grad_clip > 0 else float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        rt.synchronize()
    return step


def _timed(step, n: int) -> float:
    """Median seconds of ``n`` calls of ``step``."""
    times = []
    for _ in range(n):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def _first_compiled(base: torch.nn.Module, cfg: RunConfig, rt: Runtime) -> tuple[float, float]:
    """(seconds of the first compiled step, of a later one) of a fresh copy of ``base``.

    Dynamo is reset first, as a run's own process starts: every compile here traces the same
    ``forward``, and a grid's estimate times many shapes in one process, so without the reset
    the ninth compile would pass dynamo's recompile limit, run eager, and record eager times
    as compiled ones (which ``compile: auto`` then reads). The caches on disk are kept.
    Dynamo is imported here rather than at the top: it costs about a second of every
    ``train.py`` start, and most runs never compile."""
    import torch._dynamo

    torch._dynamo.reset()
    model = copy.deepcopy(base)
    step = _step_fn(model, torch.compile(model), cfg, rt)
    first = _timed(step, 1)
    return first, _timed(step, PROBE_STEPS)


def measure_training(cfg: RunConfig, rt: Runtime, compiled: bool) -> ShapeTimes:
    """Time the shape's eager steps (and compiled ones, with both compile costs) and record them."""
    times = load(shape_key(cfg, rt))
    times.busy = machine_busy(rt.device.type)
    rng = torch.get_rng_state()
    try:
        torch.manual_seed(0)
        base = Transformer(cfg.model).to(rt.device)
        step = _step_fn(base, base, cfg, rt)
        step()  # warm-up: allocations, first-call dispatch
        times.eager_step_s = _timed(step, PROBE_STEPS)
        if compiled:
            use_compile_cache()
            cold, times.compiled_step_s = _first_compiled(base, cfg, rt)
            warm, _ = _first_compiled(base, cfg, rt)
            times.compile_cold_s = max(0.0, cold - times.compiled_step_s)
            times.compile_warm_s = max(0.0, warm - times.compiled_step_s)
    finally:
        torch.set_rng_state(rng)
    times.measured = time.strftime("%Y-%m-%d %H:%M:%S")
    times.save()
    return times


def _shared_job(cfg: RunConfig, rt: Runtime, threads: Optional[int], steps: int, start, timed, results) -> None:
    """One of the jobs timed together (a spawned process): warm up, wait for the others, time
    ``steps`` eager steps, then keep stepping until every job has timed its own, so that no
    job's timed steps run on an emptier machine than a grid's would."""
    try:
        if threads:
            torch.set_num_threads(threads)
        torch.manual_seed(0)
        model = Transformer(cfg.model).to(rt.device)
        step = _step_fn(model, model, cfg, rt)
        step()
        start.wait(timeout=SHARED_TIMEOUT_S)
        results.put(_timed(step, steps))
        with timed.get_lock():
            timed.value += 1
        while timed.value < start.parties:
            step()
    except Exception as e:  # noqa: BLE001 — reported to the parent, which gives the probe up
        results.put(f"{type(e).__name__}: {e}")


def measure_shared(cfg: RunConfig, rt: Runtime, jobs: int, threads: Optional[int]) -> ShapeTimes:
    """Time the shape's eager step in ``jobs`` processes at once, each with ``threads`` threads,
    as a grid with ``--jobs`` runs them on the CPU, and record one job's step time then (the
    mean of the jobs' medians) under ``shared_step_s[jobs]``. Nothing is recorded when a job
    fails or the probe runs past SHARED_TIMEOUT_S; the record is returned as it was."""
    times = load(shape_key(cfg, rt))
    if times.eager_step_s is None:
        times = measure_training(cfg, rt, compiled=False)
    steps = max(PROBE_STEPS, min(500, math.ceil(SHARED_WINDOW_S / max(times.eager_step_s, 1e-6))))
    ctx = multiprocessing.get_context("spawn")  # a fresh interpreter each, as a grid's jobs are
    start, timed, results = ctx.Barrier(jobs), ctx.Value("i", 0), ctx.Queue()
    procs = [ctx.Process(target=_shared_job, args=(cfg, rt, threads, steps, start, timed, results), daemon=True)
             for _ in range(jobs)]
    busy = machine_busy(rt.device.type)
    for proc in procs:
        proc.start()
    got, deadline = [], time.monotonic() + SHARED_TIMEOUT_S
    try:
        while len(got) < jobs and all(isinstance(g, float) for g in got):
            try:
                got.append(results.get(timeout=1.0))
            except queue.Empty:
                if time.monotonic() > deadline or any(p.exitcode not in (None, 0) for p in procs):
                    got.append("a job died or hung")  # killed (e.g. out of memory) before it could say why
    finally:
        for proc in procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.terminate()
    if all(isinstance(g, float) for g in got):
        times.shared_step_s[str(jobs)] = sum(got) / len(got)
        times.busy = times.busy or busy
        times.measured = time.strftime("%Y-%m-%d %H:%M:%S")
        times.save()
    return times


def shared_slowdown(times: ShapeTimes, jobs: int) -> float:
    """How many times longer one job's step takes with ``jobs`` jobs at once than alone
    (1 for one job, or when that was not measured; never below 1: a job cannot gain from
    company, so a faster shared timing is noise)."""
    shared = times.shared_step_s.get(str(jobs)) if jobs > 1 else None
    if shared is None or not times.eager_step_s:
        return 1.0
    return max(1.0, shared / times.eager_step_s)


def _spread(lengths: list[int]) -> list[int]:
    """The lengths worth timing: the shortest, the longest, and every ~4× between (rate_at
    interpolates the rest)."""
    picked = [lengths[0]]
    for n in lengths[1:]:
        if n >= 4 * picked[-1] or n == lengths[-1]:
            picked.append(n)
    return picked


def rate_at(times: ShapeTimes, n: int) -> Optional[float]:
    """Forward tokens/s at length ``n``: measured, or interpolated log-log between the measured
    lengths around it (the nearest one's beyond them); None when none was measured."""
    measured = sorted((int(k), v) for k, v in times.eval_tok_s.items())
    if not measured:
        return None
    below = [m for m in measured if m[0] <= n] or measured[:1]
    above = [m for m in measured if m[0] >= n] or measured[-1:]
    (n0, r0), (n1, r1) = below[-1], above[0]
    if n0 == n1:
        return r0
    w = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
    return math.exp((1 - w) * math.log(r0) + w * math.log(r1))


@torch.inference_mode()
def measure_evaluation(cfg: RunConfig, rt: Runtime, lengths: list[int], batch_tokens: int = 16384) -> ShapeTimes:
    """Forward tokens/s at the evaluation lengths (random tokens, a batch of up to
    ``batch_tokens`` tokens, as eval/lm/perplexity.py batches windows): timed at a spread of them
    (``_spread``), recorded with the shape."""
    times = load(shape_key(cfg, rt))
    times.busy = times.busy or machine_busy(rt.device.type)
    rng = torch.get_rng_state()
    try:
        torch.manual_seed(0)
        model = Transformer(cfg.model).to(rt.device).eval()
        served = [n for n in sorted(set(lengths)) if model.pos.max_len is None or n <= model.pos.max_len]
        for n in _spread(served) if served else []:
            if str(n) in times.eval_tok_s:
                continue
            rows = windows_per_batch(n, PROBE_ROWS, batch_tokens)
            x = torch.randint(0, cfg.model.vocab_size, (rows, n), device=rt.device)

            def forward() -> None:
                with rt.autocast():
                    model(x, targets=x, reduction="none")
                rt.synchronize()
            forward()
            times.eval_tok_s[str(n)] = rows * n / _timed(forward, 1)
    finally:
        torch.set_rng_state(rng)
    times.measured = time.strftime("%Y-%m-%d %H:%M:%S")
    times.save()
    return times


def compile_decision(cfg: RunConfig, rt: Runtime, remaining_steps: int) -> tuple[bool, str]:
    """Whether ``train.compile: auto`` compiles a run with ``remaining_steps`` left, and why.

    With a record of the shape's compiled and eager steps: compile when the time saved over
    the remaining steps exceeds the warm compile time by COMPILE_MARGIN. Without one: time
    the eager step (a few seconds); if even the best speed-up seen here could not pay a cold
    compile, stay eager; otherwise probe the compiled steps (which also warms the caches)
    and decide from what was measured.
    """
    times = load(shape_key(cfg, rt))
    if times.compiled_step_s is None:
        if times.eager_step_s is None:
            times = measure_training(cfg, rt, compiled=False)
        best = remaining_steps * times.eager_step_s * (1 - 1 / BEST_SPEEDUP_GUESS)
        if best < COMPILE_MARGIN * FIRST_COMPILE_GUESS_S:
            return False, (f"eager: {remaining_steps} steps of {times.eager_step_s * 1e3:.0f} ms could save at most "
                           f"{best:.0f} s, less than a first compile costs (~{FIRST_COMPILE_GUESS_S:.0f} s)")
        times = measure_training(cfg, rt, compiled=True)
    saved = remaining_steps * (times.eager_step_s - times.compiled_step_s)
    cost = times.compile_warm_s or 0.0
    numbers = (f"{remaining_steps} steps × ({times.eager_step_s * 1e3:.0f} → {times.compiled_step_s * 1e3:.0f} ms) "
               f"save {saved:.0f} s against {cost:.0f} s to compile")
    if saved > COMPILE_MARGIN * cost:
        return True, f"compiled: {numbers}"
    return False, f"eager: {numbers}"
