"""The task report: effective length with its interval, chance, pooling the seeds that
learned a task, and how the report's files are written (eval/tasks/effective_length.py,
eval/tasks/report.py, eval/tasks/first_error.py)."""

from __future__ import annotations

import pytest

from ropelab.eval.tasks.effective_length import effective_length, effective_text, row_effective_length
from ropelab.eval.reporting.runs_section import competence_text, evaluation_provenance
from ropelab.eval.reporting.stats import wilson_interval
from ropelab.eval.tasks.learning import learning_curves
from ropelab.eval.tasks.first_error import first_error_grid, token_edges
from ropelab.eval.tasks.report import by_seed, write_task_report

from helpers.tasks import cell_row


def test_effective_length_by_hand():
    curve = {16: 0.5, 32: 1.0, 64: 0.9, 128: 0.79, 256: 0.95}
    assert effective_length(curve, 32, 0.8) == 64  # 128 falls below 0.8: 256 recovering does not count
    assert effective_length(curve, 32, 0.75) == 256
    assert effective_length({**curve, 128: None}, 32, 0.5) == 64  # a length not served fails
    assert effective_length({32: 0.0, 64: 0.0}, 32, 0.8) is None and effective_length({64: 1.0}, 32, 0.8) is None
    seeds = [{32: 1.0, 64: 0.9, 128: 0.1, 256: 0.0}, {32: 1.0, 64: 0.5, 128: 0.0, 256: 0.0},
             {32: 0.96, 64: 0.96, 128: 0.9, 256: 0.2}]
    found = row_effective_length(seeds, 32, 0.8)
    assert found["per_seed"] == [64, 32, 128] and found["censored"] == 0
    # Known only on the grid: the grid values the seeds fall between, and each seed's own value,
    # never a mean of grid values (64 here, a length no seed was found at in that form).
    assert effective_text(found) == "32–128 (×1–×4); seeds 64, 32, 128"
    kept = row_effective_length([seeds[2], {32: 1.0, 64: 1.0, 128: 1.0, 256: 1.0}], 32, 0.8)
    assert kept["censored"] == 1
    assert effective_text(kept) == "128–≥ 256 (×4–×8); seeds 128, ≥ 256"  # kept to the longest: only "at least"
    one = row_effective_length([seeds[0]], 32, 0.8)
    assert effective_text(one) == "64 (×2); one seed"
    same = row_effective_length([seeds[0]] * 3, 32, 0.8)
    assert effective_text(same) == "64 (×2); seeds 64, 64, 64"
    every = row_effective_length([{32: 1.0, 64: 1.0}] * 2, 32, 0.8)
    assert effective_text(every) == "≥ 64 (×2); seeds ≥ 64, ≥ 64"
    # ALiBi's passkey seeds in the retrieval study: 512, 512, 256, 512 (of 128…1024) read 256–512,
    # where their geometric mean, 431, is no length any seed was measured at.
    alibi = [{128: 1.0, 256: 1.0, 512: 1.0, 1024: 0.5}] * 2 + [{128: 1.0, 256: 1.0, 512: 0.5, 1024: 0.5},
                                                               {128: 1.0, 256: 1.0, 512: 1.0, 1024: 0.2}]
    assert effective_text(row_effective_length(alibi, 128, 0.8)) == "256–512 (×2–×4); seeds 512, 512, 256, 512"


def test_effective_length_section_names_the_fraction_even_where_no_row_learned():
    from ropelab.eval.tasks.effective_length import effective_section
    settings = {"r0": {"reference": 32, "fraction": 0.8, "chance": {}}, "r1": {"reference": 32, "fraction": 0.8}}
    lines = effective_section({"rope": {}, "alibi": {}}, settings, lambda cells: None, "copy")
    assert "at least 0.8 × its accuracy" in lines[1]
    assert lines[-2:] == ["| alibi | – | – (no seed learned the task) |", "| rope | – | – (no seed learned the task) |"]


