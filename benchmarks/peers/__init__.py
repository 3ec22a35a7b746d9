"""The peers distseg is timed against: Keras ``fit`` (``keras_fit``) and
``tf.distribute.MultiWorkerMirroredStrategy`` (``mwms``), each run as its own process."""
