"""Length extrapolation of trained runs: ``python -m eval.extrapolation RUN_DIR... [options]``.

For every run, every RoPE scaling asked for (RoPE runs only; ``factor = L_eval / L_train``
unless ``eval.factor`` is set, so lengths up to L_train are plain RoPE) and every length:
perplexity under each protocol, plus the per-position loss at the longest length. Writes
``results.json``, ``report.md`` and PNG plots into ``--out`` (see eval/report.py).

What is evaluated is each run's own ``eval`` config (configs/schema.py: EvalConfig),
with the command-line flags (or a grid's ``eval:``) overriding its keys. The corpus is
tokenized with the run's own tokenizer.json. Lengths a learned table cannot serve are
recorded as ``n/a`` with the table size, never evaluated (and never a crash).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np
import torch

from configs import override_section
from configs.experiment import seed_group
from configs.schema import EvalConfig, RunConfig, TokenizerConfig
from data.atomic import write_text_atomic
from data.prepare import prepare_data
from eval.labels import encoding_label
from eval.perplexity import per_position_loss, perplexity
from eval.report import write_report
from model.config import SCALING_TYPES, RopeScalingConfig
from model.errors import DataError, UserError
from training.cli import entry_point
from training.run_dir import RunDir
from training.saved_run import SavedRun, load_run, read_run_config, rescaled

EvalFor = Callable[[RunConfig], EvalConfig]  # the evaluation config of a run, from its config


def own_eval(cfg: RunConfig) -> EvalConfig:
    return cfg.eval


def scaling_for(kind: str, length: int, train_len: int, factor: Optional[float]) -> Optional[RopeScalingConfig]:
    """The RoPE scaling at one evaluation length; None where it reduces to plain RoPE."""
    s = factor if factor is not None else length / train_len
    if kind == "none" or s <= 1.0:
        return None
    return RopeScalingConfig(type=kind, factor=s, original_max_len=train_len)


def run_metadata(saved: SavedRun, ev: EvalConfig) -> dict:
    cfg, meta = saved.cfg, saved.meta
    group = pooling_group(cfg, meta.get("tokens"))
    return {"run": str(saved.run_dir), "name": cfg.name, "encoding": cfg.model.pos.kind,
            "attention": cfg.model.attention, "group": group,
            "stem": re.sub(r"[_-]?seed[-=]?\d+", "", cfg.name) or cfg.name,
            "pairing": cfg.model.pos.rope.pairing if cfg.model.pos.kind == "rope" else None,
            "params": saved.model.num_params(), "tokens_trained": meta.get("tokens"),
            "steps": meta.get("step"), "train_len": cfg.train.seq_len, "seed": cfg.train.seed,
            "max_len": saved.model.pos.max_len, "git_commit": meta.get("git_commit"),
            "checkpoint": saved.checkpoint.name, "eval": dataclasses.asdict(ev)}


def pooling_group(cfg: RunConfig, tokens: Optional[int]) -> str:
    """Seeds of one experiment, trained for as many tokens, are pooled into one row."""
    return f"{seed_group(cfg)}-{tokens}"


def split_tokens(saved: SavedRun, split: str) -> np.ndarray:
    """The run's ``split``, tokenized with the run's own tokenizer.json (never retrained)."""
    own = TokenizerConfig(kind="file", path=str(saved.run.tokenizer))
    data_cfg = dataclasses.replace(saved.cfg.data, tokenizer=own)
    data = prepare_data(data_cfg, progress=False, splits=[split])
    if data.tokenizer != saved.tokenizer:  # unreachable unless the cache was tampered with
        raise DataError(f"the prepared data in {data.dir} does not match {saved.run.tokenizer}; "
                        "delete that directory and evaluate again")
    return data.split(split)


def evaluate_run(run_dir: Path, ev: EvalConfig, device: str = "cpu", log=print) -> tuple[dict, list[dict], dict]:
    """(metadata, result rows, per-position curves by scaling) for one run."""
    base = load_run(run_dir, device=device)
    train_len = base.cfg.train.seq_len
    lengths = ev.resolved_lengths(train_len)
    scalings = ev.resolved_scalings(base.cfg.model.pos.kind)
    meta = run_metadata(base, ev)
    tokens = split_tokens(base, ev.split)
    token_bytes = base.tokenizer.token_bytes()
    rows, curves = [], {}
    limit = base.model.pos.max_len
    for scaling in scalings:
        for length in lengths:
            plain = scaling != "none" and scaling_for(scaling, length, train_len, ev.factor) is None
            if plain and "none" in scalings:  # factor 1 is plain RoPE: copy, don't recompute
                rows += [{**r, "scaling": scaling} for r in rows if r["scaling"] == "none" and r["length"] == length]
                continue
            model = None if limit is not None and length > limit else _model_for(base, scaling, length, ev)
            for protocol in ev.protocols:
                row = {**{k: meta[k] for k in ("run", "name", "encoding", "seed", "train_len")},
                       "scaling": scaling, "length": length, "protocol": protocol, "split": ev.split}
                if model is None:
                    rows.append({**row, "status": "n/a", "note": f"trained table: {limit} positions"})
                    continue
                stride = length if protocol == "nonoverlap" else ev.sliding_stride(length)
                started = time.perf_counter()
                result = perplexity(model, tokens, length, stride=min(stride, length),
                                    batch_size=ev.batch_size, max_tokens=ev.max_tokens, token_bytes=token_bytes)
                rows.append({**row, "status": "ok", **result.to_dict(), "protocol": protocol,
                             "seconds": round(time.perf_counter() - started, 2)})
                log(f"  {meta['name']:<28} {scaling:<8} L={length:<6} {protocol:<10} ppl={result.ppl:10.3f}")
        if ev.per_position:
            curves[scaling] = _curve(base, scaling, lengths, tokens, ev)
    return meta, rows, curves


def _model_for(base: SavedRun, scaling: str, length: int, ev: EvalConfig):
    rope_scaling = scaling_for(scaling, length, base.cfg.train.seq_len, ev.factor)
    return base.model if rope_scaling is None else rescaled(base, rope_scaling)


def _curve(base: SavedRun, scaling: str, lengths: list[int], tokens, ev: EvalConfig) -> Optional[list[float]]:
    limit = base.model.pos.max_len
    usable = [n for n in lengths if limit is None or n <= limit]
    if not usable:
        return None
    length = max(usable)
    model = _model_for(base, scaling, length, ev)
    # Four times the perplexity budget: each position is one sample per window, so the
    # curve needs more windows than a mean over all positions does.
    windows = None if ev.max_tokens is None else max(1, 4 * ev.max_tokens // length)
    try:
        curve = per_position_loss(model, tokens, length, batch_size=ev.batch_size, max_windows=windows)
    except DataError:
        return None
    return [round(float(v), 5) for v in curve]  # nats; more digits would only bloat results.json


def _cache_key(ev: EvalConfig) -> str:
    """What changes the numbers: every eval key but batch_size."""
    key = {k: v for k, v in dataclasses.asdict(ev).items() if k != "batch_size"}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]


def cached_evaluation(run_dir: Path, eval_for: EvalFor, device: str, log) -> tuple[dict, list[dict], dict]:
    """evaluate_run, reusing an earlier result for the same checkpoint and evaluation config."""
    run = RunDir(run_dir)
    cfg = read_run_config(run)
    ev = eval_for(cfg)
    path = run.eval_cache("extrapolation", _cache_key(ev))
    ckpt = run.latest_checkpoint()
    if ckpt is not None and path.exists():
        cached = json.loads(path.read_text())
        if cached.get("checkpoint") == ckpt.name:
            log(f"  reusing {path}")
            # The group hashes the whole config as the schema reads it today: a key added
            # since (e.g. model.attention) must not split a cached seed from a fresh one.
            cached["meta"]["group"] = pooling_group(cfg, cached["meta"].get("tokens_trained"))
            return cached["meta"], cached["rows"], cached["curves"]
    meta, rows, curves = evaluate_run(run.path, ev, device, log)
    path.parent.mkdir(exist_ok=True)
    write_text_atomic(path, json.dumps({"checkpoint": meta["checkpoint"], "meta": meta, "rows": rows,
                                        "curves": curves}))
    return meta, rows, curves


def _label_groups(runs: list[dict], rows: list[dict]) -> None:
    """Label rows by encoding and attention kind; where one such pair has several configs, add
    the run-name stem."""
    # Evaluations cached before attention kinds existed are softmax runs.
    kinds = {run["run"]: encoding_label(run["encoding"], run.get("attention", "softmax")) for run in runs}
    groups_per_kind: dict[str, set] = {}
    for run in runs:
        groups_per_kind.setdefault(kinds[run["run"]], set()).add(run["group"])
    label = {}
    for run in runs:
        kind = kinds[run["run"]]
        label[run["run"]] = kind if len(groups_per_kind[kind]) == 1 else f"{kind} [{run['stem']}]"
        run["label"] = label[run["run"]]
    for row in rows:
        row["label"] = label[row["run"]]


def run_extrapolation(run_dirs: Sequence[Path], out: Path, eval_for: EvalFor = own_eval, device: str = "cpu",
                      log=print, missing: Sequence[dict] = ()) -> dict:
    """Evaluate every run with ``eval_for(its config)`` and write results.json, report.md and plots.

    ``missing`` lists runs that should have been there (``{"run", "error"}``) for the report.
    """
    runs, rows, curves, failures = [], [], {}, list(missing)
    for run_dir in run_dirs:
        log(f"evaluating {run_dir}")
        try:
            meta, run_rows, run_curves = cached_evaluation(Path(run_dir), eval_for, device, log)
        except UserError as e:
            failures.append({"run": str(run_dir), "error": str(e)})
            log(f"  skipped: {e}")
            continue
        runs.append(meta)
        rows.extend(run_rows)
        curves[meta["run"]] = run_curves
    if not runs:
        raise UserError("no run could be evaluated:\n" + "\n".join(f"- {f['run']}: {f['error']}" for f in failures))
    _label_groups(runs, rows)
    results = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": runs, "results": rows,
               "per_position": curves, "missing": failures}
    write_report(results, out)
    return results


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.extrapolation", description=__doc__.split("\n\n")[0],
                                epilog="Flags override the keys of each run's own eval config.")
    p.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    p.add_argument("--lengths", type=int, nargs="+", help="eval.lengths: evaluation lengths")
    p.add_argument("--scaling", nargs="+", choices=SCALING_TYPES, dest="scalings",
                   help="eval.scalings: RoPE scalings to compare (RoPE runs only)")
    p.add_argument("--protocols", nargs="+", choices=["nonoverlap", "sliding"])
    p.add_argument("--stride", type=int, help="eval.stride: sliding-window stride (default: half the length)")
    p.add_argument("--max-tokens", type=int, help="eval.max_tokens: cap on scored tokens per length")
    p.add_argument("--split", choices=["valid", "test"])
    p.add_argument("--factor", type=float, help="eval.factor: fixed RoPE scaling factor (default: L_eval / L_train)")
    p.add_argument("--batch-size", type=int, help="eval.batch_size: windows per forward")
    p.add_argument("--no-per-position", dest="per_position", action="store_const", const=False,
                   help="skip per-position loss curves")
    p.add_argument("--device", default="cpu")
    p.add_argument("--out", type=Path, default=Path("reports/extrapolation"), help="report directory")
    return p.parse_args(argv)


EVAL_FLAGS = ("lengths", "scalings", "protocols", "stride", "max_tokens", "split", "factor", "batch_size",
              "per_position")


@entry_point
def main(argv=None) -> int:
    args = parse_args(argv)
    tree = {key: getattr(args, key) for key in EVAL_FLAGS if getattr(args, key) is not None}
    override_section(EvalConfig(), tree, "command line", "eval.")  # a bad value fails before any work

    def eval_for(cfg: RunConfig) -> EvalConfig:
        return override_section(cfg.eval, tree, "command line", "eval.")

    with torch.inference_mode():
        run_extrapolation(args.runs, args.out, eval_for, device=args.device)
    print(f"wrote {args.out}/report.md, results.json and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