def test_effective_length_above_chance():
    """A curve at a random candidate's accuracy keeps nothing: 4 needles, one asked, chance 1/4."""
    at_chance = {32: 0.25, 64: 0.25, 128: 0.25}
    assert effective_length(at_chance, 32, 0.8) == 128  # without chance: "kept to the longest length"
    assert effective_length(at_chance, 32, 0.8, chance=0.25) is None
    curve = {32: 0.85, 64: 0.7, 128: 0.69}  # 0.8 × 0.85 = 0.68 kept; above chance 0.45 < 0.8 × 0.6 = 0.48
    assert effective_length(curve, 32, 0.8) == 128 and effective_length(curve, 32, 0.8, chance=0.25) == 32
    found = row_effective_length([at_chance, at_chance], 32, 0.8, chance=0.25)
    assert found["per_seed"] == [None, None] and "at or below chance, 0.25" in effective_text(found)
    half = row_effective_length([at_chance, curve], 32, 0.8, chance=0.25)
    assert effective_text(half) == "32 (×1); seeds –, 32"  # a seed at chance at R has none


def test_chance_of_each_task_by_hand():
    from ropelab.data.tasks import build_task, task_tokenizer
    from ropelab.configs.tasks import SyntheticConfig
    tok = task_tokenizer()

    def chance(name, **cfg):
        return build_task(name, SyntheticConfig(tasks=[name], **cfg), tok).chance

    assert chance("passkey", distractors=4) == pytest.approx(1 / 5) and chance("passkey") == 0.0
    assert chance("multikey", needles=4) == pytest.approx(1 / 4)
    assert chance("multikey", needles=4, asked=2) == pytest.approx(1 / 12)  # 4 · 3 ordered picks
    assert chance("multikey", needles=3, asked="mixed") == pytest.approx((1 / 3 + 1 / 6 + 1 / 6) / 3)
    assert chance("vartrack", chains=2) == pytest.approx(1 / 2)
    assert chance("multivalue", values=3) == pytest.approx(1 / 6)  # the three values in a random order
    # One candidate is no choice to guess: RULER's one chain of four hops, one needle, one value.
    assert chance("vartrack", chains=1, hops=4) == chance("multikey", needles=1) == chance("multivalue", values=1) == 0.0
    assert chance("copy") == chance("addition") == chance("recall") == 0.0


def test_the_runs_table_names_the_checks_in_a_row_a_stop_asked_for():
    assert competence_text({"competence": {"reached": True, "step": 300}}) == "at step 300"  # written before the key
    assert competence_text({"competence": {"reached": True, "step": 300, "checks": 2}}) == "at step 300 (2 checks in a row)"
    assert competence_text({"competence": {"reached": True, "step": 7750}}) == "at step 7,750"  # as every other step
    # The budget ended right after a first passing check of the two asked for.
    ran_out = {"reached": False, "threshold": 0.98, "accuracy": {"copy": 0.984}, "checks": 2, "streak": 1}
    assert competence_text({"competence": ran_out}) == "**not reached** (0.984 ≥ 0.98 at 1 of 2 checks)"


