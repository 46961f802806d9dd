"""Length extrapolation of trained runs: ``ropelab eval RUN_DIR... [options]``.

For every run, every RoPE scaling asked for (RoPE runs only; ``factor = L_eval / L_train``
unless ``eval.factor`` is set, so lengths up to L_train are plain RoPE) and every length:
perplexity under each protocol, plus the per-position loss at the longest length. Writes
``results.json``, ``report.md`` and PNG plots into ``--out`` (see eval/lm/report.py).

What is evaluated is each run's own ``eval`` config (configs/eval_config.py: EvalConfig),
with the command-line flags (or a grid's ``eval:``) overriding its keys. The corpus is
tokenized with the run's own tokenizer.json. Lengths a learned table cannot serve are
recorded as ``n/a`` with the table size, never evaluated (and never a crash). The latest
checkpoint is evaluated, or those of the training steps ``eval.steps`` (``--steps``; a
fine-tuning budget curve, eval/lm/finetune_budget.py).

The command line, the ``--eval-file`` merge and the per-run cache are eval/evaluation.py's,
shared with ``ropelab tasks``; this module is the perplexity sweep of one run, its
cache key, its flags and its report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Optional, Sequence

import torch

from ropelab.configs.grid import run_stem
from ropelab.configs.schema import EvalConfig, EvalCorpus
from ropelab.eval.core import evaluation
from ropelab.eval.core.cell_cache import STORE_DIR, CellStore, address, tokens_digest, weights_digest
from ropelab.eval.core.corpus import CorpusTokens, corpus_settings, load_corpus
from ropelab.eval.core.evaluation import (EvalFor, Evaluation, check_served, evaluate_all, evaluated_checkpoints, mark_step, own_eval,
                         pooling_group)
from ropelab.eval.lm.flags import MEMORY_FIX, add_flags, corpus_plans, flag_tree, preflight
from ropelab.eval.core.resume_journal import Cells
from ropelab.eval.reporting.labels import label_groups
from ropelab.eval.reporting.like_for_like import run_setup, unlike_rows
from ropelab.eval.lm.perplexity import perplexity
from ropelab.eval.reporting.reference import missing_reference
from ropelab.eval.lm.report import write_report
from ropelab.model.config import RopeScalingConfig
from ropelab.model.encodings import KINDS, accepts_rope_scaling
from ropelab.common.errors import NonFiniteOutput, UserError
from ropelab.model.positional.rope import RoPE
from ropelab.model.positional.rope_scaling import effective_scale
from ropelab.common.cli import entry_point
from ropelab.common.logs import get_logger
from ropelab.training.competence import logged_progress
from ropelab.training.metrics import steady_train_seconds
from ropelab.training.provenance import git_commit, is_dirty
from ropelab.training.run_dir import RunDir
from ropelab.training.saved_run import SavedRun, load_run, rescaled, with_scaling

logger = get_logger(__name__)


def scaling_for(kind: str, length: int, train_len: int, factor: Optional[float]) -> Optional[RopeScalingConfig]:
    """The RoPE scaling evaluated at one length; None where it is plain RoPE there.

    Static methods use factor s = length / train_len (or the fixed ``factor``). Dynamic NTK
    fits itself to the length, so its factor stays 1 (or ``factor``): setting s = L/L0 as
    well would scale by s² − s + 1 (model/positional/rope_scaling.py).
    """
    if kind == "none" or length <= train_len and kind == "dynamic":
        return None
    s = (factor or 1.0) if kind == "dynamic" else (factor if factor is not None else length / train_len)
    if kind != "dynamic" and s <= 1.0:
        return None
    return RopeScalingConfig(type=kind, factor=s, original_max_len=train_len)


def scale_note(kind: str, length: int, train_len: int, factor: Optional[float]) -> dict:
    """What a scaling row did at one length: its configured factor and effective scale."""
    scaling = scaling_for(kind, length, train_len, factor)
    if scaling is None:
        return {"scaling_factor": 1.0, "effective_scale": 1.0}
    return {"scaling_factor": scaling.factor, "effective_scale": round(effective_scale(scaling, length), 6)}


def run_metadata(saved: SavedRun, ev: EvalConfig) -> dict:
    cfg, meta = saved.cfg, saved.meta
    group = pooling_group(cfg, meta.get("tokens"), meta.get("parent"))
    metrics = RunDir(saved.run_dir).metrics
    return {"run": str(saved.run_dir), "name": cfg.name, "encoding": cfg.model.encoding_name(),
            "attention": cfg.model.attention, "group": group,
            "stem": run_stem(cfg.name, cfg.init.run),
            "pairing": cfg.model.pos.rope.pairing if KINDS[cfg.model.pos.kind].rotary else None,
            "params": saved.model.num_params(), "tokens_trained": meta.get("tokens"), "setup": run_setup(cfg),
            "steps": meta.get("step"), "train_len": cfg.train.seq_len, "seed": cfg.train.seed,
            "max_len": saved.model.max_len, "git_commit": meta.get("git_commit"),
            "commits": meta.get("commits"), "total_steps": meta.get("total_steps"),
            **({"schedules": meta["schedules"]} if meta.get("schedules") else {}),
            "train_seconds": meta.get("train_seconds"),
            "steady_train_seconds": steady_train_seconds(metrics, meta.get("tokens")),
            "parent": meta.get("parent"),
            "checkpoint": saved.checkpoint.name, "eval": dataclasses.asdict(ev),
            **({"competence": meta["competence"]} if meta.get("competence") else {}),
            **logged_progress(metrics, meta.get("competence"))}


def _check_finished(saved: SavedRun, allow_unfinished: bool) -> None:
    if allow_unfinished or saved.meta.get("finished", True):
        return
    raise UserError(f"{saved.run_dir} is not finished (its latest checkpoint is step {saved.meta.get('step')} of "
                    f"{saved.meta.get('total_steps')}): it is still training or was interrupted. Finish it with "
                    "python train.py CONFIG --resume, or evaluate the checkpoint as it is with --allow-unfinished.")


def evaluate_run(run_dir: Path, ev: EvalConfig, device: str = "cpu",
                 allow_unfinished: bool = False, cells: Optional[Cells] = None,
                 store: Optional[CellStore] = None) -> tuple[dict, list[dict], dict]:
    """(metadata, result rows, per-position curves by corpus and scaling) for one run.
    ``cells``: finished cells to reuse and record (the driver's journal); ``store``:
    cells by content, shared with other runs and evaluation configs (eval/core/cell_cache.py)."""
    started = time.perf_counter()
    cells = cells if cells is not None else Cells()
    latest = load_run(run_dir, device=device)
    _check_finished(latest, allow_unfinished)
    check_served(latest.cfg, sorted({n for lengths, _ in corpus_plans(latest.cfg, ev) for n in lengths}))
    meta = run_metadata(latest, ev)
    meta["eval_commit"] = git_commit()  # the code that scores the cells computed now (cached ones keep theirs)
    rows, curves = [], {}
    for step, base in evaluated_checkpoints(run_dir, ev, latest, device):
        last = step is None or step == max(ev.steps)  # curves at the last step only
        step_ev = ev if last else dataclasses.replace(ev, per_position=False)
        for corpus in ev.corpora:
            data = load_corpus(base, corpus, ev)
            settings = corpus_settings(corpus, base, step_ev)
            meta.setdefault("corpora", {})[data.name] = {**settings, "name": data.name,
                                                         "split_tokens": int(len(data.tokens))}
            corpus_rows, corpus_curves = _evaluate_corpus(base, step_ev, corpus, data, meta, cells,
                                                          prefix=f"{step}|", store=store)
            mark_step(corpus_rows, step, base)
            rows += corpus_rows
            if last:
                curves[data.name] = corpus_curves
    # Time spent in this process plus the cells an interrupted earlier attempt finished.
    meta["eval_seconds"] = round(time.perf_counter() - started + cells.seconds, 1)
    return meta, rows, curves


def _evaluate_corpus(base: SavedRun, ev: EvalConfig, corpus: EvalCorpus, data: CorpusTokens, meta: dict,
                     cells: Cells, prefix: str = "", store: Optional[CellStore] = None) -> tuple[list[dict], dict]:
    train_len, limit = base.cfg.train.seq_len, base.model.max_len
    lengths = sorted(set(corpus.lengths)) or ev.resolved_lengths(train_len)
    curve_at = max((n for n in lengths if limit is None or n <= limit), default=None) if ev.per_position else None
    scalings = ev.resolved_scalings(base.cfg.model.pos.kind)
    token_bytes = base.tokenizer.token_bytes()  # once per corpus, not per cell and protocol
    protocols = corpus.protocols or ev.protocols
    content = None if store is None else {
        "weights": weights_digest(base.model), "format": EVAL_FORMAT, "max_tokens": ev.max_tokens,
        "tokens": tokens_digest(data.tokens, token_bytes, base.tokenizer.eot_id, data.within_document)}
    rows, curves = [], {}
    scored: dict[tuple[int, str], str] = {}  # (length, rotary tables' digest) → the scaling scored with them
    for scaling in scalings:
        for length in lengths:
            digest = rotary_digest(base, scaling, length, ev)
            same = scored.setdefault((length, digest), scaling) if digest is not None else scaling
            if same != scaling:  # the same tables as a scaling scored already: the same numbers
                note = scale_note(scaling, length, train_len, ev.factor)
                rows += [{**r, "scaling": scaling, **note, "same_as": same}
                         for r in rows if r["scaling"] == same and r["length"] == length]
                if length == curve_at and same in curves:
                    curves[scaling] = curves[same]
                continue
            key = f"{prefix}{data.name}|{scaling}|{length}"
            done = cells.get(key)
            if done is not None:
                rows += done["rows"]
                if done["curve"] is not None:
                    curves[scaling] = done["curve"]
                logger.info(f"  {meta['name']:<28} {data.name[:24]:<24} {scaling:<8} L={length:<6} (done before)")
                continue
            started = time.perf_counter()
            where = None if content is None or (limit is not None and length > limit) else address({
                **content, "model": dataclasses.asdict(_cell_model_config(base, scaling, length, ev)),
                "length": length, "protocols": [[p, *_layout(p, length, lengths, ev).values()] for p in protocols]})
            stored = _stored_cell(store, where, meta, want_curve=length == curve_at)
            if stored is not None:  # the same weights, tables and tokens, scored for another run or config
                cell_rows = [{**_cell_header(meta, data, ev, scaling, length, r["protocol"]), **r}
                             for r in stored["results"]]
                curve = stored["curve"] if length == curve_at else None
                logger.info(f"  {meta['name']:<28} {data.name[:24]:<24} {scaling:<8} L={length:<6} (scored before: "
                            f"{STORE_DIR}/)")
            else:
                cell_rows, curve = _evaluate_cell(base, ev, corpus, data, meta, scaling, length, lengths,
                                                  curve=length == curve_at, token_bytes=token_bytes)
                if where is not None:  # stored without the run's identity, which a reader adds back
                    header = _cell_header(meta, data, ev, scaling, length, protocol="")
                    store.put(where, [{k: v for k, v in r.items() if k == "protocol" or k not in header}
                                      for r in cell_rows], curve)
            cells.add(key, cell_rows, curve, time.perf_counter() - started)
            rows += cell_rows
            if curve is not None:
                curves[scaling] = curve
    return rows, curves


def _stored_cell(store: Optional[CellStore], where: Optional[str], meta: dict, want_curve: bool) -> Optional[dict]:
    """The cell at ``where`` in the store, if it can stand for scoring it here: None where it
    lacks the per-position curve this evaluation wants, or was scored by uncommitted code while
    this evaluation's code is clean (a clean evaluation scores such a cell itself)."""
    stored = store.get(where) if store is not None and where is not None else None
    if stored is None or (want_curve and stored["curve"] is None):
        return None
    if _changed_code(stored) and not is_dirty(meta.get("eval_commit")):
        return None
    return stored


def _changed_code(stored: dict) -> bool:
    """Whether a stored cell was scored by code that differed from its commit: reused by a
    clean evaluation, its rows would carry that provenance into a result from clean code."""
    return any(is_dirty(r.get("eval_commit")) for r in stored["results"])


def _evaluate_cell(base: SavedRun, ev: EvalConfig, corpus: EvalCorpus, data: CorpusTokens, meta: dict,
                   scaling: str, length: int, lengths: list[int], curve: bool,
                   token_bytes) -> tuple[list[dict], Optional[dict]]:
    """Every protocol at one (scaling, length): its rows and, if asked, the per-position curve."""
    limit = base.model.max_len
    model = model_for(base, scaling, length, ev)
    rows, found_curve = [], None
    for protocol in corpus.protocols or ev.protocols:
        row = _cell_header(meta, data, ev, scaling, length, protocol)
        if model is None:
            rows.append({**row, "status": "n/a", "note": f"trained table: {limit} positions"})
            continue
        started = time.perf_counter()
        result = perplexity(model, data.tokens, length, **_layout(protocol, length, lengths, ev),
                            batch_size=ev.batch_size, max_tokens=ev.max_tokens, token_bytes=token_bytes,
                            eot_id=base.tokenizer.eot_id, within_document=data.within_document,
                            curve=curve and protocol == "nonoverlap")
        if not math.isfinite(result.nll):
            raise NonFiniteOutput(f"the loss at length {length} ({protocol}, scaling {scaling}) is {result.nll}")
        found = result.to_dict()
        if found.pop("curve") is not None:
            found_curve = result.curve
        rows.append({**row, "status": "ok", **found, "seconds": round(time.perf_counter() - started, 2),
                     "eval_commit": meta.get("eval_commit")})
        logger.info(f"  {meta['name']:<28} {data.name[:24]:<24} {scaling:<8} L={length:<6} {protocol:<10} "
                    f"ppl={result.ppl:10.3f}")
    return rows, found_curve


def _cell_header(meta: dict, data: CorpusTokens, ev: EvalConfig, scaling: str, length: int, protocol: str) -> dict:
    """What identifies a result row: run, corpus, scaling (with what it did) and length."""
    return {**{k: meta[k] for k in ("run", "name", "encoding", "seed", "train_len")},
            "corpus": data.name, "within_document": data.within_document, "scaling": scaling,
            **scale_note(scaling, length, meta["train_len"], ev.factor), "length": length, "protocol": protocol}


def _layout(protocol: str, length: int, lengths: list[int], ev: EvalConfig) -> dict:
    """How ``protocol`` lays its windows at ``length`` (perplexity()'s keywords): a stride, or the
    same-token spans over every length of the corpus."""
    if protocol == "same-tokens":
        return {"target": ev.target_span(lengths)}
    return {"stride": length if protocol == "nonoverlap" else min(ev.sliding_stride(length), length)}


def _cell_model_config(base: SavedRun, scaling: str, length: int, ev: EvalConfig):
    """The model config a cell runs with: the run's own, with the cell's RoPE scaling."""
    return with_scaling(base.cfg, scaling_for(scaling, length, base.cfg.train.seq_len, ev.factor)).model


def rotary_digest(base: SavedRun, scaling: str, length: int, ev: EvalConfig) -> Optional[str]:
    """A digest of the cos/sin tables a RoPE run's forwards use at ``length`` under ``scaling``
    (None for other encodings). Every window of a cell is exactly ``length`` tokens, so two
    scalings with equal digests give the same numbers bit for bit: a method at scale 1 is plain
    RoPE, and dynamic NTK fitted to L is NTK with s = L / L_train. Such a cell is scored once."""
    if not accepts_rope_scaling(base.cfg.model.pos.kind):
        return None
    cos, sin = RoPE(_cell_model_config(base, scaling, length, ev)).cos_sin(torch.arange(length), length)
    return hashlib.sha256(cos.numpy().tobytes() + sin.numpy().tobytes()).hexdigest()


def model_for(base: SavedRun, scaling: str, length: int, ev: EvalConfig):
    """The model to evaluate at ``length`` under ``scaling`` (the run's own where that is plain
    RoPE), or None past the end of a learned position table."""
    limit = base.model.max_len
    if limit is not None and length > limit:
        return None
    rope_scaling = scaling_for(scaling, length, base.cfg.train.seq_len, ev.factor)
    return base.model if rope_scaling is None else rescaled(base, rope_scaling)


# Bumped whenever the evaluation code changes a number for the same run and settings, so
# results cached in run directories by an older version are computed again.
EVAL_FORMAT = 3  # 3: units are documents however few; per-unit sums by context position; same-tokens


def _cache_key(ev: EvalConfig) -> str:
    """What changes the numbers: every eval key but those that cannot (how many windows go
    through one forward, the report's reference row, the settings of task scoring and of
    the attention diagnostics), and the evaluation format."""
    key = {k: v for k, v in dataclasses.asdict(ev).items()
           if k not in ("batch_size", "reference", "tasks", "diagnostics")}
    key["format"] = EVAL_FORMAT
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def share_window_sets(rows: list[dict]) -> dict[str, dict]:
    """Move each row's per-unit token and byte counts (and per position bin) into a table
    shared by every row scored on the same windows (they are identical), keeping
    results.json small."""
    sets = {}
    for row in rows:
        if "unit_tokens" not in row:
            continue
        shared = {"unit_kind": row.pop("unit_kind"), "unit_tokens": row.pop("unit_tokens"),
                  "unit_bytes": row.pop("unit_bytes")}
        if row.get("position_unit_tokens"):  # per position bin (non-overlapping windows)
            shared.update(position_edges=row.pop("position_edges"),
                          position_unit_tokens=row.pop("position_unit_tokens"))
        else:
            for key in ("position_edges", "position_unit_tokens", "position_unit_nll"):
                row.pop(key, None)
        key = hashlib.sha256(json.dumps(shared).encode()).hexdigest()[:12]
        sets[key] = shared
        row["window_set"] = key
    return sets


def _evaluate(run_dir: Path, ev: EvalConfig, device: str, cells: Cells,
              allow_unfinished: bool = False) -> tuple[dict, list[dict], dict]:
    """evaluate_run as the driver's cache loop calls it: cells shared by the runs of one directory."""
    return evaluate_run(run_dir, ev, device, allow_unfinished, cells=cells,
                        store=CellStore(Path(run_dir).parent / STORE_DIR))


def run_extrapolation(run_dirs: Sequence[Path], out: Path, eval_for: EvalFor = own_eval, device: str = "cpu",
                      missing: Sequence[dict] = (), allow_unfinished: bool = False) -> dict:
    """Evaluate every run with ``eval_for(its config)`` and write results.json, report.md and plots.

    ``missing`` lists runs that should have been there (``{"run", "error"}``) for the report.
    """
    done = evaluate_all(EXTRAPOLATION, run_dirs, eval_for, device, missing, allow_unfinished=allow_unfinished)
    curves = {meta["run"]: run_curves for meta, run_curves in zip(done.runs, done.extras)}
    label_groups(done.runs, done.rows)
    corpora: dict[str, dict] = {}
    for run in done.runs:  # how each corpus was scored (absent from evaluations cached before this was recorded)
        for name, settings in run.get("corpora", {}).items():
            corpora.setdefault(name, settings)
    results = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "corpora": corpora, "runs": done.runs,
               "results": done.rows, "window_sets": share_window_sets(done.rows), "per_position": curves,
               "missing": done.failures}
    write_report(results, out)
    return results


def _warnings(results: dict) -> list[str]:
    missing, unlike = missing_reference(results), unlike_rows(results)
    return [*([missing] if missing else []), *([unlike.replace("**", "")] if unlike else [])]


EXTRAPOLATION = Evaluation(
    command="eval",
    name="extrapolation", doc=__doc__, result="curves", default_out=Path("reports/extrapolation"),
    cache_key=lambda cfg, ev: _cache_key(ev), evaluate=_evaluate, report=run_extrapolation, add_flags=add_flags,
    flag_tree=flag_tree, options=lambda args: {"allow_unfinished": args.allow_unfinished}, warnings=_warnings,
    journal=True, preflight=preflight, memory_fix=MEMORY_FIX)


@entry_point
def main(argv=None) -> int:
    return evaluation.command(EXTRAPOLATION, argv)


if __name__ == "__main__":
    sys.exit(main())
