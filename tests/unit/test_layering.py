"""Layers only point down, and nothing dodges that rule.

Lowest first: common < model < configs < data < training < eval < grid, bench < train.py <
scripts. A module may import its own package or a lower one (grid and bench are one layer and
do not import each other). Everything is imported through the one package, ``ropelab``
(``from ropelab.model.config import ...``): a bare ``model`` or ``eval`` is an error, since
installing the project puts no such name on the path. No file-level import cycles (within a package
too), no project import inside a function (the usual way to hide a cycle), and no
``sys.path`` edits (the project is installed). Imports are read with ``ast``; nothing is
imported or executed.
"""

from __future__ import annotations

import ast
from pathlib import Path

from helpers import ROOT

LAYERS = {"common": 0, "model": 1, "configs": 2, "data": 3, "training": 4, "eval": 5, "grid": 6, "bench": 6,
          "train": 7, "scripts": 8}
PACKAGE = "ropelab"


def project_modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the layered packages."""
    modules = {}
    for top in LAYERS:
        if (root / f"{top}.py").is_file():
            modules[top] = root / f"{top}.py"
        for path in sorted((root / top).rglob("*.py")) if (root / top).is_dir() else []:
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


class _Imports(ast.NodeVisitor):
    """(imported name, line, inside a function) for every import; relative ones resolved."""

    def __init__(self, module: str, is_package: bool):
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[tuple[str, int, bool]] = []
        self.depth = 0
        self.sys_path_lines: list[int] = []

    def _function(self, node) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(alias.name, node.lineno, self.depth > 0) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:
            anchor = [PACKAGE, *self.package.split(".")]
            anchor = anchor[: len(anchor) - node.level + 1]
            base = ".".join(p for p in [*anchor, base] if p)
        self.found += [(f"{base}.{alias.name}", node.lineno, self.depth > 0) for alias in node.names]
        self.found.append((base, node.lineno, self.depth > 0))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr == "path" and isinstance(node.value, ast.Name) and node.value.id == "sys":
            self.sys_path_lines.append(node.lineno)
        self.generic_visit(node)


def check(root: Path) -> tuple[list[str], dict[str, set[str]]]:
    """(violations, module-level import graph between project modules)."""
    modules = project_modules(root)
    problems, graph = [], {name: set() for name in modules}
    for name, path in modules.items():
        visitor = _Imports(name, path.name == "__init__.py")
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        where = path.relative_to(root)
        problems += [f"{where}:{line}: edits sys.path" for line in visitor.sys_path_lines]
        for target, line, in_function in visitor.found:
            if target.split(".")[0] in LAYERS and target in modules:
                problems.append(f"{where}:{line}: imports {target} by its bare name; use {PACKAGE}.{target}")
                continue
            target = target.removeprefix(f"{PACKAGE}.")
            if target not in modules:  # third-party, stdlib, or a name inside a module
                continue
            if in_function:
                problems.append(f"{where}:{line}: imports {target} inside a function")
            if LAYERS[target.split(".")[0]] > LAYERS[name.split(".")[0]]:
                problems.append(f"{where}:{line}: {name} imports {target}, a higher layer")
            if target != name:
                graph[name].add(target)
    return problems, graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_layers_only_point_down():
    problems, graph = check(ROOT)
    assert len(graph) > 40, "the checker found too few modules to be reading the project"
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    _, graph = check(ROOT)
    assert not cycles(graph), cycles(graph)


def test_the_checker_catches_each_kind_of_violation(tmp_path):
    """A deliberately broken miniature project: every rule must fire."""
    files = {
        "model/__init__.py": "",
        "model/a.py": "from ropelab.model.b import x\n",
        "model/b.py": "from ropelab.model.a import y\n",  # cycle a <-> b
        "model/up.py": "from ropelab.training.run import z\n",  # upward
        "model/bare.py": "from model.a import y\n",  # a bare name, not through the package
        "data/__init__.py": "",
        "data/lazy.py": "def f():\n    from ropelab.configs.c import q\n",  # inside a function
        "configs/__init__.py": "",
        "configs/c.py": "from . import d\nimport sys\nsys.path.insert(0, '.')\n",  # relative ok, sys.path not
        "configs/d.py": "from ropelab.model.a import y\n",
        "training/__init__.py": "",
        "training/run.py": "import numpy\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    problems, graph = check(tmp_path)
    text = "\n".join(problems)
    assert "model.up imports training.run, a higher layer" in text
    assert "imports configs.c inside a function" in text
    assert "configs/c.py:3: edits sys.path" in text
    assert "model/bare.py:1: imports model.a by its bare name; use ropelab.model.a" in text
    assert "configs.d" in graph["configs.c"]  # the relative import was resolved
    assert cycles(graph) == [["model.a", "model.b"]]
    assert len(problems) == 4


MAIN_GUARD = 'if __name__ == "__main__":'  # what makes a module a command (a mention of __main__ does not)


def test_every_entry_point_reports_user_errors_through_the_one_helper():
    """Each module runnable as a command wraps its ``main`` in ``common.cli.entry_point``; an
    old entry point kept for a while (``python -m eval.tasks``) runs a command's ``main``."""
    commands, modules = [], project_modules(ROOT)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        if MAIN_GUARD not in path.read_text(encoding="utf-8"):
            continue
        commands.append(name)
        borrowed = [n.module.removeprefix(f"{PACKAGE}.") for n in tree.body if isinstance(n, ast.ImportFrom)
                    and any(a.name == "main" for a in n.names)]
        if borrowed:
            assert borrowed[0] in commands or MAIN_GUARD in modules[borrowed[0]].read_text(encoding="utf-8"), name
            continue
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        assert mains, f"{name} runs as a command but has no main()"
        decorators = [ast.unparse(d) for d in mains[0].decorator_list]
        assert "entry_point" in decorators, f"{name}.main is not wrapped in entry_point"
    assert {"train", "eval.lm.extrapolation", "scripts.ablate", "scripts.sample", "scripts.cli"} <= set(commands)
