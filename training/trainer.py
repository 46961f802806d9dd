"""The training loop: one run, from its config to a run directory (training/run_dir.py).

The same loop runs data-parallel under ``torchrun`` (NCCL on CUDA, gloo on CPU); rank 0
alone writes files. A checkpoint is the weights, ``meta.json`` (what evaluation reads) and
``state.pt``, which is ``Trainer.state_dict()`` and is read back by ``load_state_dict``.

Exactness: a resumed run restores weights, optimizer, schedule position, RNG states and
the sampler, so every later logged loss equals the uninterrupted run's (bitwise on CPU
with the same settings and thread count).
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from pathlib import Path
from typing import Optional

import torch

from ropelab.common.atomic import write_text_atomic
from ropelab.common.errors import CheckpointError, UserError
from ropelab.common.logs import get_logger
from ropelab.configs import config_to_yaml, load_config
from ropelab.configs.experiment import experiment_differences
from ropelab.configs.schema import RunConfig
from ropelab.data.samplers import RandomPositions
from ropelab.model.transformer import Transformer
from ropelab.training.checkpoint import (NonFiniteWeights, load_newest, load_state, load_weights, read_meta, save_best,
                                 save_checkpoint, set_aside, unwrap)
from ropelab.training.consistency import check_continuation, fingerprints
from ropelab.training.competence import CompetenceStop
from ropelab.training.data import MixedSampler, TrainingData, prepare
from ropelab.training.nonfinite import NonFiniteWatch, diverged, non_finite_checkpoint
from ropelab.training.memory import check_training
from ropelab.training.metrics import MetricsLog
from ropelab.training.optim import build_optimizer, lr_at, set_learning_rate, upgrade_optimizer_state
from ropelab.training.warm_start import load_parent, parent_record
from ropelab.training.step_timing import compile_decision, use_compile_cache
from ropelab.training.provenance import git_commit
from ropelab.training.run_dir import RunDir
from ropelab.training.run_record import check_not_record
from ropelab.training.runtime import Runtime

logger = get_logger(__name__)


def check_resumable(saved: RunConfig, current: RunConfig, run: RunDir) -> None:
    """Refuse a resume that would silently turn into a different experiment."""
    changed = experiment_differences(saved, current)
    if changed:
        raise UserError(f"cannot resume {run}: these settings differ from the saved run: "
                        f"{', '.join(changed)}. A resumed run must be the same experiment; "
                        "start a new run with another name=... instead.")


def parent_origin(parent: dict) -> str:
    """Where a fine-tuned run's starting weights came from, for its start-up line."""
    tokens = parent.get("tokens")
    trained = f"{tokens:,} tokens" if tokens is not None else "tokens not recorded"
    return f"from {parent['run']} {parent['checkpoint']} (step {parent.get('step')}, {trained})"


