"""Cross-validation folds by case, kept in the data file and chosen at training time.

A data file converted once holds every case and, in its group ``folds/``, a fold
table: for each fold ``I`` of ``K``, the role of every case when fold ``I`` validates
(``train``, ``val``, or ``test``: out of that fold's training and validation, as a
held-out test case is in every fold and a buffer slab of LiTS 117 beside its
validation slabs). ``distseg-train --fold I`` reads row ``I`` instead of the split the
file was written with; without ``--fold`` the file's own split holds, which the writers
make fold 0's (``convert --folds K --fold I``: fold I's).

Layout of the group (plain HDF5, any layout of file)::

    folds/case_id   (M,) int64    every case of the file, in the file's order
    folds/role      (K, M) uint8  0 train, 1 val, 2 test, as the file's ``split``
    folds/patient   (M,) str      the group each case was kept with (optional)
    folds.attrs     k, how        K, and how the table was made (one line)

Folds are drawn over patients, not cases, where a patient map is given (a CSV of case
to patient, or a regular expression whose first group names the patient in a case's
name), so two scans of one patient never sit on both sides of a fold. nnU-Net v2's
``splits_final.json`` (a list of ``{"train": [...], "val": [...]}`` by case name) is
read into the table and written from it, so a lab keeps its splits either way.

Plain h5py and numpy: the report reads the table through this module too.
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass
from typing import Sequence

import h5py
import numpy as np

from distseg.core.errors import InputError
from distseg.data import h5format

GROUP = "folds"
TRAIN, VAL, TEST = (h5format.SPLITS[k] for k in ("train", "val", "test"))
#: nnU-Net v2's fold rule: sklearn's ``KFold(5, shuffle=True, random_state=12345)``
#: over the sorted case names (``--like-nnunet``).
NNUNET_SEED = 12345


@dataclass(frozen=True)
class FoldTable:
    """The roles of every case in every fold."""

    case_ids: np.ndarray
    """(M,) the file's cases in file order."""
    roles: np.ndarray
    """(K, M) uint8: the role of case m when fold k validates."""
    how: str
    patients: tuple[str, ...] = ()
    """One patient name per case, or empty where none was given."""

    @property
    def k(self) -> int:
        return int(self.roles.shape[0])

    def fold_of(self) -> np.ndarray:
        """(M,) the fold each case validates in, -1 for a case no fold validates."""
        out = np.full(len(self.case_ids), -1, dtype=np.int64)
        for k in range(self.k):
            out[self.roles[k] == VAL] = k
        return out

    def check(self, where: str) -> None:
        """Every case validates in at most one fold and no fold is empty.

        Raises:
          InputError: naming ``where`` (the file or the splits file) and the case or fold.
        """
        validating = (self.roles == VAL).sum(axis=0)
        for m in np.flatnonzero(validating > 1):
            raise InputError(f"{where}: case {self.case_ids[m]} validates in "
                             f"{int(validating[m])} folds, expected at most one")
        for k in range(self.k):
            for role, word in ((VAL, "validates"), (TRAIN, "trains")):
                if not (self.roles[k] == role).any():
                    raise InputError(f"{where}: fold {k} {word} no case")


def _groups_of(n_cases: int, patients: Sequence[str] | None) -> list[list[int]]:
    """Case indices grouped by patient, groups in order of their first case."""
    if patients is None:
        return [[m] for m in range(n_cases)]
    first: dict[str, list[int]] = {}
    for m, p in enumerate(patients):
        first.setdefault(p, []).append(m)
    return list(first.values())


def draw(n_cases: int, k: int, seed: int, patients: Sequence[str] | None = None,
         held: np.ndarray | None = None) -> np.ndarray:
    """(M,) the fold of every case (-1 for ``held`` ones, the test cases): a seeded
    permutation of the patients cut into ``k`` contiguous runs of about equal case
    counts. Without patients this is the cut ``convert --folds`` has always made
    (``np.array_split`` of the permuted cases).

    Raises:
      InputError: fewer patients than folds.
    """
    held = np.zeros(n_cases, bool) if held is None else np.asarray(held, bool)
    groups = [g for g in _groups_of(n_cases, patients) if not held[g[0]]]
    if not 2 <= k <= len(groups):
        raise InputError(f"--folds {k}: need 2 <= folds <= the {len(groups)} "
                         f"{'patients' if patients is not None else 'cases'} that are not test cases")
    order = np.random.default_rng(seed).permutation(len(groups))
    n = sum(len(g) for g in groups)
    targets = np.cumsum([len(part) for part in np.array_split(np.arange(n), k)])
    fold_of = np.full(n_cases, -1, dtype=np.int64)
    done, fold = 0, 0
    for g in order:
        fold_of[groups[g]] = fold
        done += len(groups[g])
        # Move on once this fold holds its share, leaving at least a patient a fold.
        while fold < k - 1 and done >= targets[fold]:
            fold += 1
    if len(set(fold_of[fold_of >= 0].tolist())) < k:
        raise InputError(f"--folds {k}: the patients' case counts leave a fold empty; "
                         f"ask for fewer folds")
    return fold_of


