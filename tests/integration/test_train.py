"""train.py end to end on a tiny config: learning, exact resume, faults, DDP, wandb."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import ropelab.model.transformer
from ropelab import train
import ropelab.training.trainer
from ropelab.configs import load_config
from helpers.runs import records, stop_after, write_run_config as write_config
from ropelab.training.checkpoint import load_state, read_meta
from ropelab.training.metrics import MetricsLog
from ropelab.training.run_dir import RunDir
from ropelab.training.runtime import Runtime
from ropelab.training.saved_run import load_run
from ropelab.training.trainer import Trainer
from helpers import ROOT


def latest_checkpoint(run_dir: Path) -> Path:
    return RunDir(run_dir).latest_checkpoint()


def run_cli(*args: str, env_extra: dict | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env_extra or {})}
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=ROOT)


def test_short_run_lowers_loss_and_writes_run_dir(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=60"]) == 0
    run_dir = tmp_path / "runs" / "tiny"
    losses = records(run_dir)
    assert len(losses) == 60
    first, last = sum(losses[s] for s in (1, 2, 3)) / 3, sum(losses[s] for s in (58, 59, 60)) / 3
    assert last < first - 1.0, (first, last)
    val = records(run_dir, "val_loss")
    assert sorted(val) == [10, 20, 30, 40, 50, 60] and val[60] < val[10]
    for name in ("config.yaml", "tokenizer.json", "best/model.safetensors", "checkpoints/latest"):
        assert (run_dir / name).exists(), name
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_000050", "step_000060"]
    meta = read_meta(latest_checkpoint(run_dir))
    assert meta["finished"] and meta["step"] == 60
    run = load_run(run_dir)  # the run directory alone rebuilds the model
    assert run.model.cfg.vocab_size == 257
    # Running the same command again refuses to touch the finished run.
    assert train.main([str(cfg), "train.max_steps=60"]) == 2


def tick_per_step(monkeypatch, seconds: float) -> None:
    """Give the trainer a clock that advances ``seconds`` per training step and stands still
    otherwise, so the wall time it records is known exactly."""
    now = [0.0]
    monkeypatch.setattr(ropelab.training.trainer, "time", SimpleNamespace(perf_counter=lambda: now[0]))
    original = Trainer.train_step

    def train_step(self):
        now[0] += seconds
        return original(self)

    monkeypatch.setattr(Trainer, "train_step", train_step)


def test_interrupted_and_resumed_equals_uninterrupted(tmp_path, corpus, monkeypatch):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "name=straight"]) == 0
    with monkeypatch.context() as m:
        tick_per_step(m, 0.25)
        stop_after(13, m)
        m.setattr(ropelab.training.trainer, "git_commit", lambda: "a" * 40)
        assert train.main([str(cfg), "name=broken"]) == 128 + signal.SIGTERM
    run_dir = tmp_path / "runs" / "broken"
    assert read_meta(latest_checkpoint(run_dir))["step"] == 13
    assert read_meta(latest_checkpoint(run_dir))["commits"] == ["a" * 40]
    assert max(records(run_dir)) == 13
    assert read_meta(latest_checkpoint(run_dir))["train_seconds"] == 13 * 0.25  # recorded unrounded
    with monkeypatch.context() as m:
        tick_per_step(m, 0.25)  # a new session's clock starts again at 0
        m.setattr(ropelab.training.trainer, "git_commit", lambda: "b" * 40)  # resumed under other code
        assert train.main([str(cfg), "name=broken", "--resume"]) == 0
    assert read_meta(latest_checkpoint(run_dir))["train_seconds"] == 30 * 0.25  # the sum of both sessions
    meta = read_meta(latest_checkpoint(run_dir))
    assert meta["git_commit"] == "b" * 40 and meta["commits"] == ["a" * 40, "b" * 40]  # both sessions' code
    straight, resumed = records(tmp_path / "runs" / "straight"), records(run_dir)
    assert sorted(resumed) == list(range(1, 31))
    assert resumed == straight  # bitwise: every logged loss identical
    assert records(run_dir, "val_loss") == records(tmp_path / "runs" / "straight", "val_loss")


def test_positional_lr_multiplier_trains_and_resumes_exactly(tmp_path, corpus, monkeypatch):
    """T5 with its table at 10× the lr: the optimizer state keeps the four groups' scales, a
    resumed run equals an uninterrupted one, and resuming with another multiplier is refused."""
    cfg = write_config(tmp_path, corpus)
    args = [str(cfg), "model.pos.kind=t5", "train.max_steps=8", "train.pos_lr_multiplier=10"]
    assert train.main([*args, "name=straight"]) == 0
    with monkeypatch.context() as m:
        stop_after(4, m)
        assert train.main([*args, "name=broken"]) == 128 + signal.SIGTERM
    groups = load_state(latest_checkpoint(tmp_path / "runs" / "broken"))["optimizer"]["param_groups"]
    assert [g["lr_scale"] for g in groups] == [1.0, 1.0, 10.0, 10.0]
    assert [g["lr"] for g in groups[2:]] == [10 * groups[0]["lr"]] * 2
    assert train.main([*args, "name=broken", "--resume"]) == 0
    assert records(tmp_path / "runs" / "broken") == records(tmp_path / "runs" / "straight")
    assert train.main([str(cfg), "model.pos.kind=t5", "train.max_steps=12", "name=broken", "--resume"]) == 2


def test_resume_refuses_a_different_experiment(tmp_path, corpus, capsys):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    assert train.main([str(cfg), "train.max_steps=20", "model.d_model=64", "--resume"]) == 2
    assert "model.d_model" in capsys.readouterr().err
    assert train.main([str(cfg), "train.max_steps=20", "train.lr=1e-2", "--resume"]) == 2
    # Extending the run is the same experiment.
    assert train.main([str(cfg), "train.max_steps=20", "--resume"]) == 0
    assert max(records(tmp_path / "runs" / "tiny")) == 20


def test_sigterm_saves_a_loadable_checkpoint(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), str(cfg), "train.max_steps=100000",
                             "train.ckpt_interval=100000"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "runs" / "tiny" / "metrics.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline and (not metrics.exists() or len(metrics.read_text().splitlines()) < 5):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Continue with --resume" in out
    ckpt = latest_checkpoint(tmp_path / "runs" / "tiny")
    state = load_state(ckpt)
    assert state["step"] == read_meta(ckpt)["step"] >= 5
    load_run(tmp_path / "runs" / "tiny")


def test_nan_loss_stops_cleanly_and_keeps_checkpoints(tmp_path, corpus, monkeypatch, capsys):
    cfg = write_config(tmp_path, corpus)
    calls = {"n": 0}
    real = ropelab.model.transformer.linear_cross_entropy

    def poisoned(*args, **kwargs):
        calls["n"] += 1
        loss = real(*args, **kwargs)
        return loss * float("nan") if calls["n"] == 15 else loss

    monkeypatch.setattr(ropelab.model.transformer, "linear_cross_entropy", poisoned)
    assert train.main([str(cfg), "train.eval_interval=1000"]) == 2
    err = capsys.readouterr().err
    assert "became non-finite at step 15" in err and "Traceback" not in err
    run_dir = tmp_path / "runs" / "tiny"
    ckpt = latest_checkpoint(run_dir)
    assert read_meta(ckpt)["step"] == 10
    run = load_run(run_dir)
    assert all(torch.isfinite(p).all() for p in run.model.parameters())


def test_corrupt_checkpoints_are_refused_clearly(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    ckpt = latest_checkpoint(tmp_path / "runs" / "tiny")
    weights = ckpt / "model.safetensors"
    good = weights.read_bytes()
    weights.write_bytes(good[: len(good) // 2])
    res = run_cli(str(cfg), "train.max_steps=20", "--resume")
    assert res.returncode == 2 and "truncated or corrupt" in res.stderr and "Traceback" not in res.stderr
    weights.write_bytes(good)
    # A state file holding a pickled object (code on load) is refused, not executed.
    torch.save({"optimizer": object()}, ckpt / "state.pt")
    res = run_cli(str(cfg), "train.max_steps=20", "--resume")
    assert res.returncode == 2 and "cannot load" in res.stderr and "Traceback" not in res.stderr


def test_checkpoint_keys_have_no_compile_prefix(tmp_path):
    from helpers.models import tiny_config
    from ropelab.model.transformer import Transformer
    from safetensors import safe_open
    from ropelab.training.checkpoint import save_checkpoint

    model = Transformer(tiny_config())
    compiled = torch.compile(model)  # not run: wrapping alone adds the _orig_mod. prefix
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())
    ckpt = save_checkpoint(RunDir(tmp_path), 1, compiled, {"step": 1}, {}, keep_last=1)
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and not any("_orig_mod" in k or k.startswith("module.") for k in keys)


def test_existing_run_is_not_overwritten(tmp_path, corpus, capsys):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    before = (tmp_path / "runs" / "tiny" / "metrics.jsonl").read_text()
    assert train.main([str(cfg), "train.max_steps=10"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (tmp_path / "runs" / "tiny" / "metrics.jsonl").read_text() == before


def test_torchrun_two_processes_match_one(tmp_path, corpus):
    cfg = write_config(tmp_path, corpus)
    common = [str(cfg), "train.max_steps=12", "train.eval_interval=6"]
    assert train.main(common + ["name=single", "train.batch_size=8"]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                          str(ROOT / "train.py"), *common, "name=ddp", "train.batch_size=4"],
                         capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    single, ddp = records(tmp_path / "runs" / "single"), records(tmp_path / "runs" / "ddp")
    assert sorted(ddp) == list(range(1, 13))
    for step in single:
        assert ddp[step] == pytest.approx(single[step], rel=1e-4, abs=1e-5), step
    vs, vd = records(tmp_path / "runs" / "single", "val_loss"), records(tmp_path / "runs" / "ddp", "val_loss")
    assert vd[12] == pytest.approx(vs[12], rel=1e-4)


def test_wandb_offline_writes_files_without_network(tmp_path, corpus):
    pytest.importorskip("wandb")
    cfg = write_config(tmp_path, corpus)
    res = run_cli(str(cfg), "train.max_steps=4", "log.wandb=true", "log.wandb_mode=offline",
                  env_extra={"WANDB_SILENT": "true", "HTTPS_PROXY": "http://127.0.0.1:9"})
    assert res.returncode == 0, res.stderr[-2000:]
    run_dir = tmp_path / "runs" / "tiny"
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert offline and any(offline[0].glob("*.wandb"))
    run_id = (run_dir / "wandb_id.txt").read_text().strip()
    assert offline[0].name.endswith(run_id)
    # A resumed run continues the same wandb run id.
    res = run_cli(str(cfg), "train.max_steps=6", "log.wandb=true", "log.wandb_mode=offline", "--resume",
                  env_extra={"WANDB_SILENT": "true"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert all(p.name.endswith(run_id) for p in (run_dir / "wandb").glob("offline-run-*"))


def test_mfu_peak_is_measured_on_cpu_or_taken_from_the_environment(monkeypatch):
    from ropelab.configs.schema import TrainConfig
    from ropelab.training.runtime import setup_runtime

    monkeypatch.delenv("ROPELAB_PEAK_FLOPS", raising=False)
    rt = setup_runtime(TrainConfig(device="cpu"))
    assert rt.peak_source.startswith("measured matmul") and rt.peak_flops > 1e8
    assert rt.mfu(rt.peak_flops / 2) == pytest.approx(0.5)
    monkeypatch.setenv("ROPELAB_PEAK_FLOPS", "2e12")
    rt = setup_runtime(TrainConfig(device="cpu"))
    assert (rt.peak_flops, rt.peak_source) == (2e12, "ROPELAB_PEAK_FLOPS")
    rt = setup_runtime(TrainConfig(device="cpu", dtype="bfloat16"))
    assert rt.peak_flops == 2e12  # the override wins; without it bf16 on a CPU is not timed
    monkeypatch.delenv("ROPELAB_PEAK_FLOPS")
    rt = setup_runtime(TrainConfig(device="cpu", dtype="bfloat16"))
    assert rt.peak_flops is None and rt.mfu(1e9) is None and "not measured" in rt.peak_source


def test_the_peak_behind_mfu_is_measured_in_each_run_and_says_when_the_machine_was_busy(monkeypatch):
    """MFU is against the matmul rate measured at the run's start, never against a best rate
    remembered from other runs (which rose over a day as quieter moments came, so one run's MFU
    drifted); a peak measured while other work shared the CPUs says so."""
    from ropelab.configs.schema import TrainConfig
    from ropelab.training import runtime

    monkeypatch.delenv("ROPELAB_PEAK_FLOPS", raising=False)
    rates = iter([5e10, 2e10, 8e10])
    monkeypatch.setattr(runtime, "measure_matmul_peak", lambda *a, **k: {"flops": next(rates)})
    monkeypatch.setattr(runtime, "machine_busy", lambda device_type="cpu": "")
    assert [runtime.setup_runtime(TrainConfig(device="cpu")).peak_flops for _ in range(2)] == [5e10, 2e10]
    monkeypatch.setattr(runtime, "machine_busy", lambda device_type="cpu": "load average 3.2 on 2 CPUs")
    busy = runtime.setup_runtime(TrainConfig(device="cpu"))
    assert busy.peak_flops == 8e10
    assert busy.peak_source == ("measured matmul at this run's start, while other work shared the CPUs "
                                "(load average 3.2 on 2 CPUs): its MFU may read high")


def test_training_log_lines_carry_gpu_peak_memory_only_when_given(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="ropelab")
    cfg = SimpleNamespace(log=SimpleNamespace(progress=False, wandb=False))
    log = MetricsLog(RunDir(tmp_path / "run"), cfg, is_main=True)
    log.train(1, 64, 2.5, 1e-3, 0.5, 1000.0, None, peak_mem_gib=1.23456)
    log.train(2, 128, 2.4, 1e-3, 0.5, 1000.0, None)
    log.close()
    first, second = records_of(tmp_path / "run" / "metrics.jsonl")
    assert first["peak_mem_gib"] == 1.235 and "peak_mem_gib" not in second
    lines = caplog.messages
    assert "| 1.2 GiB peak |" in lines[0] and "GiB" not in lines[1]
    assert Runtime(device=torch.device("cpu"), dtype=torch.float32).peak_memory_gib() is None


def records_of(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def same(a, b) -> bool:
    """Equal nested state: tensors element for element, everything else by ==."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def test_the_checkpoint_state_is_read_back_whole(tmp_path, corpus):
    """Every field state_dict writes, load_state_dict restores; older state without
    train_seconds still loads."""
    cfg = load_config(write_config(tmp_path, corpus))
    rt = Runtime(device=torch.device("cpu"), dtype=torch.float32)
    trained = Trainer(cfg, rt)
    for _ in range(3):
        trained.train_step()
    trained.best_val, trained.wandb_id, trained.train_seconds = 2.5, "abc", 12.345
    torch.manual_seed(1234)  # an RNG state that building another trainer (seed 7) does not give
    state = trained.state_dict()
    fresh = Trainer(cfg, rt)
    fresh.load_state_dict(state)
    assert same(fresh.state_dict(), state)
    assert (fresh.step, fresh.sampler.batches_drawn, fresh.train_seconds) == (3, 3, 12.345)
    older = Trainer(cfg, rt)
    older.load_state_dict({k: v for k, v in state.items() if k != "train_seconds"})
    assert older.train_seconds == 0.0 and older.step == 3


