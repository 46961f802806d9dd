"""How long a grid will take on this machine, before it starts, and how that compared after.

For each distinct shape of the grid's pending runs (training/step_timing.py: architecture with
its vocabulary, length, batch, thread count, …) a few training steps are timed and the
forward throughput at every evaluation length measured, once: the records are cached, so
a second ``--dry-run`` (and the runs' own ``train.compile: auto``) reuse them. The data of
each distinct corpus is prepared first (cached for training anyway), which gives the exact
vocabulary and the size of the evaluation split.

A run's estimate:
- training: its remaining steps × the step time (compiled or eager, as ``train.compile``
  would choose, plus the warm compile), plus the validations (``eval_batches`` windows
  every ``eval_interval`` steps, at the forward rate at L, and with ``train.stop_at_accuracy``
  as many instances at L per task for the competence check). A run trained to competence
  may stop early: its estimate is the whole budget, an upper bound, and says so;
- evaluation: for every checkpoint scored (``eval.steps``, else the latest), corpus,
  scaling, length and protocol, the tokens its windows feed through the model (the scored
  tokens; × length / stride for sliding windows, × length / target span for the same-token
  protocol) at the forward rate at that length; task scoring as its instances' tokens, for
  every task, scaling and length (and depth, for the tasks that place a needle).

The grid's wall time divides the sum by the number of parallel jobs. Jobs on the CPU share
its caches, memory bandwidth and maybe its cores, so a job among others may run slower
than alone: with ``--jobs`` N > 1 on the CPU each shape's eager step is also timed in N
processes at once (training/step_timing.py ``measure_shared``), and the run's training and
evaluation times are stretched by that slowdown (the task grid's copy runs then trained at
69-78 ms a step, two at once; their shape's probe said 73). An estimate is for the machine
it was made on and the load it had then: virtual machines of one kind differ (the task
grid's runs went at 22,700 tokens/s per job on one and 10,500-14,800 on others, two jobs at
once each time). It is a plan; the grid's summary prints it beside what each run took.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import torch

from ropelab.common.errors import UserError
from ropelab.common.logs import get_logger
from ropelab.configs.grid import Grid, PlannedRun, fold_seeds, row_of
from ropelab.configs.schema import EvalConfig, RunConfig
from ropelab.data.tasks import TASKS
from ropelab.eval.tasks.exact_match import planned_parent, resolved_tasks, wants_tasks
from ropelab.model.encodings import accepts_rope_scaling
from ropelab.data.prepare import cached_data
from ropelab.data.sources import open_corpus, resolve_files
from ropelab.data.tokenizers import train_tokenizer
from ropelab.model.transformer import Transformer
from ropelab.training.data import TextData, prepare
from ropelab.model.encodings import served_length
from ropelab.grid.archive import record_of
from ropelab.grid.deadline import steps_past
from ropelab.training.memory import MemoryLimitError, check_fits, check_training, forward_estimate, largest
from ropelab.training.step_timing import (COMPILE_MARGIN, PROBE_ROWS, ShapeTimes, cache_dir, load, measure_evaluation,
                            measure_shared, measure_training, rate_at, shape_key, shared_slowdown)
from ropelab.training.run_dir import RunDir
from ropelab.training.runtime import setup_runtime
from ropelab.training.validation import windows_per_batch

logger = get_logger(__name__)


@dataclass
class Estimate:
    train_s: float
    eval_s: float
    note: str = ""
    expected_train_s: Optional[float] = None  # where the row's ended seeds say when a competence stop comes
    failed: bool = False  # no estimate could be made (the note says why): its seconds mean nothing
    reason: str = ""  # a failed estimate's cause, the error its run will fail with
    # A run that stops at competence: its row, the steps it has trained and those its budget has left
    # (train_s trains them all), from which a deadline expects its stop anew as its row's runs end.
    competence_row: Optional[str] = None
    done: int = 0
    steps: int = 0


def _eval_lengths(cfg: RunConfig) -> list[int]:
    ev = cfg.eval
    lengths = set(ev.resolved_lengths(cfg.train.seq_len)) | {cfg.train.seq_len}
    for corpus in ev.corpora:
        lengths |= set(corpus.lengths)
    return sorted(lengths)


def _rate(times: ShapeTimes, n: int, limit: Optional[int] = None) -> Optional[float]:
    """Forward tokens/s at ``n``, or None past the encoding's served length ``limit``."""
    return None if limit is not None and n > limit else rate_at(times, n)


