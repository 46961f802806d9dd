"""Where a grid's run stands on disk: new, partial, done or conflict, as ``train.py --resume``
would see it (ropelab ablate plans from it; grid/tune.py and the launchers read it)."""

from __future__ import annotations

from ropelab.configs import load_config
from ropelab.configs.experiment import experiment_differences
from ropelab.configs.grid import PlannedRun
from ropelab.common.errors import UserError
from ropelab.training.checkpoint import read_meta
from ropelab.training.competence import reached_competence
from ropelab.training.run_dir import RunDir
from ropelab.training.run_record import is_record, record_advice


def status(run: PlannedRun) -> tuple[str, str]:
    """(state, detail): new | partial | done | conflict, as ``train.py --resume`` would see it;
    a record restored from the grid's archive is done, or a conflict when the grid asks for
    more than it holds (grid/archive.py)."""
    state, detail = _status(run)
    run_dir = RunDir.of(run.cfg)
    if state in ("partial", "conflict") and is_record(run_dir):
        return "conflict", f"{detail}; {record_advice(run_dir)}"
    if state == "done" and is_record(run_dir):
        return state, f"{detail}, restored from the archive"
    return state, detail


def past_budget(run: PlannedRun, meta: dict) -> str:
    """How a run on disk (its checkpoint's ``meta``) went past the budget of its row, named by
    the key (a grid whose budget was lowered); "" when it did not. Raising the budget is fine:
    the run is continued, its schedule re-planned (training/consistency.py)."""
    t, step, tokens = run.cfg.train, int(meta["step"]), int(meta.get("tokens") or 0)
    if t.max_tokens is not None:  # by tokens: past it when it would have stopped a step earlier
        if step and tokens - tokens / step >= t.max_tokens:
            return f"train.max_tokens: it trained {tokens:,} tokens, the row's budget is {t.max_tokens:,}"
        return ""
    planned = max(step, int(meta.get("total_steps") or step))
    if planned <= t.max_steps:
        return ""
    if step > t.max_steps:
        return f"train.max_steps: it trained {step} steps, the row's budget is {t.max_steps}"
    return (f"train.max_steps: it was planned for {planned} steps (its learning rate decays over them), the row's "
            f"budget is {t.max_steps}")


def _status(run: PlannedRun) -> tuple[str, str]:
    run_dir = RunDir.of(run.cfg)
    try:
        ckpt = run_dir.latest_checkpoint() if run_dir.path.exists() else None
    except UserError as e:
        return "conflict", str(e)
    if ckpt is None:
        return "new", ""
    diffs = experiment_differences(load_config(run_dir.config), run.cfg)
    if diffs:
        return "conflict", (f"{run_dir} holds a run with other settings ({', '.join(diffs)}); "
                            "move it away or give the grid another name")
    meta = read_meta(ckpt)
    step, budget = meta["step"], run.cfg.train.max_tokens
    if reached_competence(meta):  # train.stop_at_accuracy: stopped before its budget, its tasks learned at L
        return "done", f"step {step}, competence reached"
    past = past_budget(run, meta)
    if past:  # pooled under the row, it would stand for a budget it was not trained to
        return "conflict", (f"{run_dir} holds a run trained to another budget than its row ({past}); move it "
                            "away, give the grid another name, or put the budget back")
    if budget is not None:  # by tokens: N ranks reach it in N times fewer steps than one process
        if meta.get("tokens", 0) >= budget:
            return "done", f"step {step}"
        return "partial", f"{meta.get('tokens', 0):,}/{budget:,} tokens"
    total = run.cfg.train.total_steps()
    if step >= total:
        return "done", f"step {step}"
    return "partial", f"step {step}/{total}"
