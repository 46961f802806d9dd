"""scripts/bench.py runs end to end and records what it claims; no timing is asserted."""

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ropelab.scripts import bench

from ropelab.bench import run as bench_run
from ropelab.bench import worker as bench_worker
from ropelab.bench.trees import importable

from helpers import ROOT

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
        assert len(ops) == 5 and all(op["op"] and op["calls_per_step"] > 0 for op in ops)
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
        # The ratio to the bare forward: one per timed pair, their median, same windows per forward.
        assert all(r["flops_ratio"] > 0 and len(r["flops_ratios"]) == 3 for r in evals)
        assert all(r["flops_ratio"] == sorted(r["flops_ratios"])[1] and r["forward_batch"] == 8 for r in evals)
    # One matmul peak per run, measured at its start, behind every row's MFU, and named.
    peak = shape["peak"]
    assert all(shape["train"][kind]["peak"] == peak for kind in ("rope", "alibi", "learned"))
    assert peak["size"] in (512, 1024, 2048) and peak["when"] == "at the start of this run"
    printed = capsys.readouterr().out
    assert "MFU" in printed and "latency" in printed and "2× L=32" in printed and "torch.profiler" in printed and "where one eager rope" in printed
    assert f"MFU against the matmul peak of {peak['flops'] / 1e9:,.0f} GFLOP/s (float32, best of 10" in printed
    assert "× fwd" in printed


def test_a_layer_plan_is_a_row_of_its_own(tmp_path, capsys):
    """--plans gemma3: the preset merged over the shape, measured as the row plan:gemma3 with its
    windows and two bases (not the shape's plain RoPE)."""
    code, out = run_bench(tmp_path, "--set", "model.n_layers=4", "--sections", "train", "eval",
                          "--kinds", "rope", "--plans", "gemma3")
    assert code == 0
    shape = json.loads(out.read_text())["shapes"]["config"]
    assert shape["kinds"] == ["rope", "plan:gemma3"]
    assert all("error" not in shape[s][row] for s in ("train", "eval") for row in shape["kinds"])
    spec = SimpleNamespace(config=str(ROOT / "configs" / "bench.yaml"), set=TINY + ["model.n_layers=4"],
                           eval_multipliers=[1, 2], decode_lengths=[4, 9])
    layers = bench_worker.bench_config(spec, "plan:gemma3").model.layer_types()
    assert [(t.window, t.pos.rope.theta) for t in layers] == [(4, 1e4)] * 3 + [(None, 1e6)]
    assert "plan:gemma3" in capsys.readouterr().out


def test_an_unknown_plan_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(["--plans", "gemma9"])
    assert e.value.code == 2 and "gemma3" in capsys.readouterr().err


def test_bench_warns_when_the_machine_is_busy_and_marks_each_row_measured_then(tmp_path, capsys, monkeypatch):
    """Other work on the CPUs slows every timing, rows measured at different moments by
    different amounts: the run says so before it starts, and each row measured then says so."""
    monkeypatch.setattr(bench_run, "measure_matmul_peak", lambda *a, **k: {"flops": 1e10, "dtype": "float32",
                                                                           "size": 1024})
    monkeypatch.setattr(bench_run, "machine_busy", lambda device_type="cpu": "load average 3.2 on 2 CPUs")
    code, out = run_bench(tmp_path, "--sections", "train", "decode", "--kinds", "rope")
    assert code == 0
    shape = json.loads(out.read_text())["shapes"]["config"]
    assert shape["train"]["rope"]["busy"] == shape["decode"]["rope"]["busy"] == "load average 3.2 on 2 CPUs"
    captured = capsys.readouterr()
    assert "warning: other work shares the CPUs (load average 3.2 on 2 CPUs)" in captured.err
    assert "(1 of 2)" in captured.err and "done in" in captured.err  # progress, measurement by measurement
    assert captured.out.count("(measured while busy)") == 2
    assert "while other work shared the CPUs (load average 3.2 on 2 CPUs)" in captured.out  # the peak too


def test_bench_refuses_a_bad_config_before_measuring(tmp_path, capsys):
    code, out = run_bench(tmp_path, "--sections", "train", "--set", "model.pos.kind=rotary")
    assert code == 2 and not out.exists()
    assert "model.pos.kind" in capsys.readouterr().err


