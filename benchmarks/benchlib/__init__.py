"""Measurement pieces of ``benchmarks/bench_table.py`` (``make bench``).

Each module measures one row of the table and can run alone: FLOPs and dense-GEMM
FLOP/s (``flops``), bf16 against fp32 step time (``precision``), the input pipeline
alone (``pipeline``), allreduce and memory-copy bandwidth (``bandwidth``), local copies
of distseg's train step for A/B runs (``step_variants``, ``train_variant``), the
machine description (``machine``), and the table itself (``table``).
"""