def draw_like_nnunet(names: Sequence[str], k: int, seed: int = NNUNET_SEED,
                     held: np.ndarray | None = None) -> np.ndarray:
    """(M,) the fold of every case as nnU-Net v2 draws them: sklearn's ``KFold(k,
    shuffle=True, random_state=seed)`` over the sorted names of the cases that are not
    ``held`` (its folds' sizes differ by at most one, the first ones larger)."""
    held = np.zeros(len(names), bool) if held is None else np.asarray(held, bool)
    keys = sorted(n for n, h in zip(names, held) if not h)
    if not 2 <= k <= len(keys):
        raise InputError(f"--folds {k}: need 2 <= folds <= the {len(keys)} cases")
    indices = np.arange(len(keys))
    np.random.RandomState(seed).shuffle(indices)
    sizes = np.full(k, len(keys) // k)
    sizes[:len(keys) % k] += 1
    fold_by_name = {}
    for fold, part in enumerate(np.split(indices, np.cumsum(sizes)[:-1])):
        fold_by_name.update({keys[i]: fold for i in part})
    return np.array([fold_by_name.get(n, -1) for n in names], dtype=np.int64)


def table_of(case_ids: np.ndarray, fold_of: np.ndarray, how: str,
             patients: Sequence[str] | None = None) -> FoldTable:
    """The table of plain folds: fold k validates its cases, the others train, cases of
    fold -1 are test cases in every fold."""
    k = int(fold_of.max()) + 1
    roles = np.where(fold_of[None, :] == np.arange(k)[:, None], VAL, TRAIN).astype(np.uint8)
    roles[:, fold_of < 0] = TEST
    return FoldTable(np.asarray(case_ids, np.int64), roles, how,
                     tuple(patients) if patients is not None else ())


def patients_from_csv(path: str, names: Sequence[str]) -> list[str]:
    """Each case's patient from a CSV of ``case,patient`` rows (a header row is allowed
    when its first cell is not a case).

    Raises:
      InputError: unreadable, a row of other than two cells, or a case without a row.
    """
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.reader(f) if r and any(c.strip() for c in r)]
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    known = set(names)
    if rows and rows[0][0].strip() not in known:
        rows = rows[1:]
    patient: dict[str, str] = {}
    for line, row in enumerate(rows, 1):
        if len(row) != 2:
            raise InputError(f"{path}: row {line} has {len(row)} cells, expected 2 (case,patient)")
        patient[row[0].strip()] = row[1].strip()
    missing = [n for n in names if n not in patient]
    if missing:
        raise InputError(f"{path}: no patient for {len(missing)} case(s) of the data file, "
                         f"e.g. {missing[0]!r}; expected a row case,patient for every case")
    return [patient[n] for n in names]


def patients_from_pattern(pattern: str, names: Sequence[str]) -> list[str]:
    """Each case's patient: the first group (or the whole match) of ``pattern``
    searched in its name, e.g. ``^(\\w+?)_scan\\d+$``.

    Raises:
      InputError: a bad expression, or a case name it does not match.
    """
    try:
        rule = re.compile(pattern)
    except re.error as e:
        raise InputError(f"--patient-pattern {pattern!r}: not a regular expression ({e})") from None
    out = []
    for n in names:
        m = rule.search(n)
        if m is None:
            raise InputError(f"--patient-pattern {pattern!r} does not match case {n!r}; "
                             f"expected it to match every case name")
        out.append(m.group(1) if rule.groups else m.group(0))
    return out


