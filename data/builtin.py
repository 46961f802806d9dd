"""The built-in corpus: the English documentation that ships with Python itself.

Two parts, both present in every CPython install and readable without a network:
- ``pydoc_data.topics.topics``: the language-reference topics ``help()`` shows;
- docstrings of the pure-Python standard library (module, class and function), read by
  parsing the source files with ``ast`` (never importing them, so no side effects),
  rendered roughly like ``pydoc``: a heading per definition followed by its docstring.

One document per topic and per module, in sorted order, so the text is identical on
every run with the same Python. Each document's split is fixed by a hash of its title
(about 80% train, 10% valid, 10% test of the documents), so a module added in a newer
Python does not move the other documents between splits.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import platform
import sys
import sysconfig
import warnings
from pathlib import Path

# Tests are code about code, and installed packages are not Python's documentation.
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
VALID_PERCENT, TEST_PERCENT = 10, 10


def _stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not _SKIP_DIRS & set(p.relative_to(root).parts)]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _signature(node: ast.AST, qualname: str) -> str:
    if isinstance(node, ast.ClassDef):
        bases = ", ".join(ast.unparse(b) for b in node.bases)
        return f"class {qualname}({bases})" if bases else f"class {qualname}"
    prefix = "async def" if isinstance(node, ast.AsyncFunctionDef) else "def"
    return f"{prefix} {qualname}({ast.unparse(node.args)})"


def _definitions(body: list[ast.stmt], qualifier: str = ""):
    """(heading, docstring) for every documented class/function, depth first in source order."""
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc:
                yield _signature(node, qualifier + node.name), doc
            yield from _definitions(node.body, f"{qualifier}{node.name}.")


def _module_document(root: Path, path: Path) -> tuple[str, str] | None:
    name = path.relative_to(root).with_suffix("").as_posix().replace("/", ".")
    name = name.removesuffix(".__init__")
    try:
        with warnings.catch_warnings():  # e.g. invalid escape sequences in old modules
            warnings.simplefilter("ignore")
            tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError):  # a few files are templates or other dialects
        return None
    blocks = []
    module_doc = ast.get_docstring(tree)
    if module_doc:
        blocks.append(module_doc)
    blocks.extend(f"{heading}\n{doc}" for heading, doc in _definitions(tree.body))
    if not blocks:
        return None
    return f"module {name}", f"Module {name}\n\n" + "\n\n".join(blocks)


@functools.lru_cache(maxsize=1)
def builtin_documents() -> tuple[tuple[str, str], ...]:
    """All (title, text) documents, sorted by title; cached for the life of the process."""
    from pydoc_data.topics import topics

    docs = [(f"topic {name}", text.strip()) for name, text in topics.items() if text.strip()]
    root, files = _stdlib_files()
    docs.extend(doc for doc in map(functools.partial(_module_document, root), files) if doc)
    return tuple(sorted(docs))


def split_of(title: str) -> str:
    """train / valid / test for a document, from a stable hash of its title."""
    bucket = int.from_bytes(hashlib.sha256(title.encode()).digest()[:4], "big") % 100
    if bucket < VALID_PERCENT:
        return "valid"
    if bucket < VALID_PERCENT + TEST_PERCENT:
        return "test"
    return "train"


def builtin_identity() -> dict:
    """What determines the corpus text, cheap to compute (no parsing): for the cache key."""
    root, files = _stdlib_files()
    listing = "\n".join(f"{p.relative_to(root).as_posix()} {p.stat().st_size}" for p in files)
    return {
        "python": sys.version,
        "implementation": platform.python_implementation(),
        "stdlib_listing_sha256": hashlib.sha256(listing.encode()).hexdigest(),
    }
