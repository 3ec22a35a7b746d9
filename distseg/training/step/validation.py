"""Validation: each rank scores its share of the validation set, and one allreduce of
the packed scores gives the loss of the whole set and its hard Dice.

Slices (2D) are scored in batches with the eval step; volumes (3D) whole, by the
sliding-window inferer, each rank taking cases balanced by voxels. Both add up the same
two things, the loss sums (``losses.sums_width``) and the hard-Dice counts
(``metrics``), so the loss and Dice of the whole set are exact at any rank count. Both
also give the Dice of each validation case (``Scores.cases``), each case from one rank.

No Horovod here: ``rank`` and ``size`` come in as ints, and the caller runs the
allreduce of ``Scores.packed``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from distseg import losses, metrics, sliding
from distseg.core import config as config_lib
from distseg.data import feeds, sharding
from distseg.parallel import agreement


@dataclass
class Scores:
    """One rank's share of a validation pass."""

    sums: np.ndarray
    """``losses.loss_sums`` of this rank's samples (slices or whole volumes), added up:
    summed over ranks they give the loss of the whole validation set."""
    samples: int
    counts: np.ndarray
    """Hard-Dice counts (3, classes): intersection, predicted, true voxels."""
    cases: dict = field(default_factory=dict)
    """Case id -> per-class Dice of that whole case (3D: its volume; 2D: all its
    validation slices), for the cases this rank owns: each case is owned by one rank."""

    @classmethod
    def empty(cls, num_classes: int) -> "Scores":
        return cls(np.zeros(losses.sums_width(num_classes)), 0, np.zeros((3, num_classes)))

    def packed(self, failed: bool) -> np.ndarray:
        """[samples, failed, counts, sums]: what the ranks sum in one allreduce."""
        return np.concatenate([[self.samples, failed], self.counts.ravel(), self.sums])


@dataclass(frozen=True)
class Totals:
    """The sum over ranks of every rank's ``Scores.packed``."""

    samples: int
    failed: bool
    """True when any rank failed to score its share."""
    counts: np.ndarray
    sums: np.ndarray

    @classmethod
    def unpack(cls, total: np.ndarray, num_classes: int) -> "Totals":
        end = 2 + 3 * num_classes
        return cls(int(total[0]), bool(total[1] > 0),
                   np.asarray(total[2:end]).reshape(3, num_classes), np.asarray(total[end:]))


def score(cfg: config_lib.Config, feed: feeds.Feed, reader, eval_step: Callable,
          predict: Callable, rank: int, size: int) -> Scores:
    """This rank's scores: slices in batches of the eval step, or whole volumes."""
    if isinstance(feed, feeds.VolumeFeed):
        return score_volumes(cfg, feed, reader, predict, rank, size)
    return score_slices(cfg, feed, reader, eval_step, rank, size)


def shard_scores(cfg: config_lib.Config, feed: feeds.Feed, reader, eval_step: Callable,
                 predict: Callable, rank: int, size: int) -> tuple[Scores, tuple | None]:
    """``score``, and this rank's failure (``agreement.failure_of``; None: none) for the
    caller to share in the allreduce of the scores, with empty scores in its place."""
    try:
        return score(cfg, feed, reader, eval_step, predict, rank, size), None
    except Exception as e:  # noqa: BLE001 - shared in the allreduce of the scores
        return Scores.empty(cfg.model.num_classes), agreement.failure_of(e)


def score_slices(cfg: config_lib.Config, feed: feeds.SliceFeed, reader, eval_step: Callable,
                 rank: int, size: int) -> Scores:
    """This rank's contiguous share of the validation slices (``sharding.shard_eval``),
    and the Dice of each case whose first validation slice is in that share: where such
    a case runs on into the next ranks' shares, its slices there are scored here too,
    for the case's Dice only (the totals count every slice once)."""
    info = feed.info
    batches = sharding.shard_eval(info.val_indices, rank, size, cfg.train.batch_size)
    out = Scores.empty(cfg.model.num_classes)
    per_case: dict[int, np.ndarray] = {}
    for ids in batches:
        sums, counts = _evaluate(eval_step, reader, ids)
        out.sums += sums
        out.samples += len(ids)
        out.counts += counts.sum(axis=0)
        add_case_counts(per_case, info.case_ids[ids], counts)
    shard = np.concatenate(batches) if batches else np.empty(0, np.int64)
    owned = owned_cases(info.val_indices, info.case_ids, shard)
    for ids in rest_of_cases(info.val_indices, info.case_ids, shard, owned,
                             cfg.train.batch_size):
        add_case_counts(per_case, info.case_ids[ids], _evaluate(eval_step, reader, ids)[1])
    out.cases = {str(int(case)): metrics.dice_from_counts(per_case[int(case)])
                 for case in owned}
    return out