def read_splits_final(path: str, names: Sequence[str], case_ids: np.ndarray,
                      test: np.ndarray) -> FoldTable:
    """The table of nnU-Net v2's ``splits_final.json`` at ``path`` over the file's cases
    (``names``, ``case_ids``; ``test``: the file's test cases, which no fold may name).

    Raises:
      InputError: not a list of {"train", "val"} lists of names, a name the data file
        lacks or a test case, a case in both lists of a fold, or a case no fold names.
    """
    try:
        with open(path) as f:
            raw = json.load(f)
    except OSError as e:
        raise InputError(f"{path}: cannot be read ({e.strerror})") from None
    except ValueError as e:
        raise InputError(f"{path}: not JSON ({e})") from None
    if not isinstance(raw, list) or len(raw) < 2 or not all(
            isinstance(s, dict) and isinstance(s.get("train"), list) and
            isinstance(s.get("val"), list) for s in raw):
        raise InputError(f"{path}: expected a list of at least 2 folds, each "
                         '{"train": [case names], "val": [case names]}')
    index = {n: m for m, n in enumerate(names)}
    roles = np.full((len(raw), len(names)), TEST, dtype=np.uint8)
    for k, split in enumerate(raw):
        for role, key in ((TRAIN, "train"), (VAL, "val")):
            for name in split[key]:
                m = index.get(name) if isinstance(name, str) else None
                if m is None:
                    raise InputError(f"{path}: fold {k} {key} names {name!r}, which the data "
                                     f"file does not hold (its cases are e.g. {names[0]!r})")
                if test[m]:
                    raise InputError(f"{path}: fold {k} {key} names {name!r}, a test case of "
                                     f"the data file; test cases stay out of every fold")
                if roles[k, m] != TEST:
                    raise InputError(f"{path}: fold {k} names {name!r} twice (train and val, "
                                     f"or one list twice)")
                roles[k, m] = role
    unnamed = [names[m] for m in range(len(names)) if not test[m] and (roles[:, m] == TEST).all()]
    if unnamed:
        raise InputError(f"{path}: no fold names {len(unnamed)} case(s) of the data file, e.g. "
                         f"{unnamed[0]!r}; expected every case that is not a test case")
    table = FoldTable(np.asarray(case_ids, np.int64), roles, f"nnU-Net splits {os.path.basename(path)}")
    table.check(path)
    return table


def splits_final(table: FoldTable, names: Sequence[str]) -> list[dict]:
    """nnU-Net v2's ``splits_final.json`` of ``table``: per fold the sorted names of the
    cases that train and that validate (as nnU-Net writes them)."""
    return [{"train": sorted(names[m] for m in np.flatnonzero(r == TRAIN)),
             "val": sorted(names[m] for m in np.flatnonzero(r == VAL))} for r in table.roles]


def write_splits_final(path: str, table: FoldTable, names: Sequence[str]) -> None:
    """Writes ``splits_final`` of ``table`` as nnU-Net saves it (indent 4)."""
    from distseg.core.partial import write_json
    write_json(path, splits_final(table, names), indent=4)


@dataclass(frozen=True)
class FileCases:
    """The cases of a data file in file order, as the fold table lists them."""

    case_ids: np.ndarray
    names: tuple[str, ...]
    """``cases/name`` where the file has it (convert), else ``case_<id>``."""
    test: np.ndarray
    """(M,) bool: a test case: in no fold of the file's table, or, without a table, in
    the file's ``test`` split."""


def file_cases(path: str) -> FileCases:
    """The cases of the data file ``path`` (either layout; metadata only).

    Raises:
      DatasetError: not a readable distseg file.
    """
    with h5format._h5(path) as f, h5format.damaged(path):
        case_of, split_of = f["case_id"][:], f["split"][:]
        # Slices list a case once per slice: keep each case's first row.
        _, first = np.unique(case_of, return_index=True)
        rows = np.sort(first)
        case_ids = case_of[rows].astype(np.int64)
        named = {}
        if "cases" in f and "name" in f["cases"] and "case_id" in f["cases"]:
            named = {int(c): (n.decode() if isinstance(n, bytes) else str(n))
                     for c, n in zip(f["cases/case_id"][:], f["cases/name"][:])}
    names = tuple(named.get(int(c), f"case_{int(c)}") for c in case_ids)
    table = read_table(path)
    if table is not None and np.array_equal(table.case_ids, case_ids):
        # The file's split is one fold's, where a buffer is "test" too: a test case is
        # one that no fold uses.
        return FileCases(case_ids, names, (table.roles == TEST).all(axis=0))
    return FileCases(case_ids, names, split_of[rows] == TEST)


