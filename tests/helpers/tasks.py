"""The synthetic tasks' tokenizer and instances, rows of a task report, and a stand-in model
whose predictions a test writes down."""

from __future__ import annotations

import numpy as np
import torch

from ropelab.configs.tasks import SyntheticConfig
from ropelab.data.tasks import TaskData, build_task

TOK = TaskData(SyntheticConfig()).tokenizer


def task(name: str, **cfg):
    return build_task(name, SyntheticConfig(**cfg), TOK)


def text_of(tokens) -> str:
    return TOK.decode(np.asarray(tokens).tolist())


def answer_of(inst) -> str:
    return text_of(inst.tokens[inst.answer])


def cell_row(run: str, seed: int, length: int, correct: int, total: int = 10, **extra) -> dict:
    """One scored cell of a task report's results (copy, 32 tokens of training length)."""
    return {"run": run, "name": run, "encoding": "rope", "seed": seed, "train_len": 32, "task": "copy",
            "scaling": "none", "length": length, "depth": None, "status": "ok", "correct": correct, "total": total,
            "accuracy": correct / total, "ci_low": 0.0, "ci_high": 1.0, **extra}


class FixedPredictions(torch.nn.Module):
    """A stand-in model whose next-token prediction at position t is ``table[t]`` for every row
    (at explicit ``positions`` when decoding with a cache, which it needs none of)."""

    def __init__(self, table: list[int], vocab: int = 10):
        super().__init__()
        self.table, self.cfg = table, type("Cfg", (), {"vocab_size": vocab})()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x, positions=None):
        positions = torch.arange(x.shape[1]) if positions is None else positions
        logits = torch.zeros(x.shape[0], x.shape[1], self.cfg.vocab_size)
        logits[:, torch.arange(x.shape[1]), torch.tensor([self.table[p] for p in positions.tolist()])] = 1.0
        return logits

    def setup_cache(self, batch_size: int, max_len: int) -> None:  # the table needs no past
        pass

    def clear_cache(self) -> None:
        pass
