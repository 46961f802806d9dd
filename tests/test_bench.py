"""scripts/bench.py runs end to end and records what it claims; no timing is asserted."""

import json
from pathlib import Path

import pytest

from scripts import bench, bench_worker

ROOT = Path(__file__).resolve().parents[1]
TINY = ["model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.tokenizer.vocab_size=300",
        "train.seq_len=16", "train.batch_size=2"]


def run_bench(tmp_path, *extra):
    out = tmp_path / "bench.json"
    code = bench.main(["--config", str(ROOT / "configs" / "bench.yaml"), "--set", *TINY,
                       "--in-process", "--repeats", "2", "--warmup", "0", "--decode-lengths", "4", "9",
                       "--decode-repeats", "1", "--eval-multipliers", "1", "2", "--eval-tokens", "64",
                       "--eval-repeats", "1", "--out", str(out), *extra])
    return code, out


def test_bench_writes_every_section_for_every_encoding(tmp_path, capsys):
    code, out = run_bench(tmp_path, "--sections", "train", "decode", "eval", "--kinds", "rope", "alibi", "learned",
                          "--profile", "5")
    assert code == 0
    results = json.loads(out.read_text())
    machine = results["machine"]
    shape = results["shapes"]["config"]
    assert machine["torch"] and machine["git_commit"] and machine["logical_cpus"] >= 1
    for kind in ("rope", "alibi", "learned"):
        train = shape["train"][kind]
        assert "error" not in train, train
        assert train["tokens_per_step"] == 2 * 16 and len(train["step_ms_all"]) == 2
        assert train["tok_s"] == pytest.approx(train["tokens_per_step"] / (train["step_ms"] / 1e3))
        assert train["mfu"] == pytest.approx(train["achieved_flops"] / train["peak"]["flops"])
        assert train["peak"]["dtype"] == "float32" and train["peak_rss_mb"] > 0
        ops = train["profile"]
        assert len(ops) == 5 and any("mm" in op["op"] for op in ops)
        assert 0 < sum(op["share"] for op in ops) <= 1 + 1e-9
        decode = shape["decode"][kind]
        assert [r["new_tokens"] for r in decode["rows"]] == [4, 9]
        assert all(r["cached_tok_s"] > 0 and r["uncached_tok_s"] > 0 and r["speedup"] > 0 for r in decode["rows"])
        lat = decode["latency"]
        # 9 tokens: 8 gaps between forward calls, split into a start and an end window of 4.
        assert lat["new_tokens"] == 9 and lat["window"] == 4 and lat["start_ms"] > 0 and lat["end_ms"] > 0
        evals = shape["eval"][kind]["rows"]
        assert [(r["multiplier"], r["length"]) for r in evals] == [(1, 16), (2, 32)]
        assert all(r["tokens"] > 0 and r["tok_s"] > 0 and r["peak_rss_mb"] > 0 for r in evals)
    printed = capsys.readouterr().out
    assert "MFU" in printed and "latency" in printed and "2× L=32" in printed and "torch.profiler" in printed and "where one eager rope" in printed


def test_bench_refuses_a_bad_config_before_measuring(tmp_path, capsys):
    code, out = run_bench(tmp_path, "--sections", "train", "--set", "model.pos.kind=rotary")
    assert code == 2 and not out.exists()
    assert "model.pos.kind" in capsys.readouterr().err


def test_bench_measures_linear_attention_beside_softmax(tmp_path, capsys, monkeypatch):
    # The matmul peak is measured (and tested) above; a fixed one keeps this test fast.
    monkeypatch.setattr(bench_worker, "measure_matmul_peak", lambda *a, **k: {"flops": 1e10, "dtype": "float32"})
    code, out = run_bench(tmp_path, "--sections", "train", "decode", "--attention", "softmax", "linear",
                          "--kinds", "rope", "alibi")
    assert code == 0
    results = json.loads(out.read_text())["shapes"]["config"]
    assert results["kinds"] == ["rope", "alibi", "linear+rope"]
    assert "no attention matrix to bias" in results["skipped"]["linear+alibi"]
    train, decode = results["train"]["linear+rope"], results["decode"]["linear+rope"]
    assert "error" not in train and "error" not in decode, (train, decode)
    assert train["tok_s"] > 0 and decode["latency"]["end_ms"] > 0
    # MFU counts linear attention's own FLOPs, not softmax's.
    assert train["achieved_flops"] / train["tok_s"] != results["train"]["rope"]["achieved_flops"] / results["train"]["rope"]["tok_s"]
    printed = capsys.readouterr().out
    assert "linear+rope" in printed and "skipped linear+alibi" in printed


