"""Seeds whose learned judgement their test instances do not settle (eval/tasks/borderline.py)."""

from __future__ import annotations

import math

import pytest

from ropelab.eval.tasks.borderline import unsettled
from ropelab.eval.tasks.report import write_task_report

from helpers.tasks import cell_row


def one_sided_wilson(correct: int, n: int, upper: bool) -> float:
    """The Wilson score bound written out (Wilson 1927), z = 1.645."""
    z, p = 1.6448536269514722, correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre + half if upper else centre - half


def test_a_judgement_is_settled_by_the_one_sided_bound_on_its_side_of_the_threshold():
    # Learned: 190/200 (0.95) leaves its lower bound at 0.918, 196/200 settles it (0.956).
    assert unsettled(190, 200, 0.95, True) == pytest.approx(one_sided_wilson(190, 200, False))
    assert unsettled(190, 200, 0.95, True) == pytest.approx(0.9181, abs=1e-4)
    assert one_sided_wilson(196, 200, False) == pytest.approx(0.9562, abs=1e-4)
    assert unsettled(196, 200, 0.95, True) is None
    assert unsettled(40, 40, 0.95, True) == pytest.approx(0.9366, abs=1e-4)  # 40 instances cannot settle it
    # Not learned: 187/200 (0.935) may still be at or above 0.95 (upper 0.958); 180/200 is not (0.930).
    assert unsettled(187, 200, 0.95, False) == pytest.approx(one_sided_wilson(187, 200, True))
    assert unsettled(180, 200, 0.95, False) is None
    assert one_sided_wilson(180, 200, True) == pytest.approx(0.9297, abs=1e-4)


def _report(tmp_path, scored: dict[str, int], learned_accuracy=0.95) -> str:
    runs = [{"run": run, "name": run, "encoding": run[:-1], "group": run[:-1], "stem": run[:-1], "seed": int(run[-1]),
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc",
             "eval": {"tasks": {"learned_accuracy": learned_accuracy}}, "tasks_trained": ["copy"]} for run in scored]
    rows = [{**cell_row(run, int(run[-1]), 32, correct, total=100), "encoding": run[:-1]}
            for run, correct in scored.items()]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    return (tmp_path / "report.md").read_text()


def test_the_report_names_the_unsettled_seeds_and_the_range_of_a_rows_learned_count(tmp_path):
    """RoPE: seed 0 100/100 (settled), seed 1 96/100 learned (lower bound 0.914), seed 2 93/100
    not learned (upper bound 0.962); ALiBi's one seed 100/100 is settled and has no line."""
    report = _report(tmp_path, {"rope0": 100, "rope1": 96, "rope2": 93, "alibi0": 100})
    assert one_sided_wilson(96, 100, False) == pytest.approx(0.9138, abs=1e-4)
    assert one_sided_wilson(93, 100, True) == pytest.approx(0.9616, abs=1e-4)
    assert ("| rope | 2/3 | 1–3 of 3 | seed 1 (learned, 96/100 = 0.96, lower bound 0.91); "
            "seed 2 (not learned, 93/100 = 0.93, upper bound 0.96) |") in report
    assert "| alibi |" not in report.split("Seeds near the learned threshold")[1].split("\n\n")[1]
    # Every seed settled (100/100: lower bound 0.974): one sentence, no table.
    report = _report(tmp_path, {"rope0": 100, "rope1": 100})
    assert "unsettled seeds" not in report
    assert "every judged seed is settled" in report


def test_a_bound_rounding_to_the_threshold_keeps_more_digits(tmp_path):
    """195/200 (two depths of 100) has a lower bound of 0.94955, which two decimals print as
    the threshold itself."""
    runs = [{"run": "rope0", "name": "rope0", "encoding": "rope", "group": "rope", "stem": "rope", "seed": 0,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "eval": {"tasks": {"learned_accuracy": 0.95}},
             "tasks_trained": ["passkey"]}]
    rows = [{**cell_row("rope0", 0, 32, correct, total=100, depth=depth), "task": "passkey"}
            for depth, correct in ((0.0, 98), (1.0, 97))]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "seed 0 (learned, 195/200 = 0.97, lower bound 0.9495)" in report  # not "0.95", the threshold


def test_no_section_where_learning_is_not_judged(tmp_path):
    assert "Seeds near the learned threshold" not in _report(tmp_path, {"rope0": 93}, learned_accuracy=None)
