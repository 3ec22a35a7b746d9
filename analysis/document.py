"""The report's document: typed tables, sections and notes, shared by ``report`` and ``render``.

A leaf module: it imports nothing else of ``analysis``, so the modules that compute a
report (``report``) and the one that draws it (``render``) both depend on it and never
on each other. What a renderer does with a piece is chosen by its ``Role``, never by
its title, so a title can be reworded without changing how it is drawn.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Iterator

import pandas as pd


@dataclass(frozen=True)
class Note:
    """One thing the report skipped, doubts or wants a reader to know.

    Attributes:
      level: ``skipped`` (data left out), ``warning`` (numbers may mislead) or ``info``.
      where: the run label or file the note is about.
      message: one line for a person.
    """

    level: str
    where: str
    message: str

    def line(self) -> str:
        return f"[{self.level}] {self.where}: {self.message}"


def _table(csv: str | None = None, in_json: bool = True):
    """A ``Tables`` field: its CSV file (``None``: not written) and whether JSON holds it."""
    return field(metadata={"csv": csv, "in_json": in_json})


@dataclass(frozen=True)
class Tables:
    """Every table of a report, one typed field each (columns: docs/report.md).

    The field order is the order of ``report.json``; field metadata says which tables
    are also written as CSV (and under which name) and which stay out of the JSON
    document (the per-step curve, too long to inline: it is in its CSV).
    """

    runs: pd.DataFrame = _table()
    time_per_epoch: pd.DataFrame = _table("time_per_epoch.csv")
    scaling: pd.DataFrame = _table("scaling.csv")
    throughput_vs_size: pd.DataFrame = _table("throughput_vs_size.csv")
    links: pd.DataFrame = _table("links.csv")
    loss_vs_time: pd.DataFrame = _table("loss_vs_time.csv", in_json=False)
    hours_to_target: pd.DataFrame = _table("hours_to_target.csv")
    statistical_efficiency: pd.DataFrame = _table("statistical_efficiency.csv")
    rank_balance: pd.DataFrame = _table("rank_balance.csv")
    rank_balance_summary: pd.DataFrame = _table()
    val_dice_spread: pd.DataFrame = _table("val_dice_spread.csv")
    val_dice_last: pd.DataFrame = _table()
    coverage: pd.DataFrame = _table("coverage.csv")
    coverage_summary: pd.DataFrame = _table()

    def csv_frames(self) -> Iterator[tuple[str, str, pd.DataFrame]]:
        """``(name, CSV file name, frame)`` of each table written as CSV."""
        for f in dataclasses.fields(self):
            if f.metadata["csv"]:
                yield f.name, f.metadata["csv"], getattr(self, f.name)

    def json_frames(self) -> Iterator[tuple[str, pd.DataFrame]]:
        """``(name, frame)`` of each table the JSON document holds."""
        for f in dataclasses.fields(self):
            if f.metadata["in_json"]:
                yield f.name, getattr(self, f.name)


#: Tables a report holds only when the runs give them rows, name -> CSV file: kept out
#: of ``Tables`` so that a report of runs without them writes what it always did.
#: ``seed_groups``: ``analysis.seeds``; ``lr_find``: ``analysis.lrrange``; ``cv_*``: a
#: cross-validation's (``analysis.cvrender``); the others: ``analysis.noise``.
OPTIONAL_CSV = {"seed_groups": "seed_groups.csv", "noise_scale": "noise_scale.csv",
                "noise_scale_series": "noise_scale_series.csv",
                "noise_prediction": "noise_prediction.csv", "lr_find": "lr_find.csv",
                "cv_dice": "cv_dice.csv", "cv_paired": "cv_paired.csv",
                "cv_hours": "cv_hours.csv", "cv_runs": "cv_runs.csv",
                "cv_configs": "cv_configs.csv"}


def csv_files() -> dict[str, str]:
    """Table name -> CSV file name, for every table written as CSV."""
    return {f.name: f.metadata["csv"] for f in dataclasses.fields(Tables) if f.metadata["csv"]}


@dataclass(frozen=True)
class Projection:
    """The fitted scaling model and its table (``analysis.project``).

    Attributes:
      table: one row per measured run (``kind`` = ``measured``, with the model's value
        beside it) and per projected node count (``kind`` = ``projection``).
      assumptions: one line each, printed with the table; the first is the label that
        says it is a projection.
      compute_s: the fitted per-step compute time.
      targets: projected time to each target (``analysis.stateff.project_rows``;
        empty without targets).
      target_assumptions: the lines printed with ``targets``; the first labels it.
      nodes: per target and node count the predicted batch, lr, step time, throughput,
        samples and hours beside the measured ones (``analysis.project.node_rows``;
        written as ``projection_nodes.csv``).
      node_assumptions: the lines printed with ``nodes``; the first labels it.
    """

    table: pd.DataFrame
    assumptions: list[str]
    compute_s: float
    targets: pd.DataFrame = field(default_factory=pd.DataFrame)
    target_assumptions: list[str] = field(default_factory=list)
    nodes: pd.DataFrame = field(default_factory=pd.DataFrame)
    node_assumptions: list[str] = field(default_factory=list)

    def predicts_hours(self) -> bool:
        """Whether some row of ``nodes`` has predicted hours (what the figure draws)."""
        return ("predicted_hours" in self.nodes.columns
                and bool(self.nodes["predicted_hours"].astype(float).notna().any()))


@dataclass(frozen=True)
class TimeUnit:
    """The unit wall-clock times are shown in to people (plots, document tables).

    The CSV and JSON files keep their fixed units (``hours``, ``wall_h``), named in
    the column, whatever the run length; only what people read follows the run.

    Attributes:
      name: ``s``, ``min`` or ``h`` (used in column names: ``wall_min``).
      seconds: seconds in one unit.
      word: ``seconds``, ``minutes`` or ``hours`` (axis labels).
    """

    name: str
    seconds: float
    word: str

    def of(self, seconds):
        """``seconds`` (a number or an array) in this unit."""
        return seconds / self.seconds

    def text(self, seconds: float) -> str:
        """A time for people: ``3.500 h``, ``0.021 h (1.3 min)``, ``12.25 min``, ``45.0 s``."""
        value = self.of(seconds)
        if self.name == "min":
            return f"{value:.2f} min"
        if self.name == "s":
            return f"{value:.1f} s"
        if value >= 1:
            return f"{value:.3f} h"
        minutes = value * 60
        return (f"{value:.3f} h ({minutes:.1f} min)" if minutes >= 1
                else f"{value:.4f} h ({minutes * 60:.1f} s)")


SECONDS = TimeUnit("s", 1.0, "seconds")
MINUTES = TimeUnit("min", 60.0, "minutes")
HOURS = TimeUnit("h", 3600.0, "hours")


def time_unit(longest_s: float) -> TimeUnit:
    """The unit that fits a report whose longest run lasted ``longest_s`` seconds:
    seconds below 2 minutes, minutes below 2 hours, else hours (so an axis or a
    column reads 0 to 60 s or 0 to 90 min, not 0 to 0.02 h)."""
    if not longest_s < 2 * 3600:  # also NaN: nothing to go by, the long-run unit
        return HOURS
    return SECONDS if longest_s < 120 else MINUTES


class Role(enum.Enum):
    """How a section is drawn."""

    TABLE = "table"
    """A frame, optionally restricted to ``columns``."""
    FIGURE = "figure"
    """A PNG in the output directory (``figure``); left out of the terminal."""
    LIST = "list"
    """Lines (``items``), cut to a maximum in the terminal."""
    WARNINGS = "warnings"
    """Lines like ``LIST`` that a reader must see first (styled as warnings)."""
    PROJECTION = "projection"
    """A model's table (``frame``) with its assumptions (``items``, the first a label)."""


