"""The pieces of ``benchmarks/bench_stateff.py``, the large-batch study (samples and
time to a validation Dice, docs/statistical-efficiency.md), one concern each:

  ``study``      what is run: scales, variants, the benchmark data, one run's config;
  ``curves``     a run's per-rank logs to validation points and its numbers (samples
                 and time to the target, the largest drop);
  ``real``       back-end ``hvd``: ``distseg-train`` itself, one process or ``horovodrun``;
  ``emulation``  back-end ``sim``: N data-parallel ranks emulated step for step in one
                 process (``SimRanks``), held to the real loop by
                 ``tests/e2e/test_bench_stateff_parity.py``;
  ``runs``       one run, cached as JSON, and the grid of runs;
  ``summary``    the table over seeds, printed and as Markdown;
  ``goals``      the fixed-global-batch study's goal rows and the noise scale's predictions;
  ``largebatch`` the large-batch study's rows: global batches past 8 under each lr rule, the noise
                 scale's prediction from the B = 8 run, the goodput policy against
                 fixed per-rank batches in projected time;
  ``results``    the results file ``bench/results/stateff-<date>.json``.
"""
