"""Bad input, systematically (issue #11): property-based tests of the config loader
(``config.resolve``) and the HDF5 readers (``data.examine``, ``data.check_fit``,
``data.SliceReader``).

The property, for every generated input: the call succeeds, or it raises
``errors.InputError`` whose message is one printable, non-empty line naming the file
(data) or the field (config), and the same message when asked again, as every rank
asks. Never another exception type, never a hang (pytest-timeout), never a traceback
(the end-to-end test runs the real ``distseg-data info``).

Inputs are derandomized, so every run and every CI machine tries the same ones.
``DISTSEG_EXPLORE=1`` tries ten times as many fresh random ones, for hunting new bugs.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distseg.core import config, errors
from distseg.data import h5format
from distseg.data import slices as data

from proc_group import run_group
from support import BIN, command_env

EXPLORE = bool(os.environ.get("DISTSEG_EXPLORE"))
#: Inputs tried per property (x10 when exploring); the module runs in ~30 s on 2 cores.
CONFIG_EXAMPLES = 1500
DATA_EXAMPLES = 600
TIMEOUT = 1200 if EXPLORE else 120


def _settings(examples: int) -> settings:
    # No per-example deadline: timings on 2 shared cores are noisy, and a hang is what
    # the pytest-timeout of each test is for.
    return settings(max_examples=examples * (10 if EXPLORE else 1), deadline=None,
                    derandomize=not EXPLORE, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("bad-input")


_names = itertools.count()


def _one_line(err: errors.InputError, *, names: str = "") -> str:
    """The property's message half: one printable line that names ``names``."""
    msg = str(err)
    assert msg and msg == msg.strip() and msg.isprintable(), repr(msg)
    assert names in msg, (names, msg)
    return msg


def _refused_or(call, names: str):
    """``call()``'s result, or None when it raised a well-formed ``InputError``; a second
    call (another rank) must take the same decision with the same message."""
    try:
        result = call()
    except errors.InputError as e:
        msg = _one_line(e, names=names)
        with pytest.raises(errors.InputError) as again:
            call()
        assert str(again.value) == msg
        return None
    return result


# ---------------------------------------------------------------- config files and flags

SECTIONS = {"data": config.DataConfig, "model": config.ModelConfig, "train": config.TrainConfig}
FIELDS = [f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)]
KNOWN = {*FIELDS, *SECTIONS, "run_dir"}

# Text with control characters, lone surrogates and the rest of Unicode.
texts = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
huge = st.sampled_from([2 ** 63 - 1, 2 ** 63, -2 ** 63 - 1, 2 ** 64, 10 ** 400, -10 ** 400,
                        1e308, 5e-324, -0.0, math.nan, math.inf, -math.inf])
numbers = st.integers(-3, 300) | st.integers() | st.floats() | huge
words = st.sampled_from([*config.LOSSES, *config.LR_SCALINGS, *config.NORMS, *config.NONFINITE,
                         "x.h5", "runs/a", "", "false", "1e-3", "nan"])
scalars = st.none() | st.booleans() | numbers | words | texts
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(texts, kids, max_size=3), max_leaves=8)
#: Values of each field's own type, often valid, so that inputs also get past the type
#: checks to validate() and sometimes resolve.
TYPED = {bool: st.booleans(), int: st.integers(-2, 300), float: st.floats(-0.5, 2.0), str: words,
         tuple: st.lists(words, max_size=4),  # model.class_names: a list of names in JSON
         dict: st.dictionaries(texts, scalars, max_size=3)}  # model.args: a JSON object
FIELD_VALUES = {f"{s}.{f.name}": TYPED[type(getattr(cls(), f.name))]
                for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}


def _rarely(common, rare):
    """``common`` nine times in ten, else ``rare``."""
    return st.integers(0, 9).flatmap(lambda i: rare if i == 0 else common)