def test_the_compile_speedup_is_paired_in_one_process(tmp_path, capsys, monkeypatch):
    """The compile section times eager steps in turn with compiled ones in its own process
    and reports the ratio of their medians (here torch.compile is the identity: the
    structure is tested, never a timing)."""
    import torch

    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: model)
    monkeypatch.setattr(bench_worker, "measure_matmul_peak", lambda *a, **k: {"flops": 1e10, "dtype": "float32"})
    built = []
    original = bench_worker.Trainer

    def spy(cfg, *args, **kwargs):
        built.append(cfg.train.compile)
        return original(cfg, *args, **kwargs)

    monkeypatch.setattr(bench_worker, "Trainer", spy)
    code, out = run_bench(tmp_path, "--sections", "train", "compile", "--kinds", "rope", "--repeats", "3")
    assert code == 0 and built == [False, True, False]  # the train section, then compiled + its eager twin
    shape = json.loads(out.read_text())["shapes"]["config"]
    paired = shape["compile"]["rope"]["paired"]
    assert paired["steps"] == 3 and paired["eager_step_ms"] > 0 and paired["compiled_step_ms"] > 0
    assert paired["speedup"] == pytest.approx(paired["eager_step_ms"] / paired["compiled_step_ms"])
    assert "paired" not in shape["train"]["rope"]
    printed = capsys.readouterr().out
    assert f"{paired['speedup']:.2f}×" in printed and "taken in turn in one process" in printed


def test_the_small_shape_is_nanogpts_cpu_recipe():
    from types import SimpleNamespace
    spec = SimpleNamespace(config=str(ROOT / "configs" / "bench-small.yaml"), set=[], eval_multipliers=[1],
                           decode_lengths=[4])
    cfg = bench_worker.bench_config(spec, "rope")
    assert (cfg.model.d_model, cfg.model.n_layers, cfg.model.n_heads) == (128, 4, 4)
    assert (cfg.train.seq_len, cfg.train.batch_size, cfg.model.vocab_size) == (64, 12, 65)


def test_an_ab_comparison_measures_both_trees_in_one_run(tmp_path, capsys):
    """Against HEAD itself, two rounds: every pair measured in fresh processes, each side's
    median record kept, the median paired ratio printed (no interval from two pairs)."""
    out = tmp_path / "ab.json"
    code = bench.main(["--config", str(ROOT / "configs" / "bench.yaml"), "--set", *TINY, "--compare", "HEAD",
                       "--rounds", "2", "--sections", "train", "--kinds", "rope", "--repeats", "1",
                       "--warmup", "0", "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    pair = results["shapes"]["config"]["train"]["rope"]
    assert pair["base"]["tok_s"] > 0 and pair["this"]["tok_s"] > 0
    assert len(pair["rounds"]) == 2 and all(r["base"] > 0 and r["this"] > 0 for r in pair["rounds"])
    ratios = sorted(r["this"] / r["base"] for r in pair["rounds"])
    assert pair["ratio"]["median"] == pytest.approx(sum(ratios) / 2)
    assert pair["ratio"]["pairs"] == 2 and pair["ratio"]["low"] is None
    assert pair["base"]["tok_s"] == min(r["base"] for r in pair["rounds"])  # the lower middle of two
    assert len(results["compare"]["base"]) == 40
    printed = capsys.readouterr().out
    assert "A/B in one run" in printed and "(6 rounds or more) over 2 pairs" in printed
    assert bench.main(["--compare", "no-such-rev", "--out", str(tmp_path / "x.json")]) == 2


def test_rounds_need_a_comparison(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--rounds", "3", "--out", str(tmp_path / "x.json")])
    assert exc.value.code == 2 and "--rounds repeats an A/B pair" in capsys.readouterr().err


def test_bench_trains_a_synthetic_config_on_its_task_instances(tmp_path, monkeypatch):
    """A synthetic-task config is benchmarked on the real step: its sampler draws instances."""
    drawn = []
    original = bench_worker.TaskData.train_sampler

    def spy(self, *args, **kwargs):
        drawn.append(self.cfg.tasks)
        return original(self, *args, **kwargs)
    monkeypatch.setattr(bench_worker.TaskData, "train_sampler", spy)
    out = tmp_path / "bench.json"
    code = bench.main(["--config", str(ROOT / "configs" / "synthetic-cpu.yaml"), "--set", "model.d_model=32",
                       "model.n_heads=2", "train.batch_size=2", "--in-process", "--sections", "train",
                       "--kinds", "rope", "--repeats", "2", "--warmup", "0", "--out", str(out)])
    assert code == 0 and drawn == [["passkey", "copy", "recall", "addition"]]
    train = json.loads(out.read_text())["shapes"]["config"]["train"]["rope"]
    assert "error" not in train and train["tokens_per_step"] == 2 * 32
