"""Measurement pieces of ``benchmarks/bench_table.py`` (``make bench``).

Each module measures one row of the table and can run alone: FLOPs and dense-GEMM
FLOP/s (``flops``), bf16 against fp32 step time (``precision``), the input pipeline
alone (``pipeline``), allreduce and memory-copy bandwidth (``bandwidth``), local copies
of distseg's train step for A/B runs (``step_variants``, ``train_variant``), the
machine description (``machine``), and the table itself (``table``).

What every benchmark and study shares lives here too, one copy each: the command line
of a ``distseg-train`` run, its environment, the data files made with distseg's tools
and the results file (``launch``), the shared flags, ``--results-dir`` among them
(``args``), the commit (``machine.revision``), what a run's logs say (``runlogs``), and
the model and optimizer a benchmark trains, built by the run's own factory
(``model_variants.model_and_optimizer``), so a config's optimizer reaches it.
"""
