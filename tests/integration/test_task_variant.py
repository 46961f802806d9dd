"""eval.tasks.variant: a trained run scored on other task settings than its own (one chain of
variable tracking for a model trained on four, more passkey distractors), and its bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from ropelab import train
from ropelab.configs import load_config, override_section
from ropelab.common.errors import ConfigError
from ropelab.data.tasks import TaskError, task_tokenizer
from ropelab.eval.tasks import exact_match as eval_tasks
from helpers.runs import recall_config, tasks_cli


def scored_with(**tree):
    return lambda cfg: override_section(cfg.eval, tree, "test", "eval.")


def vartrack_config(tmp_path: Path):
    return load_config(recall_config(tmp_path), [
        "data.synthetic.tasks=[vartrack]", "data.synthetic.chains=4", "data.synthetic.asked=mixed",
        "train.seq_len=192", "eval.length_multipliers=[1]"])


def test_a_variant_builds_the_scored_task_with_its_settings_and_keeps_the_rest(tmp_path):
    cfg, tok = vartrack_config(tmp_path), task_tokenizer()
    (trained,) = eval_tasks.run_tasks(cfg, tok, cfg.eval)
    (one,) = eval_tasks.run_tasks(cfg, tok, scored_with(tasks={"variant": {"chains": 1}, "asked": 1})(cfg))
    assert (trained.chains, one.chains) == (4, 1)
    assert (trained.hops, trained.answer) == (one.hops, one.answer)  # what the variant leaves alone
    # Four chains of 2 hops state twelve assignments; one chain, three.
    assignments = lambda task: int((task.make(np.random.default_rng(0), 192).tokens == tok.encode("=")[0]).sum())
    assert assignments(trained) > assignments(one) >= 3


def test_a_variant_has_its_own_cache_key_and_none_keeps_the_old_one(tmp_path):
    cfg = vartrack_config(tmp_path)
    base = eval_tasks.TASKS.cache_key(cfg, cfg.eval)
    keys = {eval_tasks.TASKS.cache_key(cfg, scored_with(tasks={"variant": v})(cfg))
            for v in ({"chains": 1}, {"chains": 2}, {"chains": 1, "hops": 3})}
    assert len(keys) == 3 and base not in keys
    assert eval_tasks.TASKS.cache_key(cfg, scored_with(tasks={"variant": {"chains": None}})(cfg)) == base


@pytest.mark.parametrize("variant, message", [
    ({"chain": 1}, "unknown key 'eval.tasks.variant.chain'; did you mean 'eval.tasks.variant.chains'?"),
    ({"chains": "two"}, "eval.tasks.variant.chains must be an integer, got 'two'"),
    ({"asked": 1}, "eval.tasks.variant.asked cannot be set: eval.tasks.asked sets the questions scored"),
    ({"tasks": ["copy"]}, "eval.tasks.variant.tasks cannot be set: eval.tasks.tasks picks the tasks scored"),
    ({"chains": 0}, "eval.tasks.variant.chains must be a positive integer (got 0)"),
    ({"name_letters": 9}, "eval.tasks.variant.name_letters must be in [1, 8] (got 9)"),
    ({"queries": 0}, "eval.tasks.variant.queries must be a positive integer (got 0)"),
])
def test_variant_keys_and_types_are_checked_as_any_section(tmp_path, variant, message):
    cfg = vartrack_config(tmp_path)
    with pytest.raises(ConfigError, match=re.escape(message)):
        scored_with(tasks={"variant": variant})(cfg)


def test_a_variant_the_task_or_length_cannot_take_is_refused_naming_the_variant(tmp_path):
    cfg, tok = vartrack_config(tmp_path), task_tokenizer()
    # What holds only with the run's other settings is checked once the variant meets them.
    with pytest.raises(TaskError, match=r"eval.tasks.variant \(chains=5, name_letters=1\), the task settings scored "
                                        r"instead of the run's own: data.synthetic.name_letters=1 gives 26 names"):
        eval_tasks.run_tasks(cfg, tok, scored_with(tasks={"variant": {"chains": 5, "name_letters": 1}})(cfg))
    # Trained with asked: mixed, every chain count is fine; asked 3 of 2 chains is not.
    with pytest.raises(TaskError, match=r"eval.tasks.variant \(chains=2\).*asked must be in \[1, chains=2\]"):
        eval_tasks.run_tasks(cfg, tok, scored_with(tasks={"variant": {"chains": 2}, "asked": 3})(cfg))
    with pytest.raises(TaskError, match="vartrack"):  # sixteen chains do not fit 192 positions
        eval_tasks.run_tasks(cfg, tok, scored_with(tasks={"variant": {"chains": 16}})(cfg))


@pytest.fixture(scope="module")
def recall_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("variant")
    assert train.main([str(recall_config(tmp)), "name=recall", "train.max_steps=4", "train.eval_interval=4"]) == 0
    return tmp / "runs" / "recall"


def test_the_command_scores_a_variant_and_the_report_says_so(recall_run, tmp_path):
    out = tmp_path / "rep"
    assert eval_tasks.main([str(recall_run), "--variant", "pairs=2", "queries=1", "--samples", "3",
                            "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["runs"][0]["eval"]["tasks"]["variant"]["pairs"] == 2
    assert {r["total"] for r in results["results"]} == {3}
    # One query: each instance's answer is one digit.
    assert {n for r in results["results"] for n in r["answer_tokens"]} == {1}
    report = (out / "report.md").read_text()
    assert "**Scored on a variant of the trained task** (eval.tasks.variant): pairs=2, queries=1." in report
    own = tmp_path / "own"
    assert eval_tasks.main([str(recall_run), "--samples", "3", "--out", str(own)]) == 0
    assert "variant" not in (own / "report.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--variant", "pair=2"], "did you mean 'eval.tasks.variant.pairs'?"),
    (["--variant", "data.synthetic.pairs=2"], "without its section, e.g. pairs=2"),
    (["--variant", "pairs"], "is not of the form dotted.key=value"),
    (["--variant", "pairs=30"], "eval.tasks.variant.pairs must be in [1, 26]"),
    (["--variant", "pairs=20"], "needs at least"),  # 20 pairs do not fit the run's lengths
    # A key recall does not read was accepted, and the report said the instances differ from training.
    (["--variant", "chains=1"], "eval.tasks.variant sets chains, which no task scored here reads (recall reads "
                                "pairs, queries), so the instances would be the run's own"),
])
def test_bad_variants_on_the_command_line_exit_2_with_a_message(recall_run, tmp_path, args, message):
    out = tmp_path / "bad"
    done = tasks_cli(str(recall_run), *args, "--samples", "2", "--out", str(out))
    assert done.returncode == 2, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not out.exists()