def test_rows_pool_the_seeds_that_learned_the_task_and_say_how_many(tmp_path):
    """Seed 0 learned copy at L (10/10), seed 1 did not (5/10): cells beyond L are seed 0's alone."""
    runs = [{"run": f"r{s}", "name": f"rope_seed-{s}", "encoding": "rope", "group": "g", "stem": "rope", "seed": s,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "eval": {"tasks": {"learned_accuracy": 0.95}},
             "trained_on": "copy",  # a results.json written before tasks_trained was recorded
             "total_steps": 600 if s == 0 else 1000,  # seed 0 stopped under a budget the grid raised since
             **({"competence": {"reached": True, "step": 300}} if s == 0 else
                {"competence": {"reached": False, "threshold": 0.98, "accuracy": {"copy": 0.977}},
                 "competence_earlier": {"step": 800, "accuracy": {"copy": 0.85}}})} for s in (0, 1)]
    errors = {0: {32: [16] * 10, 64: [32] * 4 + [16, 17, 18, 19, 20, 21]}, 1: {32: [16] * 5 + [0] * 5, 64: [0] * 10}}
    rows = [cell_row(f"r{s}", s, n, c, first_error=errors[s][n], answer_tokens=[n // 2] * 10)
            for s, table in ((0, {32: 10, 64: 4}), (1, {32: 5, 64: 0})) for n, c in table.items()]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    low, high = wilson_interval(4, 10)
    assert "| rope | 1/2 | 1.00 " in report and f"| 0.40 [{low:.2f}, {high:.2f}] |" in report
    assert "| rope | 1/2 | 1.00 / (0.50) | 0.40 / (0.00) |" in report  # every seed, the unlearned in ()
    assert "| rope | 32 | 32 (×1); one seed |" in report  # 0.4 < 0.8 × 1.0 at 64
    assert "| rope | 1.00 | 0.75 |" in report  # right before the first error at 64: (4 + (16 + … + 21) / 32) / 10
    assert "at step 300" in report and "**not reached** (0.977 < 0.98; 0.850 at step 800)" in report  # never "0.98 < 0.98"
    assert ("different learning-rate schedules** (the row pools runs of different experiments; retrain them at one "
            "budget to compare like with like): `rope_seed-0` 600 steps; `rope_seed-1` 1,000 steps.") in report
    assert (tmp_path / "copy_first_error.png").read_bytes()[:4] == b"\x89PNG"
    names, lengths, grid = first_error_grid({"r0": {n: [r for r in rows if r["run"] == "r0" and r["length"] == n]
                                                    for n in (32, 64)}}, 32)
    # m_R = 16 answer tokens; answers at 64 are 32 long, so an error falls below 2 × m_R.
    assert names == ["[0, ¼)", "[¼, ½)", "[½, 1)", "[1, 2)", "none"] and lengths == [32, 64]
    # At 64, six instances fail at 16..21 tokens ([1, 2) × m_R), four are right.
    assert grid[:, 0].tolist() == [0, 0, 0, 0, 1.0] and grid[:, 1].tolist() == [0, 0, 0, 0.6, 0.4]


def test_first_errors_of_a_fixed_length_answer_fall_in_token_bins():
    """A retrieval answer keeps its length: one bin per answer token (1: wrong from the start),
    then "none"; past 12 tokens the first token alone and the rest in 11 groups."""
    cells = {32: [{"first_error": [5, 5, 0, 0], "answer_tokens": [5] * 4}],
             64: [{"first_error": [0, 0, 3, 5], "answer_tokens": [5] * 4}]}
    names, lengths, grid = first_error_grid({"r0": cells}, 32, grows=False)
    assert names == ["1", "2", "3", "4", "5", "none"] and lengths == [32, 64]
    assert grid[:, 0].tolist() == [0.5, 0, 0, 0, 0, 0.5] and grid[:, 1].tolist() == [0.5, 0, 0, 0.25, 0, 0.25]
    assert token_edges(5) == [0, 1, 2, 3, 4, 5]
    # 23 tokens (multivalue, 4 values of 5 digits): token 1, then 2-3, 4-5, ..., 22-23.
    assert token_edges(23) == [0, *range(1, 23, 2), 23]
    long = {32: [{"first_error": [0, 1, 2, 22, 23], "answer_tokens": [23] * 5}]}
    names, _, grid = first_error_grid({"r0": long}, 32, grows=False)
    assert names[:3] == ["1", "2–3", "4–5"] and names[-2:] == ["22–23", "none"] and len(names) == 13
    assert grid[:, 0].tolist() == [0.2, 0.4] + [0] * 9 + [0.2, 0.2]


def test_a_row_no_seed_learned_shows_where_every_seed_fails(tmp_path):
    """Multikey that no seed learned: no accuracy pools, but the first-error section shows both
    seeds, marked, by answer token (most answers wrong from their first token: the wrong pick)."""
    runs = [{"run": f"r{s}", "name": f"rope_seed-{s}", "encoding": "rope", "group": "g", "stem": "rope", "seed": s,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "eval": {"tasks": {"learned_accuracy": 0.95}},
             "tasks_trained": ["multikey"]} for s in (0, 1)]
    rows = [{**cell_row(f"r{s}", s, 32, 1, total=4, first_error=[0, 0, 2, 5], answer_tokens=[5] * 4),
             "task": "multikey", "eval_commit": "e" * 40} for s in (0, 1)]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    # The runs section says which code trained the runs and which scored them.
    assert "All 2 runs were trained from commit `abc`, a clean tree." in report
    assert f"The evaluations were computed at `{'e' * 18}`, each a clean tree." in report
    assert "| rope | 0/2 | n/a (no seed learned the task) |" in report
    assert "| rope (not learned: 2 seeds) | 0.35 |" in report  # (0 + 0 + 2/5 + 1) / 4
    assert (tmp_path / "multikey_first_error.png").read_bytes()[:4] == b"\x89PNG"
    # Results written before eval.tasks.learned_accuracy existed pooled every seed, and a report
    # made again from them pools every seed still: its numbers stay those first reported.
    for run in runs:
        run["eval"] = {"tasks": {}}
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path / "early")
    early = (tmp_path / "early" / "report.md").read_text()
    assert "n/a (no seed learned the task)" not in early and "| rope (not learned: 2 seeds) |" not in early
    assert "| rope | 0.35 |" in early  # both seeds pooled in the first-error table


def test_evaluation_provenance_names_the_scoring_commits_and_cells_scored_before_they_were_kept():
    ok = lambda commit=None: {"status": "ok", **({"eval_commit": commit} if commit else {})}  # noqa: E731
    before = "before each cell recorded the commit that scored it"
    assert evaluation_provenance([ok("a" * 40), ok("a" * 40), {"status": "n/a"}]) == [
        f"The evaluations were computed at `{'a' * 18}`, each a clean tree."]
    assert evaluation_provenance([ok("a" * 40), ok("b" * 40 + "-dirty")])[0].endswith(
        "(**not all from a clean tree**).")
    assert evaluation_provenance([ok()]) == [f"The evaluations were computed {before}."]
    # Cells from before the commit was kept are named as such, not as an unclean tree.
    assert evaluation_provenance([ok("a" * 40), ok()]) == [
        f"The evaluations were computed at `{'a' * 18}`, each a clean tree. Some were computed {before}."]


def test_fine_tunes_of_several_parents_count_each_parent_once(tmp_path):
    """Two parents x two fine-tuning seeds, every seed pooled: the accuracy interval comes from the
    two parents' means (1 df), not from four runs taken as independent (eval/reporting/stats.py,
    "Fine-tunes of several parents"); the effective length lists every run's own value."""
    from ropelab.eval.reporting.stats import pooled_accuracy_interval
    runs = [{"run": f"r{p}{s}", "name": f"ft_p{p}_seed-{s}", "encoding": "rope", "group": "g", "stem": "ft", "seed": s,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "tasks_trained": ["copy"],
             "eval": {"tasks": {"learned_accuracy": None}}, "parent": {"run": f"parents/p{p}", "checkpoint": "step_9"}}
            for p in (0, 1) for s in (0, 1)]
    correct = {"r00": (40, 36, 16), "r01": (40, 36, 16), "r10": (36, 16, 0), "r11": (36, 16, 0)}  # at 32, 64, 128
    rows = [cell_row(run, int(run[-1]), n, c, total=40) for run, by_n in correct.items()
            for n, c in zip((32, 64, 128), by_n)]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    at_64 = [(36, 40), (36, 40), (16, 40), (16, 40)]
    low, high = pooled_accuracy_interval(at_64, ("p0", "p0", "p1", "p1"))
    naive = pooled_accuracy_interval(at_64)
    assert f"| 0.65 [{low:.2f}, {high:.2f}] |" in report and high - low > naive[1] - naive[0] + 0.1
    # Effective lengths 64, 64 (parent 0: 0.9 ≥ 0.8 at 64) and 32, 32 (parent 1): every run's value listed.
    curves = [{n: c / 40 for n, c in zip((32, 64, 128), correct[run])} for run in sorted(correct)]
    assert row_effective_length(curves, 32, 0.8)["per_seed"] == [64, 64, 32, 32]
    assert "| rope | 32 | 32–64 (×1–×2); seeds 64, 64, 32, 32 |" in report
    # k_max per run names each value's parent: the two parents' fine-tunes share seeds 0 and 1.
    from ropelab.eval.tasks.report import kmax_table
    passkey = [{**r, "task": "passkey"} for r in rows]
    kmax = [{**cell_row(run, int(run[-1]), 32, 0), "task": "passkey", "kmax": 64 if run[1] == "0" else None}
            for run in sorted(correct)]
    assert kmax_table(runs, passkey, kmax)[-1] == ("| rope | 64 (parent p0, seed 0), 64 (parent p0, seed 1), "
                                                   "< shortest (parent p1, seed 0), < shortest (parent p1, seed 1) |")


def test_a_task_report_replaces_an_earlier_ones_figures_it_no_longer_draws(tmp_path):
    """Written as the perplexity report is: an earlier report's figure this one does not link
    goes (once the new one is whole), other report files stay, and report.md is UTF-8."""
    runs = [{"run": "r0", "name": "rope_seed-0", "encoding": "rope", "group": "g", "stem": "rope", "seed": 0,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "eval": {"tasks": {"learned_accuracy": 0.95}},
             "tasks_trained": ["copy"]}]
    rows = [cell_row("r0", 0, n, 10, first_error=[16] * 10, answer_tokens=[16] * 10) for n in (32, 64)]
    (tmp_path / "report.md").write_text("an earlier report\n")
    (tmp_path / "accuracy_passkey.png").write_bytes(b"stale")  # drawn by an earlier report with passkey
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    assert not (tmp_path / "accuracy_passkey.png").exists()
    assert (tmp_path / "accuracy_copy.png").read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "copy_learning.png").exists()  # its run recorded no curve
    assert "×" in (tmp_path / "report.md").read_text(encoding="utf-8")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_each_seeds_accuracy_during_training_is_drawn_per_row(tmp_path):
    """Seed 0 stopped at competence, seed 1 ran out; a run without a recorded curve is left out."""
    curves = {0: {"steps": [100, 200, 300], "accuracy": {"copy": [0.1, 0.6, 0.99]}},
              1: {"steps": [100, 200, 300, 400], "accuracy": {"copy": [0.0, 0.25, 0.25, 0.3]}}}
    runs = [{"run": f"r{s}", "name": f"rope_seed-{s}", "encoding": "rope", "group": "g", "stem": "rope", "seed": s,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "eval": {"tasks": {"learned_accuracy": 0.95}},
             "tasks_trained": ["copy"], "competence": {"reached": s == 0, "threshold": 0.98, "step": 300},
             **({"competence_curve": curves[s]} if s in curves else {})} for s in (0, 1, 2)]
    rows = [cell_row(f"r{s}", s, n, 10, first_error=[16] * 10, answer_tokens=[16] * 10)
            for s in (0, 1, 2) for n in (32, 64)]
    everyone = by_seed(runs, rows, "copy")
    drawn, threshold = learning_curves("copy", everyone, {r["run"]: r for r in runs})
    assert threshold == 0.98 and list(drawn) == ["rope"]
    assert drawn["rope"] == {0: ([100, 200, 300], [0.1, 0.6, 0.99]), 1: ([100, 200, 300, 400], [0.0, 0.25, 0.25, 0.3])}
    assert learning_curves("passkey", everyone, {r["run"]: r for r in runs}) == ({}, None)  # not a task they logged
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "![copy: accuracy at L during training](copy_learning.png)" in report
    assert "(dashed: the stop's threshold, 0.98)" in report
    assert (tmp_path / "copy_learning.png").read_bytes()[:4] == b"\x89PNG"


