"""A report's results.json layout (common/report_json.py): the same data, one line per cell."""

import json
import math

from ropelab.common.report_json import dumps_report


def _results():
    cell = {"run": "runs/g/rope_seed-0", "length": 128, "nll": 2.72, "unit_nll": [998.5, 1922.6, 256.59],
            "position_unit_nll": [[10.17, 22.48], [0.0012, 14.4]], "note": "ü → ok"}
    return {"created": "2026-11-25 02:00:00", "runs": [{"name": "rope_seed-0", "eval": {"lengths": [128, 256]}}],
            "results": [cell, cell | {"length": 256, "nll": float("nan")}], "missing": [],
            "per_position": {"rope": {"128": [1.0, 2.0]}, 7: None}, "empty": {}, "flag": True, "none": None}


def test_reads_back_as_the_same_data():
    text = dumps_report(_results())
    back = json.loads(text)
    want = json.loads(json.dumps(_results()))  # what the old indent=1 layout read back as (int keys → str)
    assert back.keys() == want.keys()
    assert math.isnan(back["results"][1].pop("nll")) and math.isnan(want["results"][1].pop("nll"))
    assert back == want
    assert back["per_position"]["7"] is None and back["results"][0]["note"] == "ü → ok"


def test_one_line_per_cell_and_smaller_than_indented():
    results = _results()
    results["results"] = [results["results"][0] | {"length": 128 * 2 ** k} for k in range(20)]
    lines = dumps_report(results).splitlines()
    cells = [line for line in lines if line.startswith('{"run":')]
    assert len(cells) == 20 and all(line.endswith("}") or line.endswith("},") for line in cells)
    assert '"created":"2026-11-25 02:00:00",' in lines
    assert len(dumps_report(results)) < 0.7 * len(json.dumps(results, indent=1))


def test_anything_but_a_dict_is_plain_compact_json():
    assert dumps_report([1, {"a": 2}]) == '[1,{"a":2}]\n'