def read_table(path: str) -> FoldTable | None:
    """The fold table of the data file ``path``, or None where it has none.

    Raises:
      DatasetError: a table of the wrong shape or values (one line naming the field).
    """
    with h5format._h5(path) as f, h5format.damaged(path):
        if GROUP not in f:
            return None
        g = f[GROUP]
        try:
            case_ids, roles = g["case_id"][:].astype(np.int64), g["role"][:].astype(np.uint8)
        except KeyError as e:
            raise h5format.DatasetError(f"{path}: the fold table lacks {GROUP}/{e.args[0]}") from None
        patients = tuple(p.decode() if isinstance(p, bytes) else str(p)
                         for p in g["patient"][:]) if "patient" in g else ()
        how = str(g.attrs.get("how", ""))
    if roles.ndim != 2 or roles.shape[1] != len(case_ids) or not np.isin(roles, (TRAIN, VAL, TEST)).all():
        raise h5format.DatasetError(f"{path}: {GROUP}/role has shape {roles.shape} or values other "
                                    f"than 0, 1, 2; expected (K, {len(case_ids)}) roles")
    return FoldTable(case_ids, roles, how, patients)


def write_table(path: str, table: FoldTable, base_fold: int = 0) -> None:
    """Writes ``table`` into the data file ``path`` (replacing any table) and sets the
    file's own split to fold ``base_fold``'s roles, so a run without ``--fold`` trains
    that fold. Everything is checked before the file is opened for writing."""
    cases = file_cases(path)
    if not np.array_equal(cases.case_ids, table.case_ids):
        raise InputError(f"{path}: the fold table's cases differ from the file's")
    table.check(path)
    with h5py.File(path, "r+", locking=False) as f:
        if GROUP in f:
            del f[GROUP]
        g = f.create_group(GROUP)
        g.create_dataset("case_id", data=table.case_ids)
        g.create_dataset("role", data=table.roles)
        if table.patients:
            g.create_dataset("patient", data=np.array(table.patients, dtype=h5py.string_dtype()))
        g.attrs["k"] = table.k
        g.attrs["how"] = table.how
        split = f["split"]
        split[...] = roles_of(table, base_fold, f["case_id"][:], path)


def roles_of(table: FoldTable, fold: int, sample_cases: np.ndarray, where: str) -> np.ndarray:
    """The role in fold ``fold`` of each entry of ``sample_cases`` (case ids: per slice
    of a slice file, per row of a volume file)."""
    index = {int(c): m for m, c in enumerate(table.case_ids)}
    try:
        rows = np.array([index[int(c)] for c in sample_cases], dtype=np.int64)
    except KeyError as e:
        raise h5format.DatasetError(f"{where}: case {e.args[0]} is missing from the fold table "
                                    f"({GROUP}/case_id)") from None
    return table.roles[fold][rows].astype(np.uint8)


def applied(info, fold: int):
    """``info`` (a slice file's ``DatasetInfo`` or a volume file's ``VolumeInfo``) as
    fold ``fold`` sees it: each case's split taken from the file's fold table; ``info``
    itself for ``fold`` -1.

    Raises:
      DatasetError: the file has no fold table, or ``fold`` is outside it.
    """
    if fold < 0:
        return info
    table = read_table(info.path)
    if table is None:
        raise h5format.DatasetError(
            f"{info.path}: holds no fold table for --fold {fold}; write one with "
            f"distseg-data folds {info.path} --folds K (or convert with --folds K)")
    if fold >= table.k:
        raise h5format.DatasetError(f"{info.path}: --fold {fold} is outside the file's {table.k} "
                                    f"folds (0..{table.k - 1})")
    return info.with_splits(roles_of(table, fold, info.case_ids, info.path))


def examine(path: str, spatial_dims: int, fold: int = -1, check_labels: bool = False):
    """The data file's info (``slices.examine`` or ``volumes.examine``) as fold ``fold``
    sees it: the one way a run, predict's decisions and the report read its split."""
    from distseg.data import slices, volumes
    reader = volumes if spatial_dims == 3 else slices
    return applied(reader.examine(path, check_labels=check_labels), fold)



def table_from_cases_column(path: str, how: str) -> FoldTable:
    """The plain table of the fold ``convert --folds`` wrote per case (``cases/fold``)."""
    cases = file_cases(path)
    with h5format._h5(path) as f:
        fold_by_case = dict(zip(f["cases/case_id"][:].tolist(), f["cases/fold"][:].tolist()))
    fold_of = np.array([fold_by_case[int(c)] for c in cases.case_ids], dtype=np.int64)
    return table_of(cases.case_ids, fold_of, how)
