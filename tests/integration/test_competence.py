"""Training to competence: the stop, its record, exact resume, pooling and bad input."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import numpy as np
import pytest

from ropelab import train
from ropelab.common.errors import ConfigError
from ropelab.configs import load_config
from helpers.runs import stop_after
from ropelab.eval.core.evaluation import pooling_group
from ropelab.training.checkpoint import read_meta
from ropelab.training.competence import CompetenceStop, accuracy_curve, earlier_check, logged_progress, reached_competence
from ropelab.training.run_dir import RunDir


def config(tmp: Path) -> Path:
    """Copying one letter ("a>a"): a tiny model passes 30% exact match within ~40 steps."""
    path = tmp / "copy.yaml"
    path.write_text(f"""
name: copy
out_dir: {tmp / 'runs'}
model: {{d_model: 32, n_layers: 2, n_heads: 4, n_kv_heads: 2}}
data: {{source: synthetic, tokenizer: {{kind: char}}, synthetic: {{tasks: [copy]}}}}
train: {{seq_len: 4, batch_size: 16, max_steps: 80, lr: 1.0e-2, warmup_steps: 2, eval_interval: 4,
        eval_batches: 2, ckpt_interval: 4, log_interval: 1, seed: 3, stop_at_accuracy: 0.3}}