def test_a_state_file_of_another_layout_is_refused_clearly(tmp_path, corpus, capsys):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.max_steps=10"]) == 0
    ckpt = latest_checkpoint(tmp_path / "runs" / "tiny")
    state = load_state(ckpt)
    torch.save({k: v for k, v in state.items() if k != "sampler"}, ckpt / "state.pt")
    assert train.main([str(cfg), "train.max_steps=20", "--resume"]) == 2
    err = capsys.readouterr().err
    assert "state.pt does not match this run (KeyError: 'sampler')" in err and "Traceback" not in err
    assert read_meta(latest_checkpoint(tmp_path / "runs" / "tiny"))["step"] == 10  # nothing was changed


def test_device_flag_is_short_for_the_override(tmp_path, corpus, capsys):
    cfg = write_config(tmp_path, corpus)
    assert train.main([str(cfg), "train.device=cpu", "--print-config"]) == 0
    with_override = capsys.readouterr().out
    assert train.main([str(cfg), "--print-config", "--device", "cpu"]) == 0
    assert capsys.readouterr().out == with_override and "device: cpu" in with_override
    assert train.main([str(cfg), "--device", "cuda:1", "--print-config"]) == 0
    assert "device: cuda:1" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        train.main([str(cfg), "--device", "gpu"])
    assert exc.value.code == 2 and "'gpu' is not a device" in capsys.readouterr().err