@st.composite
def field_values(draw, dotted: str):
    """A value for field ``dotted``: of its type mostly, anything sometimes."""
    typed = FIELD_VALUES.get(dotted)
    return draw(json_values if typed is None or draw(st.integers(0, 3)) == 0 else typed)


@st.composite
def config_docs(draw):
    """A JSON object shaped like a config file: mostly real sections and field names
    holding values of their type or any other, sometimes unknown keys or garbage where a
    section goes."""
    doc = {}
    for _ in range(draw(st.integers(0, 4))):
        key = draw(_rarely(st.sampled_from([*SECTIONS, "run_dir"]), texts))
        if key in SECTIONS and draw(st.integers(0, 4)):
            names = [f.name for f in dataclasses.fields(SECTIONS[key])]
            doc[key] = {}
            for _ in range(draw(st.integers(0, 4))):
                name = draw(_rarely(st.sampled_from(names), texts))
                doc[key][name] = draw(field_values(f"{key}.{name}"))
        else:
            doc[key] = draw(json_values)
    return doc


@st.composite
def config_files(draw):
    """(how, bytes) of a config file: garbage in well-formed JSON, or broken JSON."""
    how = draw(st.sampled_from(["json"] * 8 + ["not-a-mapping", "truncated", "not-utf8", "utf16",
                                               "bytes", "deep", "long-int", "empty"]))
    text = json.dumps(draw(config_docs()))  # NaN and Infinity as the tokens json reads back
    if how == "json":
        return how, text.encode()
    if how == "not-a-mapping":
        return how, json.dumps(draw(json_values.filter(lambda v: not isinstance(v, dict)))).encode()
    if how == "truncated":
        return how, text.encode()[:draw(st.integers(0, max(0, len(text) - 1)))]
    if how == "not-utf8":
        at = draw(st.integers(0, len(text)))
        bad = draw(st.sampled_from([b"\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\xfe\xff"]))
        return how, text.encode()[:at] + bad + text.encode()[at:]
    if how == "utf16":
        return how, text.encode("utf-16")
    if how == "bytes":
        return how, draw(st.binary(max_size=64))
    if how == "deep":
        depth = draw(st.integers(1, 5000))
        closed = draw(st.booleans())
        return how, ('{"train": {"loss": ' + "[" * depth + "]" * depth * closed + "}}").encode()
    if how == "long-int":
        section, name = draw(st.sampled_from(FIELDS)).split(".")
        digits = "9" * draw(st.integers(1, 6000))
        return how, f'{{"{section}": {{"{name}": {digits}}}}}'.encode()
    return how, b""


override_keys = (st.sampled_from(["", ".", "train.", ".lr", "train..lr", "train.lr.x",
                                    "model.depth.0", "nope", "train.\nlr"])
                 | texts)


@st.composite
def overrides(draw):
    """Command-line style ``{"train.lr": 0.1}`` overrides, keys sometimes malformed."""
    flags = {}
    for _ in range(draw(st.integers(0, 4))):
        key = draw(_rarely(st.sampled_from([*FIELDS, *SECTIONS, "run_dir"]), override_keys))
        flags[key] = draw(_rarely(field_values(key), huge | st.none()))
    return flags


presets = _rarely(st.sampled_from(list(config.PRESETS)), texts)
sources = _rarely(config_files(), st.sampled_from(["none", "none", "missing", "directory"]))


def _config_path(workdir, source) -> str | None:
    if source == "none":
        return None
    path = workdir / f"config-{next(_names)}.json"
    if source == "directory":
        path.mkdir()
    elif source != "missing":
        path.write_bytes(source[1])
    return str(path)


