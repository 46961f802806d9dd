"""Retrieval instances mixed into a text run's batches (data.mix): batches, resume, scoring, bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from ropelab import train
from ropelab.common.errors import ConfigError
from ropelab.configs import load_config
from helpers.runs import write_run_config
from ropelab.data.samplers import TrainSampler
from ropelab.data.tasks import TaskSampler, build_task
from ropelab.eval.tasks import exact_match as eval_tasks
from ropelab.model.loss import IGNORE_INDEX
from ropelab.training.data import MixedData, MixedSampler, mix_weights, mixed_rows, prepare
from ropelab.training.runtime import Runtime

CPU = Runtime(torch.device("cpu"), torch.float32)

MIX = ["data.mix.tasks=[passkey,multikey]", "data.mix.fraction=0.25", "data.synthetic.needles=2",
       "data.synthetic.distractors=1", "train.seq_len=64"]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("mix")
    cfg = write_run_config(tmp, corpus)
    return tmp, cfg, load_config(cfg, MIX)


def test_a_batch_is_text_windows_then_task_instances(mixed):
    tmp, _, cfg = mixed
    data = prepare(cfg, CPU)
    assert isinstance(data, MixedData) and mixed_rows(cfg.data.mix, 8) == 2
    sampler = data.train_sampler(64, 8, seed=5)
    x, y = sampler.next_batch()
    text = TrainSampler(data.train, 64, 6, seed=5).next_batch()
    tasks = TaskSampler(data.tasks, 64, 2, 5, data.tokenizer.eot_id).next_batch()
    assert torch.equal(x[:6], text[0]) and torch.equal(y[:6], text[1])  # every text target counts
    assert torch.equal(x[6:], tasks[0]) and torch.equal(y[6:], tasks[1])
    assert ((y[6:] != IGNORE_INDEX).sum(dim=1) > 0).all() and (y[6:] == IGNORE_INDEX).float().mean() > 0.8
    # In the run's own tokenizer, in the task wording.
    words = [data.tokenizer.decode(row[row != data.tokenizer.eot_id].tolist()) for row in x[6:]]
    assert all("the grass" in w or ": " in w for w in words)
    again = data.train_sampler(64, 8, seed=5)
    again.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert isinstance(again, MixedSampler) and again.batches_drawn == 1
    assert torch.equal(again.next_batch()[0], sampler.next_batch()[0])


def test_a_mixed_run_trains_validates_on_text_and_is_scored_on_its_tasks(mixed, tmp_path):
    tmp, cfg_path, _ = mixed
    args = [str(cfg_path), *MIX, "train.max_steps=6", "train.eval_interval=3", "train.ckpt_interval=3"]
    assert train.main([*args, "name=mixed"]) == 0
    run = tmp / "runs" / "mixed"
    val = [json.loads(line)["val_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()
           if "val_loss" in line]
    assert len(val) == 2 and all(np.isfinite(val))
    results = eval_tasks.run_task_evaluation([run], tmp_path / "rep", lambda c: load_config(
        cfg_path, [*MIX, "eval.lengths=[64]", "eval.tasks.samples=2", "eval.tasks.depths=[0.5]"]).eval)
    assert {r["task"] for r in results["results"]} == {"passkey", "multikey"}  # its own mix, not the paper's
    assert results["runs"][0]["trained_on"] == "text (local) + 0.25 passkey+multikey"


def test_the_task_rows_carry_their_share_of_the_loss(mixed, tmp_path):
    """By default a task row weighs what a text row does (2 of 8 rows: a quarter of the loss),
    whatever its few answer tokens; data.mix.loss_share sets the share; the trainer's step
    uses it."""
    from ropelab.model.transformer import Transformer
    from ropelab.training.trainer import Trainer

    _, cfg_path, cfg = mixed
    data = prepare(cfg, CPU)
    x, y = data.train_sampler(64, 8, seed=5).next_batch()
    torch.manual_seed(0)
    model = Transformer(cfg.with_vocab_size(data.tokenizer.vocab_size).model)
    with torch.no_grad():
        nll = model(x, targets=y, reduction="none")
        scored = (y != IGNORE_INDEX).float()
        text, task = nll[:6].sum() / scored[:6].sum(), nll[6:].sum() / scored[6:].sum()
        for share, sampler in ((0.25, data.train_sampler(64, 8, seed=5)),
                               (0.6, prepare(load_config(cfg_path, [*MIX, "data.mix.loss_share=0.6"]), CPU)
                                .train_sampler(64, 8, seed=5))):
            assert sampler.loss_share == pytest.approx(share)
            weights = sampler.target_weights(sampler.next_batch()[1])
            torch.testing.assert_close(model(x, targets=y, target_weights=weights), (1 - share) * text + share * task)
        assert abs(float(model(x, targets=y)) - float(0.75 * text + 0.25 * task)) > 1e-3  # the plain mean differs
    run_cfg = load_config(cfg_path, [*MIX, "data.mix.loss_share=0.6", "train.batch_size=8", "train.compile=false",
                                     f"out_dir={tmp_path}", "name=share"])
    trainer = Trainer(run_cfg, CPU)
    xs, ys = prepare(run_cfg, CPU).train_sampler(64, 8, seed=run_cfg.train.seed).next_batch()
    with torch.no_grad():
        weights = mix_weights(ys, 2, 0.6)
        expected = float(trainer.model(xs, targets=ys, target_weights=weights))
    loss, _ = trainer.train_step()
    assert float(loss) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("overrides,message", [
    (["data.mix.tasks=[copy]", "data.mix.fraction=0.25"], "copy exist only in the synthetic task alphabet"),
    (["data.mix.tasks=[passkey]"], "data.mix.tasks and data.mix.fraction go together"),
    (["data.mix.tasks=[passkey]", "data.mix.fraction=0.01"], "it must leave at least one task row"),
    (["data.mix.tasks=[passkey]", "data.mix.fraction=1.0"], "data.mix.fraction must be in [0, 1)"),
    (["data.mix.tasks=[passkey]", "data.mix.fraction=0.5", "data.mix.loss_share=1.0"],
     "data.mix.loss_share must be in (0, 1)"),
    (["data.mix.loss_share=0.5"], "set data.mix.tasks and data.mix.fraction too"),
    (["data.source=synthetic", "data.tokenizer.kind=char", "data.mix.tasks=[passkey]", "data.mix.fraction=0.5"],
     "a synthetic run trains on data.synthetic.tasks alone"),
])
def test_bad_mixes_are_clear(mixed, overrides, message):
    _, cfg_path, _ = mixed
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(cfg_path, overrides)


def test_a_task_that_cannot_fill_the_training_length_stops_before_training(mixed, tmp_path):
    _, cfg_path, _ = mixed
    assert train.main([str(cfg_path), *MIX, "train.seq_len=24", f"out_dir={tmp_path}", "name=short"]) == 2
    assert not (tmp_path / "short" / "checkpoints").exists()
    with pytest.raises(Exception, match="multikey with 2 needles needs at least"):
        build_task("multikey", load_config(cfg_path, MIX).data.synthetic, prepare(
            load_config(cfg_path, MIX), CPU).tokenizer).check_length(24, "train.seq_len")


def test_a_mixed_parent_trains_to_competence_and_its_fine_tunes_read_its_wording(mixed, tmp_path, capsys):
    """The stop scores a text run's mixed tasks; a child fine-tuned on text alone is scored on
    its parent's tasks as the parent learned them, and must keep the parent's task settings."""
    tmp, cfg_path, _ = mixed
    base = [str(cfg_path), *MIX, "train.eval_interval=3", "train.ckpt_interval=3", f"out_dir={tmp_path}"]
    assert train.main([*base, "train.max_steps=3", "train.stop_at_accuracy=0.99", "name=parent"]) == 0
    parent = tmp_path / "parent"
    record = [json.loads(line) for line in (parent / "metrics.jsonl").read_text().splitlines()][-1]
    assert {"val_acc_passkey", "val_acc_multikey"} <= set(record)
    assert "competence NOT reached: the budget of 3 steps ran out" in capsys.readouterr().out
    child = [str(cfg_path), "data.synthetic.needles=2", "data.synthetic.distractors=1", "train.seq_len=64",
             f"init.run={parent}", "train.max_steps=2", "train.eval_interval=2", "train.ckpt_interval=2",
             f"out_dir={tmp_path}", "name=child"]
    cfg = load_config(child[0], child[1:])
    assert eval_tasks.resolved_tasks(cfg, cfg.eval, eval_tasks.planned_parent(cfg)) == ["passkey", "multikey"]
    assert eval_tasks.resolved_tasks(cfg, cfg.eval) == ["passkey"]  # without its parent: the paper's passkey
    eval_tasks.check_planned(cfg, cfg.eval, "grid")  # multikey is readable: the parent learned its wording
    assert train.main(child) == 0
    results = eval_tasks.run_task_evaluation([tmp_path / "child"], tmp_path / "rep", lambda c: load_config(
        cfg_path, [*MIX, "eval.lengths=[64]", "eval.tasks.samples=2", "eval.tasks.depths=[0.5]"]).eval)
    assert {r["task"] for r in results["results"]} == {"passkey", "multikey"}
    assert results["runs"][0]["parent"]["mix"] == ["passkey", "multikey"]
    # Other task settings than the parent's would score the child on instances the parent never saw.
    assert train.main([*child[:1], "data.synthetic.needles=3", *child[2:-1], "name=other"]) == 2
    assert "learned its retrieval tasks with other data.synthetic settings" in capsys.readouterr().err
    assert not (tmp_path / "other" / "checkpoints").exists()
