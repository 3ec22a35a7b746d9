"""Did the ranks' shards cover the training set exactly once per epoch?

The logs hold per-rank sample counts and digests (sums of mixed ids modulo 2**64),
not the ids. Digests add, so the ranks' digests of an epoch combine into the digest
of what the epoch covered, and a gap or an overlap between shards changes it. The
reference to compare with is the digest of the data file's train split (a 3D run's:
the slab ids of its train cases) when that file is still readable here, else the
digest most complete epochs of the same dataset agree on (every epoch is a new
permutation of the same set, in every run of that dataset).

The pipeline: ``expected_samples`` (what one epoch should hold, and on what basis),
``epoch_shards`` (the ranks' digests combined per epoch), ``digest_votes`` and
``reference_digest`` (what to compare with), ``verdict`` (one epoch's answer).
"""

from __future__ import annotations

import enum
import math
import os
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd

from analysis.logs import RunData
from distseg.core import schema
from distseg.core.errors import InputError, refuse_newer


class Basis(enum.Enum):
    """What an epoch's expected sample count rests on."""

    ALL = "all"
    """Every train sample once: count and digest can both be checked."""
    BATCH_ONE = "batch one"
    """Batch size 1 drops a new random few samples each epoch: only the count is fixed."""
    CAPPED = "capped"
    """``max_steps_per_epoch`` cut the epoch short: a part of the set, by design."""
    UNKNOWN = "unknown"
    """The run record lacks the dataset size or the number of ranks."""


@dataclass(frozen=True)
class Expected:
    """Samples one epoch should cover across ranks.

    Attributes:
      samples: the count (NaN when unknown or capped).
      basis: what it rests on.
      why: the phrase shown in the table.
    """

    samples: float
    basis: Basis
    why: str

    @property
    def varying(self) -> bool:
        """Whether each epoch covers a different subset by design (digests differ)."""
        return self.basis in (Basis.BATCH_ONE, Basis.CAPPED)


#: Run records' ``batch_plan`` (the kind of ``batchplan.batch_plan``'s plan) under which
#: a launch cuts its ranks' batches from fixed global batches of ``global_batch_size``:
#: ``global``, ``grown``, and ``chosen``, the per-rank batch the ``goodput`` policy
#: chose, which a resumed launch goes on with.
CUT_GLOBAL = ("global", "grown", "chosen")


def _fixed_global_batch(rec: dict) -> int:
    """The fixed global batch a launch's shards are cut in (0: per-rank shards)."""
    if rec.get("batch_plan") in CUT_GLOBAL:
        return int(rec.get("global_batch_size") or 0)
    return 0


def expected_samples(run: RunData) -> Expected:
    """Samples one epoch should cover across ranks, and why (see ``shard_batches``)."""
    rec = run.run_record
    n, size, b = run.train_samples, run.size, rec.get("batch_size")
    if n is None or not size:
        return Expected(math.nan, Basis.UNKNOWN, "unknown (no dataset.train_samples, "
                        "train_slabs or size in the run record)")
    n, size = int(n), int(size)
    fixed = _fixed_global_batch(rec)
    if b is not None:
        b = int(b)
        full = schema.steps_per_epoch(n, size, b, fixed)
        spe = rec.get("steps_per_epoch")
        if spe is not None and int(spe) < full:
            return Expected(math.nan, Basis.CAPPED,
                            f"capped: {spe} of {full} steps per epoch (max_steps_per_epoch)")
        if fixed and n % fixed:
            return Expected(float(schema.epoch_samples(n, size, b, fixed)), Basis.BATCH_ONE,
                            f"global batch {fixed}: {n % fixed} of {n} samples skipped per "
                            "epoch by design (a new random few each epoch)")
        if not fixed and b == 1 and n % size:
            return Expected(float(n - n % size), Basis.BATCH_ONE,
                            f"batch size 1: {n % size} of {n} samples skipped per epoch by "
                            "design (a new random few each epoch)")
    return Expected(float(n), Basis.ALL, "all train samples")


_FILE_DIGESTS: dict[tuple, tuple[str | None, str]] = {}