@pytest.mark.timeout(TIMEOUT)
@_settings(CONFIG_EXAMPLES)
@given(preset=presets, source=sources, flags=overrides())
def test_config_resolves_or_names_the_field(workdir, preset, source, flags):
    path = _config_path(workdir, source)
    flags = {"data.path": "x.h5", "run_dir": "r", **flags}
    try:
        cfg = config.resolve(preset, path, flags)
    except errors.InputError as e:
        msg = _one_line(e)
        event(f"refused: {' '.join(msg.split()[:2]) if msg.startswith('config') else 'preset'}")
        if msg.startswith("config field "):
            name = msg.split(" ")[2]
            assert name in KNOWN or " is unknown (known: " in msg, msg
        else:
            assert msg.startswith((f"config file {path}: ", "preset ")), msg
        with pytest.raises(errors.InputError) as again:
            config.resolve(preset, path, flags)
        assert str(again.value) == msg
        return
    event("resolved")
    # What resolves is what a run saves in RUN/config.json and reads back on --resume:
    # strict JSON (no NaN, no inf), and the same config again.
    saved = workdir / f"saved-{next(_names)}.json"
    saved.write_text(json.dumps(cfg.to_dict(), allow_nan=False))
    assert config.resolve("liver2d", str(saved)) == cfg


# ---------------------------------------------------------------- HDF5 data files

attr_values = st.one_of(
    st.integers(-2 ** 63, 2 ** 63 - 1), st.sampled_from([0, 1, 2, 3, -1, 2 ** 63 - 1]),
    st.floats(), st.sampled_from([math.nan, math.inf, -math.inf, 2.5]), st.booleans(),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8),
    st.binary(max_size=8).map(np.bytes_),
    st.binary(min_size=1, max_size=8).map(lambda b: ("not-utf8", b)),
    hnp.arrays(st.sampled_from(["i8", "f8", "u1"]),
               hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)),
    st.just(h5py.Empty("f")),
)
DTYPES = ["f8", "f4", "f2", "i2", "u1", "i8", "?", "c8", "S3", "vlen-str", "compound"]
DATASET_NAMES = [*data.REQUIRED, *data.REQUIRED]  # the required ones, mostly


def _array(dtype, shape) -> np.ndarray:
    if dtype == "compound":
        dtype = [("a", "i4"), ("b", "f4")]
    if dtype == "vlen-str" or np.dtype(dtype).kind == "O":
        return np.full(shape, "1", dtype=object)
    return np.ones(shape, dtype=dtype)


def _create(f: h5py.File, name: str, data: np.ndarray) -> None:
    f.create_dataset(name, data=data, dtype=h5py.string_dtype() if data.dtype.kind == "O" else None)


mutations = st.one_of(
    st.tuples(st.just("drop"), st.sampled_from(DATASET_NAMES)),
    st.tuples(st.sampled_from(["group", "soft-link", "external-link", "empty", "scalar"]),
              st.sampled_from(DATASET_NAMES)),
    st.tuples(st.just("dtype"), st.sampled_from(DATASET_NAMES), st.sampled_from(DTYPES)),
    st.tuples(st.just("shape"), st.sampled_from(DATASET_NAMES),
              st.lists(st.integers(0, 6), max_size=5).map(tuple)),
    st.tuples(st.just("label"), st.integers(0, 255)),
    st.tuples(st.sampled_from(["split", "case_id"]),
              st.lists(st.integers(0, 5), min_size=1, max_size=6)),
    st.tuples(st.just("attr"), st.sampled_from(["format_version", "num_classes", "format_version",
                                                "num_classes", "source", "class_names", "hu_window",
                                                "spacing", "other"]), attr_values),
    st.tuples(st.just("del-attr"), st.sampled_from(["format_version", "num_classes", "source"])),
)
hdf5_files = st.tuples(st.just("hdf5"), st.integers(1, 6), st.integers(1, 5),  # (N, S, changes)
                       st.lists(mutations, max_size=3))
data_files = st.one_of(
    hdf5_files, hdf5_files,
    st.tuples(st.just("bytes"), st.binary(max_size=2048)),
    st.tuples(st.just("truncated"), st.integers(0, 2 ** 20)),
    # bytes overwritten in the object header of a dataset or of the root group
    st.tuples(st.just("corrupt"), st.lists(st.tuples(st.sampled_from([*data.REQUIRED, "/"]),
                                                     st.integers(0, 299), st.integers(0, 255)),
                                           min_size=1, max_size=4)),
    st.tuples(st.sampled_from(["missing", "directory", "zero-length"])),
)


