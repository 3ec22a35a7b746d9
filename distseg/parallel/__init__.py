"""The runtime that every stage shares: ``distributed``, the only module of distseg that
imports Horovod (rank, size, collectives, the agreement that no rank fails alone), and
``threads``, TensorFlow's thread pools for one rank."""