def _read_train_ids(path: str, slab: tuple[int, ...] | None,
                    fold: int = -1) -> tuple[np.ndarray, int]:
    """The train sample ids of a data file and its number of samples: the train
    slices of a slice file; of a volume file, the slab ids of its train cases on the
    grid of ``slab`` (as 3D training numbers them). With ``fold`` >= 0, the split is
    that fold's (``distseg.data.folds``), as the run trained it. Only the small tables
    are read.

    Raises:
      InputError: the file's ``format_version`` is newer than this distseg reads.
      ValueError: a volume file, and no slab to cut it with.
    """
    import h5py  # a plain HDF5 reader, imported only when a data file is checked

    from distseg.data import folds, volumes  # h5py and numpy only
    from distseg.data.h5format import FORMAT_VERSION

    # Locking off, as the ranks read it: a file on Lustre/NFS may refuse locks.
    with h5py.File(path, "r", locking=False) as f:
        version = f.attrs.get("format_version")
        if version is not None:
            refuse_newer(path, "format_version", version, FORMAT_VERSION)
        split = np.asarray(f["split"][...])
        if fold >= 0:
            split = _fold_split(path, fold, np.asarray(f["case_id"][...]), folds)
        train = np.flatnonzero(split == schema.SPLITS["train"])
        layout = f.attrs.get("layout", "slices")
        if (layout.decode() if isinstance(layout, bytes) else layout) != volumes.LAYOUT:
            return train, len(split)
        if slab is None:
            raise ValueError("a volume file, and the run record names no slab")
        grid = volumes.SlabGrid.of(np.asarray(f["shape"][...]), slab)
        return grid.ids(train), grid.total


def _fold_split(path: str, fold: int, case_ids: np.ndarray, folds) -> np.ndarray:
    """The split of fold ``fold`` of the file's fold table, per entry of ``case_ids``."""
    table = folds.read_table(path)
    if table is None or fold >= table.k:
        raise ValueError(f"no fold {fold} in the file's fold table")
    return folds.roles_of(table, fold, case_ids, path)


def _train_digest(path: str, n: int, n_train: int, slab: tuple[int, ...] | None,
                  fold: int = -1) -> tuple[str | None, str]:
    try:
        train, total = _read_train_ids(path, slab, fold)
    except InputError:
        raise  # a newer format is refused, not skipped: its split may mean something else
    except Exception as e:  # noqa: BLE001 (any unreadable file only loses the cross-check)
        return None, f"data file {path} unreadable ({e.__class__.__name__})"
    if total != n or len(train) != n_train:
        return None, (f"data file {path} now holds {total} samples, {len(train)} train "
                      f"(the run logged {n}, {n_train})")
    where = "train split of the data file" if fold < 0 else f"fold {fold}'s train cases of the data file"
    return schema.sample_digest(train.tolist()), where


def _logged_slab(ds: dict) -> tuple[int, ...] | None:
    """A 3D run's slab shape (``dataset.slab``), ``None`` when absent or malformed."""
    slab = ds.get("slab")
    if (isinstance(slab, list) and len(slab) == 3
            and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in slab)):
        return tuple(slab)
    return None


def data_file_digest(run: RunData) -> tuple[str | None, str]:
    """Digest of the train split of the data file the run logged, if it can be trusted.

    The file is read only when it still exists and its sample counts equal the logged
    ones (a file rewritten since the run would give a wrong reference). A 3D run's
    samples are slabs: the file's train cases are cut on the grid of the logged
    ``dataset.slab``. Returns the digest (or ``None``) and a phrase saying where it
    comes from or why there is none.

    Raises:
      InputError: the data file was written by a newer distseg (``format_version``).
    """
    ds = run.dataset
    path, n, n_train = ds.get("path"), ds.get("samples"), ds.get("train_samples")
    if not isinstance(path, str) or not path or n is None or n_train is None:
        return None, "no data file path and sizes in the run record"
    if not os.path.isfile(path):
        return None, f"data file {path} not found here"
    slab, fold = _logged_slab(ds), run_fold(run)
    try:
        key = (path, os.path.getmtime(path), int(n), int(n_train), slab, fold)
    except (OSError, TypeError, ValueError):
        return None, f"data file {path} cannot be checked"
    if key not in _FILE_DIGESTS:
        _FILE_DIGESTS[key] = _train_digest(path, int(n), int(n_train), slab, fold)
    return _FILE_DIGESTS[key]


