"""Length extrapolation of trained runs: ``python -m eval.extrapolation RUN_DIR... [options]``.

For every run, every RoPE scaling asked for (RoPE runs only; ``factor = L_eval / L_train``
unless ``--factor`` is given, so lengths up to L_train are plain RoPE) and every length:
perplexity under each protocol, plus the per-position loss at the longest length. Writes
``results.json``, ``report.md`` and PNG plots into ``--out`` (see eval/report.py).

Lengths a learned table cannot serve are recorded as ``n/a`` with the table size, never
evaluated (and never a crash). Everything a run needs is read from its directory.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from configs import config_to_dict
from configs.schema import EvalConfig
from data.prepare import prepare_data
from eval.perplexity import per_position_loss, perplexity
from eval.report import encoding_label, write_report
from model.config import RopeScalingConfig
from model.errors import DataError, UserError
from model.checkpoint import latest_checkpoint
from model.load import load_run, rescaled

SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "llama3")


@dataclass
class Settings:
    """What to evaluate; None fields fall back to each run's own ``eval`` config."""

    lengths: Optional[list[int]] = None
    scalings: Optional[list[str]] = None
    protocols: Optional[list[str]] = None
    stride: Optional[int] = None
    max_tokens: Optional[int] = None
    split: Optional[str] = None
    factor: Optional[float] = None  # fixed scaling factor instead of L_eval / L_train
    batch_size: int = 8
    device: str = "cpu"
    per_position: bool = True


def scaling_for(kind: str, length: int, train_len: int, factor: Optional[float]) -> Optional[RopeScalingConfig]:
    """The RoPE scaling at one evaluation length; None where it reduces to plain RoPE."""
    s = factor if factor is not None else length / train_len
    if kind == "none" or s <= 1.0:
        return None
    return RopeScalingConfig(type=kind, factor=s, original_max_len=train_len)


def run_metadata(run) -> dict:
    cfg, meta = run.cfg, run.meta
    identity = config_to_dict(cfg)
    for section, key in (("train", "seed"), ("train", "resume"), ("train", "device")):
        identity[section].pop(key, None)
    for key in ("name", "out_dir", "eval", "log"):
        identity.pop(key, None)
    group = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    return {"run": str(run.run_dir), "name": cfg.name, "encoding": cfg.model.pos.kind, "group": group,
            "stem": re.sub(r"[_-]?seed[-=]?\d+", "", cfg.name) or cfg.name,
            "pairing": cfg.model.pos.rope.pairing if cfg.model.pos.kind == "rope" else None,
            "params": run.model.num_params(), "tokens_trained": meta.get("tokens"),
            "steps": meta.get("step"), "train_len": cfg.train.seq_len, "seed": cfg.train.seed,
            "max_positions": run.model.pos.max_positions, "git_commit": meta.get("git_commit"),
            "checkpoint": run.checkpoint.name}


def _split_tokens(run, split: str) -> np.ndarray:
    data_cfg = run.cfg.data
    if data_cfg.tokenizer.kind == "file":  # the run's own copy, wherever the run was moved
        tokenizer = dataclasses.replace(data_cfg.tokenizer, path=str(run.run_dir / "tokenizer.json"))
        data_cfg = dataclasses.replace(data_cfg, tokenizer=tokenizer)
    data = prepare_data(data_cfg, progress=False)
    if data.tokenizer != run.tokenizer:
        raise DataError(f"the prepared data for {run.run_dir} was tokenized differently from the "
                        "run's tokenizer.json; delete the data cache and evaluate again")
    if split not in data.splits:
        raise DataError(f"{run.run_dir}: the corpus has no '{split}' split (has {data.splits})")
    return data.split(split)


def evaluate_run(run_dir: Path, settings: Settings, log=print) -> tuple[dict, list[dict], dict]:
    """(metadata, result rows, per-position curves by scaling) for one run."""
    base = load_run(run_dir, device=settings.device)
    ev: EvalConfig = base.cfg.eval
    train_len = base.cfg.train.seq_len
    lengths = settings.lengths or ev.resolved_lengths(train_len)
    protocols = settings.protocols or ev.protocols
    split = settings.split or ev.split
    max_tokens = settings.max_tokens if settings.max_tokens is not None else ev.max_tokens
    kind = base.cfg.model.pos.kind
    scalings = (settings.scalings or ev.scalings) if kind == "rope" else ["none"]
    scalings = sorted(set(scalings), key=lambda name: (name != "none", SCALINGS.index(name)))
    meta = run_metadata(base)
    tokens = _split_tokens(base, split)
    token_bytes = base.tokenizer.token_bytes()
    rows, curves = [], {}
    limit = base.model.pos.max_positions
    for scaling in scalings:
        for length in lengths:
            plain = scaling != "none" and scaling_for(scaling, length, train_len, settings.factor) is None
            if plain and "none" in scalings:  # factor 1 is plain RoPE: copy, don't recompute
                rows += [{**r, "scaling": scaling} for r in rows if r["scaling"] == "none" and r["length"] == length]
                continue
            model = None if limit is not None and length > limit else \
                _model_for(base, scaling, length, train_len, settings)
            for protocol in protocols:
                row = {**{k: meta[k] for k in ("run", "name", "encoding", "seed", "train_len")},
                       "scaling": scaling, "length": length, "protocol": protocol, "split": split}
                if model is None:
                    rows.append({**row, "status": "n/a", "note": f"trained table: {limit} positions"})
                    continue
                stride = length if protocol == "nonoverlap" else (settings.stride or ev.sliding_stride(length))
                started = time.perf_counter()
                result = perplexity(model, tokens, length, stride=min(stride, length),
                                    batch_size=settings.batch_size, max_tokens=max_tokens, token_bytes=token_bytes)
                rows.append({**row, "status": "ok", **result.to_dict(), "protocol": protocol,
                             "seconds": round(time.perf_counter() - started, 2)})
                log(f"  {meta['name']:<28} {scaling:<8} L={length:<6} {protocol:<10} ppl={result.ppl:10.3f}")
        if settings.per_position:
            curves[scaling] = _curve(base, scaling, lengths, train_len, tokens, max_tokens, settings)
    return meta, rows, curves


