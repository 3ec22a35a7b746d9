"""distseg's input pipeline alone: the reader and prefetcher with no training behind.

Feeds ``distseg.data.prefetch.Prefetcher`` the same batches a one-rank run reads
(``shard_batches`` of the training split, every epoch) and drains it as fast as it
delivers, so the samples/s printed is what the pipeline could supply. Training
consumes far fewer; the ratio says how much room the pipeline has (the share of step
time spent waiting for data, read from the training logs, says whether it kept up).

    python -m benchlib.pipeline --data data/liver117.h5 --epochs 4
"""

from __future__ import annotations

import json
import time

from benchlib.args import workload_parser


def pipeline_samples_per_s(path: str, image_size: int, batch_size: int, epochs: int,
                           seed: int = 0, depth: int = 2) -> dict:
    """Samples/s of the reader and prefetcher over ``epochs`` one-rank epochs."""
    from distseg.data import prefetch, sharding
    from distseg.data import slices as data
    info = data.examine(path, check_labels=False)
    batches = [ids for e in range(epochs)
               for ids in sharding.shard_batches(info.train_indices, 0, 1, batch_size, e, seed)]
    with data.SliceReader(path, image_size) as reader:
        feed = prefetch.Prefetcher(reader, batches, depth=depth)
        start = time.perf_counter()
        samples = sum(len(ids) for ids, _, _ in feed)
        seconds = time.perf_counter() - start
        feed.close()
    return {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}


def main(argv=None):
    p = workload_parser(__doc__, epochs=4, threads=False)
    args = p.parse_args(argv)
    from distseg.core import config as config_lib
    cfg = config_lib.PRESETS[args.preset]()
    print(json.dumps(pipeline_samples_per_s(args.data, cfg.model.image_size, args.batch_size,
                                            args.epochs, cfg.train.seed, cfg.data.prefetch)),
          flush=True)


if __name__ == "__main__":
    main()
