"""Training requests that cannot work, found before any work, and training that goes wrong
on the way: each stops with exit 2 and a message, keeps what was saved, and its advice,
followed as written, trains.

- a resume that would cut the learning-rate schedule short (it was re-planned silently);
- a loss that becomes NaN, before and after the first checkpoint (the advice was to lower
  train.lr and --resume, which is then refused as another experiment);
- a validation split shorter than one window (found at the first validation, mid-run);
- a step that cannot fit in memory, for text and for synthetic tasks (a numpy allocation
  error), and a grid whose time estimate would time such a step.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from ropelab import train
from helpers.bad_input import cli, follow, limit_memory, refused, refused_in_process, snapshot
from ropelab.configs import load_config
from ropelab.configs.grid import load_grid
from helpers import ROOT
from helpers.runs import stop_after, write_grid, write_run_config
from ropelab.grid.estimate import estimate_grid
from ropelab.common.cli import entry_point
from ropelab.training import memory
from ropelab.training.memory import training_estimate
from ropelab.training.trainer import Trainer


@pytest.fixture
def config(tmp_path, corpus) -> Path:
    return write_run_config(tmp_path, corpus)


def stopped_at(monkeypatch, step: int, argv: list[str]) -> None:
    """Train ``argv`` until a SIGTERM arrives during step ``step`` (a checkpoint is saved then)."""
    with monkeypatch.context() as m:
        stop_after(step, m)
        assert train.main(argv) == 128 + signal.SIGTERM


# --------------------------------------------------------------- resuming

def test_resuming_for_fewer_steps_than_planned(config, monkeypatch, capsys):
    run = config.parent / "runs" / "tiny"
    stopped_at(monkeypatch, 4, [str(config), "train.max_steps=12"])
    before = snapshot(run / "checkpoints")
    refused_in_process(train.main, [str(config), "train.max_steps=8", "--resume"], capsys,
                       "cannot resume", "planned for 12", "is at step 4", "Resume with train.max_steps=12")
    assert snapshot(run / "checkpoints") == before
    assert train.main([str(config), "train.max_steps=12", "--resume"]) == 0  # the advice
    meta = json.loads((run / "checkpoints" / "step_000012" / "meta.json").read_text())
    assert meta["finished"] and meta["schedules"] == [[0, 12]]  # resumed on its plan: one schedule


def test_resuming_for_more_steps_says_the_schedule_is_re_planned(config, monkeypatch, capsys):
    run = config.parent / "runs" / "tiny"
    stopped_at(monkeypatch, 4, [str(config), "train.max_steps=12"])
    capsys.readouterr()
    assert train.main([str(config), "train.max_steps=16", "--resume"]) == 0
    assert "was planned for 12 steps and now trains for 16: its learning-rate schedule is re-planned from step 4" \
        in capsys.readouterr().err
    # The checkpoint keeps both plans, so the reports can say the run is not a fresh 16-step run.
    assert json.loads((run / "checkpoints" / "step_000016" / "meta.json").read_text())["schedules"] == [[0, 12], [4, 16]]


# --------------------------------------------------------------- a loss that becomes NaN

def nan_at(monkeypatch, step: int) -> None:
    """Training's weights become NaN just before step ``step`` (as a divergence leaves them)."""
    original = Trainer.train_step

    def poisoned(self):
        if self.step == step - 1:
            with torch.no_grad():
                next(self.model.parameters()).fill_(float("nan"))
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", poisoned)