def _write_good(path: str, n: int, s: int) -> None:
    case_id = np.arange(n) // 2
    data.write_dataset(path, np.linspace(0, 1, n * s * s, dtype=np.float32).reshape(n, s, s),
                       (np.arange(n * s * s) % 3).reshape(n, s, s).astype(np.uint8), case_id,
                       (case_id % 3 == 2).astype(np.uint8), source="property test",
                       hu_window=h5format.HU_WINDOW)


def _mutate(f: h5py.File, change: tuple) -> None:
    what, *args = change
    if what in ("label", "split", "case_id"):
        dset = f.get("masks" if what == "label" else what)
        if (not isinstance(dset, h5py.Dataset) or not dset.ndim or not dset.size
                or dset.dtype.kind not in "iu"):
            return  # an earlier change left nothing to put numbers in
        if what == "label":
            dset[(0,) * dset.ndim] = args[0]
        elif dset.ndim == 1:
            dset[: len(args[0])] = args[0][: len(dset)]
    elif what == "attr":
        name, value = args
        if isinstance(value, tuple):  # bytes that are not UTF-8, declared UTF-8
            f.attrs.create(name, np.array(value[1], dtype=h5py.string_dtype("utf-8")))
        else:
            f.attrs[name] = value
    elif what == "del-attr":
        f.attrs.pop(args[0], None)
    else:
        name = args[0]
        old = f.get(name)
        if name in f:  # also a link to nothing, which f.pop() would leave
            del f[name]
        shape = old.shape if isinstance(old, h5py.Dataset) and old.shape is not None else (3,)
        dtype = old.dtype if isinstance(old, h5py.Dataset) else np.dtype("f4")
        if what == "group":
            f.create_group(name)
        elif what == "soft-link":
            f[name] = h5py.SoftLink("/nowhere")
        elif what == "external-link":
            f[name] = h5py.ExternalLink("missing.h5", "/x")
        elif what == "empty":
            f.create_dataset(name, data=h5py.Empty("f4" if dtype.kind == "O" else dtype))
        elif what == "scalar":
            _create(f, name, _array(dtype, ()))
        elif what == "dtype":
            _create(f, name, _array(args[1], shape))
        elif what == "shape":
            _create(f, name, _array(dtype, args[1]))


def _corrupt(path: str, flips) -> None:
    with h5py.File(path, "r") as f:
        headers = {name: h5py.h5o.get_info(f[name].id).addr for name in [*data.REQUIRED, "/"]}
    with open(path, "r+b") as fh:
        for name, offset, byte in flips:
            fh.seek(headers[name] + offset)
            fh.write(bytes([byte]))


def _data_path(workdir, spec) -> str:
    """Writes the file ``spec`` describes; returns its path."""
    path = str(workdir / f"data-{next(_names)}.h5")
    kind = spec[0]
    if kind == "hdf5":
        _, n, s, changes = spec
        _write_good(path, n, s)
        with h5py.File(path, "r+") as f:
            for change in changes:
                _mutate(f, change)
    elif kind == "bytes":
        with open(path, "wb") as fh:
            fh.write(spec[1])
    elif kind == "truncated":
        _write_good(path, 4, 4)
        os.truncate(path, spec[1] % os.path.getsize(path))
    elif kind == "corrupt":
        _write_good(path, 4, 4)
        _corrupt(path, spec[1])
    elif kind == "directory":
        os.mkdir(path)
    elif kind == "zero-length":
        open(path, "wb").close()
    return path


def _closed(path: str) -> None:
    """A reader that refused an HDF5 file left it closed: it opens for writing."""
    with h5py.File(path, "r+"):
        pass


