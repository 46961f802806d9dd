"""The documentation holds together: README.md is short and every relative link resolves.

Checked for README.md and every Markdown file under docs/: a link or image
(``[text](target)``, ``![alt](target)``) whose target is not a URL must name a file or
directory that exists, relative to the file holding the link, and an ``#anchor`` into a
Markdown file (or into the same file) must be one of that file's headings under GitHub's
slug rules: formatting dropped, lowercase, punctuation dropped, each space a hyphen, and
a heading that repeats an earlier slug gets ``-1``, ``-2``, …. Text in code (fenced
blocks and inline spans) is not a link. The generated reports (``report.md`` under
docs/results/) are held to their file links only.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from helpers import ROOT

README_MAX_LINES = 300

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[`~]*[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
_LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", re.M)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def _without_code(text: str) -> str:
    """The Markdown with fenced blocks and inline code spans blanked out."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text (before de-duplication)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link or image: its text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of every heading of a Markdown text, repeats numbered as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for match in _HEADING.finditer(_FENCE.sub("", text)):
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    """Every link and image target of a Markdown text, code excluded."""
    return [m.group(1) for m in _LINK.finditer(_without_code(text))]


def broken_links(md_file: Path, check_anchors: bool = True) -> list[str]:
    """What is wrong with each relative link of ``md_file``: a missing file, or (with
    ``check_anchors``) an anchor that is no heading of the Markdown file it points into."""
    problems = []
    for target in link_targets(md_file.read_text(encoding="utf-8")):
        if not target or _SCHEME.match(target):
            continue  # a URL (https:, mailto:) is not ours to check
        path_part, _, anchor = target.partition("#")
        dest = (md_file.parent / unquote(path_part)).resolve() if path_part else md_file
        if not dest.exists():
            problems.append(f"{target}: no such file {dest}")
        elif check_anchors and anchor and dest.suffix == ".md":
            if unquote(anchor) not in anchors(dest.read_text(encoding="utf-8")):
                problems.append(f"{target}: no heading with anchor #{anchor} in {dest.name}")
    return problems


def _is_generated_report(path: Path) -> bool:
    return path.name == "report.md" and (ROOT / "docs" / "results") in path.parents


DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_fits_in_five_minutes():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {README_MAX_LINES} and move detail to docs/")


README_ORDER = ["Set up and train", "Sample and evaluate", "Tests", "Commands", "Where corpora come from", "Results",
                "Layout"]
RESULTS_MAX_LINES, RESULTS_MAX_BULLETS, STUDY_MAX_LINES = 60, 6, 400
STUDY_PAGES = sorted(p for p in (ROOT / "docs" / "results").glob("*.md"))


def test_the_readme_is_a_map_in_the_order_a_newcomer_follows():
    """Set up and train (with the expected time and loss right after), sample, evaluate, tests,
    commands, corpora, then one results section of one table and a few bullets, then layout."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    headings = [h for h in re.findall(r"^## (.*)$", text, re.M) if h in README_ORDER]
    assert headings == README_ORDER
    setup = text.split("## Set up and train", 1)[1].split("\n## ", 1)[0]
    assert "python train.py configs/quickstart.yaml" in setup and "validation loss" in setup
    results = text.split("## Results", 1)[1].split("\n## ", 1)[0].splitlines()
    assert len(results) <= RESULTS_MAX_LINES, f"README's results have {len(results)} lines"
    assert sum(line.startswith("- ") for line in results) <= RESULTS_MAX_BULLETS
    assert sum(1 for a, b in zip(results, results[1:]) if b.startswith("|---")) == 1  # one table


@pytest.mark.parametrize("page", STUDY_PAGES, ids=lambda p: p.name)
def test_each_study_page_opens_with_a_summary_and_its_regeneration_command(page: Path):
    lines = page.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= STUDY_MAX_LINES, f"{page.name} has {len(lines)} lines"
    assert lines[0].startswith("# ") and lines[1] == ""
    assert all(line.startswith("- ") for line in lines[2:7]) and lines[7] == ""  # five lines of summary
    assert "```bash" in lines[8:12] and any("ropelab " in line for line in lines[10:14])


@pytest.mark.parametrize("md_file", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(md_file: Path):
    problems = broken_links(md_file, check_anchors=not _is_generated_report(md_file))
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_readme_links_every_page_of_docs():
    linked = {(ROOT / t.partition("#")[0]).resolve()
              for t in link_targets((ROOT / "README.md").read_text(encoding="utf-8"))}
    pages = sorted((ROOT / "docs").glob("*.md"))
    assert pages and [p.name for p in pages if p not in linked] == []
    # Each page is a page: a title and some prose under it (an emptied file would still "resolve").
    thin = [p.name for p in pages if not p.read_text(encoding="utf-8").startswith("# ")
            or len(p.read_text(encoding="utf-8").splitlines()) < 10]
    assert thin == []


def test_slugs_follow_githubs_rules():
    assert slug("Results: extrapolation on WikiText-2 (CPU scale)") == "results-extrapolation-on-wikitext-2-cpu-scale"
    assert slug("Export to `transformers` — *Llama*") == "export-to-transformers--llama"
    assert slug("The [grid](a.md) file, v2.0") == "the-grid-file-v20"
    assert slug("out_dir and  eval") == "out_dir-and--eval"
    assert anchors("# A\n## A\n```\n# A\n```\n## A!\n") == {"a", "a-1", "a-2"}


def test_link_checker_reports_each_broken_link(tmp_path: Path):
    (tmp_path / "docs" / "img").mkdir(parents=True)
    (tmp_path / "docs" / "img" / "plot.png").write_bytes(b"png")
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## Grid files: `name`, `base`\n## Page\n", encoding="utf-8")
    tmp_path = tmp_path.resolve()
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Top\n\n"
        "[ok](docs/page.md) [ok](docs/page.md#grid-files-name-base) [ok](docs/page.md#page-1)\n"
        "![ok](docs/img/plot.png) [ok](#top) [ok](docs/) [web](https://example.org/x#y)\n"
        "`[code](missing-in-code.md)`\n\n```\n[fenced](missing-in-fence.md)\n```\n"
        "[bad file](docs/nope.md) ![bad image](img/plot.png) [bad anchor](docs/page.md#grid)\n"
        "[bad local anchor](#bottom)\n",
        encoding="utf-8")
    assert broken_links(readme) == [
        f"docs/nope.md: no such file {tmp_path / 'docs' / 'nope.md'}",
        f"img/plot.png: no such file {tmp_path / 'img' / 'plot.png'}",
        "docs/page.md#grid: no heading with anchor #grid in page.md",
        "#bottom: no heading with anchor #bottom in README.md",
    ]
    assert broken_links(readme, check_anchors=False) == broken_links(readme)[:2]
