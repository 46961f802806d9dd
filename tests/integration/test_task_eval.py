"""Task evaluation: exact match by hand and against greedy decoding, Wilson intervals, k_max,
synthetic runs end to end (train, resume, score, report), passkey on text runs, bad input."""

from __future__ import annotations

import logging

import json
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch

from ropelab import train
from ropelab.common.devices import DEVICE_NAMES
from ropelab.configs import load_config, override_section
from ropelab.configs.schema import EvalConfig
from helpers.models import tiny_config
from helpers.tasks import FixedPredictions
from helpers.runs import recall_config, stop_after, tasks_cli, write_run_config
from ropelab.data.tasks import Instance, TaskError, task_tokenizer
from ropelab.eval.core import evaluation
from ropelab.eval.lm import extrapolation
from ropelab.eval.tasks import exact_match as eval_tasks
from ropelab.training.exact_match import exact_match, first_errors
from ropelab.training.provenance import git_commit
from ropelab.eval.tasks.effective_length import k_max
from ropelab.eval.reporting.stats import pooled_accuracy_interval, wilson_interval
from ropelab.model.generate import generate
from ropelab.model.transformer import Transformer
from ropelab.training.run_dir import RunDir
from ropelab.training.validation import answer_loss


def inst(tokens, answer_positions) -> Instance:
    answer = np.zeros(len(tokens), dtype=bool)
    answer[list(answer_positions)] = True
    return Instance(np.asarray(tokens, dtype=np.int64), answer)


def test_exact_match_by_hand():
    # The model predicts 5, 6, 7, 8, 9 at positions 0..4, i.e. as tokens 1..5.
    model = FixedPredictions([5, 6, 7, 8, 9])
    cases = [
        (inst([0, 1, 2, 7, 8], [3, 4]), True),        # answers 7, 8 are the predictions for tokens 3, 4
        (inst([0, 1, 2, 7, 0], [3, 4]), False),       # last answer token wrong
        (inst([0, 5, 1, 1, 1, 9], [1, 5]), True),     # answers spread out (recall-like), both right
        (inst([0, 5, 1, 1, 1, 3], [1, 5]), False),
        (inst([0, 0, 6], [2]), True),                 # a shorter instance in the same batch
        (inst([3, 3, 3, 3, 3, 9], [5]), True),        # wrong non-answer tokens do not matter
        (inst([3, 4, 4, 4, 4, 4], [5]), False),
    ]
    got = exact_match(model, [c for c, _ in cases])
    assert got.tolist() == [want for _, want in cases]


def test_teacher_forced_exact_match_equals_greedy_decoding():
    torch.manual_seed(0)
    model = Transformer(tiny_config("alibi")).eval()
    rng = np.random.default_rng(0)
    for _ in range(4):
        prompt = rng.integers(0, 97, size=int(rng.integers(5, 20))).tolist()
        greedy = generate(model, prompt, max_new_tokens=4, temperature=0)[0, len(prompt):].tolist()
        right = inst(prompt + greedy, range(len(prompt), len(prompt) + 4))
        wrong_last = inst(prompt + greedy[:3] + [(greedy[3] + 1) % 97], range(len(prompt), len(prompt) + 4))
        assert exact_match(model, [right, wrong_last]).tolist() == [True, False]


def test_answer_loss_is_the_mean_over_answer_targets():
    torch.manual_seed(0)
    model = Transformer(tiny_config("rope")).eval()
    x = torch.randint(0, 97, (2, 8))
    y = torch.full((2, 8), -100)
    y[0, 3], y[1, 5], y[1, 6] = 4, 5, 6
    with torch.no_grad():
        logp = torch.log_softmax(model(x), dim=-1)
    want = -(logp[0, 3, 4] + logp[1, 5, 5] + logp[1, 6, 6]) / 3
    assert answer_loss(model, [(x[:1], y[:1]), (x[1:], y[1:])]) == pytest.approx(want.item(), rel=1e-5)


def test_k_max_definition_by_hand():
    def cells(table):  # {length: [correct per depth]} out of 10
        return [{"length": n, "depth": d, "status": "ok", "correct": c, "total": 10}
                for n, row in table.items() for d, c in enumerate(row)]
    assert k_max(cells({64: [10, 10], 128: [2, 9], 256: [1, 10], 512: [10, 10]}), 0.2) == 128
    assert k_max(cells({64: [10, 10], 128: [2, 9], 256: [1, 10]}), 0.3) == 64
    assert k_max(cells({64: [1, 10]}), 0.2) is None
    na = cells({64: [10, 10]}) + [{"length": 128, "depth": 0, "status": "n/a"}]
    assert k_max(na, 0.2) == 64