class Trainer:
    def __init__(self, cfg: RunConfig, rt: Runtime, data: Optional[TrainingData] = None):
        """``data``: already prepared data (training/data.py's interface, e.g. scripts/bench.py's
        random tokens); by default ``cfg.data`` is prepared, or its synthetic tasks set up."""
        self.rt = rt
        self.run_dir = RunDir.of(cfg)
        resume_from = self._find_resume_point(cfg)
        data = prepare(cfg, rt) if data is None else data
        self.cfg = cfg.with_vocab_size(data.tokenizer.vocab_size)
        self.tokenizer = data.tokenizer
        check_training(self.cfg, rt.device, rt.world_size)  # before the model, batches and validation set
        self.fingerprints = fingerprints(self.cfg, self.tokenizer.to_json())  # recorded in every checkpoint
        t = self.cfg.train
        self.total_steps = t.total_steps(rt.world_size)
        torch.manual_seed(t.seed)
        self.model = Transformer(self.cfg.model).to(rt.device)
        self.optimizer = build_optimizer(self.model, t.lr, t.weight_decay, (t.beta1, t.beta2), rt.device.type,
                                         t.pos_lr_multiplier)
        self.sampler = data.train_sampler(t.seq_len, t.batch_size, t.data_order_seed, rt.rank, rt.world_size)
        # A mixed batch's per-target loss weights (data.mix.loss_share); plain batches have none.
        self.target_weights = self.sampler.target_weights if isinstance(self.sampler, MixedSampler) else None
        self.validation_loss = data.validation(t.seq_len, t.batch_size, t.eval_batches, rt.world_size)
        self.competence = None if t.stop_at_accuracy is None else CompetenceStop(
            t.stop_at_accuracy, data.accuracies(t.seq_len, t.eval_batches * t.batch_size * rt.world_size,
                                                self.cfg.eval.tasks.asked, self.cfg.eval.tasks.resolved_depths()),
            t.stop_checks)
        self.positions = None if t.random_positions is None else RandomPositions(
            t.random_positions.max_len, t.seq_len, t.batch_size, seed=t.data_order_seed, rank=rt.rank,
            world_size=rt.world_size)
        self.scaler = torch.amp.GradScaler(rt.device.type) if rt.dtype == torch.float16 else None
        self.watch = NonFiniteWatch(rt.device)  # the first non-finite step, kept on the device
        self.step, self.tokens_seen, self.best_val, self.wandb_id = 0, 0, math.inf, None
        self.parent: Optional[dict] = None  # where the starting weights came from (init.run)
        self.earlier_commits: list[str] = []  # the commits of this run's earlier sessions, oldest first
        # Every learning-rate schedule this run trained under, [from step, planned total steps]
        # oldest first: more than one where a resumed session re-planned it (a grid that raised
        # train.max_steps; training/consistency.py), which the reports name, since such a run is
        # not the run a fresh start at its final budget would train (eval/reporting/runs_section.py).
        self.schedules: list[list[int]] = [[0, self.total_steps]]
        self.compiled: Optional[bool] = None  # train.compile=auto's decision, once made
        if resume_from is None and self.cfg.init.run:
            parent = load_parent(self.cfg, self.tokenizer)
            self.model.load_state_dict(parent.model.state_dict())
            self.parent = parent_record(parent)
        # Wall seconds of the training loop over every session of this run (steps, validation,
        # checkpoints), for the ablation runner's accounting.
        self.train_seconds, self._session_start = 0.0, time.perf_counter()
        if resume_from is not None:
            self._restore()
        self.forward_model = self._wrap(self.model)
        self.stop_signal: Optional[int] = None
        self.git_commit = git_commit()

    # --- setup ----------------------------------------------------------------------
    def _find_resume_point(self, cfg: RunConfig) -> Optional[Path]:
        ckpt = self.run_dir.latest_checkpoint() if self.run_dir.path.exists() else None
        if ckpt is not None:
            check_not_record(self.run_dir)  # no weights to continue from
        if ckpt is not None and cfg.train.resume == "never":
            raise UserError(f"{self.run_dir} already has a checkpoint ({ckpt.name}). Continue it with "
                            "--resume (or train.resume=auto), or start a new run with name=... ; "
                            "nothing was changed.")
        return ckpt

    def _compiles(self) -> bool:
        """train.compile, or for ``auto`` the decision (training/step_timing.py), made once per run: a
        resumed run keeps the choice its checkpoint recorded, so it continues as it began."""
        choice = self.cfg.train.compile
        if choice != "auto":
            return bool(choice)
        if self.compiled is None:
            decided, why = compile_decision(self.cfg, self.rt, self.total_steps - self.step)
            self.compiled = self.rt.any_rank(decided and self.rt.is_main)  # rank 0's choice, for every rank
            logger.info(f"train.compile=auto: {why}")
        return self.compiled

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self._compiles():
            use_compile_cache()
            model = torch.compile(model)
        if self.rt.world_size > 1:
            ids = [self.rt.device.index] if self.rt.device.type == "cuda" else None
            model = torch.nn.parallel.DistributedDataParallel(model, device_ids=ids)
        return model

    # --- the checkpoint state -------------------------------------------------------
    def state_dict(self) -> dict:
        """Everything besides the weights that continuing exactly needs: a checkpoint's state.pt."""
        return {"optimizer": self.optimizer.state_dict(), "sampler": self.sampler.state_dict(),
                "rng_cpu": torch.get_rng_state(),
                "rng_cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
                "scaler": self.scaler.state_dict() if self.scaler else None,
                "step": self.step, "tokens": self.tokens_seen, "best_val": self.best_val,
                "wandb_id": self.wandb_id, "train_seconds": self.train_seconds, "compiled": self.compiled,
                **({"competence": self.competence.state_dict()} if self.competence else {})}

    def load_state_dict(self, state: dict) -> None:
        """Continue from ``state_dict()``'s output; keys added since a checkpoint was written
        (``train_seconds``, ``wandb_id``) may be absent from it."""
        self.optimizer.load_state_dict(upgrade_optimizer_state(state["optimizer"], self.model,
                                                             self.cfg.train.pos_lr_multiplier))
        self.sampler.load_state_dict(state["sampler"])
        torch.set_rng_state(state["rng_cpu"])
        if torch.cuda.is_available() and state.get("rng_cuda") is not None:
            torch.cuda.set_rng_state(state["rng_cuda"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.step, self.tokens_seen = int(state["step"]), int(state["tokens"])
        self.best_val, self.wandb_id = float(state["best_val"]), state.get("wandb_id")
        self.train_seconds = float(state.get("train_seconds", 0.0))
        self.compiled = state.get("compiled")  # absent before train.compile=auto existed
        if self.competence is not None:
            self.competence.load_state_dict(state.get("competence"))

    def _restore(self) -> None:
        """Continue from the newest checkpoint that reads; damaged newer ones are set aside."""
        saved = load_config(self.run_dir.config)
        check_resumable(saved, self.cfg, self.run_dir)
        try:
            found = load_newest(self.run_dir, self._restore_from)
        except NonFiniteWeights as e:
            raise non_finite_checkpoint(e, self.run_dir, self.cfg) from None
        if found is None:  # the checkpoint seen at start-up has gone since
            raise CheckpointError(f"{self.run_dir} has no checkpoint any more; nothing was changed")
        ckpt, meta, skipped = found
        if self.rt.is_main:
            for bad in skipped:
                set_aside(self.run_dir, bad)
            if skipped or self.run_dir.pointer_target() != ckpt.name:
                write_text_atomic(self.run_dir.latest_pointer, ckpt.name)
        self.rt.barrier()
        logger.info(f"resuming {self.run_dir} from {ckpt.name} (step {meta['step']})")

    def _restore_from(self, ckpt: Path) -> dict:
        """Load ``ckpt`` into the model and the training state; its meta. Every file is read
        before anything is set, so an unreadable one leaves the state as it was."""
        meta = read_meta(ckpt)
        check_continuation(self.run_dir, ckpt, meta, self.cfg, self.tokenizer.to_json(), self.total_steps)
        state = load_state(ckpt)
        load_weights(self.model, ckpt)
        self.parent = meta.get("parent")
        self.earlier_commits = list(meta.get("commits") or filter(None, [meta.get("git_commit")]))
        planned = meta.get("total_steps")
        earlier = [list(p) for p in meta.get("schedules") or ([[0, planned]] if planned else [])]
        if earlier and earlier[-1][1] != self.total_steps:
            earlier.append([int(meta.get("step", 0)), self.total_steps])
        self.schedules = earlier or self.schedules
        try:
            self.load_state_dict(state)
        except (KeyError, ValueError, RuntimeError, TypeError) as e:
            raise CheckpointError(f"{ckpt}/state.pt does not match this run ({type(e).__name__}: {e}); "
                                  "it may come from another version or config. Nothing was changed; start a "
                                  "new run with another name=... instead") from None
        return meta

    # --- one optimisation step ------------------------------------------------------
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Forward/backward over grad_accum micro-batches, clip, step; returns (loss, grad norm)
        as device tensors, read back only on logging steps (``_read``): no step waits for the device."""
        t = self.cfg.train
        lr = lr_at(self.step, t.lr, t.warmup_steps, self.total_steps, t.min_lr_ratio)
        set_learning_rate(self.optimizer, lr)
        loss_sum = torch.zeros((), device=self.rt.device)
        for micro in range(t.grad_accum):
            positions = self._positions(self.sampler.batches_drawn)
            x, y = (b.to(self.rt.device, non_blocking=True) for b in self.sampler.next_batch())
            last = micro == t.grad_accum - 1
            sync = contextlib.nullcontext() if last or self.rt.world_size == 1 else self.forward_model.no_sync()
            with sync, self.rt.autocast():
                weights = self.target_weights(y) if self.target_weights else None
                loss = self.forward_model(x, positions, targets=y, target_weights=weights) / t.grad_accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            loss_sum += loss.detach()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        clip = t.grad_clip if t.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        # A scaler skips steps with non-finite gradients itself: only its loss counts then.
        self.watch.update(self.step + 1, loss_sum, None if self.scaler else grad_norm)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.tokens_seen += t.tokens_per_step(self.rt.world_size)
        return loss_sum, grad_norm.detach()

    def _read(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
        """The step's loss (mean over ranks) and gradient norm on the host, in one read with the
        divergence watch's; raise the divergence error if a step since the last read was not finite."""
        loss = self.rt.mean_across_ranks_tensor(loss)
        loss_value, grad_value, first_bad = torch.stack([loss.float(), grad_norm.float(), self.watch.first]).tolist()
        self._check_finite(first_bad)
        return loss_value, grad_value

    def _check_finite(self, first_bad: Optional[float] = None) -> None:
        if first_bad is None:
            first_bad = float(self.watch.first)
        if first_bad >= 0:
            raise diverged("the loss or the gradient norm became non-finite", int(first_bad), self.run_dir, self.cfg,
                           seen=self.step)

    def _positions(self, batch_index: int) -> Optional[torch.Tensor]:
        """Batch ``batch_index``'s randomized positions (B, T), or None for 0 … T−1."""
        if self.positions is None:
            return None
        return self.positions.batch(batch_index).to(self.rt.device, non_blocking=True)

    # --- evaluation and checkpoints -------------------------------------------------
    def evaluate(self) -> float:
        with self.rt.autocast():
            return self.validation_loss(unwrap(self.model))

    def commits(self) -> list[str]:
        """Every commit that trained some of this run's steps, oldest first, each once: a run
        resumed under other code says so (eval/reporting/runs_section.py names it in the report)."""
        return list(dict.fromkeys([*self.earlier_commits, *filter(None, [self.git_commit])]))

    def save(self, val_loss: Optional[float] = None) -> None:
        self._check_finite()  # never a checkpoint of weights a non-finite step touched
        now = time.perf_counter()
        self.train_seconds += now - self._session_start
        self._session_start = now
        if self.rt.is_main:
            meta = {"tokens": self.tokens_seen, "val_loss": val_loss,
                    "finished": self._complete(), "total_steps": self.total_steps,
                    "params": self.model.num_params(), "git_commit": self.git_commit,
                    "commits": self.commits(), "schedules": self.schedules,
                    "train_seconds": self.train_seconds, "parent": self.parent, **self.fingerprints,
                    **({"competence": self.competence.record()} if self.competence else {})}
            # A fine-tuned run's step 0 is its parent's weights: the budget curve starts there.
            pinned = (0,) if self.parent is not None else ()
            save_checkpoint(self.run_dir, self.step, self.model, self.state_dict(), meta, self.cfg.train.keep_last,
                            pinned)
        self.rt.barrier()

    def _validate_and_save(self, log: MetricsLog) -> None:
        """Step 0 of a run started from a parent: its validation loss and a checkpoint."""
        val_loss = self.evaluate() if self.rt.is_main else None
        self.model.train()
        if self.rt.is_main:
            log.validation(self.step, self.tokens_seen, val_loss)
        self.save(val_loss)

    def _handle_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def _complete(self) -> bool:
        """The budget is spent, or (train.stop_at_accuracy) the tasks are learned at L."""
        return self.step >= self.total_steps or (self.competence is not None and self.competence.reached)

    def _check_competence(self, log: MetricsLog) -> None:
        """After a validation: the accuracy at L of every task (every rank scores the same set)."""
        accuracies = self.competence.check(unwrap(self.model), self.step)
        self.model.train()
        log.accuracy(self.step, self.tokens_seen, accuracies)

    # --- the loop -------------------------------------------------------------------
    def run(self) -> int:
        t, rt = self.cfg.train, self.rt
        if self._complete():
            reason = f"; {self.competence.outcome(self.step)}" if self.competence else ""
            logger.info(f"{self.run_dir} is already complete ({self.step}/{self.total_steps} steps{reason})")
            return 0
        log = MetricsLog(self.run_dir, self.cfg, rt.is_main, start_step=self.step, wandb_id=self.wandb_id)
        if rt.is_main:
            self.run_dir.path.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.run_dir.config, config_to_yaml(self.cfg))
            write_text_atomic(self.run_dir.tokenizer, self.tokenizer.to_json())
        self.wandb_id = log.wandb_id
        flops_per_token = unwrap(self.model).flops_per_token(t.seq_len)
        peak = f"{rt.peak_flops / 1e9:,.0f} GFLOP/s per device" if rt.peak_flops else "no peak"
        origin = f" {parent_origin(self.parent)}" if self.parent is not None else ""
        logger.info(f"training {self.run_dir}{origin}: {self.model.num_params():,} parameters, "
                    f"{t.tokens_per_step(rt.world_size):,} tokens/step, {rt.device.type} {str(rt.dtype)[6:]} "
                    f"× {rt.world_size}; MFU against {peak} ({rt.peak_source})")
        old_handlers = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        self._session_start = time.perf_counter()  # data preparation and setup are not training
        try:
            if self.parent is not None and self.step == 0:  # the starting point is step 0 of the budget
                self._validate_and_save(log)
            return self._loop(log, flops_per_token)
        finally:
            for s, h in old_handlers.items():
                signal.signal(s, h)
            log.close()

    def _loop(self, log: MetricsLog, flops_per_token: float) -> int:
        t, rt = self.cfg.train, self.rt
        self.model.train()
        bar = log.progress(self.total_steps, self.step)
        window_seconds, window_tokens = 0.0, 0  # training time only, not eval or saving
        while self.step < self.total_steps:
            started = time.perf_counter()
            loss, grad_norm = self.train_step()
            step_seconds = time.perf_counter() - started
            window_seconds += step_seconds
            window_tokens += t.tokens_per_step(rt.world_size)
            last = self.step >= self.total_steps
            bar.update(1)
            if self.step % t.log_interval == 0 or last:  # the only steps that read values back
                loss, grad_norm = self._read(loss, grad_norm)
                speed = window_tokens / window_seconds if window_seconds > 0 else 0.0
                log.train(self.step, self.tokens_seen, loss, self.optimizer.param_groups[0]["lr"],
                          grad_norm, speed, rt.mfu(flops_per_token * speed), rt.peak_memory_gib())
                window_seconds, window_tokens = 0.0, 0
                bar.set_postfix(loss=f"{loss:.3f}", lr=f"{self.optimizer.param_groups[0]['lr']:.2e}",
                                tok_s=f"{speed:,.0f}", refresh=False)
            val_loss = None
            if self.step % t.eval_interval == 0 or last:
                val_loss = self.evaluate() if rt.is_main else None
                self.model.train()
                if rt.is_main:
                    log.validation(self.step, self.tokens_seen, val_loss)
                    if val_loss < self.best_val:
                        self.best_val = val_loss
                        save_best(self.run_dir, self.model, {"step": self.step, "val_loss": val_loss,
                                                             **self.fingerprints})
                if self.competence is not None:
                    self._check_competence(log)
                    last = last or rt.any_rank(self.competence.reached)
            # Under torchrun the ranks agree on a signal at logging and checkpoint steps only (an
            # all-reduce every step would wait on the devices): a stop comes within one interval.
            checked = self.step % t.log_interval == 0 or self.step % t.ckpt_interval == 0 or last
            stop = rt.any_rank(self.stop_signal is not None) if checked or rt.world_size == 1 else False
            if self.step % t.ckpt_interval == 0 or last or stop:
                self.save(val_loss)
            if stop and not last:
                name = signal.Signals(self.stop_signal).name if self.stop_signal else "a signal"
                logger.info(f"\nstopped by {name} at step {self.step}; checkpoint saved in {self.run_dir}. "
                            "Continue with --resume.")
                return 128 + (self.stop_signal or signal.SIGTERM)
            if last:
                break
        bar.close()
        logger.info(f"done: {self.step} steps, {self.tokens_seen:,} tokens, best val loss {self.best_val:.4f} "
                    f"→ {self.run_dir}"
                    + (f"; {self.competence.outcome(self.total_steps)}" if self.competence else ""))
        return 0