def train_seconds(cfg: RunConfig, times: ShapeTimes, steps: int) -> tuple[float, str]:
    """(seconds, how they were counted) to train ``steps`` steps of ``cfg`` at the shape's
    ``times``: eager or compiled steps, and the validations (and competence checks) among them."""
    t = cfg.train
    step, note = times.eager_step_s, "eager"
    compiled = times.compiled_step_s is not None
    if t.compile is True and compiled:
        step, note = times.compiled_step_s + (times.compile_warm_s or 0) / max(steps, 1), "compiled"
    elif t.compile == "auto" and compiled:
        saved = steps * (times.eager_step_s - times.compiled_step_s)
        if saved > COMPILE_MARGIN * (times.compile_warm_s or 0):
            step, note = times.compiled_step_s + (times.compile_warm_s or 0) / max(steps, 1), "compiled (auto)"
    validations = steps // t.eval_interval + 1
    rate = _rate(times, t.seq_len) or t.seq_len / times.eager_step_s
    # A competence check scores as many instances at L per task as a validation reads.
    passes = 1 + (len(cfg.data.mix.tasks or cfg.data.synthetic.tasks) if t.stop_at_accuracy is not None else 0)
    validation_s = passes * validations * t.eval_batches * t.batch_size * t.seq_len / rate
    if t.stop_at_accuracy is not None:
        note += f"; at most: stops once accuracy at L reaches {t.stop_at_accuracy:g}"
    return steps * step + validation_s, note


def eval_seconds(cfg: RunConfig, times: ShapeTimes, split_tokens: int) -> float:
    """Seconds to evaluate a run of ``cfg`` at the shape's forward rates: the tokens each length,
    protocol and scaling feeds, and the task scoring, for every checkpoint scored."""
    ev: EvalConfig = cfg.eval
    train_len, limit = cfg.train.seq_len, served_length(cfg.model.pos)
    total = 0.0
    for corpus in ev.corpora:
        lengths = sorted(set(corpus.lengths)) or ev.resolved_lengths(train_len)
        protocols = corpus.protocols or ev.protocols
        scored = min(ev.max_tokens or split_tokens, split_tokens)
        n_scalings = len(ev.resolved_scalings(cfg.model.pos.kind)) if accepts_rope_scaling(cfg.model.pos.kind) else 1
        for n in lengths:
            rate = _rate(times, n, limit)
            if rate is None:  # a length the encoding cannot serve
                continue
            models = n_scalings if n > train_len else 1
            for protocol in protocols:
                fed = scored * (n / min(ev.sliding_stride(n), n) if protocol == "sliding" else
                                n / ev.target_span(lengths)[0] if protocol == "same-tokens" else 1)
                total += models * fed / rate
    if wants_tasks(cfg, ev):
        cells = sum(len(ev.tasks.resolved_depths()) if TASKS[name].has_depth else 1
                    for name in resolved_tasks(cfg, ev, planned_parent(cfg))) * len(ev.resolved_scalings(cfg.model.pos.kind))
        for n in ev.resolved_lengths(train_len):
            rate = _rate(times, n, limit)
            if rate is not None:
                total += cells * ev.tasks.samples * n / rate
    return total * len(ev.steps or [None])  # every checkpoint scored


DRY_RUN_TIMING_S = 30.0  # a dry run times shapes for about this long; the rest are scaled by FLOPs
DRY_RUN_BATCH_TOKENS = 4096  # a dry run's timed forwards: a quarter of evaluation's batch


