"""Folds by case kept in the data file (``distseg.data.folds``, ``distseg-data folds``):
the draw over cases and over patients, nnU-Net's ``splits_final.json`` in and out, a
fold applied to a slice file and to a volume file, and the bad inputs refused in one
line with the file untouched."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from click.testing import CliRunner

from distseg.cli.data import data as data_cli
from distseg.core.errors import InputError
from distseg.data import folds, synth, volumes
from distseg.data import slices as slice_data
from distseg.data.convert import pipeline, samples


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _cli(*args):
    return CliRunner().invoke(data_cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture
def slices(tmp_path):
    path = str(tmp_path / "s.h5")
    synth.make_dataset(path, cases=10, size=16, seed=0, slices_per_case=3)
    return path


def test_draw_without_patients_is_convert_s_old_cut():
    # convert --folds has always cut a seeded permutation with np.array_split.
    for n, k, seed in ((10, 3, 0), (17, 5, 4), (4, 4, 1)):
        old = np.full(n, -1)
        for fold, members in enumerate(np.array_split(np.random.default_rng(seed).permutation(n), k)):
            old[members] = fold
        assert folds.draw(n, k, seed).tolist() == old.tolist()


def test_draw_over_patients_never_splits_a_patient_and_balances_the_folds():
    # 20 scans of 14 patients: 6 patients with two scans.
    patients = [f"p{i}" for i in range(14)] + [f"p{i}" for i in range(6)]
    for seed in range(5):
        fold_of = folds.draw(20, 5, seed, patients)
        assert set(fold_of.tolist()) == set(range(5))
        for p in set(patients):
            assert len({int(fold_of[m]) for m, q in enumerate(patients) if q == p}) == 1
        sizes = np.bincount(fold_of, minlength=5)
        assert sizes.max() - sizes.min() <= 2  # within a patient's scans of even


def test_held_cases_are_in_no_fold_and_too_many_folds_are_refused():
    held = np.zeros(8, bool)
    held[[1, 5]] = True
    fold_of = folds.draw(8, 3, 0, held=held)
    assert fold_of[1] == fold_of[5] == -1 and (fold_of[~held] >= 0).all()
    with pytest.raises(InputError, match="--folds 7: need 2 <= folds <= the 6"):
        folds.draw(8, 7, 0, held=held)
    with pytest.raises(InputError, match="patients"):
        folds.draw(4, 3, 0, ["a", "a", "b", "b"])


def test_like_nnunet_is_kfold_over_the_sorted_names():
    names = [f"liver_{i}" for i in (7, 3, 11, 0, 5, 2, 9)]
    fold_of = folds.draw_like_nnunet(names, 3)
    keys = sorted(names)
    order = np.arange(len(keys))
    np.random.RandomState(12345).shuffle(order)
    # sklearn's KFold: sizes 3, 2, 2 over the shuffled indices of the sorted keys.
    expected = {keys[i]: f for f, part in enumerate((order[:3], order[3:5], order[5:])) for i in part}
    assert [expected[n] for n in names] == fold_of.tolist()
    # The file's own order does not matter, only the names.
    again = folds.draw_like_nnunet(list(reversed(names)), 3)
    assert again.tolist() == list(reversed(fold_of.tolist()))


def test_splits_final_round_trip_is_identical(slices, tmp_path):
    cases = folds.file_cases(slices)
    table = folds.table_of(cases.case_ids, folds.draw(len(cases.names), 4, 3), "t")
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    folds.write_splits_final(str(first), table, cases.names)
    raw = json.loads(first.read_text())
    assert len(raw) == 4 and sorted(n for s in raw for n in s["val"]) == sorted(cases.names)
    back = folds.read_splits_final(str(first), cases.names, cases.case_ids, cases.test)
    assert np.array_equal(back.roles, table.roles)
    folds.write_splits_final(str(second), back, cases.names)
    assert first.read_bytes() == second.read_bytes()
    # As nnU-Net writes it (indent 4, sorted names): read and written back to the byte.
    nnunet = json.dumps([{"train": sorted(s["train"]), "val": sorted(s["val"])} for s in raw],
                        indent=4, sort_keys=True)
    assert first.read_text() == nnunet


@pytest.mark.parametrize("splits,words", [
    ([{"train": ["case_0"], "val": ["case_1"]}], "at least 2 folds"),
    ("not a list", "at least 2 folds"),
    ([{"train": ["nobody"], "val": []}, {"train": [], "val": []}], "'nobody', which the data file does not hold"),
    ([{"train": ["case_0"], "val": ["case_0"]}, {"train": [], "val": []}], "names 'case_0' twice"),
    ([{"train": [f"case_{i}" for i in range(1, 5)], "val": [f"case_{i}" for i in range(5, 10)]},
      {"train": [f"case_{i}" for i in range(5, 10)], "val": [f"case_{i}" for i in range(1, 5)]}],
     "no fold names 1 case(s) of the data file, e.g. 'case_0'"),
])
def test_a_bad_splits_file_is_one_line_and_the_data_file_is_untouched(slices, tmp_path, splits, words):
    bad = tmp_path / "splits_final.json"
    bad.write_text(json.dumps(splits))
    before = _digest(slices)
    out = _cli("folds", slices, "--splits-in", bad)
    assert out.exit_code == 2
    assert words in out.output and str(bad) in out.output and out.output.count("\n") == 1
    assert _digest(slices) == before


def test_folds_applied_to_a_slice_file(slices):
    assert _cli("folds", slices, "--folds", "3", "--seed", "2").exit_code == 0
    table = folds.read_table(slices)
    info = slice_data.examine(slices)
    for k in range(3):
        seen = folds.examine(slices, 2, k)
        val_cases = set(info.case_ids[seen.val_indices].tolist())
        train_cases = set(info.case_ids[seen.train_indices].tolist())
        assert val_cases == set(table.case_ids[table.roles[k] == folds.VAL].tolist())
        assert train_cases == set(table.case_ids[table.roles[k] == folds.TRAIN].tolist())
        assert not val_cases & train_cases and len(val_cases | train_cases) == 10
    # Without --fold the file's own split is fold 0's.
    assert np.array_equal(info.val_indices, folds.examine(slices, 2, 0).val_indices)
    with pytest.raises(InputError, match=r"--fold 3 is outside the file's 3 folds \(0..2\)"):
        folds.examine(slices, 2, 3)


def test_a_file_without_folds_is_refused_for_a_fold(slices):
    with pytest.raises(InputError, match="holds no fold table for --fold 0; write one with distseg-data folds"):
        folds.examine(slices, 2, 0)
    assert folds.examine(slices, 2, -1).samples == 30


def test_folds_applied_to_a_volume_file(tmp_path):
    path = str(tmp_path / "v.h5")
    synth.make_volumes(path, cases=6, size=16, seed=0, slices_per_case=8)
    assert _cli("folds", path, "--folds", "2").exit_code == 0
    table = folds.read_table(path)
    for k in range(2):
        info = folds.examine(path, 3, k)
        assert isinstance(info, volumes.VolumeInfo)
        assert set(info.case_ids[info.val_cases].tolist()) == set(
            table.case_ids[table.roles[k] == folds.VAL].tolist())
        assert len(info.train_cases) + len(info.val_cases) == 6


def test_patient_map_errors_name_the_file_or_flag(slices, tmp_path):
    csv = tmp_path / "patients.csv"
    csv.write_text("case,patient\n" + "".join(f"case_{i},p{i // 2}\n" for i in range(9)))
    before = _digest(slices)
    out = _cli("folds", slices, "--folds", "2", "--patients", csv)
    assert out.exit_code == 2 and f"{csv}: no patient for 1 case(s) of the data file, e.g. 'case_9'" in out.output
    out = _cli("folds", slices, "--folds", "2", "--patient-pattern", r"^scan_(\d+)")
    assert out.exit_code == 2 and "does not match case 'case_0'" in out.output
    out = _cli("folds", slices, "--folds", "2", "--splits-in", csv)
    assert out.exit_code == 2 and "pass one" in out.output
    assert _digest(slices) == before
    csv.write_text("".join(f"case_{i},p{i // 2}\n" for i in range(10)))
    assert _cli("folds", slices, "--folds", "5", "--patients", csv).exit_code == 0
    fold_of = folds.read_table(slices).fold_of()
    assert all(fold_of[2 * p] == fold_of[2 * p + 1] for p in range(5))


def test_convert_folds_patients_and_splits_final_on_mixed_spacings(tmp_path):
    """The issue's dataset: 20 phantom cases at mixed spacings, two scans of some
    patients; every case in exactly one fold, no patient split, splits_final.json read
    and written back identical."""
    src = tmp_path / "src"
    samples.write_phantoms(str(src), 20, "random", extent=(40.0, 120.0, 120.0), seed=3)
    out = str(tmp_path / "all.h5")
    pipeline.run(str(src), out, pipeline.Options(size=16, folds=5, fold=2, progress=False))
    table = folds.read_table(out)
    cases = folds.file_cases(out)
    assert table.k == 5 and sorted((table.roles == folds.VAL).sum(axis=0).tolist()) == [1] * 20
    # The file's own split is fold 2's, as convert --fold 2 asked.
    info = slice_data.examine(out)
    assert set(info.case_ids[info.val_indices].tolist()) == set(table.case_ids[table.roles[2] == 1].tolist())
    # volume-2k and volume-2k+1 (k < 4) are two scans of one patient.
    csv = tmp_path / "patients.csv"
    csv.write_text("".join(f"{n},{'pat%d' % (int(n.split('-')[1]) // 2) if int(n.split('-')[1]) < 8 else n}\n"
                           for n in cases.names))
    splits = tmp_path / "splits_final.json"
    assert _cli("folds", out, "--folds", "5", "--patients", csv, "--splits-out", splits).exit_code == 0
    fold_of = folds.read_table(out).fold_of()
    assert (fold_of >= 0).all()
    index = {n: m for m, n in enumerate(cases.names)}
    for p in range(4):
        assert fold_of[index[f"volume-{2 * p}"]] == fold_of[index[f"volume-{2 * p + 1}"]]
    again = tmp_path / "again.json"
    assert _cli("folds", out, "--splits-in", splits, "--splits-out", again).exit_code == 0
    assert splits.read_bytes() == again.read_bytes()


def test_test_cases_stay_out_of_every_fold_and_the_file_s_split(slices, tmp_path):
    out = _cli("folds", slices, "--folds", "3", "--test", "case_2,case_7")
    assert out.exit_code == 0, out.output
    table = folds.read_table(slices)
    cases = folds.file_cases(slices)
    held = [cases.names.index(n) for n in ("case_2", "case_7")]
    assert (table.roles[:, held] == folds.TEST).all()
    assert sorted((table.roles == folds.VAL).sum(axis=0).tolist()) == [0, 0] + [1] * 8
    assert cases.test[held].all() and cases.test.sum() == 2
    info = slice_data.examine(slices)
    assert set(info.case_ids[info.splits == folds.TEST].tolist()) == set(cases.case_ids[held].tolist())
    # A splits file may not name them; an unknown name is refused, the file untouched.
    splits = tmp_path / "s.json"
    folds.write_splits_final(str(splits), table, cases.names)
    assert "case_2" not in splits.read_text()
    before = _digest(slices)
    out = _cli("folds", slices, "--folds", "3", "--test", "case_99")
    assert out.exit_code == 2 and "--test case_99: " in out.output and "holds no such case" in out.output
    assert _digest(slices) == before
