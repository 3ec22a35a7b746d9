"""The per-rank run-log schema: the one place that says what a log line holds.

Every rank of a run writes ``RUN/logs/rank-NNNNN.jsonl`` (named by
``distseg.core.rundir``): one JSON object per line, flushed per line, so a killed job leaves at most one truncated last line. Each object
says what it is in its ``type`` field. This module is plain Python (no TensorFlow, no
Horovod) so that ``analysis`` can import it to read logs.

Record types and their fields (``FIELDS``); every record also carries ``type``,
``rank`` and ``time`` (Unix seconds on this rank's clock). Readers must ignore fields
they do not know, and producers may add fields freely; only removing or renaming a
field needs a new ``SCHEMA_VERSION``. Schema 3 renamed the fields whose names meant two
things (``RENAMED``, ``RENAMED_NOISE_SCALE``); every reader sees schema 3's names,
whatever the log's version (``upgrade``, applied by ``parse_line``).

``run``   once, at start (and again after each resume):
    schema_version, rank, size, local_rank, local_size, host, pid, run_id (shared by the
    ranks), start_time (Unix seconds, rank 0's clock, agreed by broadcast), versions
    (python, tensorflow, keras, horovod, mpi, numpy, h5py), controller (mpi|gloo|none),
    threads {intra_op, inter_op, cores, pinned, affinity}, horovod_env (HOROVOD_* settings in force),
    config_hash (sha256 of the resolved config without run_dir, first 16 hex digits), model {name,
    params, hyper-parameters}, dataset {path, samples, train_samples, val_samples,
    image_size, ...}, global_seed, steps_per_epoch, batch_size (per rank),
    global_batch_size, batch_plan (``config.BatchPlan.kind``: ``global``, a fixed global
    batch split over the ranks; ``grown``, a fixed one grown past the ranks;
    ``per_rank``; ``chosen``, a per-rank batch the ``goodput`` policy chose; schema 1-2:
    batch_policy), loss_scope
    (``global_batch``: since schema 2 ``loss`` is the loss of the whole global batch),
    lr_base, lr_scaled (with lr_scaling ``gain``: the most it can reach), lr_scaling,
    lr_schedule (``constant``, ``cosine`` or ``poly`` after the warm-up), lr_find
    (``--lr auto``'s range test: lr, raw, why, steps, lrs, losses, smoothed, seconds),
    warmup_steps, epochs, voxels_per_sample (a
    sample's voxels: a slice's or a 3D slab's, so voxels/s = samples/s x this; the model
    record holds its input_shape), onednn (TensorFlow's oneDNN kernels on or off),
    link (2 or more ranks; null on one): {bandwidth_gbps, latency_us, ranks, bytes,
    seconds, model, local} fitted to allreduces timed at the start
    (``distseg.core.link``; local: every rank on one host), precision {requested
    (auto, float32 or bfloat16), choice; under auto also flags (the CPU's bfloat16
    flags), seconds {float32, bfloat16} (the slowest rank's median step in the trial;
    null: no trial), speedup, steps, trial_s, reason} (``distseg.training.startup.precision``),
    augment (``data.augment``: none, light or default; ``distseg.data.augment``),
    compression_decision {requested (auto, none or fp16), choice (none or fp16); under
    auto also reason, decision_s, and either ranks and one_host (exact without a
    prediction) or the prediction's inputs and outputs: bandwidth_gbps, latency_us,
    ranks, params, gradient_bytes {none, fp16}, measured_step_s, step_source,
    compute_s, allreduce_s {none, fp16}, step_s {none, fp16}, samples_per_step,
    samples_per_s {none, fp16}, speedup, threshold, gamma} (``distseg.core.link``,
    ``distseg.training.startup.compression``).
``step``  each training step:
    epoch, step (within the epoch), global_step, t (seconds since the agreed start),
    step_time (seconds for the whole step on this rank), data_wait (seconds of that
    spent waiting for input), loss (the loss of the whole global batch, the same on
    every rank; schema 1: the mean of the ranks' own losses), loss_local (this rank's
    batch), lr, samples (this rank's batch size), grad_sq [mean over ranks of
    |g_rank|^2, |g_averaged|^2, the same two preconditioned by Adam] (the gradient
    noise scale's two batch sizes; only on the steps that measure it,
    ``--noise-every``).
``epoch`` each finished epoch:
    epoch, t, epoch_time (training and validation), train_time (training only, with the
    epoch-end BatchNorm averaging and weight check), steps, samples (this rank's
    count), sample_digest (order-independent
    digest of the sample ids this rank saw, see ``sample_digest``), train_loss (mean
    over ranks), train_loss_local, val_loss, val_loss_local, val_dice {class: dice}
    (global, from counts summed over ranks), val_dice_local {class: dice or null},
    val_samples (all ranks), val_samples_local, weight_checksum [sum, sum of squares],
    noise_scale {b_simple, g2, tr_sigma (tr(Sigma), the per-sample gradient covariance's
    trace; Adam-preconditioned), b_simple_low, b_simple_high (b_simple's 90 %
    confidence interval; both null with fewer than 3 effective steps or after resuming
    a checkpoint from before 2026-11-28, b_simple_high alone null where it has no upper
    bound), effective_steps (the measured steps the averages are worth), b_simple_raw,
    g2_raw, tr_sigma_raw, small_batch, big_batch, base_batch, method, ema,
    preconditioned, cadence {every, auto, decision}} (``distseg.training.progress.noise``;
    schema 1-2: trace, trace_raw), lr_rule {rule, lr, gain, progress, global_batch,
    base_batch} (the lr rule in force and AdaScale's gain), under ``--batch-policy
    goodput`` goodput {policy, per_rank (this epoch's), options, step_time_model
    {alpha, beta}, measured_step_time {per-rank batch: s}, goodput {per-rank batch:
    predicted}, next_per_rank, switched, reason} (the goodput policy's measurements and
    choice, ``distseg.training.progress.batchpolicy``; schema 1-2: batch_policy);
    rank 0 of each launch's second epoch on 2 or more ranks comm {steps, file,
    gradient_s, gradient_wait_s, small_s, small_wait_s, gradient_ops, small_ops} or
    {steps, file, error}: medians from Horovod's timeline of its first steps
    (``distseg.core.timeline``);
    under ``--precise-bn`` precise_bn {steps, seconds}: the steps whose batch statistics
    replaced BatchNorm's moving ones before validation, and what that took
    (``distseg.training.epoch.precisebn``);
    since schema 2 val_loss is the loss
    of the whole validation set (its Dice sums over every sample) and train_loss the
    mean of the steps' global-batch losses;
    val_cases_local {case id: {class: dice}}: the Dice of each validation case this
    rank owns (3D: the whole volumes it validated, val_samples then counting volumes;
    2D: every validation slice of the cases whose first slice is in its share).
``end``   once, at the end, whatever happened:
    status (``ok``, ``error`` or ``interrupted``), reason (one line), t, epochs_done.
``resume`` once per resumed launch, before its ``run`` record (``--resume``):
    from_epoch and from_step (where this launch continues), global_step, checkpoint
    (the manifest it loaded), size_before (ranks that wrote it), size, warnings
    (damaged checkpoints skipped, steps redone). An elastic run writes one each time
    its ranks re-form (a rank lost, hosts changed), with checkpoint null, from_step 0
    (it continues from the state committed after the last epoch) and elastic (why,
    e.g. "lost 1 rank(s)").

``stalled`` when this rank has waited ``hang_timeout`` s in a collective: t, waited
    (seconds), where; an ``end`` record naming the ranks that stopped answering follows.

Also, when a step's update was skipped on every rank (``--on-nonfinite skip``): the
``step`` record has ``skipped: true`` and the ``epoch`` record counts ``skipped_steps``.

Reading a line (``parse_line``: the one rule of every reader, ``read_log``, the report's
``analysis.logfile`` and ``distseg-jobs outcome``). A line holds a record when it parses
as a JSON object whose ``type`` is a string; a blank line is skipped silently. Every
record read is ``upgrade``d: a field schema 3 renamed is read by its new name. A line
that does not parse is damaged, and what it was depends on where it is:

* the last line of the file, without its newline: a truncated write (the job was killed
  mid-write, or is still writing). It is skipped with a note (``TRUNCATED``), never
  repaired, and it is still the file's last line: a log that ends in one does not end
  in a record.
* any other line: when a whole record starts later on it, that record is kept with a
  note (``SALVAGED``): a run resumed after a kill appends to the line the kill cut off.
  Otherwise (and for a line that parses but is no record) it is skipped with a note
  (``DAMAGED``).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from typing import Any, Iterable, Iterator, Mapping, NamedTuple

import numpy as np

from distseg.core.errors import InputError

SCHEMA_VERSION = 3

#: Values of a data file's ``split`` dataset (``distseg.data``).
SPLITS = {"train": 0, "val": 1, "test": 2}

COMMON = ("type", "rank", "time")

#: Required fields of each record type (besides ``COMMON``). Extra fields are allowed.
FIELDS: dict[str, tuple[str, ...]] = {
    "run": (
        "schema_version", "size", "local_rank", "local_size", "host", "run_id",
        "start_time", "versions", "controller", "threads", "config_hash", "dataset",
        "global_seed", "steps_per_epoch", "batch_size", "global_batch_size",
    ),
    "step": (
        "epoch", "step", "global_step", "t", "step_time", "data_wait", "loss",
        "loss_local", "lr", "samples",
    ),
    "epoch": (
        "epoch", "t", "epoch_time", "samples", "sample_digest", "train_loss",
        "val_loss", "val_dice", "val_dice_local",
    ),
    "end": ("status", "reason", "t", "epochs_done"),
    "resume": ("from_epoch", "from_step", "global_step", "checkpoint", "size_before", "size"),
    "stalled": ("t", "waited", "where"),
}

#: Fields the trainer also writes, documented above, that readers may rely on when
#: present (older logs or other producers may lack them).
OPTIONAL: dict[str, tuple[str, ...]] = {
    "run": ("pid", "model", "horovod_env", "lr_base", "lr_scaled",
            "warmup_steps", "epochs", "voxels_per_sample", "onednn", "batch_plan",
            "loss_scope", "lr_scaling", "link", "precision", "augment", "lr_schedule",
            "lr_find", "compression_decision"),
    "step": ("skipped", "grad_sq"),
    "epoch": ("train_time", "steps", "train_loss_local", "val_loss_local",
              "val_samples_local", "val_samples", "weight_checksum", "skipped_steps",
              "val_cases_local", "noise_scale", "lr_rule", "goodput", "comm", "precise_bn"),
    "end": (),
    "resume": ("warnings", "elastic"),
    "stalled": (),
}

END_STATUSES = ("ok", "error", "interrupted")

#: Fields schema 3 renamed, by record type (old name -> new name): ``batch_policy`` was
#: the batch plan's kind in a ``run`` record and the goodput policy's dict in an
#: ``epoch`` record.
RENAMED: dict[str, dict[str, str]] = {
    "run": {"batch_policy": "batch_plan"},
    "epoch": {"batch_policy": "goodput"},
}
#: Fields schema 3 renamed inside an ``epoch`` record's ``noise_scale``: tr(Sigma).
RENAMED_NOISE_SCALE: dict[str, str] = {"trace": "tr_sigma", "trace_raw": "tr_sigma_raw"}

_MASK64 = (1 << 64) - 1


def steps_per_epoch(train_samples: int, ranks: int, batch_size: int, global_batch: int = 0) -> int:
    """Steps every rank runs per epoch (see ``distseg.data.sharding.shard_batches``).

    With a fixed ``global_batch`` G (``--global-batch``): floor(n / G) steps of G
    samples each, whatever the number of ranks. Otherwise each rank's shard of
    ``train_samples`` (at most ceil(n / ranks) samples; floor(n / ranks) with batch size
    1) in batches of at most ``batch_size``."""
    if global_batch:
        return train_samples // global_batch
    per_rank = train_samples // ranks if batch_size == 1 else math.ceil(train_samples / ranks)
    return math.ceil(per_rank / batch_size)


def epoch_samples(train_samples: int, ranks: int, batch_size: int, global_batch: int = 0) -> int:
    """Samples one full epoch trains on, all ranks together: all of them, except the
    last ``n % G`` of each epoch's permutation with a fixed global batch G, and the last
    ``n % ranks`` with a per-rank batch of 1 (a new random few each epoch)."""
    if global_batch:
        return train_samples - train_samples % global_batch
    if batch_size == 1:
        return train_samples - train_samples % ranks
    return train_samples


def mix64(ids: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser on a uint64 array (arithmetic modulo 2**64): spreads ids
    so that sums of them rarely collide."""
    with np.errstate(over="ignore"):
        x = np.asarray(ids, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def sample_digest(ids: Iterable[int]) -> str:
    """Order-independent digest of a multiset of (non-negative) sample ids, as 16 hex
    digits.

    The digest is the sum, modulo 2**64, of a 64-bit mix of each id. Because it is a
    sum, digests combine: the digests of disjoint shards add up (``combine_digests``)
    to the digest of their union, which is how ``analysis`` checks that the ranks'
    shards covered the dataset exactly once.
    """
    if not hasattr(ids, "__len__"):
        ids = list(ids)
    total = mix64(np.asarray(ids, dtype=np.int64).ravel()).sum(dtype=np.uint64)
    return f"{int(total):016x}"


def combine_digests(digests: Iterable[str]) -> str:
    """Digest of the union of disjoint id multisets, from their digests."""
    total = 0
    for d in digests:
        total = (total + int(d, 16)) & _MASK64
    return f"{total:016x}"


def config_hash(config: Mapping[str, Any]) -> str:
    """Stable hash of a JSON-able config (key order does not matter).

    ``run_dir`` is left out: the same training at 1 and 16 ranks, written to two run
    directories, has the same hash.
    """
    config = {k: v for k, v in config.items() if k != "run_dir"}
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class RecordError(InputError):
    """A log record that breaks the schema (``validate_record``); the message says how."""


class UnknownRecordType(RecordError):
    """The record's ``type`` is none of ``FIELDS``."""


class MissingFields(RecordError):
    """The record lacks required fields (``COMMON`` or ``FIELDS[type]``)."""


class UnknownStatus(RecordError):
    """An ``end`` record whose ``status`` is none of ``END_STATUSES``."""


def validate_record(record: Mapping[str, Any]) -> None:
    """Raises a ``RecordError`` naming the first problem of a parsed log record: the
    subclass says which (``UnknownRecordType``, ``MissingFields``, ``UnknownStatus``)."""
    kind = record.get("type")
    if kind not in FIELDS:
        raise UnknownRecordType(f"record type {kind!r} is not one of {sorted(FIELDS)}")
    missing = [f for f in COMMON + FIELDS[kind] if f not in record]
    if missing:
        raise MissingFields(f"{kind} record lacks field(s) {', '.join(missing)}")
    if kind == "end" and record["status"] not in END_STATUSES:
        raise UnknownStatus(f"end record status {record['status']!r} is not one of {END_STATUSES}")


#: ``LogLine.damage`` of a line that is not one whole record (see the module docstring).
TRUNCATED, SALVAGED, DAMAGED = "truncated", "salvaged", "damaged"
_RECORD_START = re.compile(rb'\{\s*"type"\s*:')


class LogLine(NamedTuple):
    """One line of a log as ``parse_line`` reads it.

    Attributes:
      record: the record the line yields (``None``: the line is skipped).
      damage: ``""`` for a whole record or a blank line, else ``TRUNCATED``,
        ``SALVAGED`` or ``DAMAGED``.
      size: the line's length in bytes, as given.
    """

    record: dict | None
    damage: str = ""
    size: int = 0

    @property
    def problem(self) -> str:
        """What the line's damage means to a reader, for a note (``""``: none)."""
        return {"": "",
                TRUNCATED: f"truncated last line ({self.size} bytes; job killed or still running)",
                SALVAGED: "a truncated record followed by another on the same line (resumed "
                          "after a kill); kept the latter",
                DAMAGED: "not a log record (not a valid JSON object with a type)"}[self.damage]


def _renamed(fields: dict, names: Mapping[str, str]) -> dict:
    """``fields`` with each old name of ``names`` it holds renamed, in their order (an old
    name whose new one is there too is left as it is); ``fields`` itself when none is."""
    if not any(old in fields and new not in fields for old, new in names.items()):
        return fields
    return {(names[k] if k in names and names[k] not in fields else k): v
            for k, v in fields.items()}


def upgrade_noise_scale(noise: dict) -> dict:
    """An ``epoch`` record's ``noise_scale`` by schema 3's names (``RENAMED_NOISE_SCALE``)."""
    return _renamed(noise, RENAMED_NOISE_SCALE)


def upgrade(record: dict) -> dict:
    """``record`` by schema 3's names: the fields schema 1 and 2 named otherwise
    (``RENAMED``, ``RENAMED_NOISE_SCALE``) renamed, nothing else changed.

    Only a ``run`` record says its ``schema_version``, so the old names decide: schema 3
    writes none of them. Returns a new dict when a field is renamed (``record`` itself
    otherwise); upgrading twice changes nothing more.
    """
    out = _renamed(record, RENAMED.get(record.get("type"), {}))
    noise = out.get("noise_scale") if out.get("type") == "epoch" else None
    if isinstance(noise, dict):
        renamed = upgrade_noise_scale(noise)
        if renamed is not noise:
            out = {**out, "noise_scale": renamed}
    return out


def _is_record(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("type"), str)


def _salvage(raw: bytes) -> dict | None:
    """The first whole record that starts after the beginning of ``raw`` (``None``: none)."""
    for m in _RECORD_START.finditer(raw, 1):
        try:
            rec = json.loads(raw[m.start():])
        except ValueError:
            continue
        if _is_record(rec):
            return upgrade(rec)
    return None


def parse_line(raw: bytes, terminated: bool = True) -> LogLine:
    """Reads one line of a log by the one rule of the module docstring.

    Args:
      raw: the line's bytes (its newline may be included).
      terminated: whether a newline ended the line; ``False`` only for the last line
        of a file that does not end in one.
    """
    if not raw.strip():
        return LogLine(None)
    try:
        rec = json.loads(raw)
    except ValueError:
        if not terminated:
            return LogLine(None, TRUNCATED, len(raw))
        rec = _salvage(raw)
        return LogLine(rec, SALVAGED if rec is not None else DAMAGED, len(raw))
    if not _is_record(rec):
        return LogLine(None, DAMAGED, len(raw))
    return LogLine(upgrade(rec), "", len(raw))


def parse_lines(data: bytes) -> Iterator[tuple[int, LogLine]]:
    """``(line number from 1, parse_line)`` of every line of a log's bytes."""
    lines = data.split(b"\n")
    for i, raw in enumerate(lines):
        yield i + 1, parse_line(raw, terminated=i < len(lines) - 1)


def last_line(data: bytes) -> LogLine:
    """The last non-blank line of a log's bytes (or of its last bytes), by
    ``parse_line``; ``LogLine(None)`` when there is none.

    A truncated last line is returned as such, not passed over: what came before it
    (an earlier launch's ``end`` record, say) is not how the log ends.
    """
    lines = data.split(b"\n")
    for i in range(len(lines) - 1, -1, -1):
        if lines[i].strip():
            return parse_line(lines[i], terminated=i < len(lines) - 1)
    return LogLine(None)


def read_log(path: str) -> tuple[list[dict], list[str]]:
    """Parses one rank's log by ``parse_line``.

    Returns:
      The records, and one message per line skipped or salvaged, as
      ``"PATH:LINE: problem"`` (a job killed mid-write leaves a truncated last line;
      that is expected, not fatal).
    """
    with open(path, "rb") as f:
        data = f.read()
    records, problems = [], []
    for lineno, line in parse_lines(data):
        if line.record is not None:
            records.append(line.record)
        if line.damage:
            problems.append(f"{path}:{lineno}: {line.problem}")
    return records, problems


def parse_node_counts(text: str, option: str = "--nodes") -> tuple[int, ...]:
    """``"1,2,4,8"`` -> (1, 2, 4, 8): positive, distinct, in the order given.

    The one parser of node lists, for ``distseg-jobs sweep --nodes`` and
    ``distseg-report --project-nodes``. A repeated count is refused in both: two
    sweep runs would share a run directory, and a projection would print a row twice.
    Raises ``InputError`` naming ``option``.
    """
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        raise InputError(f"{option} {text!r}: expected node counts like 1,2,4,8")
    nodes = tuple(int(p) for p in parts)
    if min(nodes) < 1:
        raise InputError(f"{option} {text!r}: node counts must be >= 1")
    if len(set(nodes)) != len(nodes):
        raise InputError(f"{option} {text!r}: a node count appears twice")
    return nodes