@dataclass
class Probing:
    """How much a run's shape is timed. A grid about to train (``budget_s`` None) times every
    shape fully: a few eager steps, compiled ones where the run may compile, the forward at its
    evaluation lengths, and ``sharing`` jobs at once. A dry run answers within about a minute:
    it times only eager steps and forwards, while ``budget_s`` lasts, and scales every later
    shape from the nearest timed one by its FLOPs per token; what it did not time, its notes say."""

    budget_s: Optional[float] = None
    spent: float = 0.0
    timed: list = field(default_factory=list)  # [(cfg, ShapeTimes)] measured or read from the cache

    @property
    def dry(self) -> bool:
        return self.budget_s is not None


def _shape_times(name: str, cfg: RunConfig, rt, sharing: int, threads: Optional[int],
                 probing: Probing) -> tuple[ShapeTimes, str]:
    """The timings of the run's shape (cached, else measured now, or in a dry run past its
    budget scaled from a timed shape), and what the estimate's note says of them."""
    times = load(shape_key(cfg, rt))
    wants_compile = cfg.train.compile is not False
    note = ""
    if not probing.dry:
        if times.eager_step_s is None or (wants_compile and times.compiled_step_s is None):
            logger.info(f"  timing the shape of {name} (a few steps{', compiled too' if cfg.train.compile else ''})")
            times = measure_training(cfg, rt, compiled=wants_compile)
        if not times.eval_tok_s:
            times = measure_evaluation(cfg, rt, _eval_lengths(cfg))
        if sharing > 1 and str(sharing) not in times.shared_step_s:
            logger.info(f"  timing the shape of {name} as {sharing} jobs at once")
            times = measure_shared(cfg, rt, sharing, threads)
        probing.timed.append((cfg, times))
        return times, note
    if times.eager_step_s is None or not times.eval_tok_s:
        if probing.timed and probing.spent >= probing.budget_s:
            return _scaled(cfg, probing.timed), "not timed (the dry run's timing budget was spent): scaled by FLOPs"
        started = time.perf_counter()
        logger.info(f"  timing the shape of {name} (a few eager steps and forwards)")
        if times.eager_step_s is None:
            times = measure_training(cfg, rt, compiled=False)
        if not times.eval_tok_s:  # at L and the longest length only, a small batch: rate_at interpolates
            lengths = _eval_lengths(cfg)
            times = measure_evaluation(cfg, rt, sorted({cfg.train.seq_len, lengths[-1]}), DRY_RUN_BATCH_TOKENS)
        probing.spent += time.perf_counter() - started
    probing.timed.append((cfg, times))
    if wants_compile and times.compiled_step_s is None:
        note = "compile not timed in a dry run: counted eager"
    return times, note


_MODELS: dict[str, Transformer] = {}  # model config -> a model to count its FLOPs (built once)


def _flops(cfg: RunConfig, seq_len: int, training: bool) -> float:
    key = repr(cfg.model)
    if key not in _MODELS:
        _MODELS[key] = Transformer(cfg.model)
    return _MODELS[key].flops_per_token(seq_len, training=training)


def _scaled(cfg: RunConfig, timed: list) -> ShapeTimes:
    """Timings of ``cfg``'s shape from the timed shape nearest it in FLOPs per token (one of the
    same length and batch where there is one): each rate scaled by the two shapes' FLOPs."""
    own = _flops(cfg, cfg.train.seq_len, True)
    same = [(c, t) for c, t in timed if (c.train.seq_len, c.train.batch_size) == (cfg.train.seq_len,
                                                                                 cfg.train.batch_size)]
    ref_cfg, ref = min(same or timed, key=lambda ct: abs(math.log(_flops(ct[0], cfg.train.seq_len, True) / own)))
    step_tokens = cfg.train.tokens_per_step() / ref_cfg.train.tokens_per_step()
    scaled = ShapeTimes(ref.key)  # never saved: the cache holds measured shapes only
    factor = step_tokens * own / _flops(ref_cfg, ref_cfg.train.seq_len, True)
    scaled.eager_step_s = ref.eager_step_s * factor
    scaled.eval_tok_s = {n: rate * _flops(ref_cfg, int(n), False) / _flops(cfg, int(n), False)
                         for n, rate in ref.eval_tok_s.items()}
    scaled.shared_step_s = {jobs: step * factor for jobs, step in ref.shared_step_s.items()}
    scaled.busy = ref.busy
    return scaled


