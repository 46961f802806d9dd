"""A training step reads nothing back from the device except on logging steps: every read
(``item``, ``float``, ``bool``, ``int``, ``tolist``) of a tensor makes the host wait for a GPU,
so a new one in the step would cost every step. Counted on the CPU with the reads patched."""

from __future__ import annotations

import torch

from helpers.runs import write_run_config
from ropelab import train
from ropelab.training.trainer import Trainer

READS = ("item", "tolist", "__float__", "__bool__", "__int__", "__index__")


def test_only_logging_steps_read_values_back(tmp_path, corpus, monkeypatch):
    reads_per_step, counter = [], {"n": 0}
    for name in READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, **kwargs):
            counter["n"] += 1
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(torch.Tensor, name, counted)
    step = Trainer.train_step

    def recorded(self):
        before = counter["n"]
        out = step(self)
        reads_per_step.append(counter["n"] - before)
        return out
    monkeypatch.setattr(Trainer, "train_step", recorded)
    read = Trainer._read
    logged = []
    monkeypatch.setattr(Trainer, "_read", lambda self, *a: logged.append(self.step) or read(self, *a))
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=12", "train.log_interval=4", "train.eval_interval=12",
                       "train.ckpt_interval=12"]) == 0
    assert reads_per_step == [0] * 12  # the steps themselves read nothing
    assert logged == [4, 8, 12]  # one read of (loss, grad norm, divergence watch) per logging step


def test_a_divergence_is_caught_within_one_logging_interval_and_nothing_after_it_is_saved(tmp_path, corpus,
                                                                                          monkeypatch, capsys):
    step = Trainer.train_step

    def poisoned(self):
        if self.step == 5:  # step 6 computes with NaN weights: its loss is NaN
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return step(self)
    monkeypatch.setattr(Trainer, "train_step", poisoned)
    cfg = write_run_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=12", "train.log_interval=4", "train.ckpt_interval=4",
                       "train.eval_interval=100"]) == 2
    err = capsys.readouterr().err
    assert "became non-finite at step 6; the run found it at step 8" in err and "Traceback" not in err
    checkpoints = sorted(p.name for p in (tmp_path / "runs" / "tiny" / "checkpoints").glob("step_*"))
    assert checkpoints == ["step_000004"]  # step 8's weights were never saved
