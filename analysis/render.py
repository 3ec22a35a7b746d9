"""Rendering a report ``Document`` as Markdown (terminal and ``report.md``), HTML and JSON.

Everything here takes an ``analysis.document.Document`` and returns text or JSON-ready
values; nothing computes a number. A section is drawn according to its ``Role``.
The HTML is self-contained: styles inline and plots embedded as base64 PNG data, so a
single file can be mailed or opened from a cluster's scratch space in any browser.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from typing import Any, Iterable

import numpy as np
import pandas as pd

from analysis.document import Document, Role, Section

TITLE = "distseg scaling report"
#: Version of the JSON document's layout (``schema`` in ``report.json``).
JSON_SCHEMA = "distseg-report/1"


def fmt(value: Any) -> str:
    """A table cell for people: short floats, blanks for missing values."""
    if value is None or value is pd.NA:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "yes" if value else "no"
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return ""
        if value == int(value) and abs(value) < 1e9:
            return str(int(value))
        if abs(value) >= 100:
            return f"{value:,.1f}"
        return f"{value:.4g}"
    return str(value)


def md_table(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A GitHub-flavoured Markdown table of ``df`` (``columns`` to pick and order)."""
    cols = [c for c in (columns or df.columns) if c in df.columns]
    if not len(df):
        return "_(no rows)_\n"
    head = "| " + " | ".join(cols) + " |"
    rule = "|" + "|".join("---" for _ in cols) + "|"
    body = ["| " + " | ".join(fmt(v).replace("|", "\\|") for v in row) + " |"
            for row in df[cols].itertuples(index=False, name=None)]
    return "\n".join([head, rule, *body]) + "\n"


#: A hexadecimal digest (a config hash): it may break after every 8 digits.
_DIGEST_PART = re.compile(r"([0-9a-f]{8})(?=[0-9a-f]{8})")


def _cell(value) -> str:
    """A table cell that may break after a slash (run directories) or inside a long
    hexadecimal digest, so wide tables fit a 1280-px window."""
    return _DIGEST_PART.sub(r"\1<wbr>", html.escape(fmt(value)).replace("/", "/<wbr>"))


def html_table(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    cols = [c for c in (columns or df.columns) if c in df.columns]
    if not len(df):
        return "<p><em>(no rows)</em></p>\n"
    # Column names may break after an underscore, cells as ``_cell`` says.
    head = "".join(f"<th>{html.escape(c).replace('_', '_<wbr>')}</th>" for c in cols)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>"
                                    for v in row) + "</tr>\n"
                   for row in df[cols].itertuples(index=False, name=None))
    return (f"<div class=\"wide\"><table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}"
            "</tbody>\n</table></div>\n")


def _md_table(section: Section, images: bool, max_items: int | None) -> list[str]:
    return [md_table(section.frame, section.columns)]


def _md_figure(section: Section, images: bool, max_items: int | None) -> list[str]:
    return [f"![{section.title}]({section.figure})\n"] if images else []


def _md_list(section: Section, images: bool, max_items: int | None) -> list[str]:
    items = section.items
    shown = items if max_items is None else items[:max_items]
    out = ["\n".join(f"- {i}" for i in shown) + "\n"]
    if len(shown) < len(items):
        out.append(f"- ... {len(items) - len(shown)} more in report.md\n")
    return out


def _md_projection(section: Section, images: bool, max_items: int | None) -> list[str]:
    label, *assumptions = section.items
    return ["**" + label + "** Assumptions:\n",
            "\n".join(f"- {a}" for a in assumptions) + "\n",
            md_table(section.frame, section.columns)]


_MD_BODY = {Role.TABLE: _md_table, Role.FIGURE: _md_figure, Role.LIST: _md_list,
            Role.WARNINGS: _md_list, Role.PROJECTION: _md_projection}


def markdown(doc: Document, images: bool = True, max_items: int | None = None) -> str:
    """The report as Markdown.

    Args:
      doc: the report.
      images: whether figures are linked; the terminal cannot show them, so without
        images their sections are left out altogether.
      max_items: the most lines of a list shown (the terminal's cut; ``None``: all).
    """
    lines = [f"# {TITLE}\n", f"{doc.summary}\n"]
    for section in doc.sections:
        if section.role is Role.FIGURE and not images:
            continue
        lines.append(f"## {section.title}\n")
        if section.intro:
            lines.append(section.intro + "\n")
        lines.extend(_MD_BODY[section.role](section, images, max_items))
    return "\n".join(lines)


_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto;
       max-width: 1200px; padding: 0 1em; color: #222; }
