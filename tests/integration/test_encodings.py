"""The table of encodings (model/encodings.py) is the one place that knows about kinds.

Its rows match the registry's classes (tests/unit/test_positional.py); here: it loads without
torch, every kind has its preset, and no code outside the table and the encoding's own
module tests a kind by its name. Kind names are found with ``ast``: string constants equal to
a kind name anywhere but in docstrings and inside longer strings (messages may name kinds).
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from ropelab.configs import load_config
from ropelab.model.config import PosConfig
from ropelab.model.encodings import DEFAULT_KIND, KINDS, LLAMA_KIND, POS_KINDS, PosKind, kinds_where
from ropelab.model.positional import ENCODINGS

from helpers import ROOT

CODE = ("common", "model", "configs", "data", "training", "eval", "scripts")
TABLE = ROOT / "model" / "encodings.py"
# "none" is also a RoPE scaling type and torch's reduction: it counts as the kind only where
# the expression around it speaks of an encoding.
AMBIGUOUS = {"none"}
KIND_CONTEXT = re.compile(r"pos\.kind|pos_kind|\bencoding\b|[\"']encoding[\"']|[\"']kind[\"']|\bPos")


def test_importing_the_table_leaves_torch_unloaded():
    code = "import sys, model.encodings, model.config; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "False"


def test_config_literal_and_constants_come_from_the_table():
    assert typing.get_args(PosKind) == POS_KINDS == tuple(KINDS)
    assert PosConfig().kind == DEFAULT_KIND and DEFAULT_KIND in KINDS
    assert kinds_where("exportable") == (LLAMA_KIND,)
    # A scaling only applies where there is a rotation to scale.
    assert set(kinds_where("rope_scaling")) <= set(kinds_where("rotary"))


@pytest.mark.parametrize("kind", POS_KINDS)
def test_every_kind_has_its_preset(kind):
    preset = ROOT / "configs" / "pe" / f"{KINDS[kind].label}.yaml"
    assert preset.is_file(), f"{kind} has no preset {preset.relative_to(ROOT)}"
    assert load_config([ROOT / "configs" / "quickstart.yaml", preset]).model.pos.kind == kind


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _speaks_of_a_kind(node: ast.Constant, parents: dict) -> bool:
    """For an ambiguous name: whether the comparison, call or container around it is about
    encodings (another kind name beside it, or an expression naming pos.kind / encoding)."""
    context = parents.get(node)
    while isinstance(context, (ast.Tuple, ast.List, ast.Set, ast.Dict, ast.keyword)):
        names = [e.value for e in ast.walk(context) if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if any(n in KINDS and n not in AMBIGUOUS for n in names):
            return True
        if isinstance(context, ast.keyword) and context.arg in ("kind", "encoding", "reference"):
            return True
        context = parents.get(context)
    return context is not None and bool(KIND_CONTEXT.search(ast.unparse(context)))


def kind_literals(path: Path, allowed: set[str]) -> list[tuple[int, int, str]]:
    """(line, column, kind) for each kind name used as a value in ``path`` (see module doc)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = _parents(tree)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KINDS):
            continue
        parent = parents.get(node)
        if node.value in allowed or isinstance(parent, (ast.Expr, ast.JoinedStr)):  # docstrings, f-strings
            continue
        if node.value in AMBIGUOUS and not _speaks_of_a_kind(node, parents):
            continue
        found.append((node.lineno, node.col_offset, node.value))
    return sorted(found)


def own_kinds() -> dict[Path, set[str]]:
    """The kinds each module may name: the table all, an encoding's module its own."""
    allowed = {TABLE: set(KINDS)}
    for kind, cls in ENCODINGS.items():
        allowed.setdefault(Path(inspect.getsourcefile(cls)).resolve(), set()).add(kind)
    return allowed


def test_no_code_names_a_kind_outside_its_module_and_the_table():
    allowed = own_kinds()
    files = [ROOT / "train.py", *(p for top in CODE for p in sorted((ROOT / top).rglob("*.py")))]
    found = [f"{path.relative_to(ROOT)}:{line}: {kind!r}" for path in files
             for line, _, kind in kind_literals(path, allowed.get(path.resolve(), set()))]
    assert len(files) > 40
    assert not found, "ask model/encodings.py instead of testing a kind by name:\n" + "\n".join(found)


def test_the_scan_finds_each_way_of_naming_a_kind(tmp_path):
    """A file that tests kinds every way the scan must catch, and names them every way it must not."""
    source = '''
"""Docstring naming rope and "rope"."""
def f(cfg, kind="alibi", reduction="none"):
    if cfg.model.pos.kind == "xpos" or cfg.pos.kind in ("none", "cope"):
        return TABLE["learned"]
    x = PosConfig(kind="t5")
    y = dict.get("fire", 0)
    if scaling.type == "none" or kind == "none":   # scaling types, not kinds
        loss(reduction="none")
    return f"pos.kind=rope {x}", "uses rope here"
'''
    path = tmp_path / "example.py"
    path.write_text(source)
    assert [kind for _, _, kind in kind_literals(path, set())] == ["alibi", "xpos", "none", "cope", "learned",
                                                                     "t5", "fire"]
    assert [kind for _, _, kind in kind_literals(path, {"xpos", "none"})] == ["alibi", "cope", "learned", "t5", "fire"]