def _model_for(base, scaling: str, length: int, train_len: int, settings: Settings):
    rope_scaling = scaling_for(scaling, length, train_len, settings.factor)
    if rope_scaling is None:
        return base.model
    return rescaled(base, rope_scaling)


def _curve(base, scaling, lengths, train_len, tokens, max_tokens, settings) -> Optional[list[float]]:
    limit = base.model.pos.max_positions
    usable = [n for n in lengths if limit is None or n <= limit]
    if not usable:
        return None
    length = max(usable)
    model = _model_for(base, scaling, length, train_len, settings)
    # Four times the perplexity budget: each position is one sample per window, so the
    # curve needs more windows than a mean over all positions does.
    windows = None if max_tokens is None else max(1, 4 * max_tokens // length)
    try:
        curve = per_position_loss(model, tokens, length, batch_size=settings.batch_size, max_windows=windows)
    except DataError:
        return None
    return [round(float(v), 5) for v in curve]  # nats; more digits would only bloat results.json


def _cached_evaluation(run_dir: Path, settings: Settings, log) -> tuple[dict, list[dict], dict]:
    """evaluate_run, reusing an earlier result for the same checkpoint and settings."""
    key = json.dumps({k: v for k, v in _settings_dict(settings).items() if k not in ("device", "batch_size")},
                     sort_keys=True)
    path = run_dir / "eval" / f"extrapolation-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"
    ckpt = latest_checkpoint(run_dir) if (run_dir / "config.yaml").exists() else None
    if ckpt is not None and path.exists():
        cached = json.loads(path.read_text())
        if cached.get("checkpoint") == ckpt.name:
            log(f"  reusing {path}")
            return cached["meta"], cached["rows"], cached["curves"]
    meta, rows, curves = evaluate_run(run_dir, settings, log)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps({"checkpoint": meta["checkpoint"], "settings": key, "meta": meta,
                                "rows": rows, "curves": curves}))
    return meta, rows, curves


def _label_groups(runs: list[dict], rows: list[dict]) -> None:
    """Label rows by encoding; where one encoding has several configs, add the run-name stem."""
    groups_per_kind: dict[str, set] = {}
    for run in runs:
        groups_per_kind.setdefault(run["encoding"], set()).add(run["group"])
    label = {}
    for run in runs:
        kind = encoding_label(run["encoding"])
        label[run["run"]] = kind if len(groups_per_kind[run["encoding"]]) == 1 else f"{kind} [{run['stem']}]"
        run["label"] = label[run["run"]]
    for row in rows:
        row["label"] = label[row["run"]]


def run_extrapolation(run_dirs: list[Path], settings: Settings, out: Path, log=print,
                      missing: list[dict] = ()) -> dict:
    """Evaluate every run and write results.json, report.md and plots into ``out``.

    ``missing`` lists runs that should have been there (``{"run", "error"}``) for the report.
    """
    runs, rows, curves, failures = [], [], {}, list(missing)
    for run_dir in run_dirs:
        log(f"evaluating {run_dir}")
        try:
            meta, run_rows, run_curves = _cached_evaluation(Path(run_dir), settings, log)
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
    results = {"created": time.strftime("%Y-%m-%d %H:%M:%S"), "settings": _settings_dict(settings),
               "runs": runs, "results": rows, "per_position": curves, "missing": failures}
    write_report(results, out)
    return results


def _settings_dict(s: Settings) -> dict:
    return dict(vars(s))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m eval.extrapolation", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    p.add_argument("--lengths", type=int, nargs="+", help="evaluation lengths (default: each run's eval config)")
    p.add_argument("--scaling", nargs="+", choices=SCALINGS, dest="scalings",
                   help="RoPE scalings to compare (RoPE runs only)")
    p.add_argument("--protocols", nargs="+", choices=["nonoverlap", "sliding"])
    p.add_argument("--stride", type=int, help="sliding-window stride (default: half the length)")
    p.add_argument("--max-tokens", type=int, help="cap on scored tokens per length")
    p.add_argument("--split", choices=["valid", "test"])
    p.add_argument("--factor", type=float, help="fixed RoPE scaling factor (default: L_eval / L_train)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-per-position", action="store_true", help="skip per-position loss curves")
    p.add_argument("--out", type=Path, default=Path("reports/extrapolation"), help="report directory")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    settings = Settings(lengths=args.lengths, scalings=args.scalings, protocols=args.protocols,
                        stride=args.stride, max_tokens=args.max_tokens, split=args.split,
                        factor=args.factor, batch_size=args.batch_size, device=args.device,
                        per_position=not args.no_per_position)
    try:
        with torch.inference_mode():
            run_extrapolation(args.runs, settings, args.out)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}/report.md, results.json and plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
