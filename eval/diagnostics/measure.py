"""Attention diagnostics of trained runs: what attention does as the length grows.

``ropelab diagnose RUN... --out DIR``, or a grid whose ``eval.diagnostics.enabled``
is true (ropelab ablate). For each run, at each length of ``eval.diagnostics`` (the
training length L always among them), on a sample of windows: ``windows`` windows of the
run's own ``eval.split``, tokenized with its own tokenizer (eval/core/corpus.py) and spread evenly
over it; for a run trained on synthetic tasks, test instances of its tasks instead. Each
window goes through one forward whose attention layers are read by hooks
(eval/diagnostics/attention_probe.py); for every layer and head the measures of eval/diagnostics/attention_stats.py
(entropy by query position, attended distance and its distribution, sink mass) and, for
the RoPE family, the mean q and k norm of every rotation pair (Barbero et al. 2024).
Needle retrieval adds the attention mass on the needle's tokens (the asked values) from the
queries that predict the answer, and from the first of them alone (where the needle is chosen):
on the run's own passkey or multikey instances (synthetic runs trained on them), or on passkey
instances in the paper's wording written with the run's tokenizer (runs trained on text).
Caches written before the first-query measure existed lack it and stay valid (the report says
so); delete a run's eval/diagnostics-*.json to measure it again while its weights exist.

What does not apply is said, not guessed: linear attention forms no attention matrix, so
only the RoPE pair norms (of the features its numerator rotates) are measured; lengths a
learned table (or xPos's float range) cannot serve are skipped with a note. Results are
cached per run and checkpoint; eval/diagnostics/report.py pools seeds and writes the report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from ropelab.common.errors import DataError, LengthError, NonFiniteOutput
from ropelab.common.logs import get_logger
from ropelab.configs.schema import EvalConfig, EvalCorpus, RunConfig
from ropelab.data.samplers import eval_windows, spread_windows
from ropelab.data.tasks import Task, TaskError, build_task, eval_instance
from ropelab.data.tasks.base import answer_needles
from ropelab.eval.diagnostics.attention_probe import LayerAttention, attention_inputs, rotary_pair_norms, rotated_vectors
from ropelab.eval.diagnostics.attention_stats import example_map, head_stats, needle_mass
from ropelab.eval.core.corpus import load_corpus
from ropelab.eval.diagnostics.report import write_diagnostics_report
from ropelab.eval.core.evaluation import Evaluation, EvalFor, Result, evaluate_all
from ropelab.eval.lm.extrapolation import run_metadata
from ropelab.eval.reporting.report_dir import DIAGNOSTICS as DIAGNOSTICS_REPORT
from ropelab.eval.tasks.exact_match import is_synthetic
from ropelab.model.encodings import KINDS, served_length
from ropelab.training.memory import Estimate, attention_map_estimate, largest
from ropelab.training.saved_run import SavedRun, load_run

logger = get_logger(__name__)

DIAGNOSTICS_FORMAT = 3  # bumped when a measure changes, so cached diagnostics are computed again
MAP_MULTIPLE = 8  # the example attention maps: at L and at 8L (else the longest length)


@dataclass
class Window:
    tokens: np.ndarray  # (T,): the model's input
    needle: Optional[np.ndarray] = None  # (T,) bool: the asked needle's tokens (a passkey's key)
    answer_rows: Optional[np.ndarray] = None  # the queries that predict the answer's tokens
    depth: Optional[float] = None  # the needle's depth (0: first in the filler, 1: by the question)


def corpus_windows(tokens: np.ndarray, length: int, count: int) -> list[Window]:
    """``count`` windows of ``length`` tokens spread evenly over the split (all it holds if fewer)."""
    windows = spread_windows(eval_windows(len(tokens), length), count * length)[:count]
    return [Window(np.asarray(tokens[w.start:w.start + length], dtype=np.int64)) for w in windows]


def task_windows(tasks: Sequence[Task], length: int, count: int, ev: EvalConfig) -> list[Window]:
    """``count`` test instances of ``length`` positions, the tasks taking turns; a needle task's
    (passkey, multikey: ``has_depth``) instance's depth cycles through ``eval.tasks.depths`` and
    it carries its needle, the asked needles' tokens (data/tasks/base.py: answer_needles)."""
    depths = ev.tasks.resolved_depths()
    windows = []
    for i in range(count):
        task = tasks[i % len(tasks)]
        depth = depths[i % len(depths)] if task.has_depth else None
        instance = eval_instance(task, ev.tasks.seed, length, depth, i)
        window = Window(instance.tokens[:-1].astype(np.int64))
        if task.has_depth:  # the query at a − 1 predicts the answer token at a
            window.needle = answer_needles(instance)[:-1]
            window.answer_rows = np.flatnonzero(instance.answer) - 1
            window.depth = float(depth)
        windows.append(window)
    return windows