def _expected(cfg: RunConfig, times: ShapeTimes, done: int, seen: list[int],
              slowdown: float) -> tuple[Optional[float], str]:
    """The expected training seconds of a run that stops at competence, from the steps ``seen``
    at which its row's ended runs stopped (those past ``done``, where it resumes), and what the
    estimate's note says of it; (None, "") where no such run is known."""
    later = steps_past(seen, done)
    if not later:
        return None, ""
    expected = train_seconds(cfg, times, round(sum(later) / len(later)))[0] * slowdown
    runs_said = f"{len(later)} ended run{'s' if len(later) > 1 else ''}"
    return expected, (f"; expected {expected / 60:.1f} min as its row's {runs_said}"
                      + (f" that went past its step {done:,}" if done else ""))


@dataclass
class DataSize:
    """What an estimate needs of a run's data: its vocabulary and the evaluation split's tokens
    (where not known, eval.max_tokens: what each length scores); ``note``: how
    they were found where the data is not prepared here (a dry run), said once per corpus."""

    vocab: int
    split_tokens: int
    note: str = ""


BYTES_PER_TOKEN = 4  # a dry run's guess of a BPE split's tokens from its size (English text)


def _data_size(run: PlannedRun, rt, dry_run: bool, twin: Optional[Path] = None) -> DataSize | UserError:
    """The run's data size: from the prepared data (prepared now, cached for training too), or,
    in a dry run where it is not prepared yet, from its config without downloading or tokenizing
    anything (a BPE vocabulary is data.tokenizer.vocab_size; the split's tokens are guessed from
    its bytes), the note saying so."""
    cfg = run.cfg
    try:
        if dry_run and cfg.data.source != "synthetic":
            cached = cached_data(cfg.data)
            if cached is not None:
                data = TextData.of(cached)
                return DataSize(data.tokenizer.vocab_size, len(data.valid))
            if cfg.data.tokenizer.kind in ("bpe", "file", "byte"):
                return _unprepared(run, twin)
        logger.info(f"  preparing the data of {run.name} for the estimate (cached for training)")
        data = prepare(cfg, rt)
        return DataSize(data.tokenizer.vocab_size, len(getattr(data, "valid", ())))
    except UserError as e:  # the runs themselves will fail with this message; the others go on
        return e


def _unprepared(run: PlannedRun, twin: Optional[Path]) -> DataSize:
    """A dry run's data size where the data is not prepared (see ``_data_size``)."""
    cfg = run.cfg
    tok = cfg.data.tokenizer
    vocab = tok.vocab_size if tok.kind == "bpe" else train_tokenizer(tok, []).vocab_size
    split_tokens, counted = None, f"evaluation counted at eval.max_tokens ({cfg.eval.max_tokens:,}) per length"
    if cfg.data.source == "local" and cfg.data.local.valid:
        size = sum(f.stat().st_size for f in resolve_files(cfg.data.local.valid, "data.local.valid"))
        per = 1 if tok.kind == "byte" else BYTES_PER_TOKEN
        split_tokens, counted = size // per, f"its validation split ≈ {size // per:,} tokens ({per} bytes a token)"
    if cfg.eval.max_tokens is None and split_tokens is None:
        counted = "evaluation not counted (no eval.max_tokens, and the split's size is not known)"
    hub = cfg.data.source == "hub"
    note = (f"{open_corpus(cfg.data).describe()} is not prepared here, and a dry run is not "
            f"{'downloading or ' if hub else ''}tokenizing it: vocabulary {vocab:,} from the config, {counted}"
            + (f". Offline, its twin {twin} reads the corpus from local files (docs/data.md)" if hub and twin else ""))
    return DataSize(vocab, split_tokens if split_tokens is not None else cfg.eval.max_tokens or 0, note)


