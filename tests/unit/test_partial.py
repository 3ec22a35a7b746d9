"""``distseg.core.partial``: a file appears under its name whole or not at all."""

from __future__ import annotations

import os

import pytest

from distseg.core.partial import SUFFIX, PartialFile


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_finish_renames_the_partial_file_into_place(tmp_path):
    out = str(tmp_path / "out.h5")
    part = PartialFile(out)
    assert part.partial == out + SUFFIX == out + ".partial"
    _write(part.partial, b"x" * 1000)
    assert not os.path.exists(out)  # nothing under the name before finish
    part.finish()
    assert _read(out) == b"x" * 1000
    assert os.listdir(tmp_path) == ["out.h5"]


def test_finish_replaces_an_existing_file_and_abort_leaves_it(tmp_path):
    out = str(tmp_path / "out.json")
    _write(out, b"old")
    aborted = PartialFile(out, str(tmp_path / "out.tmp.json"))
    _write(aborted.partial, b"new but cut short")
    aborted.abort()
    assert _read(out) == b"old" and os.listdir(tmp_path) == ["out.json"]
    replaced = PartialFile(out)
    _write(replaced.partial, b"new")
    replaced.finish()
    assert _read(out) == b"new" and os.listdir(tmp_path) == ["out.json"]


def test_the_context_manager_finishes_a_block_that_succeeds(tmp_path):
    out = str(tmp_path / "a.txt")
    with PartialFile(out) as part:
        _write(part.partial, b"12345")
    assert part.finished and _read(out) == b"12345"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_the_context_manager_aborts_a_block_that_raises(tmp_path):
    out = str(tmp_path / "a.txt")
    _write(out, b"previous")
    with pytest.raises(OSError, match="disk full"):
        with PartialFile(out) as part:
            _write(part.partial, b"half")
            raise OSError(28, "disk full")
    assert not part.finished
    assert _read(out) == b"previous" and os.listdir(tmp_path) == ["a.txt"]


def test_a_failed_rename_aborts_too(tmp_path):
    out = str(tmp_path / "missing-dir" / "a.txt")  # the rename's target folder is absent
    partial = str(tmp_path / "a.txt.partial")
    with pytest.raises(FileNotFoundError):
        with PartialFile(out, partial):
            _write(partial, b"data")
    assert os.listdir(tmp_path) == []


def test_abort_empties_the_file_before_release_and_ignores_its_errors(tmp_path):
    out = str(tmp_path / "v.h5")
    part = PartialFile(out)
    _write(part.partial, b"y" * 4096)
    sizes = []

    def release():  # a writer's close: a library that still holds the file open
        sizes.append(os.path.getsize(part.partial))
        raise RuntimeError("close failed as well")

    part.abort(release)
    assert sizes == [0]  # its last flush lands in an empty file, not a full disk
    assert os.listdir(tmp_path) == []


def test_abort_without_a_partial_file_and_after_finish_does_nothing(tmp_path):
    out = str(tmp_path / "b.bin")
    PartialFile(out).abort()  # the writer failed before creating it
    assert os.listdir(tmp_path) == []
    part = PartialFile(out)
    _write(part.partial, b"whole")
    part.finish()
    part.abort(lambda: pytest.fail("released after finish"))
    assert _read(out) == b"whole" and os.listdir(tmp_path) == ["b.bin"]
