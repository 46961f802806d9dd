"""Layer plans end to end: a plan trains, resumes its config unchanged, is refused where it
cannot be served, and reports and diagnostics name it by its plan (never as its default
kind), colour it on its own, compare it with its reference, and give its RoPE frequency
analysis for its rotary layers only and its other measures per layer type."""

from __future__ import annotations

import json

import pytest

from helpers import ROOT
from helpers.runs import write_run_config
from ropelab import train
from ropelab.configs import load_config
from ropelab.configs.experiment import experiment_differences, seed_group
from ropelab.configs.grid import load_grid, row_of
from ropelab.eval.lm import extrapolation
from ropelab.eval.lm.plots import encoding_color
from ropelab.model.llama_mapping import HFConversionError, check_exportable
from ropelab.scripts import diagnose
from ropelab.training.saved_run import with_scaling
from ropelab.model.config import RopeScalingConfig

PLAN = "model.layers={pattern: SN, types: {S: {window: 8}, N: {pos: {kind: none}}}}"


@pytest.fixture(scope="module")
def plan_runs(tmp_path_factory, corpus):
    tmp = tmp_path_factory.mktemp("plans")
    cfg = str(write_run_config(tmp, corpus))
    common = [cfg, "train.max_steps=8", "train.eval_interval=8", "train.ckpt_interval=8"]
    assert train.main(common + ["name=rope"]) == 0
    for seed in (1, 2):
        assert train.main(common + [f"name=plan-{seed}", f"train.seed={seed}", PLAN]) == 0
    return tmp / "runs"


def test_a_plan_is_its_own_row_with_its_own_colour_against_its_reference(plan_runs, tmp_path):
    runs = [str(plan_runs / name) for name in ("rope", "plan-1", "plan-2")]
    out = tmp_path / "report"
    assert extrapolation.main([*runs, "--lengths", "32", "64", "--protocols", "nonoverlap", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    encodings = {run["name"]: run["encoding"] for run in results["runs"]}
    assert encodings == {"rope": "rope", "plan-1": "rope·w8/none [SN]", "plan-2": "rope·w8/none [SN]"}
    report = (out / "report.md").read_text()
    assert "| rope·w8/none [SN]" in report and "vs rope" in report  # its row, compared with the reference
    assert "Rows such as `rope·w8/none [SN]` are layer plans: each layer type" in report  # the summary reads it
    assert encoding_color("rope·w8/none [SN]") not in (encoding_color("rope"), encoding_color("none"), "#000000")


def test_diagnostics_give_rotary_layers_and_each_layer_type(plan_runs, tmp_path):
    out = tmp_path / "diag"
    runs = [str(plan_runs / name) for name in ("plan-1", "plan-2")]
    assert diagnose.main([*runs, "--lengths", "64", "--windows", "2", "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    run = results["runs"][0]
    assert run["layer_types"] == ["S", "N"] and run["rotary_layers"] == [0]
    [row] = results["rows"]
    share = row["lengths"]["32"]["qk_share"]["mean"]
    assert len(share) == 1  # the NoPE layer has no rotation pairs
    report = (out / "report.md").read_text()
    assert "## By layer type" in report and "| S |" in report and "| N |" in report
    assert "Rows such as `rope·w8/none [SN]` are layer plans" in report


def test_a_plan_keeps_its_identity_and_refuses_what_it_cannot_serve(plan_runs):
    cfg = load_config(plan_runs / "plan-1" / "config.yaml")
    again = load_config(plan_runs / "plan-1" / "config.yaml")
    assert experiment_differences(cfg, again) == [] and seed_group(cfg) == seed_group(again)
    uniform = load_config(plan_runs / "rope" / "config.yaml")
    assert "model.layers.pattern" in experiment_differences(cfg, uniform)
    with pytest.raises(HFConversionError, match="layer plan"):
        check_exportable(cfg.model)
    # A scaling extends the full rotary layers: here none (S is windowed, N has no rotation).
    with pytest.raises(Exception, match="has none"):
        with_scaling(cfg, RopeScalingConfig(type="yarn", factor=4, original_max_len=32))


def test_the_retrieval_plans_grid_shares_the_retrieval_grids_runs():
    """retrieval-layers-cpu.yaml pairs its layer plans with retrieval-cpu.yaml's archived runs:
    every run the two have in common is the same experiment (so its record is restored, not
    trained again), and the plans are the only new rows besides FoX."""
    layers = {r.name: r for r in load_grid(ROOT / "configs/ablations/retrieval-layers-cpu.yaml").plan()}
    retrieval = {r.name: r for r in load_grid(ROOT / "configs/ablations/retrieval-cpu.yaml").plan()}
    shared = layers.keys() & retrieval.keys()
    assert len(shared) == 30  # RoPE, ALiBi and NoPE: 5 seeds of passkey and of multikey
    for name in shared:
        assert experiment_differences(layers[name].cfg, retrieval[name].cfg) == [], name
        assert layers[name].cfg.eval == retrieval[name].cfg.eval, name
    assert {row_of(n) for n in layers.keys() - shared} == {
        f"{task}{design}" for task in ("passkey-12k", "multikey")
        for design in ("_kind-fox", "+nope-last_kind-rope", "+rnope-swa_kind-rope", "+gemma3_kind-rope")}
    for name, run in layers.items():  # each plan's last layer is its global / NoPE one
        if "+" in name:
            last = run.cfg.model.layer_types()[-1]
            assert last.window is None and run.cfg.model.n_layers == (2 if name.startswith("passkey") else 3)
