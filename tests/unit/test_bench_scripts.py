"""benchmarks/ is one tool: every script at its top is a row of docs/development.md's
benchmark table, and the row names a test file that exists and names the script. A
script that only produced a study is retired, its study keeping the commit that ran
it; one added without a row and a test fails here."""

from __future__ import annotations

import glob
import os
import re

from support import REPO

TABLE_PAGE = os.path.join("docs", "development.md")
#: A row of the table: the script in its first cell, the tests in its last.
ROW = re.compile(r"^\| `(benchmarks/[\w.]+\.py)` \|.*\| ([^|]*) \|\s*$")
TEST = re.compile(r"`(tests/[\w/]+\.py)`")


def read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def unlisted_or_untested(root: str = REPO) -> list[str]:
    """Every top-level script of ``root``/benchmarks missing from the table, every row
    of a script that is gone, and every row whose test files are missing or none of
    which names its script."""
    lines = read(os.path.join(root, TABLE_PAGE)).splitlines()
    rows = {m.group(1): TEST.findall(m.group(2)) for m in map(ROW.match, lines) if m}
    scripts = {os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "benchmarks", "*.py"))}
    problems = [f"{s}: not in {TABLE_PAGE}'s table" for s in sorted(scripts - set(rows))]
    problems += [f"{s}: in the table, not in benchmarks/" for s in sorted(set(rows) - scripts)]
    for script, tests in sorted(rows.items()):
        name = os.path.basename(script)[:-3]
        missing = [t for t in tests if not os.path.isfile(os.path.join(root, t))]
        naming = [t for t in tests if t not in missing and name in read(os.path.join(root, t))]
        if not tests or missing or not naming:
            problems.append(f"{script}: tests {tests} (missing {missing}, none names {name})"
                            if tests else f"{script}: no test named")
    return problems


def test_every_benchmark_script_is_in_the_table_with_a_test_that_runs_it():
    assert unlisted_or_untested() == []


def test_a_script_without_a_row_or_a_test_is_found(tmp_path):
    for path, text in {"benchmarks/bench_a.py": "", "benchmarks/bench_b.py": "",
                       "benchmarks/bench_c.py": "", "benchmarks/benchlib/piece.py": "",
                       "tests/unit/test_bench_a.py": "import bench_a\n",
                       "tests/unit/test_other.py": "nothing about it\n", TABLE_PAGE: ""}.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / TABLE_PAGE).write_text(
        "| script | what | command | test |\n|---|---|---|---|\n"
        "| `benchmarks/bench_a.py` | a | `make a` | `tests/unit/test_bench_a.py` |\n"
        "| `benchmarks/bench_b.py` | b | `make b` | `tests/unit/test_other.py`, `tests/unit/test_gone.py` |\n"
        "| `benchmarks/bench_gone.py` | g | `make g` | `tests/unit/test_bench_a.py` |\n")
    assert unlisted_or_untested(str(tmp_path)) == [
        "benchmarks/bench_c.py: not in docs/development.md's table",
        "benchmarks/bench_gone.py: in the table, not in benchmarks/",
        "benchmarks/bench_b.py: tests ['tests/unit/test_other.py', 'tests/unit/test_gone.py'] "
        "(missing ['tests/unit/test_gone.py'], none names bench_b)",
        "benchmarks/bench_gone.py: tests ['tests/unit/test_bench_a.py'] (missing [], none names bench_gone)"]