def _evaluate(eval_step: Callable, reader, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eval step on slices ``ids``: loss sums, and each slice's Dice counts."""
    images, masks = reader.read(ids)
    result = eval_step(images, masks)
    return np.asarray(result.sums, np.float64), np.asarray(result.counts, np.float64)


def add_case_counts(per_case: dict[int, np.ndarray], case_ids: np.ndarray,
                    counts: np.ndarray) -> None:
    """Adds each sample's Dice counts (samples, 3, classes) to its case's in
    ``per_case`` (case id -> (3, classes))."""
    case_ids = np.asarray(case_ids)
    for case in np.unique(case_ids):
        part = counts[case_ids == case].sum(axis=0)
        per_case[int(case)] = per_case.get(int(case), 0) + part


def owned_cases(val_ids: np.ndarray, case_ids: np.ndarray, shard: np.ndarray) -> np.ndarray:
    """The cases whose first validation slice (in ``val_ids`` order) is in ``shard``:
    the cases this rank logs, so every case is logged by one rank."""
    cases = np.asarray(case_ids)[np.asarray(val_ids, np.int64)]
    _, first = np.unique(cases, return_index=True)
    starts = np.asarray(val_ids, np.int64)[first]
    return np.sort(cases[first][np.isin(starts, shard)])


def rest_of_cases(val_ids: np.ndarray, case_ids: np.ndarray, shard: np.ndarray,
                  owned: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """Batches of the validation slices of the ``owned`` cases outside ``shard`` (other
    ranks score them for the totals; this rank needs them for the case's Dice)."""
    val_ids = np.asarray(val_ids, np.int64)
    rest = val_ids[np.isin(np.asarray(case_ids)[val_ids], owned) & ~np.isin(val_ids, shard)]
    return [rest[i:i + batch_size] for i in range(0, len(rest), batch_size)]


def score_volumes(cfg: config_lib.Config, feed: feeds.VolumeFeed, reader, predict: Callable,
                  rank: int, size: int) -> Scores:
    """This rank's validation volumes (balanced by voxels), each predicted whole by
    sliding windows of the training slab."""
    info = feed.info
    num_classes = cfg.model.num_classes
    out = Scores.empty(num_classes)
    cases = info.val_cases
    for k in sliding.shard_cases(cases, rank, size, voxels=info.shapes[cases].prod(1)):
        image, mask = reader.read_case(int(k))
        probs = sliding.sliding_window(predict, image, feed.input_shape,
                                       overlap=cfg.data.val_overlap, batch=cfg.train.batch_size)
        counts = metrics.volume_dice_counts(probs, mask, num_classes)
        out.sums += losses.volume_loss_sums(probs, mask, num_classes)
        out.samples += 1
        out.counts += counts
        out.cases[str(int(info.case_ids[k]))] = metrics.dice_from_counts(counts)
    return out


def record(mine: Scores, totals: Totals, class_names: Sequence[str], kind: str) -> dict:
    """The validation fields of an ``epoch`` record: the whole set's loss and Dice, and
    this rank's share of them."""
    num_classes = len(class_names)
    n = mine.samples
    local_dice = metrics.dice_from_counts(mine.counts) if n else [None] * num_classes
    cases = {"val_cases_local": {case: dict(zip(class_names, dice))
                                 for case, dice in mine.cases.items()}} if mine.cases else {}
    return {
        # The loss of the whole validation set (its Dice sums over every rank's samples).
        "val_loss": (float(losses.loss_from_sums(totals.sums, num_classes, kind))
                     if totals.samples else None),
        "val_loss_local": float(losses.loss_from_sums(mine.sums, num_classes, kind)) if n else None,
        "val_samples_local": n,
        "val_samples": totals.samples,
        "val_dice": dict(zip(class_names, metrics.dice_from_counts(totals.counts))),
        "val_dice_local": dict(zip(class_names, local_dice)),
        **cases,
    }