def dataset_key(run: RunData) -> tuple:
    """Identifies a dataset across runs (file name, sizes, source, and a 3D run's slab:
    another slab shape cuts other slab ids from the same file), for digest votes."""
    ds = run.dataset
    return (os.path.basename(str(ds.get("path", ""))), ds.get("samples"), run.train_samples,
            ds.get("source"), str(ds.get("slab")), run_fold(run))


def run_fold(run: RunData) -> int:
    """The cross-validation fold the run validated (config ``data.fold``), -1 for none."""
    fold = ((run.config or {}).get("data") or {}).get("fold", -1)
    return fold if isinstance(fold, int) and not isinstance(fold, bool) else -1


@dataclass(frozen=True)
class EpochShards:
    """One epoch's shards, all ranks combined.

    Attributes:
      epoch: the epoch.
      ranks_logged: ranks with an epoch record.
      samples: samples of all those ranks.
      combined: the combined digest; ``None`` when a rank logged none (or a bad one).
    """

    epoch: int
    ranks_logged: int
    samples: float
    combined: str | None
    size: int | None = None
    """Ranks of the launch that logged the epoch (an elastic or resumed run's launches
    may differ in size); ``None``: unknown, the run's size applies."""


def _launch_sizes(run: RunData) -> dict[int, int]:
    """Segment -> its number of ranks, where the ``run`` records tell."""
    seg = run.segments
    if seg is None or not len(seg) or "size" not in seg:
        return {}
    return {int(k): int(v) for k, v in zip(seg["segment"], seg["size"]) if pd.notna(v)}


def epoch_shards(run: RunData) -> list[EpochShards]:
    """Per epoch of ``run``: its ranks' sample counts and digests combined.

    Only the records of the latest launch that logged an epoch count: when a launch
    ended after some ranks had logged an epoch and the next launch redid it (at
    another size, say), the earlier partial shards belong to no complete epoch."""
    out = []
    sizes = _launch_sizes(run)
    for epoch, g in run.epochs.groupby("epoch"):
        if "segment" in g and g["segment"].notna().any():
            g = g[g["segment"] == g["segment"].max()]
        digests = [d for d in g["sample_digest"] if isinstance(d, str)]
        try:
            combined = schema.combine_digests(digests) if len(digests) == len(g) else None
        except ValueError:
            combined = None
        size = sizes.get(int(g["segment"].iloc[0])) if "segment" in g else None
        out.append(EpochShards(int(epoch), int(g["rank"].nunique()),
                               float(g["samples"].sum(min_count=1)), combined, size))
    return out


def digest_votes(prepared: Sequence[tuple[RunData, Expected, list[EpochShards]]]
                 ) -> dict[tuple, Counter]:
    """Per dataset: how many complete epochs of the right count gave each digest.

    Only epochs that should cover the whole set vote (every rank logged, count as
    expected, no subset by design), so a vote is for "the digest of the train set".
    """
    votes: dict[tuple, Counter] = {}
    for run, expected, shards in prepared:
        if expected.varying:
            continue
        for s in shards:
            complete = bool(run.size) and s.ranks_logged == run.size
            if complete and s.combined is not None and s.samples == expected.samples:
                votes.setdefault(dataset_key(run), Counter())[s.combined] += 1
    return votes


def reference_digest(run: RunData, votes: dict[tuple, Counter]) -> tuple[str | None, str]:
    """The digest ``run``'s epochs are compared with, and where it comes from.

    The data file's train split when readable here; else a digest that at least two
    complete epochs of this dataset agree on and more than any other.
    """
    reference, source = data_file_digest(run)
    if reference is not None:
        return reference, source
    ballot = votes.get(dataset_key(run), Counter())
    ranked = ballot.most_common(2)
    if ranked and ranked[0][1] >= 2 and (len(ranked) == 1 or ranked[0][1] > ranked[1][1]):
        return ranked[0][0], (f"{ranked[0][1]} of {sum(ballot.values())} complete epochs of "
                              f"this dataset agree on one digest; {source}")
    if len(ranked) > 1:
        return None, f"epochs disagree and nothing tells which is right; {source}"
    return None, f"a single complete epoch, nothing to cross-check; {source}"