def diagnose_window(model, window: Window, meta: dict, full: bool, want_map: bool) -> dict[str, np.ndarray]:
    """The measures of one window, each stacked over layers: (layers, H[, bins])."""
    idx = torch.from_numpy(window.tokens)[None].to(next(model.parameters()).device)
    out: dict[str, list] = defaultdict(list)
    rotary = rotary_layers(model)
    for layer, (block, inp) in enumerate(zip(model.blocks, attention_inputs(model, idx))):
        att = LayerAttention(block.attn, inp) if meta["attention"] == "softmax" else None
        if layer in rotary:  # the RoPE frequency analysis: rotary layers only (a plan's NoPE layers have no pairs)
            q, k = att.unrotated if att is not None else rotated_vectors(block.attn, inp)
            encoding = model.encoding(layer)
            q_norm, k_norm = rotary_pair_norms(q, k, encoding.pairing, encoding.rotary_dim)
            out["qk_pairs"].append((q_norm * k_norm)[0].double().cpu().numpy())
        if att is None:
            continue
        if full:
            for name, value in dataclasses.asdict(head_stats(att, meta["sink_tokens"])).items():
                out[name].append(value)
        if window.needle is not None:
            rows = torch.from_numpy(window.answer_rows).to(idx.device)
            needle = torch.from_numpy(window.needle).to(idx.device)
            out["needle"].append(needle_mass(att, rows, needle))
            # The first answer query alone: it predicts the answer's first token with none of the
            # answer in the context yet, so it is where the needle is chosen; the later queries
            # see the asked value's first tokens and may find it by them.
            out["needle_first"].append(needle_mass(att, rows[:1], needle))
        if want_map:
            out["map"].append(example_map(att))
    found = {name: np.stack(values) for name, values in out.items()}
    for name, values in found.items():
        if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
            layer = int(np.flatnonzero(~np.isfinite(values.reshape(len(values), -1)).all(axis=1))[0])
            raise NonFiniteOutput(f"the attention diagnostics ({name}) of layer {layer} at length "
                                  f"{len(window.tokens):,} are not finite")
    return found


def rotary_layers(model) -> list[int]:
    """The layers whose encoding rotates q and k (all or none of a uniform model's)."""
    return [i for i in range(len(model.blocks)) if KINDS[model.encoding(i).kind].rotary]


def _stack(windows: list[dict[str, np.ndarray]]) -> dict[str, list]:
    """Per measure, the windows' arrays stacked (W, layers, …) and rounded, as JSON lists."""
    names = {name for w in windows for name in w}
    return {name: np.round(np.stack([w[name] for w in windows if name in w]), 6).tolist() for name in sorted(names)}


def diagnose_length(saved: SavedRun, meta: dict, length: int, sample: Callable[[int], list[Window]],
                    needles: Optional[Callable[[int], list[Window]]], map_lengths: set[int]) -> dict:
    """Every measure at one length, per window; or why the length was skipped."""
    try:
        saved.model.check_length(length)
        windows = sample(length)
    except (LengthError, TaskError, DataError) as e:  # what this length cannot be: said in the report
        return {"status": "n/a", "note": str(e)}
    results = [diagnose_window(saved.model, w, meta, full=True, want_map=i == 0 and length in map_lengths)
               for i, w in enumerate(windows)]
    cell = {"status": "ok", "windows": len(windows), **_stack(results)}
    if "map" in cell:
        cell["map"] = cell["map"][0]  # the first window's only
    cell["needle_uniform"], cell["needle_depths"] = _uniform_needle(windows), _needle_depths(windows)
    if needles is not None and meta["attention"] == "softmax":
        try:
            extra = needles(length)
        except TaskError as e:
            cell["needle_note"] = str(e)
        else:
            found = _stack([diagnose_window(saved.model, w, meta, full=False, want_map=False) for w in extra])
            cell["needle"], cell["needle_first"] = found["needle"], found["needle_first"]
            cell["needle_uniform"], cell["needle_depths"] = _uniform_needle(extra), _needle_depths(extra)
    return cell


def _uniform_needle(windows: list[Window]) -> list[float]:
    """Per passkey window, the needle mass of uniform attention: |needle| / (i + 1) over the answer's queries."""
    return [float(np.mean(w.needle.sum() / (w.answer_rows + 1))) for w in windows if w.needle is not None]


def _needle_depths(windows: list[Window]) -> list[float]:
    """Per needle window (the order of the needle measures), its needle's depth."""
    return [w.depth for w in windows if w.needle is not None]


