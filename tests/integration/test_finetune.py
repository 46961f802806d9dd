"""Context extension by fine-tuning: start from a trained run, record it, resume, report a budget."""

from __future__ import annotations

import json
import math
import signal

import pytest
import torch

from ropelab import train
from ropelab.configs.schema import EvalConfig
from helpers.runs import stop_after, write_run_config
from ropelab.eval.lm import extrapolation
from ropelab.eval.lm.extrapolation import evaluate_run, run_extrapolation
from ropelab.eval.reporting.reference import missing_reference
from ropelab.training.checkpoint import read_meta
from ropelab.training.run_dir import RunDir
from ropelab.training.saved_run import load_run

YARN = ["model.pos.rope.scaling.type=yarn", "model.pos.rope.scaling.factor=4",
        "model.pos.rope.scaling.original_max_len=16"]


@pytest.fixture(scope="module")
def parent(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("ft")
    cfg = str(write_run_config(tmp, corpus))
    assert train.main([cfg, "name=parent", "train.seq_len=16", "train.max_steps=12"]) == 0
    return tmp, cfg, tmp / "runs" / "parent"


def child_args(cfg, parent_dir, name="child", *extra):
    return [cfg, f"name={name}", f"init.run={parent_dir}", "train.seq_len=64", "train.batch_size=2",
            "train.max_steps=6", "train.ckpt_interval=2", "train.keep_last=10", "train.eval_interval=2",
            "train.warmup_steps=2", "train.min_lr_ratio=1.0", *YARN, *extra]


def test_a_child_starts_from_its_parent_and_says_so(parent, capsys):
    tmp, cfg, parent_dir = parent
    assert train.main(child_args(cfg, parent_dir)) == 0
    child = RunDir(tmp / "runs" / "child")
    # The start-up line names the weights it starts from: 12 parent steps of 8 × 16 tokens.
    assert f"training {child} from {parent_dir} step_000012 (step 12, 1,536 tokens): " in capsys.readouterr().out
    assert [p.name for p in child.complete_checkpoints()] == [f"step_{s:06d}" for s in (0, 2, 4, 6)]
    start, dad = load_run(child.path, step=0), load_run(parent_dir)
    assert all(torch.equal(a, b) for a, b in zip(start.model.state_dict().values(), dad.model.state_dict().values()))
    meta = read_meta(child.step_dir(6))
    assert meta["parent"]["run"] == str(parent_dir) and meta["parent"]["train_len"] == 16
    assert meta["tokens"] == 6 * 2 * 64  # the child's own tokens; its schedule is its own
    assert start.cfg.model.pos.rope.scaling.type == "yarn" and start.cfg.train.seq_len == 64
    records = [json.loads(line) for line in child.metrics.read_text().splitlines()]
    assert records[0]["step"] == 0 and "val_loss" in records[0]  # the budget's starting point
    # Step 0 is the parent's weights under the child's scaling: the same numbers as the
    # parent evaluated with that scaling at evaluation time.
    ev = EvalConfig(lengths=[64], protocols=["nonoverlap"], max_tokens=512, per_position=False)
    child_rows = evaluate_run(child.path, EvalConfig(**{**vars(ev), "steps": [0]}))[1]
    parent_rows = evaluate_run(parent_dir, EvalConfig(**{**vars(ev), "scalings": ["yarn"], "factor": 4.0}))[1]
    yarn_row = next(r for r in parent_rows if r["scaling"] == "yarn")
    assert child_rows[0]["nll"] == yarn_row["nll"] and child_rows[0]["eval_step"] == 0


def test_a_child_keeps_its_start_whatever_keep_last(parent):
    """Step 0 (the parent's weights) starts the budget curve, so pruning never removes it."""
    tmp, cfg, parent_dir = parent
    assert train.main(child_args(cfg, parent_dir, "pruned", "train.keep_last=2")) == 0
    child = RunDir(tmp / "runs" / "pruned")
    assert [p.name for p in child.complete_checkpoints()] == [f"step_{s:06d}" for s in (0, 4, 6)]
    ev = EvalConfig(lengths=[64], protocols=["nonoverlap"], max_tokens=512, per_position=False, steps=[0, 6])
    rows = evaluate_run(child.path, ev)[1]
    assert sorted(r["eval_step"] for r in rows) == [0, 6]


def test_an_interrupted_child_resumes_like_any_run(parent, monkeypatch):
    tmp, cfg, parent_dir = parent
    assert train.main(child_args(cfg, parent_dir, "straight")) == 0
    with monkeypatch.context() as m:
        stop_after(3, m)
        assert train.main(child_args(cfg, parent_dir, "broken")) == 128 + signal.SIGTERM
    assert train.main(child_args(cfg, parent_dir, "broken", "--resume")) == 0
    losses = {name: [json.loads(line).get("loss") for line in RunDir(tmp / "runs" / name).metrics.read_text().splitlines()]
              for name in ("straight", "broken")}
    assert losses["straight"] == losses["broken"]
    assert read_meta(RunDir(tmp / "runs" / "broken").step_dir(6))["parent"]["run"] == str(parent_dir)


def test_the_budget_report(parent, tmp_path):
    tmp, cfg, parent_dir = parent
    if not (tmp / "runs" / "child").exists():
        assert train.main(child_args(cfg, parent_dir)) == 0
    ev = EvalConfig(lengths=[16, 64], protocols=["nonoverlap"], max_tokens=512, steps=[0, 2, 6], reference="rope @ 6")
    results = run_extrapolation([tmp / "runs" / "child"], tmp_path / "r", lambda c: ev)
    report = (tmp_path / "r" / "report.md").read_text()
    assert "### Fine-tuning budget" in report and "At 64 tokens:" in report  # 4L of the parent's L = 16
    assert "At 16 tokens:" in report  # and L itself: what the short context keeps
    assert "| rope | " in report and "step 0 | step 2 | step 6" in report
    assert (tmp_path / "r" / "budget_0_nonoverlap.png").read_bytes()[:4] == b"\x89PNG"
    assert {r["eval_step"] for r in results["results"]} == {0, 2, 6}
    assert "| rope @ 0 vs rope @ 6 |" in report and "| rope @ 2 vs rope @ 6 |" in report
    assert f"Fine-tuned from `{parent_dir}` (step_" in report and "at training length 16" in report
    assert "Shown at 1× and 4× the parent's training length (16 tokens)" in report


def test_budget_rows_sort_by_step_and_pair_at_equal_steps(monkeypatch):
    import ropelab.eval.lm.comparisons as comparisons
    from ropelab.eval.reporting.labels import label_order, split_step

    labels = ["yarn @ 400", "none @ 50", "none @ 100", "yarn @ 0", "none @ 0", "none @ 400", "yarn @ 50", "rope"]
    assert sorted(labels, key=label_order) == ["none @ 0", "none @ 50", "none @ 100", "none @ 400", "rope",
                                               "yarn @ 0", "yarn @ 50", "yarn @ 400"]
    assert split_step("none @ 50 + yarn") == ("none + yarn", 50) and split_step("a @ b") == ("a @ b", None)
    seen = []
    monkeypatch.setattr(comparisons, "compare", lambda results, corpus, protocol, pairs: seen.extend(pairs))
    comparisons.section_comparisons({}, "c", "nonoverlap", dict.fromkeys(labels), "none @ 400")
    assert seen == [("none @ 0", "none @ 400"), ("none @ 50", "none @ 400"), ("none @ 100", "none @ 400"),
                    ("rope", "none @ 400"), ("yarn @ 0", "none @ 0"), ("yarn @ 50", "none @ 50"), ("yarn @ 400", "none @ 400")]


@pytest.mark.parametrize("extra,message", [
    (["init.run={tmp}/runs/nowhere"], "is not a run directory"),
    (["model.d_model=64"], "another architecture (model.d_model: 32 in the parent, 64 here"),
    (["model.pos.kind=alibi"], "scales RoPE's frequencies"),
    (["data.tokenizer.kind=char"], "another tokenizer"),
])
def test_bad_parents_are_refused_before_anything_is_written(parent, capsys, extra, message):
    tmp, cfg, parent_dir = parent
    args = child_args(cfg, parent_dir, "bad") + [e.format(tmp=tmp) for e in extra]
    assert train.main(args) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    assert not (tmp / "runs" / "bad").exists()


def test_a_parent_still_training_is_refused(parent, capsys, monkeypatch):
    tmp, cfg, _ = parent
    with monkeypatch.context() as m:
        stop_after(2, m)
        assert train.main([cfg, "name=unfinished", "train.seq_len=16", "train.max_steps=12"]) == 128 + signal.SIGTERM
    assert train.main(child_args(cfg, tmp / "runs" / "unfinished", "orphan")) == 2
    assert "has not finished training (its latest checkpoint is step 2 of 12)" in capsys.readouterr().err
    assert not (tmp / "runs" / "orphan").exists()
    # The advice works: a deliberate start from that checkpoint (init.step) is accepted.
    assert train.main(child_args(cfg, tmp / "runs" / "unfinished", "orphan") + ["init.step=2"]) == 0


def test_a_fine_tuned_run_exports_with_its_scaling(parent, tmp_path, capsys):
    pytest.importorskip("transformers")
    from ropelab.scripts.export_hf import main as export

    tmp, cfg, parent_dir = parent
    if not (tmp / "runs" / "child").exists():
        assert train.main(child_args(cfg, parent_dir)) == 0
    assert export([str(tmp / "runs" / "child"), str(tmp_path / "hf"), "--check", "--check-length", "256"]) == 0
    printed = capsys.readouterr().out
    diff = float(printed.split("random tokens:")[1].split(";")[0])
    assert diff < 1e-4 and "; pass (tolerance 0.0001)" in printed
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn" and config["rope_parameters"]["factor"] == 4.0
    assert config["rope_parameters"]["original_max_position_embeddings"] == 16


def table_after(report: str, title: str) -> list[list[str]]:
    """The cells of the first markdown table after the line starting with ``title``."""
    lines = report[report.index(title):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_a_fine_tune_beside_its_parent_is_reported_at_each_rows_own_length(parent, tmp_path, capsys):
    """Parent at L = 16, child fine-tuned at 64 with YaRN: no header claims one L, the ratio to
    L divides each row by its own, the scaling table has both rows' scalings, and the child
    is compared with its parent (the default reference stands in for no row here)."""
    tmp, cfg, parent_dir = parent
    if not (tmp / "runs" / "child").exists():
        assert train.main(child_args(cfg, parent_dir)) == 0
    out = tmp_path / "r"
    assert extrapolation.main([str(parent_dir), str(tmp / "runs" / "child"), "--lengths", "16", "64",
                               "--scaling", "none", "yarn", "--protocols", "nonoverlap", "--max-tokens", "512",
                               "--no-per-position", "--out", str(out)]) == 0
    assert "warning" not in capsys.readouterr().err
    report = (out / "report.md").read_text()
    results = json.loads((out / "results.json").read_text())
    assert "(L)" not in report
    ppl = table_after(report, "Perplexity, 95% interval across documents")  # one seed a row
    assert ppl[0] == ["row", "seeds", "L", "16", "64"]
    assert {row[0]: row[2] for row in ppl[2:]} == {"child": "64", "child + yarn": "64", "parent": "16",
                                                    "parent + yarn": "16"}
    ratios = {row[0]: [cell.split()[0] for cell in row[2:]] for row in table_after(report, "Degradation:")[2:]}
    nll = {(r["name"], r["scaling"], r["length"]): r["nll"] for r in results["results"]}
    assert ratios["parent"] == ["×1.000", f"×{math.exp(nll['parent', 'none', 64] - nll['parent', 'none', 16]):.3f}"]
    assert ratios["child"] == [f"×{math.exp(nll['child', 'none', 16] - nll['child', 'none', 64]):.3f}", "×1.000"]
    scalings = {row[0]: row[1:] for row in table_after(report, "### What each RoPE scaling did")[2:]}
    assert scalings == {"child + yarn": ["64", "1 → 1", "1 → 1"], "parent + yarn": ["16", "1 → 1", "4 → 4"]}
    assert "Reference row: `parent`" in report and "| child vs parent | 64 vs 16 |" in report
    assert missing_reference(results) is None


def test_steps_on_the_command_line_evaluate_those_checkpoints(parent, tmp_path):
    tmp, cfg, parent_dir = parent
    child = tmp / "runs" / "child"
    if not child.exists():
        assert train.main(child_args(cfg, parent_dir)) == 0
    common = ["--lengths", "64", "--protocols", "nonoverlap", "--max-tokens", "512", "--no-per-position"]
    out = tmp_path / "r"
    assert extrapolation.main([str(child), "--steps", "0", "6", *common, "--reference", "rope @ 6",
                               "--out", str(out)]) == 0
    rows = json.loads((out / "results.json").read_text())["results"]
    assert [(r["eval_step"], r["step_tokens"]) for r in rows] == [(0, 0), (6, 6 * 2 * 64)]
    latest = evaluate_run(child, EvalConfig(lengths=[64], protocols=["nonoverlap"], max_tokens=512,
                                            per_position=False))[1]
    assert rows[1]["nll"] == latest[0]["nll"] != rows[0]["nll"]  # step 6 is the latest checkpoint
