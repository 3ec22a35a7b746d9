"""Every relative link of the README and docs/ reaches a file, and its ``#anchor`` a
heading of that file (GitHub's rule: lower case, punctuation dropped, spaces to
hyphens, a repeated heading numbered). A renamed section otherwise leaves links that
lead nowhere, which no other test would notice.

docs/architecture.md names every module of ``distseg/`` and ``analysis/`` in backticks
as `name.py` (a module in a subfolder such as ``data/convert/`` by its base name), so a
new or renamed module cannot go unlisted.

No ticket numbers where a user reads: "issue 39" in the README, a page of docs/ (the
studies included) or a docstring, comment or help text of ``distseg/`` or
``analysis/`` names a thread the reader cannot open. Say what it means instead (the
study, with its dated file)."""

from __future__ import annotations

import glob
import os
import re

import pytest

from support import REPO

PAGES = ["README.md", *sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md")))]


def heading_anchors(path: str) -> set[str]:
    anchors, seen, in_code = set(), {}, False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("```"):
                in_code = not in_code
            match = None if in_code else re.match(r"^#+\s+(.*)", line)
            if match:
                slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
                n = seen.get(slug, 0)
                seen[slug] = n + 1
                anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def broken_links(page: str) -> list[str]:
    path = os.path.join(REPO, page)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    broken = []
    for link in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not checked here
        target, _, anchor = link.partition("#")
        where = os.path.normpath(os.path.join(os.path.dirname(path), target)) if target else path
        if not os.path.exists(where):
            broken.append(f"{link}: no such file")
        elif anchor and where.endswith(".md") and anchor not in heading_anchors(where):
            broken.append(f"{link}: no such heading")
    return broken


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_a_broken_anchor_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("test_docs.REPO", str(tmp_path))
    (tmp_path / "a.md").write_text("# Time to target, 2 vs 1\n## Time to target, 2 vs 1\n"
                                   "[ok](#time-to-target-2-vs-1-1) [bad](#time-to-target) "
                                   "[file](b.md) [web](https://example.org/x#y)\n")
    assert broken_links("a.md") == ["#time-to-target: no such heading", "b.md: no such file"]


ARCHITECTURE = os.path.join("docs", "architecture.md")
MODULE_ROOTS = ("distseg", "analysis")


def unnamed_modules(page: str = ARCHITECTURE) -> list[str]:
    """The module files under ``MODULE_ROOTS`` (``__init__.py`` aside) whose name
    ``page`` never gives in backticks, as ``name.py`` or a path ending in it."""
    with open(os.path.join(REPO, page), encoding="utf-8") as f:
        named = {os.path.basename(n) for n in re.findall(r"`([\w./-]+\.py)`", f.read())}
    files = sorted(os.path.relpath(p, REPO) for root in MODULE_ROOTS
                   for p in glob.glob(os.path.join(REPO, root, "**", "*.py"), recursive=True))
    return [f for f in files
            if os.path.basename(f) != "__init__.py" and os.path.basename(f) not in named]


def test_every_module_is_named_in_architecture():
    assert unnamed_modules() == []


def test_an_unnamed_module_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("test_docs.REPO", str(tmp_path))
    for path in ("distseg/__init__.py", "distseg/core/config.py", "distseg/data/convert/splits.py",
                 "distseg/training/loop.py", "analysis/links.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text(
        "| `config.py` | x |\n| `convert/splits.py` | y |\nloop.py, links (not in backticks)\n")
    assert unnamed_modules() == ["analysis/links.py", "distseg/training/loop.py"]


#: "issue 39", "Issue #11", "issues 21": a ticket number (across a line break too).
TICKET = re.compile(r"\bissues?\s+#?\d+", re.IGNORECASE)
#: What a user reads: the README, every page under docs/, every module of the package
#: and of the report.
READ_BY_USERS = ("README.md", os.path.join("docs", "**", "*.md"),
                 os.path.join("distseg", "**", "*.py"), os.path.join("analysis", "**", "*.py"))


def ticket_numbers() -> list[str]:
    """``file:line: match`` for every ticket number in ``READ_BY_USERS``."""
    found = []
    for pattern in READ_BY_USERS:
        for path in sorted(glob.glob(os.path.join(REPO, pattern), recursive=True)):
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in TICKET.finditer(text):
                line = text.count("\n", 0, m.start()) + 1
                found.append(f"{os.path.relpath(path, REPO)}:{line}: {' '.join(m.group().split())}")
    return found


def test_no_ticket_numbers_where_users_read():
    assert ticket_numbers() == []


def test_a_ticket_number_is_found(tmp_path, monkeypatch):
    monkeypatch.setattr("test_docs.REPO", str(tmp_path))
    files = {"README.md": "Fixed in Issue #11.\n",
             "docs/studies/lr-2026-11-26.md": "# lr\n\nThe study of issue\n39, and the issues 21 and 28.\n",
             "distseg/training/stopping.py": '"""Nothing to resume (issue 22)."""\n',
             "analysis/noise.py": "# three issues, tissue 5 mm, reissued: no ticket\n",
             "benchmarks/bench_table.py": "# issue 21: not read by users\n"}
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    assert ticket_numbers() == ["README.md:1: Issue #11", "docs/studies/lr-2026-11-26.md:3: issue 39",
                                "docs/studies/lr-2026-11-26.md:4: issues 21",
                                "distseg/training/stopping.py:1: issue 22"]


#: A docs/ path named in code or a job script: ``docs/PAGE.md`` or
#: ``docs/studies/STUDY.md``, with an optional ``#anchor``.
CODE_LINK = re.compile(r"\bdocs/((?:studies/)?[A-Za-z0-9_.-]+\.md)(#[a-z0-9-]+)?")
#: Where the code that names docs lives.
CODE_GLOBS = ("distseg/**/*.py", "analysis/**/*.py", "benchmarks/**/*.py", "jobs/*.in",
              "jobs/*.sh", "jobs/*.sbatch", "scripts/*.sh", "Makefile")


def broken_code_links(root: str = REPO) -> list[str]:
    """Every ``docs/...`` path named in the code (docstrings, comments, help texts) whose
    file is missing, or whose ``#anchor`` is no heading of it."""
    bad = []
    files = sorted({p for g in CODE_GLOBS for p in glob.glob(os.path.join(root, g), recursive=True)})
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for m in CODE_LINK.finditer(text):
            target = os.path.join(root, "docs", m.group(1))
            where = f"{os.path.relpath(path, root)}: docs/{m.group(1)}{m.group(2) or ''}"
            if not os.path.isfile(target):
                bad.append(f"{where} (no such file)")
            elif m.group(2) and m.group(2)[1:] not in heading_anchors(target):
                bad.append(f"{where} (no such heading)")
    return bad


def test_every_docs_path_named_in_code_resolves():
    assert broken_code_links() == []


def test_a_docs_path_that_went_is_found(tmp_path):
    (tmp_path / "docs" / "studies").mkdir(parents=True)
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Its part\n")
    (tmp_path / "distseg").mkdir()
    (tmp_path / "distseg" / "mod.py").write_text(
        '"""See docs/page.md#its-part, docs/page.md#gone and docs/studies/old-2026.md."""\n')
    assert broken_code_links(str(tmp_path)) == [
        "distseg/mod.py: docs/page.md#gone (no such heading)",
        "distseg/mod.py: docs/studies/old-2026.md (no such file)"]