def estimate_grid(grid: Grid, runs: list[PlannedRun], threads: Optional[int], jobs: int = 1,
                  ended: Optional[dict[str, list[int]]] = None, dry_run: bool = False) -> dict[str, Estimate]:
    """Each pending run's estimate (runs already finished and evaluated cost nothing more),
    as one of ``jobs`` CPU jobs at once, each with ``threads`` threads. A run that stops at
    competence, in a row some of whose runs have ended (``ended``, from ``rows_ended``), is also
    expected to train as many steps as they did on average; a resumed one, as many more as those
    that went past its step did (none such: no expectation). ``dry_run``: answer within about a
    minute (``Probing``; data not prepared is sized from its config, ``_data_size``); every
    data note and every reason a run could not be estimated is logged once."""
    if threads:
        torch.set_num_threads(threads)
    sizes: dict[str, DataSize | UserError] = {}  # data config -> its size, or the error its runs will fail with
    runtimes: dict[tuple, object] = {}  # (device, dtype) -> Runtime: one matmul peak, not one per run
    probing = Probing(DRY_RUN_TIMING_S if dry_run else None)
    out, said, refused = {}, set(), {}

    def say_once(text: str) -> None:
        if text not in said:
            said.add(text)
            logger.info(f"  {text}")

    for run in runs:
        try:
            rt = runtimes.get((run.cfg.train.device, run.cfg.train.dtype)) or setup_runtime(run.cfg.train)
            runtimes[(run.cfg.train.device, run.cfg.train.dtype)] = rt
            key = json.dumps(run.cfg.data.__dict__, default=str, sort_keys=True)
            if key not in sizes:
                sizes[key] = _data_size(run, rt, dry_run, twin_of(grid))
            size = sizes[key]
            if isinstance(size, UserError):
                raise size
            cfg = run.cfg.with_vocab_size(size.vocab)
            _check_memory(cfg, rt)
        except (UserError, MemoryLimitError) as e:  # the run itself will fail with this message; the others go on
            refused.setdefault(str(e), []).append(run.name)
            out[run.name] = Estimate(0.0, 0.0, f"no estimate: {e}", failed=True, reason=str(e))
            continue
        if size.note:
            say_once(size.note)
        out[run.name] = _estimate(run, cfg, rt, size, threads, jobs, ended, probing, say_once)
    for reason, names in refused.items():
        logger.info(f"  no estimate for {len(names)} run{'s' if len(names) > 1 else ''} "
                    f"({', '.join(fold_seeds(names))}): {reason}")
    return out


def _estimate(run: PlannedRun, cfg: RunConfig, rt, size: DataSize, threads: Optional[int], jobs: int,
              ended: Optional[dict[str, list[int]]], probing: Probing, say_once) -> Estimate:
    """One run's estimate from its shape's timings (``estimate_grid`` says the rest)."""
    sharing = jobs if rt.device.type == "cpu" else 1  # jobs on other devices do not share one
    times, timing_note = _shape_times(run.name, cfg, rt, sharing, threads, probing)
    slowdown = shared_slowdown(times, sharing)
    done = _progress(run)
    train_s, note = train_seconds(cfg, times, cfg.train.total_steps() - done)
    if timing_note:
        note += f"; {timing_note}"
    seen = (ended or {}).get(row_of(run.name), []) if cfg.train.stop_at_accuracy is not None else []
    expected, said = _expected(cfg, times, done, seen, slowdown)
    note += said
    if sharing > 1:
        note += (f"; ×{slowdown:.1f} with {sharing} jobs at once" if str(sharing) in times.shared_step_s else
                 f"; not timed as {sharing} jobs at once ({'a dry run does not' if probing.dry else 'that probe failed'})"
                 ": may run long")
    if times.busy:
        note += "; timed while busy"
        say_once(f"shapes were timed while other work shared the CPUs ({times.busy}): their estimates may run long; "
                 f"they are timed again where this runs on a quiet machine (or delete their records in {cache_dir()})")
    competence = cfg.train.stop_at_accuracy is not None
    return Estimate(train_s * slowdown, eval_seconds(cfg, times, size.split_tokens) * slowdown, note, expected,
                    competence_row=row_of(run.name) if competence else None, done=done,
                    steps=cfg.train.total_steps() - done)


