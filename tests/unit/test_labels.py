"""Row names of reports: a layer plan's name says what each layer type changes, and the
summary explains the form wherever a plan is a row."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from helpers.models import PLANS, plan_config, tiny_config
from ropelab.model.pos_config import RopeScalingConfig
from ropelab.eval.reporting.labels import PLAN_LEGEND, plan_note, plan_rows


def test_a_plans_name_gives_each_type_in_pattern_order_then_the_pattern():
    assert tiny_config("rope").encoding_name() == "rope"  # a uniform model: its kind
    assert plan_config("rnope-swa").encoding_name() == "rope·w8/none [SSSN]"
    # the global type's base and the linear ×2 it trains with: two plans differing there differ in name
    assert plan_config("gemma3").encoding_name() == "rope·w8/rope·θ1e+06·linear×2 [LLLG]"
    assert plan_config("gpt-oss").encoding_name() == "rope·w8·sinks/rope·sinks [LG]"
    assert plan_config("irope").encoding_name() == "rope/none·llama4 [RRRN]"


def test_a_types_name_gives_every_rope_setting_it_changes_and_none_it_inherits():
    def name_with(**rope):
        cfg = plan_config("rnope-swa")
        cfg.layers = copy.deepcopy(cfg.layers)  # PLANS are shared by every test
        S = cfg.layers.types["S"]
        cfg.layers.types["S"] = dataclasses.replace(S, pos=dataclasses.replace(S.pos, rope=dataclasses.replace(S.pos.rope, **rope)))
        return cfg.encoding_name().split("/")[0]
    assert name_with() == "rope·w8"  # RoPE as the default layer has it: only the window
    assert name_with(theta=1e6) == "rope·θ1e+06·w8"
    assert name_with(scaling=RopeScalingConfig(type="linear", factor=4)) == "rope·linear×4·w8"
    assert name_with(pairing="interleaved") == "rope·interleaved·w8"
    assert name_with(rotary_fraction=0.5, frequency_fraction=0.75) == "rope·r0.5·p0.75·w8"


@pytest.mark.parametrize("name", sorted(PLANS))
def test_every_plan_name_is_read_as_a_plan_and_no_uniform_kind_is(name):
    label = plan_config(name).encoding_name()
    assert plan_rows([label, f"{label} + yarn", f"{label} @ 50"]) == [label, f"{label} + yarn", f"{label} @ 50"]
    assert plan_rows(["rope", "rope + yarn", "nope (linear attention)", "rope @ 50", "t5-lr30"]) == []


def test_a_summary_explains_plan_names_only_where_a_plan_is_a_row():
    assert plan_note(["rope", "alibi + yarn"]) == ""  # the reports without plans read as before
    assert plan_note(["rope", "rope·w8/none [SSSN]"]) == f" Rows such as `rope·w8/none [SSSN]` {PLAN_LEGEND}."
