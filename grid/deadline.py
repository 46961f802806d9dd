"""``ablate.py --until``: a grid that stops taking runs at a deadline.

A session, a reserved machine or an allocation ends at a known time; runs begun too late
are left half-trained, and a machine that does not come back loses them. With ``--until``
a worker starts a run only while the run's estimate (grid/estimate.py: this
invocation's, or the one saved by an earlier invocation of the same grid) says it ends by
the deadline, and at the deadline it stops the training still under way with SIGTERM, on
which train.py saves a checkpoint at the step it is on (training/trainer.py). Runs stopped
or not started are left for later, not failures: the same command continues them.
Evaluations run to their end (minutes, where training takes hours).

A run that stops once it has learned its task is expected to stop where its row's ended runs
did, on average (grid/estimate.py), and that expectation is renewed each time one of
its row's runs ends here: a seed that looked too long for the time left when the grid started
(no run of its row had ended) may start once one has, and takes the slot it freed.

The deadline is a time of day (``09:25``: the next such time), a date and time
(``2026-12-03T09:25``, ISO 8601), or a duration from now (``90m``, ``2h``, ``3h30m``, as a
Slurm job's time limit would be given).
"""

from __future__ import annotations

import argparse
import datetime as dt
import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from typing import NamedTuple, Optional

_DURATION = re.compile(r"(?:(\d+)h)?(?:(\d+)m)?")
_CLOCK = re.compile(r"(\d{1,2}):(\d{2})")


def parse_deadline(text: str, now: Optional[dt.datetime] = None) -> dt.datetime:
    """The deadline ``text`` names, as a local time without a zone (see the module doc)."""
    now = now or dt.datetime.now()
    text = text.strip()
    duration = _DURATION.fullmatch(text)
    if text and duration and any(duration.groups()):
        hours, minutes = (int(g or 0) for g in duration.groups())
        if hours == minutes == 0:
            raise argparse.ArgumentTypeError(f"a duration of zero leaves no time for any run, got {text!r}")
        try:
            return now + dt.timedelta(hours=hours, minutes=minutes)
        except OverflowError:  # past the year 9999, which no clock reaches
            raise argparse.ArgumentTypeError(f"a duration of {text} ends after the calendar does (the year 9999); "
                                             "give the session's real length (90m, 2h, 3h30m), or leave --until "
                                             "out to take every run") from None
    clock = _CLOCK.fullmatch(text)
    if clock:
        hour, minute = int(clock.group(1)), int(clock.group(2))
        if hour > 23 or minute > 59:
            raise argparse.ArgumentTypeError(f"not a time of day (00:00 to 23:59), got {text!r}")
        at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
        return at if at > now else at + dt.timedelta(days=1)
    try:
        at = dt.datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {WHAT_A_DEADLINE_IS}, got {text!r}") from None
    if at.tzinfo is not None:
        at = at.astimezone().replace(tzinfo=None)
    if at <= now:
        raise argparse.ArgumentTypeError(f"{text!r} has passed (it is {now:%Y-%m-%d %H:%M} now)")
    return at


WHAT_A_DEADLINE_IS = "a time of day (09:25), a date and time (2026-12-03T09:25) or a duration (90m, 2h, 3h30m)"


def negative_until(argv: list[str]) -> Optional[str]:
    """Why ``--until -5m`` (which argparse reads as a flag, not as its value) is no deadline; None
    where the words hold no such value."""
    for flag, value in zip(argv, argv[1:]):
        if flag == "--until" and re.match(r"-\d", value):
            return f"--until {value}: a deadline is ahead of now, as {WHAT_A_DEADLINE_IS}"
    return None


def deadline_arg(text: str) -> float:
    """argparse type of ``--until``: the deadline as a ``time.time()`` value."""
    return parse_deadline(text).timestamp()


def describe(deadline: float) -> str:
    left = deadline - time.time()
    return f"{dt.datetime.fromtimestamp(deadline):%Y-%m-%d %H:%M} (in {_minutes(left)})"