def twin_of(grid: Grid) -> Optional[Path]:
    """The grid's ``-local`` twin beside it (the same study reading its corpus from local files,
    which may be another variant of it: docs/data.md),
    where the grid reads the Hub and such a file exists."""
    source = Path(grid.source) if grid.source else None
    if source is None or source.stem.endswith("-local"):
        return None
    twin = source.with_name(f"{source.stem}-local{source.suffix}")
    return twin if twin.is_file() else None


def _check_memory(cfg: RunConfig, rt) -> None:
    """The probe trains a few steps of the run's shape and runs forwards at its evaluation
    lengths (training/step_timing.py): refused before they start when they cannot fit, as the run's
    training and evaluation would be (training/memory.py)."""
    check_training(cfg, rt.device)
    limit = served_length(cfg.model.pos)
    forwards = [forward_estimate(cfg.model, windows_per_batch(n, PROBE_ROWS), n,
                                 f"timing {cfg.name}'s forward at length {n:,}")
                for n in _eval_lengths(cfg) if limit is None or n <= limit]
    estimate = largest(forwards)
    if estimate is not None:
        check_fits(estimate, rt.device, "Evaluate shorter lengths (eval.lengths).")


def _last_meta(run: PlannedRun, grid: Optional[Grid] = None) -> dict:
    """The metadata of the run's newest checkpoint, else (given a grid that keeps records) of its
    archived record's; {} where there is none or it does not read."""
    ckpt = RunDir.of(run.cfg).latest_checkpoint() if RunDir.of(run.cfg).path.exists() else None
    if ckpt is None and grid is not None and grid.archive is not None:
        kept = sorted((record_of(grid, run) / "checkpoints").glob("step_*"))
        ckpt = kept[-1] if kept else None
    try:
        meta = json.loads((ckpt / "meta.json").read_text()) if ckpt is not None else {}
    except (OSError, ValueError):
        return {}
    return meta if isinstance(meta, dict) else {}


def ended_at(grid: Grid, run: PlannedRun) -> Optional[int]:
    """The step a run that stops at competence ended at (reached, or its whole budget), from its
    last checkpoint or else its archived record; None where it has not ended."""
    meta = _last_meta(run, grid)
    step, competence = meta.get("step"), meta.get("competence") or {}
    if step is None or not (competence.get("reached") or step >= run.cfg.train.total_steps()):
        return None
    return int(step)


def rows_ended(grid: Grid, runs: list[PlannedRun]) -> dict[str, list[int]]:
    """Row -> the steps its runs that stop at competence ended at (ropelab ablate passes every
    planned run: a pending seed's estimate may then expect the stop where its row's seeds had it)."""
    out: dict[str, list[int]] = {}
    for run in runs:
        if run.cfg.train.stop_at_accuracy is not None and (step := ended_at(grid, run)) is not None:
            out.setdefault(row_of(run.name), []).append(step)
    return out


def _progress(run: PlannedRun) -> int:
    """The steps the run has trained (its newest checkpoint's), 0 where it has none."""
    try:
        return int(_last_meta(run).get("step", 0))
    except (TypeError, ValueError):
        return 0
