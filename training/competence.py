"""Training to competence: a synthetic run stops once it has learned its tasks at L.

With ``train.stop_at_accuracy: a`` a synthetic run (or a text run, on the tasks its
``data.mix`` mixes in: a parent that retrieves) checks, at every validation
(``train.eval_interval`` steps and the last step), the exact-match accuracy at L =
``train.seq_len`` of each of its tasks on a fixed set of ``train.eval_batches ×
train.batch_size`` instances at that length (data/tasks/batches.py: ``length_set``, the
same for every seed; the same scoring as evaluation, training/exact_match.py), each
multikey/vartrack instance asking as many questions as the evaluation does
(``eval.tasks.asked`` where set, else as trained: a run trained with ``asked: mixed`` and
scored on one question is judged on one question, as the report judges it) and each
passkey or multikey instance's needle at the evaluation's depths in turn
(``eval.tasks.depths``: a uniform depth seldom puts it at either end of the filler, where a
model can fail alone). Once every task is at ``a`` or above at ``train.stop_checks`` consecutive checks (1: the first) the
run saves its checkpoint and ends; ``train.max_steps`` is then the budget. A single check
on a few hundred instances can pass by luck (a model near ``a`` passes some checks and
fails others), so a grid whose report pools the seeds that learned can ask for two in a
row. Either way each checkpoint's meta.json records the outcome (``competence``: the
threshold, the checks asked for, whether and at which step it was reached, the latest
accuracies, the passing checks in a row so far), so a report can say which seeds learned a
task and which ran out of budget, never a silent floor.

The check only reads the model (no random draws), and its record is part of the training
state, so a resumed run stops where the uninterrupted one does, and a run that stopped is
complete: resuming it trains nothing.
"""

from __future__ import annotations

from typing import Callable, Iterable, Optional

from ropelab.training.metrics import read_records

Accuracies = Callable[[object], dict[str, float]]  # model -> {task: exact-match accuracy at L}


class CompetenceStop:
    """The stop of one run: ``check`` after each validation, ``record`` for meta.json."""

    def __init__(self, threshold: float, accuracies: Accuracies, checks: int = 1):
        self.threshold, self.accuracies, self.checks = threshold, accuracies, checks
        self.reached_at: Optional[int] = None  # the step competence was reached at
        self.latest: dict[str, float] = {}
        self.checked_at: Optional[int] = None
        self.streak = 0  # the latest checks in a row at which every task passed

    @property
    def reached(self) -> bool:
        return self.reached_at is not None

    def check(self, model, step: int) -> dict[str, float]:
        """Score the model at L; the accuracies (competence is reached once all are ≥ the
        threshold at ``checks`` checks in a row)."""
        self.latest, self.checked_at = self.accuracies(model), step
        if self.reached_at is None:
            self.streak = self.streak + 1 if min(self.latest.values()) >= self.threshold else 0
            if self.streak >= self.checks:
                self.reached_at = step
        return self.latest

    def record(self) -> dict:
        """What meta.json says: {threshold, checks, reached, step (reached at, or None), accuracy,
        checked_at, streak}."""
        return {"threshold": self.threshold, "checks": self.checks, "reached": self.reached, "step": self.reached_at,
                "accuracy": dict(self.latest), "checked_at": self.checked_at, "streak": self.streak}

    def outcome(self, steps: int) -> str:
        """A line for the end of training."""
        accuracy = ", ".join(f"{task} {acc:.3f}" for task, acc in self.latest.items()) or "not checked"
        if self.reached:
            times = f" at {self.checks} checks in a row" if self.checks > 1 else ""
            return (f"competence reached at step {self.reached_at}: accuracy at L {accuracy} ≥ {self.threshold:g}"
                    f"{times}")
        short = (f"(≥ {self.threshold:g} at the last {self.streak} of the {self.checks} checks in a row asked for)"
                 if self.streak else f"(< {self.threshold:g})")
        return (f"competence NOT reached: the budget of {steps} steps ran out with accuracy at L {accuracy} "
                f"{short}; raise train.max_steps to train further")

    def state_dict(self) -> dict:
        return self.record()

    def load_state_dict(self, state: Optional[dict]) -> None:
        if state:  # a checkpoint written before the stop existed has none
            self.reached_at, self.latest = state.get("step"), dict(state.get("accuracy") or {})
            self.checked_at = state.get("checked_at")
            # Written before train.stop_checks existed: one check decided, so a reached run's streak was 1.
            self.streak = state.get("streak", 1 if self.reached_at is not None else 0)


def earlier_check(records: Iterable[dict], competence: dict, share: float = 0.8) -> Optional[dict]:
    """For a run whose budget ran out (``competence``: its meta.json record), the last check
    at or before ``share`` of the way to its final one, from its metrics.jsonl ``records``
    (``val_acc_<task>``, logged at each check): {"step", "accuracy": {task: accuracy}}, so a
    report can say whether the run was still learning when the budget ended (0.88 at step
    8,000 against 0.94 at 10,000) or had long stalled (at chance throughout). None for a run
    that reached competence, or without such a check."""
    if not competence or competence.get("reached") or not competence.get("checked_at"):
        return None
    tasks, last = list(competence.get("accuracy") or {}), competence["checked_at"]
    checks = [r for r in records if isinstance(r.get("step"), int) and r["step"] <= share * last
              and all(isinstance(r.get(f"val_acc_{t}"), (int, float)) for t in tasks)]
    if not tasks or not checks:
        return None
    check = max(checks, key=lambda r: r["step"])
    return {"step": check["step"], "accuracy": {t: check[f"val_acc_{t}"] for t in tasks}}


def accuracy_curve(records: Iterable[dict], competence: Optional[dict]) -> Optional[dict]:
    """Every check's accuracy at L of a run trained to competence (``competence``: its meta.json
    record), from its metrics.jsonl ``records``: {"steps": [...], "accuracy": {task: [...]}},
    in step order, so a report can draw how each seed learned (a plateau at chance, a late
    rise, a stop); one value a step, the last logged. None without a check."""
    tasks = list((competence or {}).get("accuracy") or {})
    checks = {r["step"]: r for r in records if isinstance(r.get("step"), int)
              and all(isinstance(r.get(f"val_acc_{t}"), (int, float)) for t in tasks)} if tasks else {}
    if not checks:
        return None
    steps = sorted(checks)
    return {"steps": steps, "accuracy": {t: [round(float(checks[s][f"val_acc_{t}"]), 4) for s in steps] for t in tasks}}


def logged_progress(metrics_path, competence: Optional[dict]) -> dict:
    """What a report says of how a run trained to competence learned, from its metrics.jsonl:
    ``competence_earlier`` (``earlier_check``) and ``competence_curve`` (``accuracy_curve``),
    each where there is one; {} where the file cannot be read."""
    if not competence:
        return {}
    try:
        records = read_records(metrics_path)
    except (OSError, UnicodeDecodeError):
        return {}
    found = {"competence_earlier": earlier_check(records, competence),
             "competence_curve": accuracy_curve(records, competence)}
    return {key: value for key, value in found.items() if value}


def reached_competence(meta: dict) -> bool:
    """Whether the run whose checkpoint has ``meta`` stopped because it reached competence: it
    has trained all it will, whatever its budget (a grid does not resume it)."""
    return bool((meta.get("competence") or {}).get("reached"))
