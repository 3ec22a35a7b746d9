"""Every relative link of the README and docs/ reaches a file, and its ``#anchor`` a
heading of that file (GitHub's rule: lower case, punctuation dropped, spaces to
hyphens, a repeated heading numbered). A renamed section otherwise leaves links that
lead nowhere, which no other test would notice."""

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