def test_bench_measures_linear_attention_beside_softmax(tmp_path, capsys, monkeypatch):
    # The matmul peak is measured (and tested) above; a fixed one keeps this test fast.
    monkeypatch.setattr(bench_run, "measure_matmul_peak", lambda *a, **k: {"flops": 1e10, "dtype": "float32",
                                                                           "size": 1024})
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
    monkeypatch.setattr(bench_run, "measure_matmul_peak", lambda *a, **k: {"flops": 1e10, "dtype": "float32",
                                                                           "size": 1024})
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


@pytest.mark.slow  # twelve fresh processes: about 22 s on 2 quiet cores; CI runs it (-m slow)
def test_an_ab_comparison_measures_both_trees_in_one_run(tmp_path, capsys):
    """Against HEAD itself: both sides measured in fresh processes, the ratio printed."""
    out = tmp_path / "ab.json"
    code = bench.main(["--config", str(ROOT / "configs" / "bench.yaml"), "--set", *TINY, "--compare", "HEAD",
                       "--sections", "train", "--kinds", "rope", "--repeats", "1", "--warmup", "0",
                       "--out", str(out)])
    assert code == 0
    results = json.loads(out.read_text())
    pair = results["shapes"]["config"]["train"]["rope"]
    assert pair["base"]["tok_s"] > 0 and pair["this"]["tok_s"] > 0
    assert pair["ratio"]["median"] == pytest.approx(pair["this"]["tok_s"] / pair["base"]["tok_s"])
    assert len(results["compare"]["base"]) == 40
    printed = capsys.readouterr().out
    assert "A/B in one run" in printed and "(6 rounds or more) over 1 pair" in printed
    assert bench.main(["--compare", "no-such-rev", "--out", str(tmp_path / "x.json")]) == 2


def test_rounds_alternate_sides_and_give_the_median_paired_ratio(monkeypatch):
    """Six rounds with a fake measurement: the side going first alternates, each side keeps
    its lower-middle record, the ratio is the median of the paired ratios with the 95%
    sign-test interval (its extremes at n = 6), and a failed measurement leaves its pair out."""
    order, speeds = [], {"base": iter([100, 120, 90, 110, 80, 130]), "this": iter([110, 150, 99, 0, 96, 130])}

    def fake(spec, section, row, tree, in_process):
        side = "base" if tree == "BASE" else "this"
        order.append(side)
        tok_s = next(speeds[side])
        return {"tok_s": tok_s, "side": side} if tok_s else {"error": "exit 1: boom"}

    monkeypatch.setattr(bench_run, "measure", fake)
    result = bench_run.compare({}, "train", "rope", "BASE", 6)
    assert order == ["base", "this", "this", "base"] * 3
    assert [r["base"] for r in result["rounds"]] == [100, 120, 90, 110, 80, 130]
    assert result["rounds"][3]["this"] is None  # the failed measurement
    assert result["ratio"]["pairs"] == 5  # ratios 1.1, 1.25, 1.1, 1.2, 1.0
    assert result["ratio"]["median"] == pytest.approx(1.1)
    assert result["ratio"]["low"] is None  # 5 pairs are too few for a 95% interval
    assert result["base"]["tok_s"] == 100 and result["this"]["tok_s"] == 110  # lower middles
    monkeypatch.setattr(bench_run, "measure", lambda *a: {"tok_s": 100.0 if a[3] == "BASE" else 120.0})
    steady = bench_run.compare({}, "train", "rope", "BASE", 6)["ratio"]
    assert (steady["median"], steady["low"], steady["high"]) == (pytest.approx(1.2),) * 3


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


@pytest.mark.parametrize("package", [True, False])
def test_another_trees_code_is_imported_as_ropelab_despite_the_editable_install(tmp_path, package):
    """--compare's base side: ``ropelab`` resolves to the other tree, a tree from after the
    package change (its root an ``__init__.py``) or from before it (bare sibling imports)."""
    tree = tmp_path / "tree"
    (tree / "configs").mkdir(parents=True)
    (tree / "configs" / "__init__.py").write_text("")
    (tree / "configs" / "loader.py").write_text("WHICH = 'other tree'\n")
    if package:
        (tree / "__init__.py").write_text("")
        (tree / "configs" / "probe.py").write_text("from ropelab.configs.loader import WHICH\n")
    else:
        (tree / "configs" / "probe.py").write_text("from configs.loader import WHICH\n")
    probe = "import ropelab.configs.probe as p, ropelab; print(p.WHICH, p.__file__)"
    found = subprocess.run([sys.executable, "-c", probe], env=importable(tree, tmp_path / "imports").env(),
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.split()
    assert found[:2] == ["other", "tree"] and found[2].startswith(str(tmp_path / "imports" / "ropelab"))