log: {{progress: false}}
""")
    return path


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def numbers(run: Path) -> list[tuple]:
    """What a run computed (not how fast): losses and accuracies at L by step."""
    return [(r["step"], r.get("loss"), r.get("val_loss"), r.get("val_acc_copy")) for r in records(run)]


def test_the_stop_by_hand():
    scores = iter([{"a": 0.5, "b": 0.99}, {"a": 0.96, "b": 0.95}, {"a": 0.2, "b": 0.2}])
    stop = CompetenceStop(0.95, lambda model: next(scores))
    stop.check(None, 100)
    assert not stop.reached and "NOT reached" in stop.outcome(300)  # every task must pass
    stop.check(None, 200)
    assert stop.reached and stop.record() == {"threshold": 0.95, "checks": 1, "reached": True, "step": 200,
                                              "accuracy": {"a": 0.96, "b": 0.95}, "checked_at": 200, "streak": 1}
    stop.check(None, 300)  # once reached it stays reached (training has ended there)
    assert stop.record()["step"] == 200
    again = CompetenceStop(0.95, lambda model: {})
    again.load_state_dict(stop.state_dict())
    assert again.record() == stop.record()
    assert reached_competence({"step": 200, "competence": stop.record()})
    assert not reached_competence({"step": 200, "competence": {"reached": False}})
    assert not reached_competence({"step": 300})  # no stop: its budget decides


def test_checks_in_a_row_by_hand():
    """train.stop_checks=2: a passing check followed by a failing one starts over."""
    scores = iter([0.99, 0.5, 0.98, 0.99, 0.1])
    stop = CompetenceStop(0.98, lambda model: {"a": next(scores)}, checks=2)
    stop.check(None, 100)
    assert not stop.reached and stop.streak == 1
    assert "≥ 0.98 at the last 1 of the 2 checks in a row" in stop.outcome(100)
    stop.check(None, 200)
    assert not stop.reached and stop.streak == 0 and "(< 0.98)" in stop.outcome(200)
    stop.check(None, 300)
    resumed = CompetenceStop(0.98, lambda model: {"a": next(scores)}, checks=2)
    resumed.load_state_dict(stop.state_dict())  # a checkpoint between the two passing checks
    resumed.check(None, 400)
    assert resumed.reached and resumed.record()["step"] == 400 and resumed.record()["streak"] == 2
    assert "at 2 checks in a row" in resumed.outcome(400)
    resumed.check(None, 500)
    assert resumed.record()["step"] == 400  # reached stays reached
    # A checkpoint written before the key existed: one check decided.
    old = CompetenceStop(0.98, lambda model: {}, checks=1)
    old.load_state_dict({"threshold": 0.98, "reached": True, "step": 300, "accuracy": {"a": 0.99}, "checked_at": 300})
    assert old.reached and old.streak == 1


def test_a_run_stops_at_competence_resumes_exactly_and_is_then_complete(tmp_path, monkeypatch, capsys):
    cfg = str(config(tmp_path))
    assert train.main([cfg, "name=straight"]) == 0
    straight = RunDir(tmp_path / "runs" / "straight")
    meta = read_meta(straight.latest_checkpoint())
    competence = meta["competence"]
    assert competence["reached"] and meta["step"] == competence["step"] < 80 and meta["finished"]
    assert competence["accuracy"]["copy"] >= 0.3 and "competence reached at step" in capsys.readouterr().out
    checks = [r for r in records(straight.path) if "val_acc_copy" in r]
    assert [r["step"] for r in checks] == list(range(4, meta["step"] + 1, 4))
    assert all(r["val_acc_copy"] < 0.3 for r in checks[:-1]) and checks[-1]["val_acc_copy"] >= 0.3

    with monkeypatch.context() as m:
        stop_after(10, m)
        assert train.main([cfg, "name=broken"]) == 128 + signal.SIGTERM
    assert train.main([cfg, "name=broken", "--resume"]) == 0
    broken = RunDir(tmp_path / "runs" / "broken")
    assert numbers(broken.path) == numbers(straight.path)  # bitwise: the same steps, losses and stop
    assert read_meta(broken.latest_checkpoint())["competence"] == competence
    capsys.readouterr()
    assert train.main([cfg, "name=straight", "--resume"]) == 0  # complete: trains nothing
    assert "already complete" in capsys.readouterr().out
    assert read_meta(straight.latest_checkpoint())["step"] == meta["step"]


def test_a_run_asked_for_two_checks_in_a_row_stops_later_and_resumes_exactly(tmp_path, monkeypatch):
    cfg = str(config(tmp_path))
    assert train.main([cfg, "name=once"]) == 0
    once = read_meta(RunDir(tmp_path / "runs" / "once").latest_checkpoint())["competence"]
    assert train.main([cfg, "name=twice", "train.stop_checks=2"]) == 0
    twice = RunDir(tmp_path / "runs" / "twice")
    competence = read_meta(twice.latest_checkpoint())["competence"]
    assert competence["reached"] and competence["checks"] == 2 and competence["streak"] == 2
    checks = [(r["step"], r["val_acc_copy"]) for r in records(twice.path) if "val_acc_copy" in r]
    assert checks[-1][0] == competence["step"] > once["step"]
    assert checks[-2][1] >= 0.3 and checks[-1][1] >= 0.3  # the two checks in a row that stopped it
    assert all(not (a >= 0.3 and b >= 0.3) for (_, a), (_, b) in zip(checks[:-2], checks[1:-1]))
    # Stopped by a signal right after the first passing check, it resumes to the same stop.
    with monkeypatch.context() as m:
        stop_after(checks[-2][0], m)
        assert train.main([cfg, "name=broken", "train.stop_checks=2"]) == 128 + signal.SIGTERM
    assert train.main([cfg, "name=broken", "train.stop_checks=2", "--resume"]) == 0
    assert numbers(tmp_path / "runs" / "broken") == numbers(twice.path)
    # Its config is its experiment: resuming it with another count is refused.
    assert train.main([cfg, "name=twice", "train.stop_checks=3", "--resume"]) == 2


def test_a_budget_that_runs_out_is_stated(tmp_path, capsys):
    assert train.main([str(config(tmp_path)), "name=short", "train.max_steps=8"]) == 0
    meta = read_meta(RunDir(tmp_path / "runs" / "short").latest_checkpoint())
    assert meta["finished"] and meta["competence"]["reached"] is False and meta["competence"]["checked_at"] == 8
    assert "competence NOT reached: the budget of 8 steps ran out" in capsys.readouterr().out
    # Its check four fifths of the way (step 4 of 8, checks every 4), as its metrics logged it.
    logged = records(tmp_path / "runs" / "short")
    earlier = earlier_check(logged, meta["competence"])
    assert earlier == {"step": 4, "accuracy": {"copy": next(r["val_acc_copy"] for r in logged if r["step"] == 4
                                                            and "val_acc_copy" in r)}}
    # Every check's accuracy, in step order, for the report's figure; both read from the file.
    checks = [(r["step"], r["val_acc_copy"]) for r in logged if "val_acc_copy" in r]
    progress = logged_progress(RunDir(tmp_path / "runs" / "short").metrics, meta["competence"])
    assert progress == {"competence_earlier": earlier, "competence_curve": {
        "steps": [4, 8], "accuracy": {"copy": [round(a, 4) for _, a in checks]}}}
    assert logged_progress(tmp_path / "missing.jsonl", meta["competence"]) == {}
    assert logged_progress(RunDir(tmp_path / "runs" / "short").metrics, None) == {}


def test_the_earlier_check_by_hand():
    """The last check at or before 0.8 of the final one, every task's accuracy logged at it;
    nothing for a run that reached competence or was never checked."""
    competence = {"reached": False, "threshold": 0.98, "accuracy": {"a": 0.9, "b": 0.5}, "checked_at": 1000}
    logged = [{"step": 250, "val_acc_a": 0.1, "val_acc_b": 0.1}, {"step": 500, "loss": 1.0},
              {"step": 750, "val_acc_a": 0.6, "val_acc_b": 0.3}, {"step": 800, "val_acc_a": 0.7},  # b not logged
              {"step": 1000, "val_acc_a": 0.9, "val_acc_b": 0.5}]
    assert earlier_check(logged, competence) == {"step": 750, "accuracy": {"a": 0.6, "b": 0.3}}
    assert earlier_check(logged, competence, share=0.2) is None  # no check by step 200
    assert earlier_check(logged, {**competence, "reached": True, "step": 1000}) is None
    assert earlier_check(logged, {**competence, "checked_at": None}) is None


def test_the_accuracy_curve_by_hand():
    """Every check at which each task was logged, in step order, one value a step (the last);
    a run reached or not alike; nothing without a record of the tasks or a check."""
    competence = {"reached": True, "threshold": 0.98, "accuracy": {"a": 0.99, "b": 0.98}, "checked_at": 750}
    logged = [{"step": 500, "val_acc_a": 0.5, "val_acc_b": 0.25}, {"step": 250, "val_acc_a": 0.1, "val_acc_b": 0.0},
              {"step": 600, "loss": 1.0}, {"step": 700, "val_acc_a": 0.8},  # b not logged: not a check
              {"step": 750, "val_acc_a": 0.9, "val_acc_b": 0.9}, {"step": 750, "val_acc_a": 0.99, "val_acc_b": 0.98},
              {"val_acc_a": 1.0, "val_acc_b": 1.0}]  # no step
    assert accuracy_curve(logged, competence) == {"steps": [250, 500, 750],
                                                  "accuracy": {"a": [0.1, 0.5, 0.99], "b": [0.0, 0.25, 0.98]}}
    assert accuracy_curve(logged, {**competence, "accuracy": {}}) is None
    assert accuracy_curve(logged, None) is None
    assert accuracy_curve([{"step": 4, "loss": 2.0}], competence) is None


def test_seeds_trained_to_competence_pool_whatever_their_tokens(tmp_path):
    cfg = load_config(config(tmp_path))
    other_seed = load_config(config(tmp_path), ["train.seed=4"])
    assert pooling_group(cfg, 640) == pooling_group(other_seed, 1280)  # stopped at different steps
    plain = load_config(config(tmp_path), ["train.stop_at_accuracy=null"])
    assert pooling_group(plain, 640) != pooling_group(plain, 1280)
    # Fine-tunes of parents that are seeds of one experiment pool; of different experiments, not.
    a = load_config(config(tmp_path), ["train.stop_at_accuracy=null", "init.run=runs/p_seed-0"])
    b = load_config(config(tmp_path), ["train.stop_at_accuracy=null", "init.run=runs/p_seed-1"])
    assert pooling_group(a, 64, {"group": "g1"}) == pooling_group(b, 64, {"group": "g1"})
    assert pooling_group(a, 64, {"group": "g1"}) != pooling_group(b, 64, {"group": "g2"})
    assert pooling_group(a, 64, {}) != pooling_group(b, 64, {})  # older records: by parent path


@pytest.mark.parametrize("overrides,message", [
    (["train.stop_at_accuracy=1.5"], "train.stop_at_accuracy must be in (0, 1]"),
    (["data.source=builtin", "data.tokenizer.kind=bpe"], "train.stop_at_accuracy=0.3 needs tasks to score"),
    (["train.stop_checks=0"], "train.stop_checks must be a positive integer"),
    (["train.stop_at_accuracy=null", "train.stop_checks=2"], "train.stop_checks=2 counts the checks of the competence"),
])
def test_bad_stop_settings_are_clear(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("]", r"\]")):
        load_config(config(tmp_path), overrides)


def multikey(tmp: Path) -> Path:
    """Multikey with 3 needles, each training instance asking 1 to 3 of them (asked: mixed),
    scored by the evaluation on one question (eval.tasks.asked: 1, RULER's multi-key)."""
    path = tmp / "multikey.yaml"
    path.write_text(f"""
name: multikey
out_dir: {tmp / 'runs'}
model: {{d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2}}
data: {{source: synthetic, tokenizer: {{kind: char}},
       synthetic: {{tasks: [multikey], needles: 3, asked: mixed}}}}
train: {{seq_len: 96, batch_size: 4, max_steps: 4, warmup_steps: 1, eval_interval: 2, eval_batches: 1,
        ckpt_interval: 2, seed: 0, stop_at_accuracy: 0.95}}
eval: {{tasks: {{asked: 1}}}}
log: {{progress: false}}
""")
    return path


def test_competence_is_judged_on_the_questions_the_evaluation_asks(tmp_path, monkeypatch):
    import ropelab.training.data
    from ropelab.data.tasks import length_set
    from ropelab.training.data import TaskTraining, scored_tasks

    cfg = load_config(multikey(tmp_path))
    data = TaskTraining(cfg.data.synthetic)
    (trained,) = data.tasks
    assert trained.mixed and trained.asked == 3
    (scored,) = scored_tasks(data.tasks, cfg.data.synthetic, data.tokenizer, 1)
    assert scored.name == "multikey" and scored.asked == 1 and not scored.mixed
    assert scored_tasks(data.tasks, cfg.data.synthetic, data.tokenizer, None) == data.tasks  # as trained
    # One question per instance: one answer span, where the mixed task asks up to three.
    def spans(task):
        return [int(np.diff(np.r_[0, inst.answer.astype(int)]).clip(min=0).sum()) for inst in length_set(task, 96, 32)]
    assert set(spans(scored)) == {1} and max(spans(trained)) > 1

    # The trainer hands the stop the evaluation's question count.
    seen = []
    def fake(tasks, seq_len, n, depths=None):
        seen.append([(t.name, t.asked, t.mixed) for t in tasks])
        return lambda model: {t.name: 1.0 for t in tasks}
    monkeypatch.setattr(ropelab.training.data, "task_accuracies", fake)
    assert train.main([str(multikey(tmp_path))]) == 0
    assert seen == [[("multikey", 1, False)]]
    meta = read_meta(RunDir(tmp_path / "runs" / "multikey").latest_checkpoint())
    assert meta["competence"]["reached"] and meta["step"] == 2


def test_a_needle_task_is_judged_at_the_depths_the_evaluation_scores(tmp_path, monkeypatch):
    import ropelab.training.data
    from ropelab.data.tasks import length_set
    from ropelab.training.data import TaskTraining

    path = tmp_path / "passkey.yaml"
    path.write_text(f"""
name: passkey
out_dir: {tmp_path / 'runs'}
model: {{d_model: 32, n_layers: 1, n_heads: 4, n_kv_heads: 2}}
data: {{source: synthetic, tokenizer: {{kind: char}}, synthetic: {{tasks: [passkey, multivalue], distractors: 2}}}}
train: {{seq_len: 96, batch_size: 4, max_steps: 2, warmup_steps: 1, eval_interval: 2, eval_batches: 2,
        ckpt_interval: 2, seed: 0, stop_at_accuracy: 0.95}}
eval: {{tasks: {{depths: [1.0, 0.0, 0.5]}}}}
log: {{progress: false}}
""")
    cfg = load_config(path)
    passkey, multivalue = TaskTraining(cfg.data.synthetic).tasks
    placed: list = []
    def spy(task):
        make = task.make
        def recording(rng, length, depth=None):
            placed.append(depth)
            return make(rng, length, depth)
        monkeypatch.setattr(task, "make", recording)
    spy(passkey), spy(multivalue)

    # A needle task: the given depths in turn, as the report weighs them; the rest of each
    # instance is what the uniform-depth set draws, so only the needle moves.
    grid = length_set(passkey, 96, 7, [0.0, 0.5, 1.0])
    assert placed == [0.0, 0.5, 1.0, 0.0, 0.5, 1.0, 0.0]
    placed.clear()
    uniform = length_set(passkey, 96, 7)
    assert len(set(placed)) == 7 and all(0.0 < d < 1.0 for d in placed)
    assert all(a.length == b.length == 96 for a, b in zip(grid, uniform))
    assert any(not np.array_equal(a.tokens, b.tokens) for a, b in zip(grid, uniform))
    # A task without a needle (multivalue; multikey places its needles at a depth) ignores
    # them: the same instances either way.
    placed.clear()
    same = length_set(multivalue, 96, 3, [0.0, 1.0])
    assert all(0.0 < d < 1.0 for d in placed)
    assert all(np.array_equal(a.tokens, b.tokens) for a, b in zip(same, length_set(multivalue, 96, 3)))

    # The trainer hands the stop the evaluation's depths (sorted, as the report lists them).
    seen = []
    def fake(tasks, seq_len, n, depths=None):
        seen.append((seq_len, n, depths))
        return lambda model: {t.name: 0.0 for t in tasks}
    monkeypatch.setattr(ropelab.training.data, "task_accuracies", fake)
    assert train.main([str(path)]) == 0
    assert seen == [(96, 8, [0.0, 0.5, 1.0])]


def test_an_evaluation_question_count_the_task_cannot_ask_is_clear(tmp_path, capsys):
    assert train.main([str(multikey(tmp_path)), "eval.tasks.asked=4"]) == 2
    err = capsys.readouterr().err
    assert "eval.tasks.asked=4" in err and "Traceback" not in err


def test_the_question_count_is_checked_against_the_tasks_a_mixed_text_run_scores(tmp_path):
    """A text run's competence stop scores its data.mix tasks, not data.synthetic.tasks (the
    default passkey): an impossible eval.tasks.asked is refused when the config loads."""
    mixed = ["data.source=builtin", "data.tokenizer.kind=bpe", "data.mix.tasks=[multikey]", "data.mix.fraction=0.25",
             "data.synthetic.needles=3"]
    with pytest.raises(ConfigError, match=r"eval.tasks.asked=4, the questions scored per instance: .*needles=3"):
        load_config(config(tmp_path), [*mixed, "eval.tasks.asked=4"])
    assert load_config(config(tmp_path), [*mixed, "eval.tasks.asked=3"]).eval.tasks.asked == 3
    # Without the stop the same count is refused too: the run's evaluation would score it, so it
    # fails at load rather than after training (as a grid's runs always were).
    with pytest.raises(ConfigError, match=r"eval.tasks.asked=4, the questions scored per instance: .*needles=3"):
        load_config(config(tmp_path), [*mixed, "eval.tasks.asked=4", "train.stop_at_accuracy=null"])
    # The mixed tasks are built from data.synthetic: settings they cannot take fail at load, stop or not.
    with pytest.raises(ConfigError, match=r"asked must be in \[1, needles=3\].*checked against the tasks built from "
                                          r"data.synthetic: multikey"):
        load_config(config(tmp_path), [*mixed, "data.synthetic.asked=5", "train.stop_at_accuracy=null"])