def losses(run_dir: Path) -> dict[int, float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def test_synthetic_run_trains_resumes_exactly_and_saves_the_task_tokenizer(tmp_path, monkeypatch):
    cfg = str(recall_config(tmp_path))
    assert train.main([cfg, "name=straight"]) == 0
    with monkeypatch.context() as m:
        stop_after(6, m)
        assert train.main([cfg, "name=broken"]) == 128 + signal.SIGTERM
    assert train.main([cfg, "name=broken", "--resume"]) == 0
    straight, broken = losses(tmp_path / "runs" / "straight"), losses(tmp_path / "runs" / "broken")
    assert straight == broken and len(straight) == 16  # bitwise: resume restores the task sampler
    run = tmp_path / "runs" / "straight"
    assert (run / "tokenizer.json").read_text() == task_tokenizer().to_json()
    val = [json.loads(line)["val_loss"] for line in (run / "metrics.jsonl").read_text().splitlines() if "val_loss" in line]
    assert len(val) == 2 and all(np.isfinite(val))


@pytest.fixture(scope="module")
def scored_runs(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("taskruns")
    cfg = str(recall_config(tmp))
    for name, extra in (("rope-a", ["train.seed=1"]), ("rope-b", ["train.seed=2"]),
                        ("learned", ["model.pos.kind=learned"]),
                        ("passkey", ["data.synthetic.tasks=[passkey]", "model.pos.kind=alibi", "train.seq_len=32"])):
        assert train.main([cfg, f"name={name}", *extra]) == 0
    text_cfg = str(write_run_config(tmp, corpus))
    assert train.main([text_cfg, "name=text", "train.seq_len=64", "train.max_steps=4", "train.eval_interval=4",
                       "train.ckpt_interval=4"]) == 0
    return tmp / "runs"


def test_report_pools_seeds_with_seed_aware_intervals_and_marks_learned_na(scored_runs, tmp_path):
    runs = [scored_runs / n for n in ("rope-a", "rope-b", "learned", "passkey")]
    # Every seed pools (these tiny runs learn nothing; which seeds pool is tested by hand below).
    every_seed = eval_tasks_for(tasks={"learned_accuracy": None})
    results = eval_tasks.run_task_evaluation(runs, tmp_path / "rep", every_seed)
    rows = results["results"]
    for r in rows:
        if r["status"] == "ok":
            assert (r["ci_low"], r["ci_high"]) == wilson_interval(r["correct"], r["total"]) and r["total"] == 6
            # Every task keeps each instance's first error (where it broke, and for paired
            # comparisons whether it was right: eval/tasks/compare.py).
            assert "outcomes" not in r and len(r["first_error"]) == len(r["answer_tokens"]) == 6
            assert r["eval_commit"] == git_commit()  # the code that scored it
            assert all(0 <= e <= a for e, a in zip(r["first_error"], r["answer_tokens"]))
            assert sum(e == a for e, a in zip(r["first_error"], r["answer_tokens"])) == r["correct"]
    learned = [r for r in rows if r["name"] == "learned"]
    assert {(r["length"], r["status"]) for r in learned} == {(24, "ok"), (48, "n/a")}
    passkey = [r for r in rows if r["task"] == "passkey"]
    assert {(r["length"], r["depth"]) for r in passkey} == {(n, d) for n in (32, 64) for d in (0.0, 1.0)}
    assert len(results["kmax"]) == 1 and results["kmax"][0]["threshold"] == 0.2
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "n/a (trained table: 24 positions)" in report and "| rope |" in report
    pooled = [r for r in rows if r["encoding"] == "rope" and r["length"] == 24]
    c, n = sum(r["correct"] for r in pooled), sum(r["total"] for r in pooled)
    per_seed = [(sum(r["correct"] for r in pooled if r["run"] == run), sum(r["total"] for r in pooled if r["run"] == run))
                for run in sorted({r["run"] for r in pooled})]
    low, high = pooled_accuracy_interval(per_seed)
    assert len(per_seed) == 2 and f"{c / n:.2f} [{low:.2f}, {high:.2f}]" in report  # two seeds pooled into one row
    assert "Where the first error falls (passkey" in report and "at which of the answer's tokens" in report
    for name in ("passkey_heatmap.png", "accuracy_recall.png", "accuracy_passkey.png", "passkey_first_error.png",
                 "results.json"):
        assert (tmp_path / "rep" / name).is_file()
    # Cached per checkpoint: a second report reads the cache and gives the same numbers (the
    # report's own settings are not part of the cache key).
    again = eval_tasks.run_task_evaluation(runs, tmp_path / "rep2")
    assert again["results"] == rows
    assert len(list((scored_runs / "rope-a" / "eval").glob("tasks-*.json"))) == 1


def test_a_reused_evaluation_takes_each_task_s_chance_from_today_s_code(scored_runs, tmp_path, caplog):
    # Chance follows from a task's settings, not from its scores: a cached result written
    # when the code gave another (one vartrack chain once had chance 1) is reported with today's.
    run = scored_runs / "passkey"
    first = eval_tasks.run_task_evaluation([run], tmp_path / "a")
    assert first["runs"][0]["chance"] == {"passkey": 0.0}  # no distractors: no candidates to guess among
    (cache,) = (run / "eval").glob("tasks-*.json")
    stale = json.loads(cache.read_text())
    stale["meta"]["chance"] = {"passkey": 1.0}
    cache.write_text(json.dumps(stale))
    caplog.set_level(logging.INFO, logger="ropelab")
    again = eval_tasks.run_task_evaluation([run], tmp_path / "b")
    assert any("reusing" in line for line in caplog.messages) and again["results"] == first["results"]
    assert again["runs"][0]["chance"] == {"passkey": 0.0}


def test_rescore_evaluates_again_and_replaces_the_cached_result(scored_runs, tmp_path):
    run = tmp_path / "passkey"
    shutil.copytree(scored_runs / "passkey", run)
    flags = [str(run), "--samples", "4", "--depths", "0.5"]
    assert eval_tasks.main([*flags, "--out", str(tmp_path / "a")]) == 0
    (cache,) = sorted((run / "eval").glob("tasks-*.json"), key=lambda p: p.stat().st_mtime)[-1:]
    right = json.loads(cache.read_text())
    tampered = json.loads(cache.read_text())
    for row in tampered["rows"]:
        row["correct"], row["accuracy"] = row["total"] - row["correct"], 1 - row["accuracy"]  # not what it scores
    cache.write_text(json.dumps(tampered))
    assert eval_tasks.main([*flags, "--out", str(tmp_path / "b")]) == 0  # reused as it is
    assert [r["correct"] for r in json.loads((tmp_path / "b" / "results.json").read_text())["results"]] == \
        [r["correct"] for r in tampered["rows"]] != [r["correct"] for r in right["rows"]]
    assert eval_tasks.main([*flags, "--rescore", "--out", str(tmp_path / "c")]) == 0
    again = json.loads(cache.read_text())
    assert [r["correct"] for r in again["rows"]] == [r["correct"] for r in right["rows"]]
    assert [r["correct"] for r in json.loads((tmp_path / "c" / "results.json").read_text())["results"]] == \
        [r["correct"] for r in right["rows"]]


def test_passkey_on_a_text_run_in_its_own_tokenizer(scored_runs, tmp_path):
    results = eval_tasks.run_task_evaluation([scored_runs / "text"], tmp_path / "rep", eval_tasks_for(
        lengths=[300], tasks={"samples": 3, "depths": [0.5]}))
    (row,) = results["results"]
    assert (row["task"], row["length"], row["status"], row["total"]) == ("passkey", 300, "ok", 3)
    assert results["runs"][0]["trained_on"] == "text (local)" and results["runs"][0]["tasks_trained"] == []
    # Scored on a task it never trained on: learning is not judged, the row pools its seed.
    assert "| 1, not judged | 0.00 [" in (tmp_path / "rep" / "report.md").read_text()


def eval_tasks_for(**tree):
    return lambda cfg: override_section(cfg.eval, tree, "test", "eval.")


@pytest.mark.parametrize("args, message", [
    (["--tasks", "pasky"], "did you mean 'passkey'"),
    (["--depths", "0", "1.5"], "eval.tasks.depths must be in [0, 1]"),
    (["--lengths", "8"], "recall with 3 pairs and 3 queries needs at least 11 positions"),
    (["--tasks", "copy", "--lengths", "16", "--samples", "0"], "argument --samples: must be a positive integer"),
    # Which seeds learned a task is judged at L: a report without L would pool them silently.
    (["--lengths", "48", "96"], "judges whether a seed learned a task by its accuracy at the "
                                                   "reference length 24 (train.seq_len), which is not among"),
])
def test_bad_input_exits_2_with_one_line_and_writes_nothing(scored_runs, tmp_path, args, message):
    out = tmp_path / "rep"
    proc = tasks_cli(str(scored_runs / "rope-a"), "--out", str(out), *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_text_run_asked_for_a_synthetic_task_and_learned_beyond_its_table(scored_runs, tmp_path, capsys):
    out = tmp_path / "rep"
    assert eval_tasks.main([str(scored_runs / "text"), "--tasks", "copy", "--out", str(out)]) == 2
    assert "text runs can be scored on passkey only" in capsys.readouterr().err
    assert eval_tasks.main([str(scored_runs / "learned"), "--lengths", "48", "96", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "table of 24 positions" in err and "evaluate lengths up to 24" in err
    assert not out.exists()


def test_cache_key_ignores_nothing_that_changes_numbers(scored_runs):
    cfg = eval_tasks.read_run_config(RunDir(scored_runs / "rope-a"))
    base = eval_tasks.TASKS.cache_key(cfg, cfg.eval)
    for tree in ({"tasks": {"samples": 7}}, {"tasks": {"seed": 1}}, {"lengths": [24]}, {"tasks": {"tasks": ["copy"]}},
                 {"tasks": {"asked": 1}}):
        assert eval_tasks.TASKS.cache_key(cfg, eval_tasks_for(**tree)(cfg)) != base


def test_eval_tasks_asked_scores_multikey_with_fewer_questions_than_trained(tmp_path):
    """A model trained on RULER's multi-query (3 asked) is scored on its multi-key (1 asked) with
    eval.tasks.asked=1; more questions than needles is refused with the key named."""
    cfg = load_config(recall_config(tmp_path), ["data.synthetic.tasks=[multikey]", "data.synthetic.asked=3",
                                                   "train.seq_len=96", "eval.length_multipliers=[1]"])
    tok = task_tokenizer()
    (trained,) = eval_tasks.run_tasks(cfg, tok, cfg.eval)
    (scored,) = eval_tasks.run_tasks(cfg, tok, eval_tasks_for(tasks={"asked": 1})(cfg))
    assert (trained.asked, scored.asked) == (3, 1)
    answers = lambda task: int(np.diff(task.make(np.random.default_rng(0), 96).answer.astype(int)).clip(0).sum())
    assert (answers(trained), answers(scored)) == (3, 1)  # answer spans in one instance
    with pytest.raises(TaskError, match="eval.tasks.asked=5, the questions scored per instance: data.synthetic.asked must be in \\[1, needles=4\\]"):
        eval_tasks.run_tasks(cfg, tok, eval_tasks_for(tasks={"asked": 5})(cfg))


def test_perplexity_sweep_points_synthetic_runs_to_task_scoring(scored_runs, tmp_path, capsys):
    assert extrapolation.main([str(scored_runs / "rope-a"), "--out", str(tmp_path / "ppl")]) == 2
    assert "score it with ropelab tasks" in capsys.readouterr().err


def test_cache_keys_are_those_of_earlier_versions(tmp_path):
    """Caches written before stay valid: these keys were computed by the code that wrote them (the
    perplexity keys since EVAL_FORMAT 3, whose cells have documents as units however few, per-unit
    sums by context position and the same-token protocol's layout)."""
    cfg = load_config(recall_config(tmp_path))
    tasks_key, perplexity_key = eval_tasks.TASKS.cache_key, extrapolation.EXTRAPOLATION.cache_key
    assert tasks_key(cfg, cfg.eval) == "5e24cee6f230"
    assert tasks_key(cfg, eval_tasks_for(tasks={"samples": 7}, scalings=["none", "yarn"])(cfg)) == "baa56c4d16ed"
    assert perplexity_key(cfg, EvalConfig()) == "97f62d6922f5"
    assert perplexity_key(cfg, EvalConfig(lengths=[16, 32], scalings=["none", "yarn"], steps=[0, 2])) == "1ed7f9cb2b4e"
    assert perplexity_key(cfg, cfg.eval) == "8888bc82dea7"


def test_tasks_score_each_checkpoint_of_steps(scored_runs, tmp_path):
    """--steps 12 16: each step's own checkpoint is scored (its tokens are that checkpoint's), a
    row of its own in the report; step 16 is the latest, so its numbers are the latest's."""
    out = tmp_path / "rep"
    assert eval_tasks.main([str(scored_runs / "rope-a"), "--steps", "12", "16", "--samples", "3",
                            "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    tokens = {r["eval_step"]: r["step_tokens"] for r in rows}
    assert tokens == {12: 12 * 8 * 24, 16: 16 * 8 * 24}  # batch 8 × seq_len 24 per step
    latest = eval_tasks.run_task_evaluation([scored_runs / "rope-a"], tmp_path / "latest", eval_tasks_for(
        tasks={"samples": 3}))["results"]
    assert [r["correct"] for r in rows if r["eval_step"] == 16] == [r["correct"] for r in latest]
    report = (out / "report.md").read_text()
    assert "| rope @ 12 |" in report and "| rope @ 16 |" in report
    assert eval_tasks.main([str(scored_runs / "rope-a"), "--steps", "4", "--out", str(tmp_path / "x")]) == 2


def test_both_commands_share_one_driver(scored_runs, tmp_path, capsys):
    """The same common flags, help and --eval-file merge: the file's keys, then the flags over
    them, a nested mapping (tasks:) merged key by key; a bad key fails before any work."""
    for module, name in ((extrapolation, "eval"), (eval_tasks, "tasks")):
        with pytest.raises(SystemExit) as e:  # no arguments: the full help, exit 2
            module.main([])
        err = capsys.readouterr().err
        assert e.value.code == 2 and f"usage: ropelab {name}" in err
        for flag in ("--lengths", "--scaling", "--factor", "--steps", "--eval-file", "--cache-only", "--rescore",
                     "--out"):
            assert flag in err, (module, flag)
        assert DEVICE_NAMES in " ".join(err.split())
    planned = tmp_path / "planned.yaml"
    planned.write_text("lengths: [24]\nsteps: [12]\ntasks: {samples: 3, depths: [0.5]}\n")
    run = str(scored_runs / "rope-a")
    for spec in (extrapolation.EXTRAPOLATION, eval_tasks.TASKS):
        args = evaluation.parse_args(spec, [run, "--eval-file", str(planned), "--lengths", "48"])
        assert evaluation.eval_tree(spec, args) == {"lengths": [48], "steps": [12], "tasks": {"samples": 3, "depths": [0.5]}}
    args = evaluation.parse_args(eval_tasks.TASKS, [run, "--eval-file", str(planned), "--seed", "5"])
    assert evaluation.eval_tree(eval_tasks.TASKS, args)["tasks"] == {"samples": 3, "depths": [0.5], "seed": 5}
    planned.write_text("lenghts: [24]\n")
    for module in (extrapolation, eval_tasks):
        assert module.main([run, "--eval-file", str(planned), "--out", str(tmp_path / "r")]) == 2
        assert "eval.lenghts" in capsys.readouterr().err and not (tmp_path / "r").exists()


def test_first_errors_by_hand():
    model = FixedPredictions([5, 6, 7, 8, 9])  # predicts tokens 1..5 as 5, 6, 7, 8, 9
    cases = [
        (inst([0, 5, 6, 7, 8, 9], [1, 2, 3, 4, 5]), 5),  # all right: the number of answer tokens
        (inst([0, 5, 6, 0, 8, 9], [1, 2, 3, 4, 5]), 2),  # the third answer token is the first wrong one
        (inst([0, 1, 6, 7, 8, 9], [1, 2, 3, 4, 5]), 0),
        (inst([0, 5, 6, 7, 8, 0], [3, 4, 5]), 2),        # answers at the end only: the last one wrong
        (inst([0, 0, 6, 0, 8, 9], [2, 4, 5]), 3),        # spread answers (recall-like), wrong tokens between
        (inst([0, 0, 0, 0, 0, 9], [2, 5]), 0),
    ]
    got = first_errors(model, [c for c, _ in cases])
    assert got.tolist() == [want for _, want in cases]
    assert exact_match(model, [c for c, _ in cases]).tolist() == [True, False, False, False, True, False]