def test_a_nan_loss_after_a_checkpoint_is_carried_on_as_advised(config, monkeypatch, capsys):
    run = config.parent / "runs" / "tiny"
    with monkeypatch.context() as m:
        nan_at(m, 8)
        err = refused_in_process(train.main, [str(config), "train.max_steps=12", "train.ckpt_interval=5"], capsys,
                                 "the loss or the gradient norm became non-finite at step 8", "nothing it saved was changed",
                                 "Carry on from step 5 (step_000005", "init.step=5", "train.lr=0.0015",
                                 "train.max_steps=7")
    assert "--resume" not in err
    assert follow(err, capsys) == 0
    child = run.parent / "tiny-from5-lr0.0015"
    meta = json.loads((child / "checkpoints" / "step_000007" / "meta.json").read_text())
    assert meta["finished"] and meta["parent"]["run"] == str(run) and meta["parent"]["step"] == 5


def test_a_nan_loss_before_any_checkpoint_is_trained_again_as_advised(config, monkeypatch, capsys):
    with monkeypatch.context() as m:
        nan_at(m, 2)
        err = refused_in_process(train.main, [str(config), "train.max_steps=6"], capsys,
                                 "the loss or the gradient norm became non-finite at step 2", "It has no checkpoint yet",
                                 "train.lr=0.0015")
    assert follow(err, capsys) == 0
    assert (config.parent / "runs" / "tiny" / "checkpoints" / "step_000006").is_dir()


def test_a_learning_rate_that_diverges(config):
    res = cli("train.py", str(config), "train.lr=1e12", "train.grad_clip=0", "train.max_steps=6")
    refused(res, "became non-finite at step", "half the learning rate")


# --------------------------------------------------------------- data that cannot work