h1 { font-size: 1.6em; } h2 { font-size: 1.25em; margin-top: 1.6em;
  border-bottom: 1px solid #ddd; padding-bottom: .2em; }
table { border-collapse: collapse; font-size: .85em; margin: .5em 0; }
th, td { border: 1px solid #ccc; padding: .25em .4em; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
tbody tr:nth-child(even) { background: #fafafa; }
img { max-width: 100%; border: 1px solid #eee; }
.wide { overflow-x: auto; }
.intro { color: #555; } .projection { border-left: 4px solid #c80; padding-left: 1em; }
li { margin: .2em 0; } .warn li { color: #a30; }
.answer { background: #f6f9fc; border-left: 4px solid #37a; padding: .5em 1em .5em 2em; }
.answer a { color: #124; text-decoration: none; } .answer a:hover { text-decoration: underline; }
"""


def _html_table(section: Section, figures_dir: str) -> str:
    return html_table(section.frame, section.columns)


def _html_figure(section: Section, figures_dir: str) -> str:
    path = os.path.join(figures_dir, section.figure)
    try:
        with open(path, "rb") as f:
            data = base64.b64encode(f.read()).decode("ascii")
    except OSError:
        return f"<p><em>figure {html.escape(section.figure)} missing</em></p>"
    return f"<img alt=\"{html.escape(section.title)}\" src=\"data:image/png;base64,{data}\">"


def _html_items(items: Iterable[str]) -> str:
    return "".join(f"<li>{html.escape(i)}</li>" for i in items)


def anchor(title: str) -> str:
    """The HTML id of a section titled ``title``."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-") or "section"


def _html_list(section: Section, figures_dir: str) -> str:
    if not section.links:
        return "<ul>" + _html_items(section.items) + "</ul>"
    items = (f"<li><a href=\"#{anchor(to)}\">{html.escape(i)}</a></li>" if to
             else f"<li>{html.escape(i)}</li>" for i, to in zip(section.items, section.links))
    return "<ul class=\"answer\">" + "".join(items) + "</ul>"


def _html_warnings(section: Section, figures_dir: str) -> str:
    return "<ul class=\"warn\">" + _html_items(section.items) + "</ul>"


def _html_projection(section: Section, figures_dir: str) -> str:
    label, *assumptions = section.items
    return ("<div class=\"projection\"><p><strong>"
            f"{html.escape(label)}</strong> Assumptions:</p><ul>" + _html_items(assumptions)
            + "</ul>" + html_table(section.frame, section.columns) + "</div>")


_HTML_BODY = {Role.TABLE: _html_table, Role.FIGURE: _html_figure, Role.LIST: _html_list,
              Role.WARNINGS: _html_warnings, Role.PROJECTION: _html_projection}


def html_document(doc: Document, figures_dir: str) -> str:
    """A self-contained HTML page: inline CSS, plots from ``figures_dir`` as base64
    ``data:`` URIs (a missing plot is named, not fatal)."""
    parts = ["<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">",
             f"<title>{TITLE}</title>", f"<style>{_CSS}</style></head><body>",
             f"<h1>{TITLE}</h1>", f"<p>{html.escape(doc.summary)}</p>"]
    for section in doc.sections:
        parts.append(f"<h2 id=\"{anchor(section.title)}\">{html.escape(section.title)}</h2>")
        if section.intro:
            parts.append(f"<p class=\"intro\">{html.escape(section.intro)}</p>")
        parts.append(_HTML_BODY[section.role](section, figures_dir))
    parts.append("</body></html>\n")
    return "\n".join(parts)


def records(df: pd.DataFrame) -> list[dict]:
    """Rows as JSON-ready dicts (NaN and NA become null)."""
    return json.loads(df.to_json(orient="records", date_format="iso"))


def json_document(doc: Document) -> dict:
    """The report for machines; tables kept out of it (the per-step curve) are
    referenced by their CSV file in ``files``."""
    out = {"schema": JSON_SCHEMA, "summary": doc.summary, "options": doc.options,
           "time_unit": doc.time_unit,
           "tables": {name: records(frame) for name, frame in [*doc.tables.json_frames(),
                                                                 *doc.optional_tables.items()]},
           "projection": None,
           "notes": [{"level": n.level, "where": n.where, "message": n.message}
                     for n in doc.notes],
           "files": doc.files}
    if doc.projection is not None:
        out["projection"] = {"label": "projection (model, not measured)",
                             "assumptions": doc.projection.assumptions,
                             "compute_s_per_step": doc.projection.compute_s,
                             "table": records(doc.projection.table),
                             "to_target": {"assumptions": doc.projection.target_assumptions,
                                           "table": records(doc.projection.targets)},
                             "per_node": {"assumptions": doc.projection.node_assumptions,
                                          "table": records(doc.projection.nodes)}}
    elif doc.projection_error:
        out["projection"] = {"error": doc.projection_error}
    return out