def samplers(saved: SavedRun, ev: EvalConfig, meta: dict):
    """(the windows at a length, the passkey instances at a length or None) for this run, and
    what each is, for the report."""
    cfg, count = saved.cfg, ev.diagnostics.windows
    if is_synthetic(cfg):
        tasks = [build_task(name, cfg.data.synthetic, saved.tokenizer) for name in cfg.data.synthetic.tasks]
        meta["sample"] = f"{count} test instances of {'+'.join(cfg.data.synthetic.tasks)} (eval.tasks.seed {ev.tasks.seed})"
        if not any(task.has_depth for task in tasks):
            meta["needle_note"] = "not measured: the run was not trained on a needle task (passkey, multikey)"
        return (lambda n: task_windows(tasks, n, count, ev)), None
    corpus = load_corpus(saved, EvalCorpus(), ev)
    meta["sample"] = f"{count} windows spread over {corpus.name}"
    try:
        passkey = build_task("passkey", cfg.data.synthetic, saved.tokenizer, text=True)
    except TaskError as e:
        meta["needle_note"] = f"not measured: {e}"
        return (lambda n: corpus_windows(corpus.tokens, n, count)), None
    meta["needle_sample"] = f"{count} passkey instances in the paper's wording (eval.tasks.seed {ev.tasks.seed})"
    return (lambda n: corpus_windows(corpus.tokens, n, count)), (lambda n: task_windows([passkey], n, count, ev))


def diagnose_run(run_dir: Path, ev: EvalConfig, device: str = "cpu") -> tuple[dict, dict]:
    """(metadata, {length: cell}) for one run (see the module docstring)."""
    started = time.perf_counter()
    saved = load_run(run_dir, device=device)
    settings = ev.diagnostics
    train_len = saved.cfg.train.seq_len
    rotary = rotary_layers(saved.model)
    meta = {**run_metadata(saved, ev), "rotary": bool(rotary), "sink_tokens": settings.sink_tokens,
            "epsilon": settings.epsilon, "n_layers": saved.cfg.model.n_layers, "n_heads": saved.cfg.model.n_heads}
    if rotary:
        meta["frequencies"] = saved.model.encoding(rotary[0]).inv_freq.tolist()
    if not saved.cfg.model.layers.uniform:  # a layer plan: each layer's type, and which layers qk_pairs holds
        meta["layer_types"] = saved.cfg.model.layer_names()
        meta["rotary_layers"] = rotary
        meta["layer_frequencies"] = {str(i): saved.model.encoding(i).inv_freq.tolist() for i in rotary}
    sample, needles = samplers(saved, ev, meta)
    lengths = settings.resolved_lengths(train_len)
    longer = [n for n in lengths if n >= MAP_MULTIPLE * train_len]
    map_lengths = {train_len, longer[0] if longer else lengths[-1]}
    cells = {}
    with torch.inference_mode():
        for length in lengths:
            cells[str(length)] = diagnose_length(saved, meta, length, sample, needles, map_lengths)
            logger.info(f"  {meta['name']:<28} L={length:<6} {cells[str(length)].get('note', 'done')}")
    meta["eval_seconds"] = round(time.perf_counter() - started, 1)
    return meta, cells


def _cache_key(cfg: RunConfig, ev: EvalConfig) -> str:
    """What changes the measures: the sample, the lengths, the sink's tokens (ε is applied in the report)."""
    d = ev.diagnostics
    key = {"windows": d.windows, "lengths": d.resolved_lengths(cfg.train.seq_len), "sink_tokens": d.sink_tokens,
           "split": ev.split, "seed": ev.tasks.seed, "depths": ev.tasks.resolved_depths(),
           "format": DIAGNOSTICS_FORMAT}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def _evaluate(run_dir: Path, ev: EvalConfig, device: str, cells, **options) -> Result:
    """The driver's evaluation of one run: (metadata, no rows, {length: cell})."""
    meta, found = diagnose_run(run_dir, ev, device)
    return meta, [], found


def preflight(cfg: RunConfig, ev: EvalConfig) -> Optional[Estimate]:
    """The memory of the longest length the run serves (training/memory.py), which the driver
    checks before any run is diagnosed."""
    settings, limit = ev.diagnostics, served_length(cfg.model.pos)
    return largest([attention_map_estimate(cfg.model, n, settings.windows, f"diagnosing {cfg.name} at length {n:,}")
                    for n in settings.resolved_lengths(cfg.train.seq_len) if limit is None or n <= limit])


def run_diagnostics(run_dirs: Sequence[Path], out: Path, eval_for: EvalFor, device: str = "cpu",
                    missing: Sequence[dict] = ()) -> dict:
    """Diagnose every run with ``eval_for(its config)`` and write report.md, results.json and figures."""
    done = evaluate_all(DIAGNOSTICS, run_dirs, eval_for, device, missing)
    for meta in done.runs:  # ε is applied by the report: today's setting, cached or not
        meta["epsilon"] = meta["eval"]["diagnostics"]["epsilon"]
    runs, cells, failures = done.runs, {m["run"]: c for m, c in zip(done.runs, done.extras)}, done.failures
    results = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": runs, "cells": cells, "missing": failures}
    write_diagnostics_report(results, out)
    return results


DIAGNOSTICS = Evaluation(name="diagnostics", doc=__doc__, result="cells", default_out=Path("reports/diagnostics"),
                         cache_key=_cache_key, evaluate=_evaluate, report=run_diagnostics, preflight=preflight,
                         memory_fix="Diagnose shorter lengths (--lengths), or fewer windows (--windows).",
                         report_kind=DIAGNOSTICS_REPORT)
