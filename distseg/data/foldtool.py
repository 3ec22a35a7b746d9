"""``distseg-data folds``: give a data file its fold table, drawn over cases or
patients or read from nnU-Net v2's ``splits_final.json``, and write that file back.

Every input is checked before the data file is opened for writing, so a bad CSV,
pattern or splits file changes nothing (``folds.write_table`` writes last).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from distseg.core.errors import InputError
from distseg.data import folds


@dataclass(frozen=True)
class Request:
    """What the command was asked (its flags)."""

    k: int | None
    seed: int
    like_nnunet: bool
    patients: str | None
    patient_pattern: str | None
    splits_in: str | None
    splits_out: str | None
    base_fold: int
    test: tuple[str, ...] = ()
    """Case names held out of every fold (the file's test cases besides its own)."""


def _check(req: Request) -> None:
    if req.k is not None and req.splits_in:
        raise InputError("--folds draws folds and --splits-in reads them: pass one")
    if req.patients and req.patient_pattern:
        raise InputError("--patients and --patient-pattern both name patients: pass one")
    if req.like_nnunet and (req.patients or req.patient_pattern):
        raise InputError("--like-nnunet draws over cases as nnU-Net does; it keeps no "
                         "patients together (leave out --patients/--patient-pattern)")
    if req.k is None and (req.like_nnunet or req.patients or req.patient_pattern):
        raise InputError("--like-nnunet, --patients and --patient-pattern shape a draw: "
                         "give --folds K")
    if req.test and req.k is None and not req.splits_in:
        raise InputError("--test holds cases out of new folds: give --folds K or --splits-in FILE")


def _patients(req: Request, names) -> list[str] | None:
    if req.patients:
        return folds.patients_from_csv(req.patients, names)
    if req.patient_pattern:
        return folds.patients_from_pattern(req.patient_pattern, names)
    return None


def with_test(path: str, req: Request, cases: folds.FileCases) -> folds.FileCases:
    """``cases`` with ``req.test``'s cases held out too.

    Raises:
      InputError: a name the file does not hold.
    """
    if not req.test:
        return cases
    index = {n: m for m, n in enumerate(cases.names)}
    test = cases.test.copy()
    for name in req.test:
        if name not in index:
            raise InputError(f"--test {name}: {path} holds no such case (its cases are e.g. "
                             f"{cases.names[0]!r})")
        test[index[name]] = True
    return dataclasses.replace(cases, test=test)


def drawn(path: str, req: Request, cases: folds.FileCases) -> folds.FoldTable:
    """The table ``req`` draws over the file's ``cases`` (test cases held out)."""
    if req.like_nnunet:
        seed = req.seed or folds.NNUNET_SEED
        fold_of = folds.draw_like_nnunet(cases.names, req.k, seed, held=cases.test)
        return folds.table_of(cases.case_ids, fold_of, f"nnU-Net KFold({req.k}, shuffle, "
                                                       f"random_state={seed}) over sorted names")
    patients = _patients(req, cases.names)
    fold_of = folds.draw(len(cases.names), req.k, req.seed, patients, held=cases.test)
    by = " by patient" if patients is not None else ""
    return folds.table_of(cases.case_ids, fold_of, f"{req.k} folds{by}, seed {req.seed}", patients)


def run(path: str, req: Request) -> list[str]:
    """Does what ``req`` asks of the data file ``path``; returns the lines to print.

    Raises:
      InputError: conflicting flags, a bad CSV/pattern/splits file, a fold out of range
        (one line naming the file or flag; the data file untouched).
    """
    _check(req)
    cases = with_test(path, req, folds.file_cases(path))
    if req.splits_in:
        table = folds.read_splits_final(req.splits_in, cases.names, cases.case_ids, cases.test)
    elif req.k is not None:
        table = drawn(path, req, cases)
    else:
        table = folds.read_table(path)
        if table is None:
            raise InputError(f"{path}: holds no fold table; give --folds K or --splits-in FILE")
    if not 0 <= req.base_fold < table.k:
        raise InputError(f"--fold {req.base_fold} is outside the {table.k} folds (0..{table.k - 1})")
    if req.splits_in or req.k is not None:
        folds.write_table(path, table, req.base_fold)
    if req.splits_out:
        folds.write_splits_final(req.splits_out, table, cases.names)
    return describe(path, table, cases)


def describe(path: str, table: folds.FoldTable, cases: folds.FileCases) -> list[str]:
    """One line per fold: its validating cases and how many train."""
    lines = [f"{path}: {table.k} folds ({table.how}); {int(cases.test.sum())} test case(s) "
             f"in no fold"]
    for k, roles in enumerate(table.roles):
        val = [cases.names[m] for m in np.flatnonzero(roles == folds.VAL)]
        shown = ", ".join(val[:6]) + (f", ... ({len(val)})" if len(val) > 6 else "")
        lines.append(f"  fold {k}: val {shown}; {int((roles == folds.TRAIN).sum())} train, "
                     f"{int((roles == folds.TEST).sum())} unused")
    return lines
