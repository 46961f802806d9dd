"""A run's metrics: ``metrics.jsonl`` in the run directory, progress for a person, optional wandb.

Progress is a tqdm bar on a terminal. When the output goes to a file (or ``log.progress``
is false) it is one line per logged step (every ``train.log_interval`` steps: step, loss,
learning rate, tokens/s) and one per validation (loss and perplexity) instead, which a
log file shows as it is; those lines are INFO messages (common/logs.py).

Only rank 0 logs. On resume, records from steps after the checkpoint (which will be
trained again) are dropped from metrics.jsonl, so the file reads as one uninterrupted
run; wandb continues the same run id, stored in the checkpoint state and in the run
directory (training/run_dir.py).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
import uuid
from typing import Optional

from tqdm import tqdm

from ropelab.configs import config_to_dict
from ropelab.common.atomic import write_text_atomic
from ropelab.common.storage import CONTINUE_RUN, is_storage_error, storage_error
from ropelab.common.errors import UserError
from ropelab.common.logs import get_logger
from ropelab.model.loss import perplexity_of
from ropelab.training.run_dir import RunDir

logger = get_logger(__name__)


class _NoBar:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kwargs) -> None: ...
    def close(self) -> None: ...


def _records(text: str):
    """(line, record) for each complete record; a line cut short (e.g. by a full disk) is dropped."""
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield line, record


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


class MetricsLog:
    def __init__(self, run: RunDir, cfg, is_main: bool, start_step: int = 0,
                 wandb_id: Optional[str] = None):
        self.run, self.cfg, self.is_main = run, cfg, is_main
        self.wandb, self.wandb_id, self.file = None, wandb_id, None
        self.bar = is_main and cfg.log.progress and sys.stderr.isatty()  # tqdm draws on stderr
        self.lines = is_main and not (cfg.log.progress and sys.stdout.isatty())
        self.total_steps: Optional[int] = None
        self.started = time.perf_counter()
        if not is_main:
            return
        run.path.mkdir(parents=True, exist_ok=True)
        path = run.metrics
        try:
            if path.exists():
                kept = [line for line, record in _records(path.read_text()) if record.get("step", 0) <= start_step]
                write_text_atomic(path, "".join(line + "\n" for line in kept))
            self.file = open(path, "a")
        except OSError as e:
            if not is_storage_error(e):
                raise
            raise storage_error(e, "write the metrics", path) from None
        if cfg.log.wandb:
            self._init_wandb()

    def _init_wandb(self) -> None:
        try:
            import wandb
        except ImportError:
            raise UserError("log.wandb=true needs the wandb package: pip install wandb "
                            "(or set log.wandb=false)") from None
        id_file = self.run.wandb_id
        if self.wandb_id is None and id_file.exists():
            self.wandb_id = id_file.read_text().strip()
        self.wandb_id = self.wandb_id or uuid.uuid4().hex[:8]
        write_text_atomic(id_file, self.wandb_id)
        log = self.cfg.log
        try:  # a missing login, no network, a bad WANDB_* variable: wandb's own exceptions, of many kinds
            self.wandb = wandb.init(project=log.wandb_project, entity=log.wandb_entity, name=self.cfg.name,
                                    id=self.wandb_id, resume="allow", mode=log.wandb_mode,
                                    dir=str(self.run.wandb_dir), config=config_to_dict(self.cfg))
        except Exception as e:  # noqa: BLE001 - any of them is the user's setup, not a bug here
            mode = log.wandb_mode or os.environ.get("WANDB_MODE") or "online"
            raise UserError(f"log.wandb=true: wandb could not start in {mode} mode ({type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0] if str(e).strip() else 'no detail'}). Log in with "
                            "`wandb login`, or log without a network with WANDB_MODE=offline (or "
                            "log.wandb_mode=offline), or set log.wandb=false; nothing was trained now") from None

    def _write(self, record: dict) -> None:
        if not self.is_main:
            return
        record = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as e:  # a full disk: checkpoints already saved stay intact
            if not is_storage_error(e):
                raise
            raise storage_error(e, "write the metrics", self.run.metrics, CONTINUE_RUN) from None
        if self.wandb is not None:
            try:
                self.wandb.log({k: v for k, v in record.items() if v is not None and k != "step"},
                               step=record["step"])
            except Exception as e:  # noqa: BLE001 - wandb's; metrics.jsonl has the record, training goes on
                logger.warning(f"warning: wandb stopped logging ({type(e).__name__}: {e}); metrics.jsonl keeps "
                               "every record, and training continues without wandb")
                self.wandb = None

    def train(self, step: int, tokens: int, loss: float, lr: float, grad_norm: float,
              tokens_per_sec: float, mfu: Optional[float], peak_mem_gib: Optional[float] = None) -> None:
        """One training log line. ``peak_mem_gib``: the GPU allocator's peak over the window
        the line covers (CUDA only; the key is left out elsewhere)."""
        record = {"step": step, "tokens": tokens, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                  "tokens_per_sec": round(tokens_per_sec, 1), "mfu": mfu}
        if peak_mem_gib is not None:
            record["peak_mem_gib"] = round(peak_mem_gib, 3)
        self._write({**record, "time": time.time()})
        if self.lines:
            of = f"/{self.total_steps}" if self.total_steps else ""
            width = len(str(self.total_steps or step))
            efficiency = f" | MFU {mfu:.1%}" if mfu is not None else ""
            if peak_mem_gib is not None:
                efficiency += f" | {peak_mem_gib:.1f} GiB peak"
            logger.info(f"step {step:>{width}}{of} | loss {loss:.4f} | lr {lr:.2e} | {tokens_per_sec:,.0f} tok/s"
                        f"{efficiency} | {tokens:,} tokens | {_clock(time.perf_counter() - self.started)} elapsed")

    def validation(self, step: int, tokens: int, val_loss: float) -> None:
        self._write({"step": step, "tokens": tokens, "val_loss": val_loss,
                     "val_ppl": perplexity_of(val_loss), "time": time.time()})
        if self.lines or self.bar:  # with a bar, above it (common/logs.py): the bar keeps the latest training loss
            logger.info(f"validation at step {step}: val loss {val_loss:.4f} | ppl {perplexity_of(val_loss):.2f}")

    def accuracy(self, step: int, tokens: int, accuracies: dict[str, float]) -> None:
        """Exact-match accuracy at L per task (the competence stop's check, training/competence.py)."""
        self._write({"step": step, "tokens": tokens, **{f"val_acc_{task}": acc for task, acc in accuracies.items()},
                     "time": time.time()})
        text = f"accuracy at L at step {step}: " + ", ".join(f"{task} {acc:.3f}" for task, acc in accuracies.items())
        if self.lines or self.bar:
            logger.info(text)

    def progress(self, total: int, initial: int):
        self.total_steps = total
        if not self.bar:
            return _NoBar()
        return tqdm(total=total, initial=initial, desc=self.cfg.name, unit="step", dynamic_ncols=True)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        if self.wandb is not None:
            try:
                self.wandb.finish()
            except Exception as e:  # noqa: BLE001 - wandb's; the run and its metrics are saved
                logger.warning(f"warning: wandb could not finish its run ({type(e).__name__}: {e}); the run "
                               "directory is complete")
            self.wandb = None


def _parsed(lines) -> list[dict]:
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:  # a record cut short (by a kill, or by reading from the middle)
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def read_records(path) -> list[dict]:
    """The records of a metrics.jsonl, without a last line cut short by a kill."""
    with open(path, encoding="utf-8") as f:
        return _parsed(f)


def last_step_record(path, tail_bytes: int = 8192) -> Optional[dict]:
    """The last logged training step of a metrics.jsonl (a record with a loss), read from the
    file's last ``tail_bytes`` only: a long run's file holds thousands of records. None when
    that part holds none."""
    with open(path, "rb") as f:
        f.seek(max(0, f.seek(0, os.SEEK_END) - tail_bytes))
        tail = f.read().decode("utf-8", errors="replace").splitlines()
    steps = [r for r in _parsed(tail) if "loss" in r and isinstance(r.get("step"), int)]
    return steps[-1] if steps else None


def steady_train_seconds(path, tokens: Optional[int]) -> Optional[float]:
    """``tokens`` over the median of the tokens/s that ``path`` (a metrics.jsonl) logged: the
    run's training time at its usual speed. A pause (a stopped or suspended job) or a burst of
    other load lengthens the recorded wall time (``train_seconds``) but moves the median of
    the logged rates little. None without a rate, a token count or a readable file."""
    if not tokens:
        return None
    try:
        rates = [r["tokens_per_sec"] for r in read_records(path)
                 if isinstance(r.get("tokens_per_sec"), (int, float)) and r["tokens_per_sec"] > 0]
    except (OSError, UnicodeDecodeError):
        return None
    return tokens / statistics.median(rates) if rates else None