def test_a_validation_split_shorter_than_one_window(config, tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("the cat sat on a mat\n")  # 21 bytes: fewer than train.seq_len + 1 = 33
    argv = [str(config), f"data.local.valid=[{short}]", "train.max_steps=4"]
    refused_in_process(train.main, argv, capsys, "the validation split has 21 tokens, fewer than one window of "
                                                 "train.seq_len + 1 = 33", "or a shorter train.seq_len")
    assert not (config.parent / "runs" / "tiny").exists()  # found before training started
    assert train.main([*argv, "train.seq_len=16"]) == 0


# --------------------------------------------------------------- memory

def test_a_training_step_that_cannot_fit(config, tmp_path, capsys, monkeypatch):
    model = load_config(config).with_vocab_size(256).model  # the byte tokenizer's
    fits, too_big = training_estimate(model, 1, 512), training_estimate(model, 8, 512)
    limit_memory(monkeypatch, tmp_path, (fits.total + too_big.total) / 2)
    argv = [str(config), "train.seq_len=512", "train.max_steps=2", "train.eval_batches=1"]
    refused_in_process(train.main, argv, capsys, "training at train.batch_size=8 × train.seq_len=512 needs about",
                       "nothing was started", "Lower train.batch_size (raising train.grad_accum keeps")
    assert not (config.parent / "runs" / "tiny").exists()
    assert train.main([*argv, "train.batch_size=1", "train.grad_accum=8"]) == 0  # the advice


@pytest.mark.parametrize("free_gb, outcome", [(150, "fits"), (50, "warned"), (20, "refused")])
def test_on_cuda_only_an_estimate_far_past_the_free_memory_is_refused(monkeypatch, caplog, free_gb, outcome):
    """CUDA estimates are uncalibrated (activations counted as float32 where autocast keeps
    bf16): an estimate up to CUDA_MARGIN times the free memory goes ahead with a warning,
    since torch's out-of-memory error ends such a run cleanly; beyond, it is refused."""
    monkeypatch.setattr(memory, "available_memory", lambda device: (free_gb * 10**9, "free on cuda (test)"))
    estimate = memory.Estimate("training cope", (("activations", 123e9),))
    if outcome == "refused":
        with pytest.raises(memory.MemoryLimitError, match="needs about 123 GB.*nothing was started. Lower it"):
            memory.check_fits(estimate, "cuda", "Lower it.")
        return
    memory.check_fits(estimate, "cuda", "Lower it.")
    err = caplog.text
    assert ("warning: training cope needs about 123 GB" in err and "not calibrated" in err) == (outcome == "warned")
    with pytest.raises(memory.MemoryLimitError):  # the CPU's estimates are calibrated: refused there
        monkeypatch.setattr(memory, "available_memory", lambda device: (50 * 10**9, "MemAvailable"))
        memory.check_fits(estimate, "cpu", "Lower it.")


def test_a_device_that_runs_out_of_memory_ends_with_a_message(capsys):
    """torch's out-of-memory error (a GPU's) is exit 2 with advice, not a traceback."""
    @entry_point
    def main() -> int:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore details")

    assert main() == 2
    err = capsys.readouterr().err
    assert "error: the device ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB)" in err
    assert "smaller train.batch_size" in err and "Traceback" not in err


def test_a_synthetic_task_with_an_enormous_length(tmp_path):
    """A numpy allocation error before; text corpora had a message for the same thing."""
    res = cli("train.py", "configs/synthetic-cpu.yaml", f"out_dir={tmp_path}", "train.seq_len=100000000")
    refused(res, "training at train.batch_size=32 × train.seq_len=100000000 needs about", "validation set")
    assert not any(tmp_path.iterdir())


def test_a_grid_does_not_time_a_step_that_cannot_fit(config):
    """The grid's time estimate trains a few steps of each shape: one that cannot fit is not
    timed, and says why (its run is refused with the same message when it trains)."""
    path = write_grid(config.parent, name="g", base=config, file="grid", out_dir=config.parent / "grid",
                      axes={"train.seq_len": [32, 1000000000]})
    grid = load_grid(path)
    estimates = estimate_grid(grid, grid.plan(), None)
    assert estimates["seq_len-1000000000"].failed
    assert estimates["seq_len-1000000000"].note.startswith("no estimate: training at train.batch_size=8 × "
                                                           "train.seq_len=1000000000 needs about")
    assert estimates["seq_len-32"].train_s > 0


# --------------------------------------------------------------- wandb, as its environment variables set it

def test_wandb_mode_from_the_environment_is_respected(config):
    """log.wandb_mode defaulted to online and overrode WANDB_MODE=offline: wandb asked for a
    login and its UsageError escaped as a traceback."""
    pytest.importorskip("wandb")
    res = cli("train.py", str(config), "log.wandb=true", "train.max_steps=2", "train.warmup_steps=1",
              env={"WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true",
                   "HTTPS_PROXY": "http://127.0.0.1:9"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert list((config.parent / "runs" / "tiny" / "wandb").glob("offline-run-*"))


def test_a_wandb_failure_is_one_error_line(config, capsys, monkeypatch):
    wandb = pytest.importorskip("wandb")

    def no_login(**settings):
        raise wandb.errors.UsageError("No API key configured. Use `wandb login` to log in.")
    monkeypatch.setattr(wandb, "init", no_login)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    err = refused_in_process(train.main, [str(config), "log.wandb=true", "train.max_steps=2", "train.warmup_steps=1"],
                             capsys, "error: log.wandb=true: wandb could not start in online mode (UsageError: No "
                             "API key configured", "WANDB_MODE=offline", "log.wandb=false")
    assert err.count("error:") == 1 and "Traceback" not in err


# --------------------------------------------------------------- settings the evaluation after training cannot use

def test_more_questions_asked_than_needles_is_refused_before_training(tmp_path, capsys):
    """eval.tasks.asked above the needles: the grid refused it before training, but train.py trained
    the run, whose evaluation then failed."""
    refused_in_process(train.main, [str(ROOT / "configs" / "synthetic-cpu.yaml"), "data.synthetic.tasks=[multikey]",
                                    "eval.tasks.asked=5", f"out_dir={tmp_path / 'runs'}", "name=mk"], capsys,
                       "eval.tasks.asked=5, the questions scored per instance: data.synthetic.asked must be in "
                       "[1, needles=4] for multikey")
    assert not (tmp_path / "runs").exists()
