"""The perplexity sweep's own flags (``ropelab eval``; the common ones are
eval/core/evaluation.py's) and its checks of a run's settings before any work.

``flag_tree`` turns the flags into eval keys; ``preflight`` refuses settings that contradict
each other (a sliding stride no window can have, a stride without the sliding protocol) and
estimates the memory of the sweep's largest forward (training/memory.py), which the driver
checks against the device before anything is evaluated.
"""

from __future__ import annotations

import argparse
import typing
from typing import Optional

from ropelab.common.cli import positive_int
from ropelab.common.errors import ConfigError, UserError
from ropelab.configs.schema import EvalConfig, Protocol, RunConfig
from ropelab.model.encodings import served_length
from ropelab.training.memory import Estimate, forward_estimate, largest
from ropelab.training.validation import windows_per_batch

MEMORY_FIX = "Evaluate shorter lengths (--lengths), or fewer windows per forward (--batch-size)."


def add_flags(p: argparse.ArgumentParser) -> None:
    """The flags of the perplexity sweep (the common ones are eval/core/evaluation.py's)."""
    p.add_argument("--protocols", nargs="+", choices=typing.get_args(Protocol), help="eval.protocols")
    p.add_argument("--target-tokens", type=positive_int,
                   help="eval.target_tokens: targets per span of the same-tokens protocol (default: the shortest length)")
    p.add_argument("--stride", type=positive_int, help="eval.stride: sliding-window stride (default: half the length)")
    p.add_argument("--max-tokens", type=positive_int, help="eval.max_tokens: tokens scored per length (spread over the split)")
    p.add_argument("--all-tokens", action="store_true", help="score the whole split (eval.max_tokens: null)")
    p.add_argument("--split", choices=["valid", "test"], help="eval.split: which split of the run's own data")
    p.add_argument("--batch-size", type=positive_int, help="eval.batch_size: windows per forward")
    p.add_argument("--reference", metavar="ROW",
                   help="eval.reference: the report row every other row is compared with, paired, e.g. "
                        "'nope (linear attention)' (default rope; cached evaluations are reused)")
    p.add_argument("--no-per-position", dest="per_position", action="store_const", const=False,
                   help="skip the per-position loss curves")
    p.add_argument("--data", nargs="+", metavar="SOURCE",
                   help="evaluate on another corpus: files, directories or globs; 'builtin'; or 'hub:NAME' "
                        "(a preset or repo[:config]); always with each run's own tokenizer")
    p.add_argument("--documents", choices=["line", "paragraph", "file", "wikitext"],
                   help="what one document of --data is (default: file for local files, else line)")
    p.add_argument("--data-split", help="with --data hub:NAME: the dataset's split (default: its validation split)")
    p.add_argument("--within-document", action="store_true",
                   help="windows never cross a document boundary (shorter documents are skipped and counted)")
    p.add_argument("--allow-unfinished", action="store_true", help="evaluate runs whose training has not finished")


EVAL_FLAGS = ("protocols", "target_tokens", "stride", "max_tokens", "split", "batch_size", "per_position", "reference")


def flag_tree(args: argparse.Namespace) -> dict:
    """This command's own flags as a tree of eval keys (only those given)."""
    tree = {key: getattr(args, key) for key in EVAL_FLAGS if getattr(args, key) is not None}
    if args.all_tokens:
        if args.max_tokens is not None:
            raise UserError("--all-tokens and --max-tokens contradict each other; give one")
        tree["max_tokens"] = None
    corpus = corpus_from_flags(args)
    if corpus is not None:
        tree["corpora"] = [corpus]
    return tree


def corpus_from_flags(args: argparse.Namespace) -> Optional[dict]:
    """The eval.corpora entry the --data flags describe, or None (each run's own corpus)."""
    if args.data is None:
        if args.documents or args.data_split or args.within_document:
            raise UserError("--documents, --data-split and --within-document describe a --data corpus; "
                            "add --data (or set eval.corpora in the run's config)")
        return None
    corpus: dict = {"within_document": args.within_document}
    if args.documents:
        corpus["documents"] = args.documents
    if args.data == ["builtin"]:
        corpus.update(source="builtin")
    elif len(args.data) == 1 and args.data[0].startswith("hub:"):
        corpus.update(source="hub", hub=args.data[0][4:], split=args.data_split)
    else:
        corpus.update(source="local", paths=list(args.data))
    return corpus


def corpus_plans(cfg: RunConfig, ev: EvalConfig) -> list[tuple[list[int], list[str]]]:
    """(lengths, protocols) of every corpus the sweep scores for a run."""
    return [(sorted(set(corpus.lengths)) or ev.resolved_lengths(cfg.train.seq_len), list(corpus.protocols or ev.protocols))
            for corpus in ev.corpora]


def check_stride(ev: EvalConfig, plans: list[tuple[list[int], list[str]]]) -> None:
    """A sliding stride scores the last ``stride`` targets of each window: it must be a
    stride the sliding protocol is evaluated with, and no longer than any of its windows."""
    if ev.stride is None:
        return
    sliding = [lengths for lengths, protocols in plans if "sliding" in protocols]
    if not sliding:
        protocols = sorted({p for _, ps in plans for p in ps})
        raise ConfigError(f"eval.stride={ev.stride} (--stride) is the sliding protocol's, which this evaluation "
                          f"does not use (protocols: {', '.join(protocols)}); add --protocols sliding, or drop "
                          "--stride")
    shortest = min(min(lengths) for lengths in sliding)
    if ev.stride > shortest:
        raise ConfigError(f"eval.stride={ev.stride} (--stride) is longer than the evaluated length {shortest}: a "
                          "sliding window scores its last stride targets, so no window can be that far from the "
                          f"next; give a stride of at most {shortest}, or leave it unset (half of each length)")


def preflight(cfg: RunConfig, ev: EvalConfig) -> Optional[Estimate]:
    """Before any evaluation of a run: the stride checks, and the memory of its largest
    forward (lengths past a learned table are never evaluated, so they need none)."""
    plans = corpus_plans(cfg, ev)
    check_stride(ev, plans)
    limit = served_length(cfg.model.pos)
    estimates = []
    for lengths, _ in plans:
        for length in lengths:
            if limit is not None and length > limit:
                continue
            batch = windows_per_batch(length, ev.batch_size)
            estimates.append(forward_estimate(cfg.model, batch, length,
                                              f"evaluating {cfg.name} at length {length:,} ({batch} "
                                              f"window{'s' if batch > 1 else ''} per forward)"))
    return largest(estimates)