@dataclass(frozen=True)
class Verdict:
    """One epoch's coverage: ``covered`` and ``digest_matches`` are ``None`` when unknown."""

    status: str
    covered: bool | None = None
    digest_matches: bool | None = None


def verdict(size: int | None, shards: EpochShards, expected: Expected,
            reference: str | None, source: str) -> Verdict:
    """Whether one epoch covered the train set, checked from the cheapest doubt up.

    Args:
      size: the run's number of ranks.
      shards: the epoch's combined counts and digest.
      expected: what the epoch should hold.
      reference: the digest to compare with (``None``: none trusted).
      source: where ``reference`` comes from, or why there is none.
    """
    samples, combined = shards.samples, shards.combined
    if not size or shards.ranks_logged < size:
        return Verdict(f"unknown: {shards.ranks_logged} of {size or '?'} ranks logged this epoch")
    if combined is None:
        return Verdict("unknown: a rank logged no sample digest")
    if expected.basis is Basis.CAPPED:
        return Verdict(f"partial by design ({expected.why})")
    if not math.isfinite(expected.samples):
        return Verdict(f"unknown: expected count {expected.why}")
    if samples != expected.samples:
        return Verdict(f"NOT covered: {samples:.0f} samples seen, {expected.samples:.0f} "
                       f"expected ({expected.why})", covered=False)
    if expected.varying:
        return Verdict(f"covered (count only; {expected.why})", covered=True)
    if reference is None:
        return Verdict(f"count right, digest not checked: {source}")
    if combined != reference:
        return Verdict(f"NOT covered: combined digest {combined} differs from the reference "
                       f"{reference} (shards overlap or leave a gap)",
                       covered=False, digest_matches=False)
    return Verdict("covered", covered=True, digest_matches=True)


COLUMNS = ["run", "epoch", "ranks_logged", "ranks", "samples", "expected_samples",
           "combined_digest", "reference_digest", "reference", "digest_matches", "covered",
           "status"]


def coverage(runs: Sequence[RunData]) -> pd.DataFrame:
    """Per run and epoch: did the ranks' shards cover the train set exactly once?

    An epoch is ``covered`` when every rank logged it, the samples add up to the
    expected count and the combined digest equals the reference (see the module
    docstring); ``covered`` is empty where that cannot be told, and ``status`` says why.

    Raises:
      InputError: a run's data file was written by a newer distseg.
    """
    prepared = [(run, expected_samples(run), epoch_shards(run)) for run in runs
                if len(run.epochs)]
    votes = digest_votes(prepared)
    rows = []
    for run, expected, shards in prepared:
        reference, source = reference_digest(run, votes)
        for s in shards:
            size = s.size or run.size
            v = verdict(size, s, expected, reference, source)
            rows.append({"run": run.label, "epoch": s.epoch, "ranks_logged": s.ranks_logged,
                         "ranks": size, "samples": s.samples,
                         "expected_samples": expected.samples, "combined_digest": s.combined,
                         "reference_digest": reference, "reference": source,
                         "digest_matches": v.digest_matches, "covered": v.covered,
                         "status": v.status})
    return pd.DataFrame(rows, columns=COLUMNS)


def coverage_summary(cov: pd.DataFrame) -> pd.DataFrame:
    """One row per run: how many epochs were covered, and the first problem if any."""
    rows = []
    for run, g in cov.groupby("run", sort=False):
        bad = g[g["covered"] == False]  # noqa: E712 (a column of True/False/None)
        unknown = g[g["covered"].isna()]
        first = bad if len(bad) else unknown
        rows.append({"run": run, "epochs": len(g), "covered": int((g["covered"] == True).sum()),  # noqa: E712
                     "not_covered": len(bad), "unknown": len(unknown),
                     "reference": g["reference"].iloc[0],
                     "first_problem": (f"epoch {int(first['epoch'].iloc[0])}: "
                                       f"{first['status'].iloc[0]}") if len(first) else ""})
    return pd.DataFrame(rows, columns=["run", "epochs", "covered", "not_covered", "unknown",
                                       "reference", "first_problem"])