def test_fine_tunes_of_shorter_parents_head_lengths_by_the_parents_length(tmp_path):
    """Context extension: runs fine-tuned at 32 from parents trained at 8 speak of multiples of
    the parents' L₀ ("32 (4×L₀)"), not of their own L ("32 (1×L)")."""
    from ropelab.eval.tasks.report import parents_length
    runs = [{"run": f"r{s}", "name": f"ft_seed-{s}", "encoding": "rope", "group": "g", "stem": "ft", "seed": s,
             "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc", "tasks_trained": ["copy"],
             "eval": {"tasks": {"learned_accuracy": None}},
             "parent": {"run": "parents/p0", "checkpoint": "step_9", "train_len": 8}} for s in (0, 1)]
    rows = [cell_row(f"r{s}", s, n, 8) for s in (0, 1) for n in (8, 32)]
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "Training length L = 32, fine-tuned from parents trained at L₀ = 8" in report
    assert "| 8 (1×L₀) | 32 (4×L₀) |" in report and "×L)" not in report
    assert parents_length([{**runs[0], "train_len": 8}]) is None  # fine-tuned at the parents' own length
    assert parents_length([{k: v for k, v in runs[0].items() if k != "parent"}]) is None


def test_seeds_that_did_not_learn_a_needle_task_show_their_accuracy_by_depth(tmp_path):
    """Multikey at L = 32, depths 0 and 1: seed 0 learned it (10/10, 9/10), seed 1 did not
    (8/10 at depth 0, 2/10 at depth 1); ALiBi's one seed learned it, so its row has no line."""
    runs = [{"run": f"{kind}{s}", "name": f"{kind}_seed-{s}", "encoding": kind, "group": kind, "stem": kind,
             "seed": s, "params": 1, "tokens_trained": 1, "train_len": 32, "git_commit": "abc",
             "eval": {"tasks": {"learned_accuracy": 0.95}}, "tasks_trained": ["multikey"]} for kind, s in (("rope", 0), ("rope", 1), ("alibi", 0))]
    scored = {("rope0", 0.0): 10, ("rope0", 1.0): 9, ("rope1", 0.0): 8, ("rope1", 1.0): 2,
              ("alibi0", 0.0): 10, ("alibi0", 1.0): 10}
    rows = [{**cell_row(run, int(run[-1]), 32, correct, depth=depth), "task": "multikey",
             "encoding": run[:-1]} for (run, depth), correct in scored.items()]
    rows += [{**row, "length": 64, "correct": 0, "accuracy": 0.0} for row in rows]  # beyond L: not in the table
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    report = (tmp_path / "report.md").read_text()
    assert "| seeds | at R | 0 | 1 |" in report
    assert "| rope: 1 learned, pooled | 0.95 | 1.00 | 0.90 |" in report
    assert "| rope: seed 1 (not learned) | 0.50 | 0.80 | 0.20 |" in report
    assert "alibi: " not in report
    # Learning not judged (learned_accuracy: null): every seed pools, and no seed failed.
    for run in runs:
        run["eval"] = {"tasks": {"learned_accuracy": None}}
    write_task_report({"created": "now", "runs": runs, "results": rows, "kmax": [], "missing": []}, tmp_path)
    assert "by the needle's depth" not in (tmp_path / "report.md").read_text()
