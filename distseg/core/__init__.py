"""Plain-Python facts that training, ``analysis`` and ``distseg-jobs`` share: the config
tree, the error family, the log schema and the run-directory layout. An import test
(tests/unit/test_analysis_noimport.py) keeps this package free of TensorFlow and Horovod."""
