"""README.md is the front door and docs/ holds the long form: the README stays short,
every relative link in README.md and docs/*.md leads to a file (and to a heading, where
it names one), and docs/repository.md's map of the tree cannot drift from it — every
path the map names exists, and every module and sub-package of minitp/ is in the map.

Nothing here imports minitp: the pages and the tree are read as files.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAP = DOCS / "repository.md"
PACKAGE = ROOT / "minitp"

MAX_README_LINES = 200

FENCE = re.compile(r"^```.*?^```[^\n]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")  # [text](target), ![alt](target)
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # http:, https:, mailto:
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)

# In the map: a file `name.py` (or `folder/name.py`), and a folder `name/` that ends a
# word (so "row/column" and "/proc/self/io" are prose, not paths).
PY = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)*[\w.-]+\.py)\b")
FOLDER = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+)(?=[\s,;:)]|$)")


def _pages() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose(text: str) -> str:
    """The page without its code: fenced blocks and inline code spans."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def _anchors(page: Path) -> set[str]:
    """GitHub's ids for the page's headings: lower case, punctuation dropped, '-' for ' '."""
    headings = HEADING.findall(FENCE.sub("", page.read_text()))
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_readme_is_a_front_door():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines, more than {MAX_README_LINES}: move the long form "
        "to a page in docs/ and link it")


def test_the_docs_exist_and_the_readme_links_each():
    pages = sorted(p.name for p in DOCS.glob("*.md"))
    assert "repository.md" in pages, pages
    linked = {Path(t.split("#")[0]).name for t in LINK.findall(_prose(README.read_text()))}
    unlinked = [p for p in pages if p not in linked]
    assert not unlinked, f"README.md links to no page of docs/ named {unlinked}"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_leads_to_a_file(page):
    broken = []
    for target in dict.fromkeys(LINK.findall(_prose(page.read_text()))):
        if SCHEME.match(target) or target.startswith("#"):
            continue  # a web address, or a heading of this same page
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve()
        if not linked.exists():
            broken.append(f"{target} (no file {linked.relative_to(ROOT)})")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {linked.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)} has broken links: {broken}"


def _map_entries() -> list[tuple[bool, str]]:
    """The map's entries, each (inside minitp/, its text with its continuation lines).

    An entry is a line at indent 0 (a top-level folder) or, under `minitp/`, at indent
    2 (a module, modules, or a sub-package `name/`); deeper lines continue it."""
    block = FENCE.search(MAP.read_text())
    assert block, "docs/repository.md has no code block: the map of the tree is gone"
    entries: list[list] = []
    in_package = False
    for line in block.group(0).splitlines()[1:-1]:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_package = line.split()[0] == "minitp/"
            entries.append([False, line])
        elif in_package and indent == 2:
            entries.append([True, line])
        else:
            entries[-1][1] += "\n" + line
    return [(package, text) for package, text in entries]


def _named_paths() -> list[tuple[str, list[Path]]]:
    """Every path the map names, with the places it may be, as its indentation says.

    Under minitp/, a bare `name.py` (or `folder/`) is minitp's, or inside the sub-package
    that starts its entry (`calc/ ... search.py`); `a/b.py` is from the root or minitp/; a
    folder is minitp's. At the top level, a folder is the root's and `name.py` is at
    the root or in a folder its line names (`tools/  run_notebooks.py`)."""
    named = []
    for in_package, text in _map_entries():
        folders = FOLDER.findall(text)
        base = PACKAGE if in_package else ROOT
        first = text.split()[0]
        for folder in folders:
            places = [base / folder]
            if in_package and first.endswith("/") and folder != first:
                places.append(PACKAGE / first / folder)
            named.append((folder, places))
        for module in PY.findall(text):
            if in_package:
                places = [PACKAGE / module]
                if "/" in module:
                    places.append(ROOT / module)
                if first.endswith("/"):
                    places.append(PACKAGE / first / module)
            else:
                places = [ROOT / module, *(ROOT / f / module for f in folders)]
            named.append((module, places))
    return named


def test_every_path_in_the_repository_map_exists():
    missing = [f"{name} (looked for {', '.join(str(p.relative_to(ROOT)) for p in places)})"
               for name, places in _named_paths() if not any(p.exists() for p in places)]
    assert not missing, f"docs/repository.md names paths that do not exist: {missing}"


def test_every_module_and_subpackage_of_minitp_is_in_the_repository_map():
    mapped = {p.resolve() for _, places in _named_paths() for p in places if p.exists()}
    modules = [p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"]
    # ... and every module of the library's sub-packages (and the course's own top level)
    modules += [p for p in PACKAGE.glob("*/*.py") if p.name not in ("__init__.py", "__main__.py")
                and p.parent.name != "calc"]
    modules += [p for p in (PACKAGE / "course").glob("*.py") if p.name != "__init__.py"]
    subpackages = [p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    unmapped = sorted(str(p.relative_to(ROOT)) + ("/" if p.is_dir() else "")
                      for p in [*modules, *subpackages] if p.resolve() not in mapped)
    assert modules and subpackages, "found no module of minitp/"
    assert not unmapped, (
        f"docs/repository.md's map does not say where these stand: {unmapped} "
        "(add each, with a line on what it holds, under minitp/)")


# --------------------------------------------------------------------------- dotted paths
DOTTED = re.compile(r"`+(minitp(?:\.[A-Za-z_]\w*)+)")


def _texts_with_paths():
    """README, docs/ and every docstring and comment of minitp/: where a reader meets a
    backticked `minitp.…` path and may type it."""
    yield ROOT / "README.md"
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted(PACKAGE.rglob("*.py"))


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except AttributeError:
            return False
        return True
    return False


def test_every_backticked_minitp_path_resolves():
    """A path a page or a docstring names is one a reader can import: after a move, the
    old names fail here rather than in a learner's notebook."""
    broken = sorted({f"{path.relative_to(ROOT)}: {dotted}" for path in _texts_with_paths()
                     for dotted in DOTTED.findall(path.read_text()) if not _resolves(dotted)})
    assert not broken, "these minitp paths name nothing:\n" + "\n".join(broken)


def test_the_checker_of_paths_can_fail():
    assert _resolves("minitp.rules.check_parallel_config")
    assert not _resolves("minitp.rules.no_such_rule")
    assert not _resolves("minitp.head_rules")


def test_the_facade_declares_what_the_lessons_type():
    """`mt.__all__` is the course's surface: every `mt.name` a lesson, an exercise, a
    solution or README's one-screen API types, and nothing they do not."""
    import minitp as mt

    typed = set(re.findall(r"\bmt\.([A-Za-z_]\w*)", (ROOT / "README.md").read_text()))
    for folder in ("notebooks", "exercises", "solutions"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".ipynb", ".py"):
                typed |= set(re.findall(r"\bmt\.([A-Za-z_]\w*)", path.read_text()))
    typed -= {"__version__"}
    declared = set(mt.__all__)
    assert typed == declared, (f"typed but not declared: {sorted(typed - declared)}; "
                               f"declared but never typed: {sorted(declared - typed)}")