@dataclass(frozen=True)
class Section:
    """One titled part of the report; ``role`` says which other fields it uses.

    Attributes:
      title: the heading.
      role: how it is drawn.
      intro: a paragraph before the content ("" for none).
      frame: the table of ``TABLE`` and ``PROJECTION``.
      columns: the columns of ``frame`` shown (``None``: all; the CSVs have them all).
      items: the lines of ``LIST``, ``WARNINGS`` and ``PROJECTION``.
      figure: the file name of a ``FIGURE``, relative to the output directory.
      links: for a ``LIST``, per item the title of the section it sums up ("": none);
        the HTML links the item there.
    """

    title: str
    role: Role
    intro: str = ""
    frame: pd.DataFrame | None = None
    columns: tuple[str, ...] | None = None
    items: tuple[str, ...] = ()
    figure: str = ""
    links: tuple[str, ...] = ()


@dataclass(frozen=True)
class Document:
    """A computed report as the renderers see it: what is printed, nothing to compute.

    Attributes:
      summary: the line under the report's heading.
      sections: the parts in order (Markdown, HTML and the terminal draw this one list,
        so they cannot drift).
      tables: every table, for the JSON document.
      notes: every note.
      projection: the fitted model, if one was asked for and could be fitted.
      projection_error: why a projection that was asked for was not computed.
      options: the report's options as JSON-ready values.
      files: name -> path of the files written (empty when none were).
      time_unit: the unit wall-clock times are shown in (``TimeUnit.name``).
      optional_tables: the tables of ``OPTIONAL_CSV`` the runs gave rows, in that order.
    """

    summary: str
    sections: tuple[Section, ...]
    tables: Tables
    notes: tuple[Note, ...]
    projection: Projection | None
    projection_error: str
    options: dict
    files: dict[str, str]
    time_unit: str = "h"
    optional_tables: dict[str, pd.DataFrame] = field(default_factory=dict)