def _minutes(seconds: float) -> str:
    minutes = max(0, round(seconds / 60))
    return f"{minutes // 60} h {minutes % 60} min" if minutes >= 60 else f"{minutes} min"


def steps_past(ended: list[int], done: int) -> list[int]:
    """The steps its row's runs ended at (``ended``) as steps more for a run resumed at step
    ``done``: only those that went past it count, as it has not stopped by its own step."""
    return [step - done for step in ended if step > done]


class CompetencePlan(NamedTuple):
    """A pending run that stops at competence: its row, the steps it has trained and those its
    budget has left, and the seconds of training them all and of its evaluation."""

    row: str
    done: int
    steps: int
    train_s: float
    eval_s: float


@dataclass
class Deadline:
    """When the grid stops taking runs (``at``, a ``time.time()`` value) and what each
    pending run is expected to take, in seconds (training and evaluation; none where no
    estimate was made). ``plans`` are the runs that stop at competence and ``ended`` the steps
    at which each row's runs ended, which ``run_ended`` extends (the workers call it from
    their threads)."""

    at: float
    needs: dict[str, float]
    plans: dict[str, CompetencePlan] = field(default_factory=dict)
    ended: dict[str, list[int]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def refusal(self, name: str, now: Optional[float] = None) -> Optional[str]:
        """Why run ``name`` is not started now (None: it may start)."""
        now = time.time() if now is None else now
        if now >= self.at:
            return "the deadline has passed"
        with self._lock:
            need = self.needs.get(name)
        if need is not None and now + need > self.at:
            return f"needs about {_minutes(need)} by its estimate, {_minutes(self.at - now)} left"
        return None

    def run_ended(self, row: str, step: int) -> list[str]:
        """A run of ``row`` ended (reached competence or its budget) at ``step``: its row-mates
        are now expected to train as many steps as the row's ended runs that went past their
        own progress did on average, in proportion to their whole budget's seconds. Returns the
        runs whose expectation changed."""
        changed = []
        with self._lock:
            seen = self.ended.setdefault(row, [])
            seen.append(step)
            for name, plan in self.plans.items():
                later = steps_past(seen, plan.done)
                if plan.row != row or not later or plan.steps <= 0:
                    continue
                share = min(1.0, sum(later) / len(later) / plan.steps)
                self.needs[name] = plan.train_s * share + plan.eval_s
                changed.append(name)
        return changed


def needs_from(estimates: dict, saved: dict) -> dict[str, float]:
    """Each run's expected seconds: this invocation's estimates (grid/estimate.py's
    Estimate: where the run's row has ended runs, the time they took), else an earlier
    invocation's saved ones (training and evaluation at the whole budget)."""
    needs = {name: float(e["train_s"]) + float(e["eval_s"]) for name, e in saved.items()
             if isinstance(e, dict) and "train_s" in e and "eval_s" in e}
    for name, e in estimates.items():
        if e.failed:
            needs.pop(name, None)
            continue
        train = e.train_s if e.expected_train_s is None else e.expected_train_s
        needs[name] = train + e.eval_s
    return needs


def plans_from(estimates: dict) -> dict[str, CompetencePlan]:
    """The runs of this invocation's estimates that stop at competence, as a Deadline plans them."""
    return {name: CompetencePlan(e.competence_row, e.done, e.steps, e.train_s, e.eval_s)
            for name, e in estimates.items() if not e.failed and e.competence_row is not None}


def wait(proc: subprocess.Popen, deadline: Optional[float]) -> tuple[int, bool]:
    """(exit code, whether the deadline stopped it): wait for ``proc``, sending it SIGTERM at
    the deadline (train.py then saves a checkpoint and exits) and waiting for it to end."""
    if deadline is None:
        return proc.wait(), False
    try:
        return proc.wait(timeout=max(0.0, deadline - time.time())), False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(), True