@pytest.mark.timeout(TIMEOUT)
@_settings(DATA_EXAMPLES)
@given(spec=data_files, ranks=st.integers(1, 4), batch=st.integers(1, 4),
       image_size=st.sampled_from([0, None, 4, 8]), resize=st.booleans(),
       classes=st.sampled_from([None, 2, 3]),
       picks=st.lists(st.integers(0, 50), min_size=1, max_size=5))
def test_data_readers_succeed_or_name_the_file(workdir, spec, ranks, batch, image_size, resize,
                                               classes, picks):
    path = _data_path(workdir, spec)
    hdf5 = spec[0] == "hdf5"
    info = _refused_or(lambda: data.examine(path), path)
    event(f"{spec[0]}: inspect {'refused' if info is None else 'accepted'}")
    if info is None and hdf5:
        _closed(path)
    if info is not None:
        size = info.height if image_size is None else image_size
        _refused_or(lambda: data.check_fit(info, ranks=ranks, batch_size=batch, image_size=size,
                                           resize=resize, num_classes=classes), path)
    reader = _refused_or(lambda: data.SliceReader(path, image_size=image_size, resize=resize), path)
    if reader is None and hdf5:
        _closed(path)
    if hdf5:
        # A well-formed HDF5 file gets a message about what it holds, not "damaged".
        for call in (lambda: data.examine(path), lambda: data.SliceReader(path).close()):
            try:
                call()
            except errors.InputError as e:
                assert "damaged HDF5 file" not in str(e)
    if info is not None and image_size is None:
        assert reader is not None, "inspect accepted a file SliceReader refuses"
    if reader is None:
        return
    with reader, h5py.File(path, "r", locking=False) as f:
        ids = [p % f["images"].shape[0] for p in picks]
        got = _refused_or(lambda: reader.read(ids), path)
        if got is None:  # a damaged chunk index, which only reading finds
            assert spec[0] == "corrupt", "a file SliceReader opened could not be read"
            return
        images, masks = got
        event(f"{spec[0]}: slices read")
        side = image_size if image_size else reader.height
        assert images.dtype == np.float32 and images.shape == (len(ids), side, side, 1)
        assert masks.dtype == np.uint8 and masks.shape == (len(ids), side, side)
        if (reader.height, reader.width) == (side, side):
            want = np.stack([f["images"][i] for i in ids]).astype(np.float32)
            assert np.array_equal(images, want, equal_nan=True)
            assert np.array_equal(masks, np.stack([f["masks"][i] for i in ids]))


# ---------------------------------------------------------------- distseg-data info, end to end

END_TO_END = [
    ("zero-length",),
    ("bytes", b"\x89HDF\r\n\x1a\n" + bytes(range(256))),
    ("truncated", 1500),
    ("corrupt", [("masks", 40, 255), ("masks", 41, 255)]),
    ("hdf5", 4, 4, [("group", "images")]),
    ("hdf5", 4, 4, [("attr", "num_classes", math.nan)]),
    ("hdf5", 4, 4, [("attr", "format_version", np.zeros((3, 3)))]),
    ("hdf5", 4, 4, [("shape", "images", (4, 0, 0, 1)), ("shape", "masks", (4, 0, 0))]),
    ("hdf5", 4, 4, [("dtype", "split", "compound")]),
]


@pytest.mark.timeout(TIMEOUT)
@pytest.mark.parametrize("spec", END_TO_END, ids=[
    "zero-length", "random-bytes", "truncated", "corrupt-header", "group-for-images",
    "nan-num-classes", "array-format-version", "zero-size-slices", "compound-split"])
def test_distseg_data_info_exits_2_with_one_error_line(workdir, spec):
    path = _data_path(workdir, spec)
    with pytest.raises(errors.InputError) as err:
        data.examine(path)
    out = run_group([os.path.join(BIN, "distseg-data"), "info", path], env=command_env(),
                    timeout=60)
    assert out.returncode == 2, out
    assert out.stdout == ""
    assert out.stderr.splitlines() == [f"error: {err.value}"], out.stderr
