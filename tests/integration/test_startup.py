"""What a fresh process imports before it works: a grid starts one per training run and one
per evaluation, and the test suite many more, so libraries only some paths use (torch's
compiler, scipy.stats) are imported where they are used."""

from __future__ import annotations

import json
import subprocess
import sys

from helpers import ROOT

HEAVY = ("torch._dynamo", "scipy.stats")


def test_training_and_cache_filling_evaluations_start_without_unused_libraries():
    # The modules `python -m` runs for a grid's runs (grid/jobs.py): training, and
    # the evaluations that fill caches (their p-values and t quantiles come with the report).
    modules = ("train", "eval.extrapolation", "eval.tasks", "eval.diagnostics")
    code = (f"import importlib, json, sys\nloaded = {{}}\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            f"    loaded[m] = [h for h in {HEAVY!r} if h in sys.modules]\nprint(json.dumps(loaded))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert json.loads(out.stdout) == {m: [] for m in modules}
